"""Jupyter interrupts while a cell runs: sleeping, waiting for input, catching it, busy loops.

An interrupt raises KeyboardInterrupt inside the running Python code, busy loops included;
a cell that has not stopped within the grace time (a loop that swallows the exception) is
stopped hard and rolled back to its state before the cell (restarted with rollback off).
The interrupt is sent from a timer thread only after the cell has shown it is running (a
marker on stdout, or its input_request), so it can never hit an idle kernel by accident.
Both ways Jupyter delivers it are covered: SIGINT (the kernelspec's signal mode) and
interrupt_request on the control channel (message mode).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from conftest import KERNEL_NAME, Kernel
from interrupting import MARKER, SOFT_BOUND, SWALLOWING_CELL, run_and_interrupt
from jupyter_client.manager import KernelManager

from wasm_kernel.settings.kernel_settings import KernelSettings


def default_of(trait: str):
    """A setting's default as the kernel computes it (same environment as ours)."""
    return getattr(KernelSettings(), trait)


def assert_answers(kernel) -> None:
    run = kernel.execute("6 * 7")
    assert run.content["status"] == "ok", run.content
    assert run.result_text() == "42"


SLEEP_CELL = f"import time\nprint({MARKER!r})\ntime.sleep(60)\nprint('slept through')"
BUSY_CELL = f"busy_state = 'set before the loop'\nprint({MARKER!r})\nwhile True:\n    pass"
ROLLBACK_NOTICE = "interpreter was rolled back to its state before this cell"


def test_interrupt_ends_sleep_and_keeps_state(kernel: Kernel) -> None:
    assert kernel.execute("kept = 'before the interrupt'").content["status"] == "ok"
    run = run_and_interrupt(kernel, SLEEP_CELL, kernel.manager.interrupt_kernel)
    assert run.content["status"] == "error"
    assert run.content["ename"] == "KeyboardInterrupt"
    assert run.stop_delay < SOFT_BOUND
    assert "slept through" not in run.stdout()
    kept = kernel.execute("kept")
    assert kept.content["status"] == "ok"
    assert kept.result_text() == "'before the interrupt'"
    assert_answers(kernel)


def test_user_code_can_catch_the_interrupt(kernel: Kernel) -> None:
    code = (
        f"import time\nprint({MARKER!r})\n"
        "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('caught')\n"
        "print('after')"
    )
    run = run_and_interrupt(kernel, code, kernel.manager.interrupt_kernel)
    assert run.content["status"] == "ok", run.content
    assert run.stdout().endswith("caught\nafter\n")
    assert run.stop_delay < SOFT_BOUND
    assert_answers(kernel)


def test_interrupt_ends_a_pending_input(kernel: Kernel) -> None:
    assert kernel.execute("kept_input = 'x'").content["status"] == "ok"
    run = run_and_interrupt(
        kernel,
        "answer = input('never answered: ')",
        kernel.manager.interrupt_kernel,
        allow_stdin=True,
    )
    assert run.content["status"] == "error"
    assert run.content["ename"] == "KeyboardInterrupt"
    assert run.stop_delay < SOFT_BOUND
    state = kernel.execute("kept_input, 'answer' in dir()")
    assert state.result_text() == "('x', False)"
    assert_answers(kernel)


def test_interrupt_raises_keyboard_interrupt_in_a_busy_loop(kernel: Kernel) -> None:
    """A pure-Python loop gets a real KeyboardInterrupt, at once: no hard stop, no rollback."""
    run = run_and_interrupt(kernel, BUSY_CELL, kernel.manager.interrupt_kernel)
    content = run.content
    assert content["status"] == "error"
    assert content["ename"] == "KeyboardInterrupt"
    assert "stopped hard" not in content["evalue"]
    assert "rolled back" not in content["evalue"]
    assert "KeyboardInterrupt" in "\n".join(content["traceback"])
    assert run.stop_delay < SOFT_BOUND
    # An ordinary exception: what the cell did before the loop stays.
    state = kernel.execute("busy_state")
    assert state.result_text() == "'set before the loop'"
    assert_answers(kernel)


