"""A cell that fills guest memory to the sandbox's limit and keeps it full must not cost the
session: the error is reported, earlier variables survive, and the next cell can run, so the
user can free what filled memory.

The guest holds a small reserve of memory back from the user's code and gives it back when
memory runs out (see ``MEMORY_RESERVE`` in the guest's kernel module,
``guest/_wasm_kernel.py``); it takes it again once memory allows. Without it, a cell that
kept memory full left the next cell no room to run: its failure then rolled back to the full
state, whose repair failed too, and the interpreter was restarted, losing every variable.
With rollback off, a cell that kept memory full still leaves the next cells room; a trap
while memory runs out (CPython can crash there) restarts the interpreter, as every trap does
without rollback.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import Kernel, ok, plain

LIMIT = 256 << 20
SETUP = "sentinel = 'kept'\nballast = []"
KEEP_FILLING = "for i in range(5 * 10**7):\n    ballast.append([ballast])"
CATCH_AND_KEEP = (  # to the last KiB: not even a new turn's source could be compiled
    "try:\n"
    "    while True:\n"
    "        ballast.append(bytearray(1 << 16))\n"
    "except MemoryError:\n"
    "    try:\n"
    "        while True:\n"
    "            ballast.append(bytearray(1 << 10))\n"
    "    except MemoryError:\n"
    "        caught = True"
)
MODES = {
    "rollback": [f"--WasmKernel.memory_limit={LIMIT}"],
    "no-rollback": [f"--WasmKernel.memory_limit={LIMIT}", "--WasmKernel.rollback=False"],
    "strict": [
        "--WasmKernel.profile=strict",
        f"--WasmKernel.memory_limit={LIMIT}",
        "--WasmKernel.time_limit=120",
    ],
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=list(MODES))
def kernel(request) -> Iterator[Kernel]:
    started = Kernel(MODES[request.param])
    yield started
    started.shutdown()


# Running out of memory can crash CPython itself (a trap: its out-of-memory path in PyList_New
# faults), and with rollback off a trap restarts the interpreter, by design.
@pytest.fixture(scope="module", params=[mode for mode in MODES if mode != "no-rollback"])
def rolling_back(request) -> Iterator[Kernel]:
    started = Kernel(MODES[request.param])
    yield started
    started.shutdown()


@pytest.fixture
def session(kernel: Kernel) -> Kernel:
    ok(kernel.execute(SETUP))
    return kernel


@pytest.fixture
def rolling_session(rolling_back: Kernel) -> Kernel:
    ok(rolling_back.execute(SETUP))
    return rolling_back


def assert_recovers(kernel: Kernel) -> None:
    """Earlier state is intact and, once the user frees memory, cells run as before."""
    assert plain(kernel.execute("sentinel")) == "kept"
    ok(kernel.execute("ballast.clear()"))
    assert plain(kernel.execute("len(ballast), 1 + 1")) == (0, 2)
    assert plain(kernel.execute("len(bytearray(32 << 20))")) == 32 << 20


def test_memory_kept_full_by_a_global(rolling_session: Kernel) -> None:
    session = rolling_session
    run = session.execute(KEEP_FILLING, timeout=120)
    assert run.content["status"] == "error"
    assert run.content["ename"] == "MemoryLimitExceeded", run.content
    assert "256 MiB" in run.content["evalue"]
    assert "restarted" not in run.content["evalue"]
    assert_recovers(session)


def test_memory_error_caught_with_memory_still_full(session: Kernel) -> None:
    """The cell catches MemoryError and ends well, holding everything: the next cells still
    run (the cell ended with memory full, so the reserve was given back) and can free it."""
    ok(session.execute(CATCH_AND_KEEP, timeout=120))
    assert plain(session.execute("caught, len(ballast) > 100")) == (True, True)
    assert_recovers(session)


def test_repeated_bombs(rolling_session: Kernel) -> None:
    session = rolling_session
    for _ in range(3):
        run = session.execute(KEEP_FILLING, timeout=120)
        assert run.content["ename"] == "MemoryLimitExceeded", run.content
        assert plain(session.execute("sentinel")) == "kept"
    assert_recovers(session)
