"""Service requests (user_expressions, completion) run the user's code too: what that code
writes to the private /tmp is held to its size limit as a cell's is, and since no one reads a
service's error, what a request wrote past the limit is removed. The strict profile allows
64 MiB; the code here tries to write 512 MiB."""

from __future__ import annotations

import pytest
from conftest import Kernel, ok

SETUP = """
import os
held = open('/tmp/held', 'wb')
held.write(bytes(1024))
held.flush()

def fill(path):
    with open(path, 'wb') as out:
        for _ in range(512):
            out.write(bytes(1 << 20))
            out.flush()
    for _ in range(64):  # and through a file held open since an earlier cell
        held.write(bytes(1 << 20))
        held.flush()

class Filling:
    def __repr__(self):
        fill('/tmp/by-repr')
        return 'filled'

    def __dir__(self):
        fill('/tmp/by-dir')
        return ['filled']

w = Filling()
"""
LEFT = (
    "(os.path.exists('/tmp/by-repr'), os.path.exists('/tmp/by-dir'), os.stat('/tmp/held').st_size)"
)


@pytest.fixture
def strict() -> Kernel:
    started = Kernel(kernel_name="wasm-python-strict")
    ok(started.execute(SETUP))
    yield started
    started.shutdown()


def test_user_expressions_past_the_limit_leave_nothing_behind(strict: Kernel) -> None:
    run = ok(strict.execute("", user_expressions={"r": "repr(w)"}, timeout=120))
    result = run.content["user_expressions"]["r"]
    assert result["ename"] == "ScratchLimitExceeded", result
    assert "was removed" in result["evalue"]
    assert ok(strict.execute(LEFT)).result_text() == "(False, False, 1024)"


def test_a_completion_past_the_limit_leaves_nothing_behind(strict: Kernel) -> None:
    strict.client.complete("w.", 2, reply=True, timeout=120)
    run = ok(strict.execute(LEFT))
    assert run.result_text() == "(False, False, 1024)"
    assert "ScratchLimitExceeded" in run.stream_text("stderr")  # told on the next cell


# a file beside the notebook opened for appending by os.open: the host's half of the layer
# copies it up into /tmp before the request writes to it (files/layer_opens)
BESIDE = """
import os

class Appending:
    def __repr__(self):
        fd = os.open('beside.bin', os.O_WRONLY | os.O_APPEND)
        try:
            for _ in range(96):
                os.write(fd, bytes(1 << 20))
        finally:
            os.close(fd)
        return 'appended'

a = Appending()
"""
COPY = "/tmp/.wasm-kernel-writes/files/notebook/beside.bin"


def test_a_copy_up_by_a_request_past_the_limit_is_removed_too(start_kernel, tmp_path) -> None:
    (tmp_path / "beside.bin").write_bytes(bytes(4 << 20))
    kernel = start_kernel(["--WasmKernel.scratch_limit=33554432"], cwd=tmp_path)
    ok(kernel.execute(BESIDE))
    run = ok(kernel.execute("", user_expressions={"r": "repr(a)"}, timeout=120))
    result = run.content["user_expressions"]["r"]
    assert result["ename"] == "ScratchLimitExceeded", result
    left = ok(kernel.execute(f"os.path.exists({COPY!r}), os.path.getsize('beside.bin')"))
    assert left.result_text() == f"(False, {4 << 20})"
    assert (tmp_path / "beside.bin").read_bytes() == bytes(4 << 20)


# a file removed while open is held aside by the host (sandbox/unlinked_files): a request
# writing through it past the limit puts it back to its size too
HELD_ASIDE = """
gone = open('/tmp/gone', 'wb')
gone.write(bytes(1024))
gone.flush()
os.remove('/tmp/gone')

class Growing:
    def __repr__(self):
        for _ in range(96):
            gone.write(bytes(1 << 20))
            gone.flush()
        return 'grown'

g = Growing()
"""


def test_a_file_held_aside_grown_by_a_request_is_put_back(strict: Kernel) -> None:
    ok(strict.execute(HELD_ASIDE))
    run = ok(strict.execute("", user_expressions={"r": "repr(g)"}, timeout=120))
    assert run.content["user_expressions"]["r"]["ename"] == "ScratchLimitExceeded"
    size = ok(strict.execute("os.fstat(gone.fileno()).st_size"))
    assert size.result_text() == "1024"
    ok(strict.execute("open('/tmp/after', 'wb').write(bytes(1 << 20))"))  # /tmp has room again
