"""Transactional cells: a cell that traps leaves the interpreter exactly as it was before it.

For every way a cell can trap (fuel in Python code or inside a numpy C loop, memory, native
stack, the wall-clock deadline, a hard interrupt, an abort) the trapping cell first mutates
the user's namespace, imports modules and raises the recursion limit; afterwards a full
snapshot of the namespace (types, ids, reprs, pickled contents, array bytes) plus the module
table must equal the one taken just before, and numpy, pandas and matplotlib, imported
earlier, must still work. Soft interrupts (KeyboardInterrupt inside the guest) are ordinary
exceptions: the user's ``except KeyboardInterrupt`` runs and nothing is rolled back. Both
interrupt modes are covered: SIGINT (the kernelspec's signal mode) and interrupt_request.

Finally, 30 trap and rollback cycles in a row, each growing guest memory by 200 MiB first,
must keep the kernel's RSS and the guest's heap bounded (numbers printed; see them with -s).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import KERNEL_NAME, CellRun, Kernel, ok
from interrupting import MARKER, SOFT_BOUND, SWALLOWING_CELL, Interrupted, run_and_interrupt
from jupyter_client.manager import KernelManager

from wasm_kernel.sandbox.guest_thread import GuestThread

FUEL = 15_000_000_000  # imports of pandas and matplotlib.pyplot fit; a busy loop runs out in ~2 s
GRACE = 1.0
MEMORY_LIMIT = 512 << 20
KERNEL_ARGS = [
    f"--WasmKernel.fuel={FUEL}",
    f"--WasmKernel.interrupt_grace={GRACE:g}",
    f"--WasmKernel.memory_limit={MEMORY_LIMIT}",
]
# The deadline has a kernel of its own: on a busy machine a fuel trap can take several times
# its usual ~2 s, and must not meet a deadline first. Its setup cells (the imports, ~1.5 s
# each when idle) must finish within the limit too.
TIME_LIMIT = 10
DEADLINE_ARGS = [*KERNEL_ARGS, f"--WasmKernel.time_limit={TIME_LIMIT}"]
ROLLBACK_NOTICE = (
    "The interpreter was rolled back to its state before this cell: names, imports and"
    " objects from earlier cells are intact."
)
NEW_MODULES = ("graphlib", "wave")  # imported by trapping cells only

# The user's state, built once per kernel. Everything here is mutated by the trapping cells.
SETUP_CELLS = [
    "import numpy as np",
    "import pandas as pd",
    "import matplotlib.pyplot as plt",
    (
        "import json, os, sys, time\n"
        "counter = 41\n"
        "items = [1, 2, 3]\n"
        "table = {'a': 1, 'nested': [1, 2]}\n"
        "arr = np.arange(12.0).reshape(3, 4)\n"
        "big = np.random.default_rng(0).random((800, 800))\n"
        "df = pd.DataFrame({'a': [1, 2, 3], 'b': list('xyz')})\n"
        "class Box:\n"
        "    pass\n"
        "obj = Box()\n"
        "obj.attr = 'kept'\n"
        "doomed = 'still here'\n"
        "def bump(x):\n"
        "    return x + counter\n"
    ),
]

# What every trapping cell does before it traps; the printed line proves it got that far.
MUTATIONS = (
    "counter += 1\n"
    "items.append('lost')\n"
    "table['added'] = 'lost'\n"
    "table['nested'].append('lost')\n"
    "arr *= -1\n"
    "big[0, 0] = -1.0\n"
    "df.loc[0, 'a'] = -999\n"
    "obj.attr = 'lost'\n"
    "fresh = 'lost'\n"
    "del doomed\n"
    "def bump(x):\n"
    "    return -x\n"
    f"import {', '.join(NEW_MODULES)}\n"
    "sys.setrecursionlimit(5000)\n"
    "print('mutated', counter, 'graphlib' in sys.modules)\n"
)
MUTATED_LINE = "mutated 42 True\n"

# Everything observable about the user's state. Runs in a private namespace (no names are
# added to the user's) and prints one JSON document.
SNAPSHOT_SOURCE = r"""
import hashlib, json, pickle, sys
def describe(value):
    entry = {"type": type(value).__qualname__, "id": id(value), "repr": repr(value)}
    try:
        entry["pickle"] = hashlib.sha256(pickle.dumps(value, protocol=5)).hexdigest()
    except Exception:
        entry["pickle"] = None
    if type(value).__name__ == "ndarray":
        entry["bytes"] = hashlib.sha256(value.tobytes()).hexdigest()
    if type(value).__module__ == "__main__" and hasattr(value, "__dict__"):
        entry["vars"] = repr(sorted(vars(value).items()))
    return entry