def test_user_code_can_catch_the_interrupt_in_a_busy_loop(kernel: Kernel) -> None:
    code = (
        f"print({MARKER!r})\n"
        "try:\n    while True:\n        pass\nexcept KeyboardInterrupt:\n    print('caught')\n"
        "print('after')"
    )
    run = run_and_interrupt(kernel, code, kernel.manager.interrupt_kernel)
    assert run.content["status"] == "ok", run.content
    assert run.stdout() == f"{MARKER}\ncaught\nafter\n"
    assert run.stop_delay < SOFT_BOUND
    assert_answers(kernel)


def test_interrupt_stops_a_swallowing_loop_hard_after_the_grace_period(kernel: Kernel) -> None:
    """A loop that catches every KeyboardInterrupt is stopped hard once the grace time has
    passed, and the cell is rolled back: its own x is gone, the earlier one is back."""
    grace = default_of("interrupt_grace")
    assert kernel.execute("x = 'before the loop'").content["status"] == "ok"
    run = run_and_interrupt(kernel, SWALLOWING_CELL, kernel.manager.interrupt_kernel)
    content = run.content
    assert content["status"] == "error"
    assert content["ename"] == "KeyboardInterrupt"
    assert "stopped hard" in content["evalue"]
    assert ROLLBACK_NOTICE in content["evalue"]
    assert "interpreter was restarted" not in content["evalue"]
    assert grace * 0.9 <= run.stop_delay < grace + 6
    assert_answers(kernel)
    assert kernel.execute("x").result_text() == "'before the loop'"


@pytest.mark.slow
def test_hard_stop_restarts_the_interpreter_without_rollback(start_kernel) -> None:
    kernel = start_kernel(["--WasmKernel.rollback=False", "--WasmKernel.interrupt_grace=1"])
    assert kernel.execute("x = 'before the loop'").content["status"] == "ok"
    run = run_and_interrupt(kernel, SWALLOWING_CELL, kernel.manager.interrupt_kernel)
    content = run.content
    assert content["ename"] == "KeyboardInterrupt"
    assert "stopped hard" in content["evalue"]
    assert "interpreter was restarted" in content["evalue"]
    assert "rolled back" not in content["evalue"]
    assert 0.9 <= run.stop_delay < 1 + 6
    gone = kernel.execute("x")
    assert gone.content["status"] == "error"
    assert gone.content["ename"] == "NameError"
    assert_answers(kernel)


def test_interrupt_while_idle_does_not_reach_the_next_cell(kernel: Kernel) -> None:
    """An interrupt with no cell running is dropped, not left for the next cell to raise."""
    kernel.manager.interrupt_kernel()
    time.sleep(0.5)
    code = (
        "import time\ntotal = 0\nfor i in range(200_000):\n    total += i\n"
        "time.sleep(0.3)\nprint(total)"
    )
    run = kernel.execute(code)
    assert run.content["status"] == "ok", run.content
    assert run.stream_text() == f"{sum(range(200_000))}\n"


class MessageModeKernel(Kernel):
    """A kernel whose manager interrupts with interrupt_request instead of SIGINT."""

    def __init__(self) -> None:  # the kernelspec is changed before the kernel starts
        self.manager = KernelManager(kernel_name=KERNEL_NAME)
        assert self.manager.kernel_spec is not None
        self.manager.kernel_spec.interrupt_mode = "message"
        self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)


@pytest.fixture(scope="module")
def message_mode_kernel() -> Iterator[MessageModeKernel]:
    started = MessageModeKernel()
    yield started
    started.shutdown()


def test_message_mode_interrupt_ends_sleep(message_mode_kernel: MessageModeKernel) -> None:
    kernel = message_mode_kernel
    assert kernel.manager.kernel_spec.interrupt_mode == "message"
    assert kernel.execute("kept = 1").content["status"] == "ok"
    run = run_and_interrupt(kernel, SLEEP_CELL, kernel.manager.interrupt_kernel)
    assert run.content["status"] == "error"
    assert run.content["ename"] == "KeyboardInterrupt"
    assert run.stop_delay < SOFT_BOUND
    assert kernel.execute("kept").result_text() == "1"
    assert_answers(kernel)


