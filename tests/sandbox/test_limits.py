"""Per-cell limits over jupyter_client: fuel, wall-clock time, memory, output, stack.

Every limit that stops a cell must leave a kernel that answers the next one. A limit that
traps (fuel, time) rolls the interpreter back to its state before the cell, so earlier names
survive and the cell's own changes are undone; with ``--WasmKernel.rollback=False`` the
interpreter is restarted instead. Kernels with non-default settings are started once per
setting; the default one is conftest's ``kernel``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Kernel

from wasm_kernel.sandbox.interrupts import Watchdog
from wasm_kernel.settings.profiles import DEFAULT_PROFILE, PROFILES

SMALL_FUEL = 2_000_000_000
ROLLBACK_NOTICE = (
    "The interpreter was rolled back to its state before this cell: names, imports and"
    " objects from earlier cells are intact."
)
RESTART_NOTICE = "interpreter was restarted"
FRESH_NOTICE = (
    "The interpreter was rolled back to its fresh state: no earlier cell had finished, so"
    " nothing was lost."
)
SWALLOWING = (
    "while True:\n"
    "    try:\n"
    "        while True:\n"
    "            pass\n"
    "    except BaseException:\n"
    "        pass"
)


def assert_answers(kernel: Kernel) -> None:
    """The kernel runs a fresh cell normally after whatever happened before."""
    run = kernel.execute("6 * 7")
    assert run.content["status"] == "ok", run.content
    assert run.result_text() == "42"


@pytest.fixture(scope="module")
def small_fuel_kernel() -> Iterator[Kernel]:
    started = Kernel([f"--WasmKernel.fuel={SMALL_FUEL}"])
    yield started
    started.shutdown()


@pytest.fixture(scope="module")
def timed_kernel() -> Iterator[Kernel]:
    started = Kernel(["--WasmKernel.time_limit=2"])
    yield started
    started.shutdown()


def assert_fuel_exhausted(kernel: Kernel, fuel: int) -> None:
    """A busy loop runs out of fuel and is rolled back (after a first cell has run: the first
    checkpoint is taken after it)."""
    assert_answers(kernel)
    run = kernel.execute("while True: pass")
    content = run.content
    assert content["status"] == "error"
    assert content["ename"] == "FuelExhausted"
    assert f"{fuel:,}" in content["evalue"]
    assert "WasmKernel.fuel" in content["evalue"]
    assert ROLLBACK_NOTICE in content["evalue"]
    assert RESTART_NOTICE not in content["evalue"]
    assert [e["ename"] for e in run.of_type("error")] == ["FuelExhausted"]


def test_fuel_exhaustion_stops_the_cell_and_says_how_to_raise_it(small_fuel_kernel: Kernel) -> None:
    assert_fuel_exhausted(small_fuel_kernel, SMALL_FUEL)
    assert_answers(small_fuel_kernel)


def test_fuel_exhaustion_rolls_the_cell_back(small_fuel_kernel: Kernel) -> None:
    """The message says earlier state is intact; check that it is, and that the cell's own
    changes before it ran out are undone."""
    kernel = small_fuel_kernel
    assert kernel.execute("before_fuel = [1]").content["status"] == "ok"
    run = kernel.execute(
        "before_fuel.append(2)\nmade_in_cell = 3\nprint('changed')\nwhile True: pass"
    )
    assert run.content["ename"] == "FuelExhausted"
    assert run.stream_text() == "changed\n"
    after = kernel.execute("before_fuel, 'made_in_cell' in dir()")
    assert after.content["status"] == "ok", after.content
    assert after.result_text() == "([1], False)"


@pytest.mark.parametrize("rollback", ["True", "False"])
@pytest.mark.slow
def test_trap_in_the_first_cell_rolls_back_to_the_fresh_interpreter(
    start_kernel, rollback: str
) -> None:
    """Before any cell has finished there is nothing to lose: a trap leaves the fresh
    interpreter and says so (not that names are gone); from then on traps roll back."""
    kernel = start_kernel([f"--WasmKernel.fuel={SMALL_FUEL}", f"--WasmKernel.rollback={rollback}"])
    first = kernel.execute("made_in_first_cell = 1\nwhile True: pass").content
    assert first["ename"] == "FuelExhausted"
    assert FRESH_NOTICE in first["evalue"]
    assert RESTART_NOTICE not in first["evalue"] and "are gone" not in first["evalue"]
    assert kernel.execute("made_in_first_cell").content["ename"] == "NameError"
    if rollback == "False":  # without checkpoints, later traps still restart
        assert kernel.execute("kept_after_restart = 1").content["status"] == "ok"
        assert RESTART_NOTICE in kernel.execute("while True: pass").content["evalue"]
        return
    assert kernel.execute("kept_after_restart = 1").content["status"] == "ok"
    second = kernel.execute("while True: pass").content
    assert second["ename"] == "FuelExhausted"
    assert ROLLBACK_NOTICE in second["evalue"]
    assert kernel.execute("kept_after_restart").result_text() == "1"


@pytest.mark.parametrize(
    "setting",
    [{"extra_arguments": ["--WasmKernel.rollback=False"]}, {"env": {"WASM_KERNEL_ROLLBACK": "0"}}],
    ids=["argument", "environment"],
)
@pytest.mark.slow
def test_fuel_exhaustion_restarts_the_interpreter_without_rollback(start_kernel, setting) -> None:
    """With rollback off a trap restarts the interpreter: the message says state is gone,
    and it really is."""
    arguments = [f"--WasmKernel.fuel={SMALL_FUEL}", *setting.get("extra_arguments", [])]
    kernel = start_kernel(arguments, env=setting.get("env"))
    assert kernel.execute("before_fuel = 1").content["status"] == "ok"
    run = kernel.execute("while True: pass")
    content = run.content
    assert content["ename"] == "FuelExhausted"
    assert f"{SMALL_FUEL:,}" in content["evalue"]
    assert RESTART_NOTICE in content["evalue"]
    assert "are gone" in content["evalue"]
    assert "rolled back" not in content["evalue"]
    after = kernel.execute("before_fuel")
    assert after.content["status"] == "error"
    assert after.content["ename"] == "NameError"
    assert_answers(kernel)


@pytest.mark.parametrize(
    "code",
    ["import time\nwhile True: time.sleep(0.1)", "while True: pass"],
    ids=["sleeping", "busy"],
)
@pytest.mark.slow
def test_time_limit_interrupts_the_cell_and_keeps_its_effects(
    timed_kernel: Kernel, code: str
) -> None:
    """The deadline stops the cell as an interrupt does (nbgrader's timeout on the native
    kernel): a KeyboardInterrupt inside it, reported as TimeLimitExceeded, and what the cell
    did before it stays."""
    kept = timed_kernel.execute("timed_kept = {'n': 1}")
    assert kept.content["status"] == "ok"
    start = time.monotonic()
    run = timed_kernel.execute(
        f"timed_kept['n'] = 2\ntimed_new = 1\nprint('started')\n{code}", timeout=60
    )
    elapsed = time.monotonic() - start
    content = run.content
    assert content["status"] == "error"
    assert content["ename"] == "TimeLimitExceeded"
    assert "time_limit" in content["evalue"] and "interrupted" in content["evalue"]
    assert "rolled back" not in content["evalue"]
    assert [e["ename"] for e in run.of_type("error")] == ["TimeLimitExceeded"]
    assert "TimeLimitExceeded" in content["traceback"][-1]
    assert run.stream_text() == "started\n"
    assert 1.9 <= elapsed < 10, f"a 2 s limit stopped the cell after {elapsed:.1f} s"
    assert_answers(timed_kernel)
    state = timed_kernel.execute("timed_kept, 'timed_new' in dir()")
    assert state.result_text() == "({'n': 2}, True)"


@pytest.mark.slow
def test_time_limit_runs_the_cell_s_own_cleanup(timed_kernel: Kernel) -> None:
    """A cell that catches the interrupt finishes its cleanup and still fails the limit."""
    run = timed_kernel.execute(
        "import time\ntry:\n    while True: time.sleep(0.1)\n"
        "except KeyboardInterrupt:\n    print('cleaned up')\n    cleaned = True",
        timeout=60,
    )
    assert run.content["ename"] == "TimeLimitExceeded"
    assert run.stream_text() == "cleaned up\n"
    assert timed_kernel.execute("cleaned").result_text() == "True"


@pytest.mark.slow
def test_time_limit_stops_a_cell_that_ignores_it_hard_and_rolls_back(start_kernel) -> None:
    """Only a cell that ignores the interrupt for interrupt_grace is stopped hard, and then
    rolled back to its state before the cell."""
    kernel = start_kernel(["--WasmKernel.time_limit=2", "--WasmKernel.interrupt_grace=1"])
    assert kernel.execute("ignored = {'n': 1}").content["status"] == "ok"
    start = time.monotonic()
    run = kernel.execute(f"ignored['n'] = 2\n{SWALLOWING}", timeout=60)
    elapsed = time.monotonic() - start
    content = run.content
    assert content["ename"] == "TimeLimitExceeded"
    assert "did not stop within 1 s" in content["evalue"]
    assert ROLLBACK_NOTICE in content["evalue"]
    assert 2.9 <= elapsed < 12, f"2 s + 1 s grace stopped the cell after {elapsed:.1f} s"
    assert kernel.execute("ignored").result_text() == "{'n': 1}"


def test_time_limit_does_not_stop_a_short_cell(timed_kernel: Kernel) -> None:
    """A cell well under the limit finishes, output and all."""
    run = timed_kernel.execute("import time\ntime.sleep(0.5)\nprint('done')")
    assert run.content["status"] == "ok"
    assert run.stream_text() == "done\n"


@pytest.mark.parametrize("after_answer", ["", "\nwhile True:\n    pass"])
@pytest.mark.slow
def test_time_limit_does_not_count_waiting_for_input(
    timed_kernel: Kernel, after_answer: str
) -> None:
    """The 2 s limit pauses while the user answers input() (3 s here), then runs on."""
    client = timed_kernel.client
    msg_id = client.execute(
        f"answer = input('name? ')\nprint('hi', answer){after_answer}", allow_stdin=True
    )
    assert client.get_stdin_msg(timeout=60)["content"]["prompt"] == "name? "
    time.sleep(3)
    client.input("Ada")
    run = timed_kernel.collect(msg_id)
    assert run.stream_text() == "hi Ada\n"
    if after_answer:  # the clock runs again once the answer is in
        assert run.content["ename"] == "TimeLimitExceeded"
        assert run.seconds < 3 + 2 + 5
    else:
        assert run.content["status"] == "ok", run.content


def test_memory_bomb_raises_memory_limit_and_keeps_state(start_kernel) -> None:
    """Running out of memory is a MemoryError inside Python: earlier variables survive."""
    kernel = start_kernel(["--WasmKernel.memory_limit=268435456"])
    assert kernel.execute("kept_before_bomb = 'still here'").content["status"] == "ok"
    run = kernel.execute("x = [bytearray(10**6) for _ in range(1000)]")
    content = run.content
    assert content["status"] == "error"
    assert content["ename"] == "MemoryLimitExceeded"
    assert "256 MiB" in content["evalue"]
    assert "memory_limit" in content["evalue"]
    assert "rolled back" not in content["evalue"], "an ordinary MemoryError is not a trap"
    assert_answers(kernel)
    kept = kernel.execute("kept_before_bomb")
    assert kept.content["status"] == "ok"
    assert kept.result_text() == "'still here'"
    freed = kernel.execute("y = bytearray(100 * 10**6); len(y)")
    assert freed.content["status"] == "ok", "memory of the failed cell was not given back"
    assert freed.result_text() == str(100 * 10**6)


@pytest.mark.slow
def test_huge_print_is_cut_at_the_output_limit(kernel: Kernel) -> None:
    limit = PROFILES[DEFAULT_PROFILE].output_limit  # the default kernelspec's profile
    run = kernel.execute("print('x' * (100 * 1024 * 1024))")
    assert run.content["status"] == "ok"
    stdout = run.stream_text("stdout")
    assert 0 < len(stdout.encode()) <= limit
    assert set(stdout) <= {"x", "\n"}
    assert "output limit" in run.stream_text("stderr")
    assert f"{limit:,}" in run.stream_text("stderr")
    assert_answers(kernel)


def test_small_output_limit_cuts_a_printing_loop(start_kernel) -> None:
    kernel = start_kernel(["--WasmKernel.output_limit=1000"])
    run = kernel.execute("for i in range(10000):\n    print(i)")
    assert run.content["status"] == "ok"
    stdout = run.stream_text("stdout")
    assert 0 < len(stdout.encode()) <= 1000
    assert stdout.startswith("0\n1\n2\n")
    assert "9999" not in stdout
    notice = run.stream_text("stderr")
    assert "output limit" in notice
    assert notice.count("output limit") == 1
    assert_answers(kernel)
    small = kernel.execute("print('fits')")
    assert small.stream_text() == "fits\n", "the budget is per cell, not per kernel"
    assert "output limit" not in small.stream_text("stderr")


def test_fuel_set_by_environment_variable(start_kernel) -> None:
    fuel = 1_800_000_000
    kernel = start_kernel(env={"WASM_KERNEL_FUEL": str(fuel)})
    assert f"fuel {fuel:,}" in kernel.banner()
    assert_fuel_exhausted(kernel, fuel)
    assert_answers(kernel)


def test_limits_set_by_config_file(start_kernel, tmp_path: Path) -> None:
    """jupyter_wasm_kernel_config.py in JUPYTER_CONFIG_DIR is read by the kernel."""
    fuel = 1_600_000_000
    (tmp_path / "jupyter_wasm_kernel_config.py").write_text(
        f"c.WasmKernel.fuel = {fuel}\nc.WasmKernel.time_limit = 37\n"
    )
    kernel = start_kernel(env={"JUPYTER_CONFIG_DIR": str(tmp_path)})
    banner = kernel.banner()
    assert f"fuel {fuel:,}" in banner
    assert "time 37 s" in banner
    assert_fuel_exhausted(kernel, fuel)
    assert_answers(kernel)


def test_command_line_overrides_environment(start_kernel) -> None:
    """The environment variable is only a default: an explicit --WasmKernel.fuel wins."""
    kernel = start_kernel(
        [f"--WasmKernel.fuel={SMALL_FUEL}"], env={"WASM_KERNEL_FUEL": "1700000000"}
    )
    assert f"fuel {SMALL_FUEL:,}" in kernel.banner()


def test_deep_recursion_is_stopped_and_kernel_answers(kernel: Kernel) -> None:
    run = kernel.execute("def f(n): return f(n+1)\nf(0)")
    content = run.content
    assert content["status"] == "error"
    assert content["ename"] in ("RecursionError", "StackOverflow")
    assert_answers(kernel)


SCRATCH_LIMIT = 50 << 20


@pytest.fixture(scope="module")
def scratch_kernel() -> Iterator[Kernel]:
    started = Kernel([f"--WasmKernel.scratch_limit={SCRATCH_LIMIT}"])
    assert started.execute("import os").content["status"] == "ok"  # a checkpoint to roll back to
    yield started
    started.shutdown()


def test_scratch_limit_stops_a_cell_that_fills_tmp(scratch_kernel: Kernel) -> None:
    """/tmp is on the host's disk: a cell growing it past the limit is stopped while it runs
    (checked a few times a second), rolled back, and its files can then be deleted."""
    assert "up to 50 MiB" in scratch_kernel.banner()
    assert scratch_kernel.execute("kept = 'before'").content["status"] == "ok"
    slow = (
        "import time\nkept = 'during'\nwritten = 0\n"
        "with open('/tmp/slow', 'wb') as f:\n"
        "    while written < 500 << 20:\n"
        "        f.write(b'x' * (1 << 20)); f.flush(); written += 1 << 20; time.sleep(0.01)\n"
    )
    try:
        run = scratch_kernel.execute(slow)
        assert run.content["ename"] == "ScratchLimitExceeded", run.content
        assert "limit of 50 MiB" in run.content["evalue"]
        assert "rolled back" in run.content["evalue"]
        size = scratch_kernel.execute("os.path.getsize('/tmp/slow') >> 20").result_text()
        assert size is not None and int(size) < 500, "stopped before it finished"
        assert scratch_kernel.execute("kept").result_text() == "'before'"
    finally:
        run = scratch_kernel.execute("os.remove('/tmp/slow')\nopen('/tmp/small', 'w').write('ok')")
    assert run.content["status"] == "ok", run.content


def test_scratch_limit_catches_a_quick_write(scratch_kernel: Kernel) -> None:
    """One big write may end between two checks; then the check at the cell's end reports it
    and, nothing being rolled back, the cell's work stands."""
    try:
        run = scratch_kernel.execute("big = open('/tmp/quick', 'wb').write(b'y' * (80 << 20))")
        assert run.content["ename"] == "ScratchLimitExceeded", run.content
        if "rolled back" not in run.content["evalue"]:
            assert scratch_kernel.execute("big >> 20").result_text() == "80"
    finally:
        run = scratch_kernel.execute("os.remove('/tmp/quick')")
    assert run.content["status"] == "ok", run.content