print(json.dumps({
    # In and Out: IPython's input and output history, which every cell (this one too) extends
    "names": {
        k: describe(v) for k, v in user.items() if not k.startswith("_") and k not in ("In", "Out")
    },
    "modules": sorted(sys.modules),
    "recursionlimit": sys.getrecursionlimit(),
}))
"""
SNAPSHOT_CELL = f"exec({SNAPSHOT_SOURCE!r}, {{'user': globals()}})"

# numpy, pandas and matplotlib after the trap; the expected numbers are computed here.
LIBRARIES_CELL = (
    "_fig, _ax = plt.subplots()\n"
    "_ax.plot(arr.ravel(), label='arr')\n"
    "plt.show()\n"
    "print('numpy', float((arr @ arr.T).sum()), float(big.sum() > 0))\n"
    "print('pandas', int(df['a'].sum()), ''.join(df['b']), int(df.describe().loc['count', 'a']))\n"
)
ARR = [[float(4 * r + c) for c in range(4)] for r in range(3)]
DOTS = sum(sum(x * y for x, y in zip(a, b, strict=True)) for a in ARR for b in ARR)
LIBRARIES_OUTPUT = f"numpy {DOTS} 1.0\npandas 6 xyz 3\n"


class ModeKernel(Kernel):
    """A kernel interrupted the given way ('signal' or 'message'), with extra arguments."""

    def __init__(self, mode: str, extra_arguments: list[str]):
        self.manager = KernelManager(kernel_name=KERNEL_NAME)
        assert self.manager.kernel_spec is not None
        self.manager.kernel_spec.interrupt_mode = mode
        self.manager.start_kernel(extra_arguments=extra_arguments)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)
        self.mode = mode


def run_ok(kernel: Kernel, code: str) -> CellRun:
    return ok(kernel.execute(code))


def start_with_state(mode: str, arguments: list[str] = KERNEL_ARGS) -> ModeKernel:
    kernel = ModeKernel(mode, arguments)
    for cell in SETUP_CELLS:
        run_ok(kernel, cell)
    # The first error loads the kernel's traceback formatter; load it now, not mid-test.
    assert kernel.execute("raise ValueError('warm-up')").content["ename"] == "ValueError"
    absent = run_ok(kernel, f"print([m in sys.modules for m in {NEW_MODULES!r}])")
    assert absent.stream_text() == f"{[False] * len(NEW_MODULES)}\n"
    return kernel


@pytest.fixture(scope="module")
def signal_kernel() -> Iterator[ModeKernel]:
    started = start_with_state("signal")
    yield started
    started.shutdown()


@pytest.fixture(scope="module")
def message_kernel() -> Iterator[ModeKernel]:
    started = start_with_state("message")
    yield started
    started.shutdown()


@pytest.fixture(scope="module")
def deadline_kernel() -> Iterator[ModeKernel]:
    started = start_with_state("signal", DEADLINE_ARGS)
    yield started
    started.shutdown()


@pytest.fixture(params=["signal", "message"])
def mode_kernel(request: pytest.FixtureRequest) -> ModeKernel:
    kernel = request.getfixturevalue(f"{request.param}_kernel")
    assert kernel.manager.kernel_spec.interrupt_mode == request.param
    return kernel


def snapshot(kernel: Kernel) -> dict:
    run = run_ok(kernel, SNAPSHOT_CELL)
    state = json.loads(run.stream_text())
    assert {"counter", "items", "arr", "df", "obj", "np", "pd", "plt"} <= set(state["names"])
    return state


def assert_same_state(before: dict, after: dict) -> None:
    """Equal snapshots, compared piecewise so that a failure names what changed."""
    assert sorted(after["names"]) == sorted(before["names"]), "names added or removed"
    for name, entry in before["names"].items():
        assert after["names"][name] == entry, f"{name} changed"
    assert after["modules"] == before["modules"], "the module table changed"
    assert after["recursionlimit"] == before["recursionlimit"]


def assert_libraries_work(kernel: Kernel) -> None:
    run = run_ok(kernel, LIBRARIES_CELL)
    assert run.stream_text() == LIBRARIES_OUTPUT
    images = [d for d in run.of_type("display_data") if "image/png" in d["data"]]
    assert len(images) == 1, run.of_type("display_data")


def assert_rolled_back(content: dict, ename: str) -> None:
    assert content["status"] == "error"
    assert content["ename"] == ename, content
    assert content["evalue"].endswith(ROLLBACK_NOTICE), content["evalue"]
    assert "restarted" not in content["evalue"]


# -- traps -------------------------------------------------------------------------------------

TRAPS = {
    # Any other trap; first, while memory is still small (see the test after the table).
    "abort": ("os.abort()\n", "GuestCrashed"),
    "python-loop-out-of-fuel": ("while True:\n    counter += 1\n", "FuelExhausted"),
    # One matrix product needs several times the fuel: the trap hits inside numpy's C loop.
    "numpy-c-loop-out-of-fuel": ("_m = np.ones((2500, 2500))\n_p = _m @ _m\n", "FuelExhausted"),
    # Emulates C code that aborts when malloc fails: fill memory, then abort in the failure.
    "abort-after-memory-growth": (
        (
            "hog = []\n"
            "try:\n"
            "    while True:\n"
            "        hog.append(bytearray(1 << 20))\n"
            "except MemoryError:\n"
            "    os.abort()\n"
        ),
        "MemoryLimitExceeded",
    ),
    "python-recursion-overflows-the-stack": (
        "sys.setrecursionlimit(10**7)\ndef deep(n):\n    return deep(n + 1)\ndeep(0)\n",
        "StackOverflow",
    ),
    "json-recursion-overflows-the-stack": (
        "sys.setrecursionlimit(10**7)\njson.loads('[' * 100000 + ']' * 100000)\n",
        "StackOverflow",
    ),
    # the deadline interrupts first; only a cell that ignores that is stopped hard
    "wall-clock-deadline": (
        (
            "while True:\n    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n"
            "        pass\n"
        ),
        "TimeLimitExceeded",
    ),
}


@pytest.mark.parametrize("trap", list(TRAPS))
@pytest.mark.slow
def test_trapping_cell_leaves_the_namespace_as_it_was(
    request: pytest.FixtureRequest, trap: str
) -> None:
    code, ename = TRAPS[trap]
    deadline = ename == "TimeLimitExceeded"
    kernel = request.getfixturevalue("deadline_kernel" if deadline else "signal_kernel")
    before = snapshot(kernel)
    start = time.monotonic()
    run = kernel.execute(MUTATIONS + code, timeout=TIME_LIMIT * 4)
    elapsed = time.monotonic() - start
    assert run.stream_text().startswith(MUTATED_LINE), run.stream_text()
    assert_rolled_back(run.content, ename)
    assert [e["ename"] for e in run.of_type("error")] == [ename]
    if deadline:
        assert TIME_LIMIT * 0.9 <= elapsed < TIME_LIMIT + 10
    assert_same_state(before, snapshot(kernel))
    assert_libraries_work(kernel)


def test_crash_after_memory_was_full_is_not_reported_as_memory(signal_kernel: ModeKernel) -> None:
    """A trap unrelated to memory, in a cell using little of it, after an earlier cell
    filled memory and was rolled back: the earlier growth must not decide the diagnosis."""
    kernel = signal_kernel
    code, ename = TRAPS["abort-after-memory-growth"]
    assert_rolled_back(kernel.execute(code).content, ename)
    assert run_ok(kernel, "len(bytearray(10))").result_text() == "10"
    assert_rolled_back(kernel.execute("os.abort()").content, "GuestCrashed")


def test_memory_error_is_an_ordinary_exception_that_keeps_state(signal_kernel: ModeKernel) -> None:
    """Growth past the limit usually fails an allocation inside Python: MemoryError, no trap.

    Nothing is rolled back then: earlier state is intact and the cell's own changes stay,
    as with any exception.
    """
    kernel = signal_kernel
    before = snapshot(kernel)
    run = kernel.execute("[bytearray(1 << 20) for _ in range(10**4)]")
    content = run.content
    assert content["status"] == "error"
    assert content["ename"] == "MemoryLimitExceeded"
    assert f"{MEMORY_LIMIT >> 20} MiB" in content["evalue"]
    assert "rolled back" not in content["evalue"]
    assert_same_state(before, snapshot(kernel))

    run = kernel.execute("counter += 1\nhog = [bytearray(1 << 20) for _ in range(10**4)]")
    try:
        assert run.content["ename"] == "MemoryLimitExceeded"
        assert run_ok(kernel, "counter, 'hog' in dir()").result_text() == "(42, False)"
    finally:
        run_ok(kernel, "counter = 41")
    assert_same_state(before, snapshot(kernel))
    assert_libraries_work(kernel)


def test_memory_is_reusable_after_a_trap_at_the_limit(signal_kernel: ModeKernel) -> None:
    """The rolled-back cell's memory is free again: a cell can use most of the limit."""
    kernel = signal_kernel
    code, ename = TRAPS["abort-after-memory-growth"]
    assert_rolled_back(kernel.execute(code).content, ename)
    run = kernel.execute("_hold = bytearray(300 << 20)\nprint(len(_hold) >> 20)\ndel _hold")
    assert run.content["status"] == "ok", run.content
    assert run.stream_text() == "300\n"