def test_message_mode_interrupt_raises_in_a_busy_loop(
    message_mode_kernel: MessageModeKernel,
) -> None:
    kernel = message_mode_kernel
    run = run_and_interrupt(kernel, BUSY_CELL, kernel.manager.interrupt_kernel)
    assert run.content["status"] == "error"
    assert run.content["ename"] == "KeyboardInterrupt"
    assert "stopped hard" not in run.content["evalue"]
    assert run.stop_delay < SOFT_BOUND
    assert kernel.execute("busy_state").result_text() == "'set before the loop'"
    assert_answers(kernel)


def test_interrupt_request_from_the_client_is_acknowledged(
    message_mode_kernel: MessageModeKernel,
) -> None:
    """A client's own interrupt_request gets an ok interrupt_reply and stops the sleep."""
    kernel = message_mode_kernel
    sent: list[str] = []

    def request_interrupt() -> None:
        message = kernel.client.session.msg("interrupt_request", {})
        sent.append(message["header"]["msg_id"])
        kernel.client.control_channel.send(message)

    run = run_and_interrupt(kernel, SLEEP_CELL, request_interrupt)
    assert run.content["ename"] == "KeyboardInterrupt"
    assert run.stop_delay < SOFT_BOUND
    reply = kernel.client.get_control_msg(timeout=10)
    assert reply["msg_type"] == "interrupt_reply"
    assert reply["parent_header"]["msg_id"] == sent[0]
    assert reply["content"]["status"] == "ok"
    assert_answers(kernel)


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """A busy process per core, so the kernel's threads are scheduled late, as on a loaded
    server: the window where a late interrupt could reach the next cell opens wide."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


# A cell that ends by itself about when the storm reaches it, so signals arrive as it ends.
ENDING_CELL = f"print({MARKER!r})\nfor i in range(3_000_000):\n    pass"


@pytest.mark.slow
@pytest.mark.parametrize("cell", [BUSY_CELL, ENDING_CELL], ids=["spinning", "ending"])
def test_an_interrupt_storm_stops_only_the_cell_it_arrived_in(
    start_kernel, cpu_load: None, cell: str
) -> None:
    """2,000 SIGINTs while a cell runs (and, for a cell that ends meanwhile, as it ends) stop
    at most that cell; every cell sent after the storm runs untouched."""
    kernel = start_kernel()
    pid = kernel.manager.provisioner.process.pid

    def storm() -> None:
        for i in range(2000):
            os.kill(pid, signal.SIGINT)
            if i % 100 == 0:
                time.sleep(0.01)  # spread over the cell's end, not one burst

    for round_ in range(5):
        stormed = run_and_interrupt(kernel, cell, storm)
        assert stormed.content["status"] == "ok" or (
            stormed.content["ename"] == "KeyboardInterrupt"
        ), (round_, stormed.content)
        for _ in range(3):
            after = kernel.execute("sum(range(300_000))")
            assert after.content["status"] == "ok", (round_, after.content)


@pytest.mark.slow
def test_a_storm_of_interrupt_requests_stops_only_the_cell_it_arrived_in(
    cpu_load: None,
) -> None:
    """Message mode: 2,000 interrupt_requests on the control channel while a cell spins. The
    kernel works through them after the cell has ended; none may stop a cell sent later."""
    kernel = MessageModeKernel()
    try:

        def storm() -> None:  # through the client, whose session numbers its messages
            for _ in range(2000):  # (the manager's would reuse the client's message ids)
                kernel.client.control_channel.send(
                    kernel.client.session.msg("interrupt_request", {})
                )

        for round_ in range(3):
            stormed = run_and_interrupt(kernel, BUSY_CELL, storm)
            assert stormed.content["ename"] == "KeyboardInterrupt", (round_, stormed.content)
            for _ in range(3):
                after = kernel.execute("sum(range(300_000))")
                assert after.content["status"] == "ok", (round_, after.content)
    finally:
        kernel.shutdown()