WRITES_ON_LOOKUP = (
    "class Writer:\n"
    "    def __getattr__(self, name):\n"
    "        if name not in ('expressed', 'inspected'):  # IPython looks up others too\n"
    "            raise AttributeError(name)\n"
    "        with open(f'/tmp/{name}', 'wb') as f:\n"
    "            f.write(b'w' * (80 << 20))\n"
    "        return name\n"
    "writer = Writer()"
)


def test_scratch_limit_holds_for_user_expressions(scratch_kernel: Kernel) -> None:
    """user_expressions run the user's code: past the limit, each expression says why."""
    assert scratch_kernel.execute(WRITES_ON_LOOKUP).content["status"] == "ok"
    run = scratch_kernel.execute("1", user_expressions={"w": "writer.expressed"})
    assert run.content["status"] == "ok", run.content
    result = run.content["user_expressions"]["w"]
    assert result["status"] == "error", result
    assert result["ename"] == "ScratchLimitExceeded", result
    # what the request wrote is gone (see tests/hostile/test_service_scratch.py)
    assert scratch_kernel.execute("os.path.exists('/tmp/expressed')").result_text() == "False"


def test_scratch_limit_holds_for_inspection_and_the_next_cell_says_so(
    scratch_kernel: Kernel,
) -> None:
    """An inspection has no error to show: the next cell tells the user what happened."""
    assert scratch_kernel.execute(WRITES_ON_LOOKUP).content["status"] == "ok"
    client = scratch_kernel.client
    msg_id = client.inspect("writer.inspected", 16)
    reply = client.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = client.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "ok"
    told = scratch_kernel.execute("2").stream_text("stderr")
    assert "an inspection request" in told and "ScratchLimitExceeded" in told, told
    assert "was removed" in told
    assert scratch_kernel.execute("os.path.exists('/tmp/inspected')").result_text() == "False"
    assert "ScratchLimitExceeded" not in scratch_kernel.execute("3").stream_text("stderr")