def test_trap_inside_a_function_called_from_earlier_cells(signal_kernel: ModeKernel) -> None:
    """Objects from earlier cells that the trapping cell only reaches through calls."""
    kernel = signal_kernel
    run_ok(kernel, "def spin(target):\n    while True:\n        target[0] += 1")
    before = snapshot(kernel)
    run = kernel.execute("spin(items)", timeout=TIME_LIMIT * 4)
    assert_rolled_back(run.content, "FuelExhausted")
    assert_same_state(before, snapshot(kernel))
    assert run_ok(kernel, "items").result_text() == "[1, 2, 3]"


def test_consecutive_traps_roll_back_to_the_last_good_cell(signal_kernel: ModeKernel) -> None:
    """Each rollback goes to the state after the latest successful cell, not an older one."""
    kernel = signal_kernel
    run_ok(kernel, "progress = ['first']")
    trap = "progress.append('lost')\njson.loads('[' * 100000 + ']' * 100000)"
    assert_rolled_back(kernel.execute(trap).content, "StackOverflow")
    run_ok(kernel, "progress.append('second')")
    assert_rolled_back(kernel.execute(trap).content, "StackOverflow")
    assert_rolled_back(kernel.execute(trap).content, "StackOverflow")
    assert run_ok(kernel, "progress").result_text() == "['first', 'second']"
    run_ok(kernel, "del progress")


