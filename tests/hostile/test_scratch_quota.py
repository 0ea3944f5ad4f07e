"""The private /tmp's size limit, against the ways around it a cell can take.

The strict profile allows 64 MiB. Every test checks the host side too: the kernel's scratch
folder really stays near the limit.
"""

from __future__ import annotations

import pytest
from conftest import Kernel, ok

LIMIT = 64 << 20


@pytest.fixture
def strict() -> Kernel:
    started = Kernel(kernel_name="wasm-python-strict")
    ok(started.execute("import os\nsentinel = 'kept'"))
    yield started
    started.shutdown()


def assert_stopped(run) -> None:
    assert run.content["status"] == "error"
    assert run.content["ename"] == "ScratchLimitExceeded", run.content


def test_an_unlinked_file_still_open_counts(strict: Kernel) -> None:
    run = strict.execute(
        "f = open('/tmp/g', 'wb')\nos.unlink('/tmp/g')\n"
        "for _ in range(192):\n    f.write(bytes(1 << 20))\n    f.flush()",
        timeout=120,
    )
    assert_stopped(run)
    assert strict.execute("sentinel").result_text() == "'kept'"


def test_a_path_longer_than_path_max_counts(strict: Kernel) -> None:
    """Files whose host path is longer than the host's PATH_MAX (4096 bytes): the guest's own
    limit is the same, and the host path adds the scratch folder's name in front."""
    run = strict.execute(
        "path = '/tmp'\nfor level in range(20):\n    path += '/' + 'd' * 200\n    os.mkdir(path)\n"
        "name = path + '/' + 'f' * (4090 - len(path) - 1)\nfor index in range(8):\n"
        "    with open(name[:-1] + str(index), 'wb') as out:\n        out.write(bytes(10 << 20))",
        timeout=120,
    )
    assert_stopped(run)


def assert_taken_back(strict: Kernel, path: str) -> None:
    """A service request past the limit: what it wrote is gone, and /tmp has room again
    (see test_service_scratch.py)."""
    assert strict.execute(f"os.path.exists({path!r})").result_text() == "False"
    ok(strict.execute("open('/tmp/after', 'wb').write(b'x')"))


@pytest.mark.slow
def test_writes_in_user_expressions_are_measured(strict: Kernel) -> None:
    grow = "open('/tmp/from-expressions', 'wb').write(bytes(100 << 20))"
    run = ok(strict.execute("1", user_expressions={"grow": grow}, timeout=120))
    assert run.content["user_expressions"]["grow"]["ename"] == "ScratchLimitExceeded"
    assert_taken_back(strict, "/tmp/from-expressions")


@pytest.mark.slow
def test_writes_during_completion_are_measured(strict: Kernel) -> None:
    ok(
        strict.execute(
            "class Grows:\n    def __dir__(self):\n"
            "        open('/tmp/from-completion', 'ab').write(bytes(100 << 20))\n"
            "        return ['x']\n"
            "g = Grows()"
        )
    )
    strict.client.complete("g.", 2, reply=True, timeout=120)
    assert_taken_back(strict, "/tmp/from-completion")


@pytest.mark.slow
def test_over_the_limit_nothing_grows_until_files_are_deleted(strict: Kernel) -> None:
    """A cell stopped past the limit leaves its files; later cells cannot add to them, not
    even through a file kept open from before, so the excess cannot pile up cell by cell."""
    ok(strict.execute("kept = open('/tmp/kept', 'wb')"))
    assert_stopped(
        strict.execute(
            "kept.write(bytes(100 << 20))\nkept.flush()\nimport time\ntime.sleep(2)", timeout=120
        )
    )
    for code in (
        "kept.write(bytes(100 << 20))\nkept.flush()",
        "open('/tmp/new', 'wb').write(b'x')",
        "os.mkdir('/tmp/folder')",
    ):
        run = strict.execute(code, timeout=120)
        assert run.content["status"] == "error", code
        assert run.content["ename"] in ("OSError", "PermissionError"), run.content
    assert int(strict.execute("os.path.getsize('/tmp/kept')").result_text()) <= 100 << 20
    ok(strict.execute("kept.close()\nos.remove('/tmp/kept')"))
    ok(strict.execute("open('/tmp/new', 'wb').write(b'x')"))
