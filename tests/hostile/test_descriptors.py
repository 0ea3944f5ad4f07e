"""Descriptors: a cell can neither close the kernel's own nor use up the process's.

wasmtime holds the guest's open files as descriptors of the kernel process itself, next to
the kernel's ZMQ sockets, and its table is not part of a checkpoint.
"""

from __future__ import annotations

import os

import pytest
from conftest import Kernel, ok
from jupyter_client.blocking.client import BlockingKernelClient

from wasm_kernel.sandbox.descriptors import default_limit

OPEN_UNTIL_REFUSED = "held = []\nwhile True:\n    held.append(os.open('/tmp', os.O_RDONLY))"


@pytest.fixture(scope="module")
def strict() -> Kernel:
    started = Kernel(["--WasmKernel.time_limit=5"], kernel_name="wasm-python-strict")
    ok(started.execute("import os, traceback\nsentinel = 'kept'"))
    # what formatting a traceback imports, so that it works while no descriptor is left
    warm = started.execute("open('/no/such/file')")
    assert warm.content["ename"] == "FileNotFoundError"
    yield started
    started.shutdown()


def process_descriptors(kernel: Kernel) -> int:
    return len(os.listdir(f"/proc/{kernel.manager.provisioner.process.pid}/fd"))


@pytest.mark.slow
def test_opening_until_refused_leaves_the_kernel_room(strict: Kernel) -> None:
    before = process_descriptors(strict)
    run = strict.execute(OPEN_UNTIL_REFUSED)
    assert run.content["ename"] == "OSError"
    assert run.content["evalue"].startswith("[Errno 33]")
    assert "limits how many files" in "\n".join(run.content["traceback"])
    assert strict.execute("len(held)").result_text() == str(default_limit())
    assert process_descriptors(strict) <= before + default_limit() + 8  # a few are the host's
    # the kernel still serves its clients, old and new
    assert strict.execute("sentinel").result_text() == "'kept'"
    fresh = BlockingKernelClient()
    fresh.load_connection_info(strict.manager.get_connection_info())
    fresh.start_channels(hb=False)
    try:
        assert fresh.kernel_info(reply=True, timeout=30)["content"]["status"] == "ok"
    finally:
        fresh.stop_channels()
    ok(strict.execute("for fd in held:\n    os.close(fd)\nheld.clear()"))
    ok(strict.execute("open('/tmp/one-more', 'w').close()"))


@pytest.mark.slow
def test_files_opened_by_a_rolled_back_cell_are_closed(strict: Kernel) -> None:
    ok(strict.execute("kept_file = open('/tmp/kept', 'w')"))
    before = process_descriptors(strict)
    run = strict.execute(
        "import os\nleak = [os.open('/tmp', os.O_RDONLY) for _ in range(300)]\n"
        "while True:\n    try:\n        while True:\n            pass\n"
        "    except KeyboardInterrupt:\n        pass"  # ignores the time limit's interrupt
    )
    assert run.content["ename"] == "TimeLimitExceeded"
    assert process_descriptors(strict) <= before + 5
    assert strict.execute("kept_file.write('still open')").result_text() == "10"


@pytest.mark.parametrize("fd", [0, 1, 2])
def test_closing_stdio_changes_nothing(strict: Kernel, fd: int) -> None:
    ok(strict.execute(f"import os\nos.close({fd})"))
    assert strict.execute("print('printed')").stream_text() == "printed\n"
    run = strict.execute("import sys\nprint('warned', file=sys.stderr)")
    assert run.stream_text("stderr") == "warned\n"


@pytest.mark.parametrize("fd", [3, 4, 5])
def test_the_runtime_and_kernel_folders_cannot_be_closed(strict: Kernel, fd: int) -> None:
    run = strict.execute(f"import os\nos.close({fd})")
    assert run.content["ename"] == "PermissionError"
    ok(strict.execute("import json, numpy\nopen('/tmp/x', 'w').write(json.dumps([1]))"))