HOSTILE_REPAIRS = {
    "sleeps": "lambda: time.sleep(10**9)",
    "loops": "lambda: [None for _ in iter(int, 1)]",
    "exits": "lambda: os._exit(3)",
    "raises": "lambda: 1 / 0",
}


@pytest.mark.parametrize("repair", list(HOSTILE_REPAIRS))
def test_sabotaged_step_after_a_rollback_cannot_hang_or_lose_state(
    start_kernel, repair: str
) -> None:
    """After a rollback the kernel runs a short guest step that closes stale files. It lives in
    the user's interpreter, so a cell could replace it: the guest checks its own code at the
    end of every cell, so the replacing cell itself is rolled back, and a later trap still
    rolls back to the last good cell (the step is also bounded like a cell, in case a
    replacement slips past the check)."""
    kernel = start_kernel(["--WasmKernel.fuel=3000000000"])
    run_ok(kernel, "import os, time, _wasm_kernel\nkept = 41")
    sabotage = kernel.execute(
        f"kept = 0\n_wasm_kernel.close_stale_files = {HOSTILE_REPAIRS[repair]}"
    )
    assert_rolled_back(sabotage.content, "KernelSupportDamaged")
    trapped = kernel.execute("kept = 0\nwhile True:\n    pass", timeout=60)
    assert_rolled_back(trapped.content, "FuelExhausted")
    assert trapped.seconds < 30
    assert run_ok(kernel, "kept").result_text() == "41"