@pytest.mark.slow
def test_scratch_limit_counts_allocated_blocks(scratch_kernel: Kernel) -> None:
    """A sparse file's apparent size is not disk used; many empty files are."""
    sparse = "f = open('/tmp/sparse', 'wb')\nf.seek(10**12)\nf.write(b'1')\nf.close()"
    assert scratch_kernel.execute(sparse).content["status"] == "ok"
    run = scratch_kernel.execute("for i in range(20000):\n    open(f'/tmp/e{i}', 'w').close()")
    assert run.content["ename"] == "ScratchLimitExceeded", run.content


# -- the watchdog behind the wall-clock limit ---------------------------------------------------


def test_the_watchdog_fires_a_nearer_deadline_armed_while_it_sleeps_towards_a_later_one() -> None:
    watchdog = Watchdog()
    try:
        fired = threading.Event()
        far = watchdog.arm(3600, fired.set)
        time.sleep(0.1)  # the thread now sleeps towards the far deadline
        watchdog.disarm(far)
        watchdog.arm(0.2, fired.set)
        assert fired.wait(10)
    finally:
        watchdog.close()


def test_cells_that_arm_later_deadlines_do_not_wake_the_watchdog() -> None:
    """Each cell arms the time limit and disarms it: the thread keeps sleeping towards the
    first deadline (a wake-up per cell cost each cell time), and fires none of them."""
    watchdog = Watchdog()
    try:
        fired = threading.Event()
        watchdog.disarm(watchdog.arm(60, fired.set))
        time.sleep(0.1)
        sleeping_until = watchdog._wakes_at
        for _ in range(50):
            watchdog.disarm(watchdog.arm(60, fired.set))
        time.sleep(0.1)
        assert watchdog._wakes_at == sleeping_until
        assert not fired.is_set()
    finally:
        watchdog.close()


def test_strict_fuel_outlasts_its_time_limit_so_endless_loops_meet_the_time_limit(
    start_kernel,
) -> None:
    """The docs promise students TimeLimitExceeded for an endless loop: the strict profile's
    fuel must last well past its time limit at the fastest rate a loop burns it (measured
    here), and the fuel message must not tell a student to edit a kernelspec."""
    from wasm_kernel.settings.profiles import PROFILES

    budget = 20_000_000_000
    kernel = start_kernel([f"--WasmKernel.fuel={budget}", "--WasmKernel.time_limit=0"])
    start = time.monotonic()
    run = kernel.execute("while True:\n    pass")
    seconds = time.monotonic() - start
    assert run.content["ename"] == "FuelExhausted", run.content
    assert "kernelspec" not in run.content["evalue"]
    assert "WasmKernel.fuel" in run.content["evalue"]
    strict = PROFILES["strict"]
    lasts = strict.fuel / (budget / seconds)  # seconds, at this loop's rate
    assert lasts > 1.5 * strict.time_limit, f"strict fuel lasts {lasts:.0f} s"