# -- interrupts, both modes ---------------------------------------------------------------------

SOFT_CASES = {
    "python-loop": f"print({MARKER!r})\nwhile True:\n    pass",
    "sleep": f"print({MARKER!r})\ntime.sleep(60)",
    "input": "input('never answered: ')",  # interrupted once its input_request arrives
    "numpy": f"print({MARKER!r})\nwhile True:\n    _p = big @ big",
}


def interrupt(kernel: ModeKernel, code: str, allow_stdin: bool = False) -> Interrupted:
    return run_and_interrupt(
        kernel, code, kernel.manager.interrupt_kernel, allow_stdin=allow_stdin, timeout=60
    )


@pytest.mark.parametrize("case", list(SOFT_CASES))
@pytest.mark.slow
def test_interrupt_raises_keyboard_interrupt_that_user_code_handles(
    mode_kernel: ModeKernel, case: str
) -> None:
    kernel = mode_kernel
    before = snapshot(kernel)
    code = (
        "counter += 1\n"
        "items.append('interrupted')\n"
        "try:\n"
        + "".join(f"    {line}\n" for line in SOFT_CASES[case].splitlines())
        + "except KeyboardInterrupt:\n"
        "    print('caught')\n"
        "    raise\n"
    )
    run = interrupt(kernel, code, allow_stdin=case == "input")
    content = run.content
    assert run.stdout().endswith("caught\n"), run.stdout()
    assert content["status"] == "error"
    assert content["ename"] == "KeyboardInterrupt"
    assert "stopped hard" not in content["evalue"]
    assert "rolled back" not in content["evalue"]
    assert run.stop_delay < SOFT_BOUND, f"took {run.stop_delay:.1f} s to stop"
    traceback = "\n".join(content["traceback"])
    assert "KeyboardInterrupt" in traceback

    # An ordinary exception: the cell's changes stay, everything else is as it was.
    try:
        after = snapshot(kernel)
        assert run_ok(kernel, "counter, items[-1]").result_text() == "(42, 'interrupted')"
    finally:
        # back to the shared state for later tests
        run_ok(kernel, "counter = 41\nif items[-1:] == ['interrupted']:\n    items.pop()")
    for name in ("counter", "items"):
        before["names"].pop(name)
        after["names"].pop(name)
    assert_same_state(before, after)
    assert_libraries_work(kernel)


def test_caught_interrupt_lets_the_cell_finish(mode_kernel: ModeKernel) -> None:
    code = (
        f"print({MARKER!r})\n"
        "try:\n"
        "    while True:\n"
        "        pass\n"
        "except KeyboardInterrupt:\n"
        "    print('caught')\n"
        "print('after', counter)\n"
    )
    run = interrupt(mode_kernel, code)
    assert run.content["status"] == "ok", run.content
    assert run.stdout() == f"{MARKER}\ncaught\nafter 41\n"
    assert run.stop_delay < SOFT_BOUND


def test_loop_that_swallows_the_interrupt_is_stopped_hard_and_rolled_back(
    mode_kernel: ModeKernel,
) -> None:
    """The hard interrupt, the sixth trap kind: it escalates after the grace time."""
    kernel = mode_kernel
    run_ok(kernel, "x = 'before the loop'")
    before = snapshot(kernel)
    run = interrupt(kernel, MUTATIONS + SWALLOWING_CELL)
    assert run.stdout().startswith(MUTATED_LINE), run.stdout()
    assert_rolled_back(run.content, "KeyboardInterrupt")
    assert f"within {GRACE:g} s" in run.content["evalue"]
    assert "stopped hard" in run.content["evalue"]
    assert GRACE * 0.9 <= run.stop_delay < GRACE + 6, f"stopped after {run.stop_delay:.1f} s"
    assert_same_state(before, snapshot(kernel))
    assert run_ok(kernel, "x").result_text() == "'before the loop'"
    assert_libraries_work(kernel)
    # No interrupt is left over for the next cell: a short busy loop runs to its end.
    busy = run_ok(kernel, "total = 0\nfor i in range(300_000):\n    total += i\nprint(total)")
    assert busy.stream_text() == f"{sum(range(300_000))}\n"


# -- repeated rollbacks: memory stays bounded -----------------------------------------------------

CYCLES = 30
CYCLE_FUEL = 3_000_000_000
ALLOCATION = 200 << 20
RSS_SLACK = 150 << 20
HEAP_SLACK = 16 << 20
# Touches every page of 200 MiB, prints where the allocation ends in linear memory, then
# loops until the fuel runs out.
CYCLE_CELL = (
    f"_hog = np.ones({ALLOCATION // 8})\n"
    "print(_hog.__array_interface__['data'][0] + _hog.nbytes)\n"
    "while True:\n"
    "    pass\n"
)


def rss_bytes(pid: int) -> int:
    try:
        import psutil
    except ImportError:
        status = Path(f"/proc/{pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1]) * 1024
    return psutil.Process(pid).memory_info().rss


@pytest.fixture
def cycle_kernel() -> Iterator[ModeKernel]:
    started = ModeKernel("signal", [f"--WasmKernel.fuel={CYCLE_FUEL}"])
    yield started
    started.shutdown()


@pytest.mark.slow
def test_thirty_rollbacks_keep_memory_bounded(cycle_kernel: ModeKernel) -> None:
    kernel = cycle_kernel
    pid = kernel.manager.provisioner.process.pid
    assert pid != os.getpid()
    run_ok(kernel, "import numpy as np\nkept = list(range(10))")
    baseline = rss_bytes(pid)
    heap_ends: list[int] = []
    rss: list[int] = []
    for _ in range(CYCLES):
        run = kernel.execute(CYCLE_CELL)
        assert_rolled_back(run.content, "FuelExhausted")
        heap_ends.append(int(run.stream_text()))
        rss.append(rss_bytes(pid))
    mib = 1 << 20
    print(
        f"\nkernel RSS: {baseline / mib:.0f} MiB before, {rss[0] / mib:.0f} MiB after cycle 1,"
        f" {max(rss) / mib:.0f} MiB at most, {rss[-1] / mib:.0f} MiB after cycle {CYCLES}"
    )
    print(
        f"guest heap end (200 MiB allocation): {heap_ends[0] / mib:.1f} MiB in cycle 1,"
        f" {min(heap_ends) / mib:.1f}-{max(heap_ends) / mib:.1f} MiB over {CYCLES} cycles"
    )
    assert max(heap_ends) - min(heap_ends) <= HEAP_SLACK, heap_ends
    assert max(rss) < rss[0] + RSS_SLACK, [r // mib for r in rss]
    assert rss[-1] < rss[0] + RSS_SLACK
    assert run_ok(kernel, "kept").result_text() == str(list(range(10)))
    after = run_ok(kernel, "_hog = np.ones((600 << 20) // 8)\nprint(_hog.nbytes >> 20)\ndel _hog")
    assert after.stream_text() == "600\n", "memory of the rolled-back cells was not given back"


def test_a_deferred_checkpoint_runs_before_the_next_guest_job() -> None:
    """The kernel defers a cell's checkpoint until its reply is sent; whatever reaches the
    guest next (a cell, a completion, an image) must still find it taken."""
    worker = GuestThread()
    order: list[str] = []
    try:
        worker.defer(lambda: order.append("checkpoint 1"))
        worker.submit(order.append, "cell 2").result()
        worker.defer(lambda: order.append("checkpoint 2"))
        worker.defer(lambda: order.append("checkpoint 3"))  # the one before is queued first
        worker.run_deferred()
        worker.run_deferred()  # nothing left: runs nothing twice
        worker.submit(order.append, "cell 4").result()
    finally:
        worker.shutdown()
    assert order == ["checkpoint 1", "cell 2", "checkpoint 2", "checkpoint 3", "cell 4"]
