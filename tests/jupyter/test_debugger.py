"""Post-mortem debugging through the stdin channel, against the native kernel in the same test.

``%debug`` after an error and ``%pdb on`` open IPython's debugger at the failing frame; its
commands arrive as input_replies. Each test runs the same cells on ipykernel (the ``python3``
kernelspec) and on wasm-kernel, answering the debugger's prompts the same way, and compares
the input_request prompts, the stream text and the replies after normalising colours,
addresses and cell file names.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import KERNEL_NAME, NATIVE, Kernel

pytestmark = pytest.mark.slow  # each test runs cells on two kernels, with waits for prompts

ANSI = re.compile(r"\x1b\[[0-9;]*m")
ADDRESS = re.compile(r"0x[0-9a-f]+")
CELL_FILE = re.compile(r"\S*/ipykernel_\d+/\d+\.py")  # a cell's file, as ipykernel names it
FAILING = "def f(v):\n    w = v + 1\n    return w / 0\n\nf(7)"
INTERRUPT_DELAY = 0.3  # seconds between seeing the debugger's prompt and interrupting it


def normalise(text: str) -> str:
    text = ANSI.sub("", text)
    text = ADDRESS.sub("0x?", text)
    return CELL_FILE.sub("<cell>", text)


@dataclass
class Conversation:
    """A cell run while answering its input_requests: what the kernel asked and showed."""

    prompts: list[str] = field(default_factory=list)
    streams: dict[str, str] = field(default_factory=dict)
    errors: list[tuple[str, str]] = field(default_factory=list)
    reply: dict = field(default_factory=dict)

    def comparable(self) -> tuple:
        return (
            [normalise(prompt) for prompt in self.prompts],
            {name: normalise(text) for name, text in sorted(self.streams.items())},
            [(ename, normalise(evalue)) for ename, evalue in self.errors],
            self.reply.get("status"),
            self.reply.get("ename"),
        )


def converse(
    kernel: Kernel,
    code: str,
    answers: list[str],
    allow_stdin: bool = True,
    when_out_of_answers: Callable[[Kernel], None] | None = None,
    timeout: float = 60,
) -> Conversation:
    """Run ``code``, answering each input_request with the next answer; once they run out,
    call ``when_out_of_answers`` (an interrupt) instead, once, and answer nothing more."""
    client = kernel.client
    msg_id = client.execute(code, allow_stdin=allow_stdin)
    talk, left, idle = Conversation(), list(answers), False
    deadline = time.monotonic() + timeout
    while not idle:
        assert time.monotonic() < deadline, f"{code!r} never finished: {talk}"
        try:
            request = client.get_stdin_msg(timeout=0.02)
        except queue.Empty:
            pass
        else:
            talk.prompts.append(request["content"]["prompt"])
            if left:
                client.input(left.pop(0))
            elif when_out_of_answers is not None:
                time.sleep(INTERRUPT_DELAY)
                when_out_of_answers(kernel)
                when_out_of_answers = None
        try:
            msg = client.get_iopub_msg(timeout=0.02)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status":
            idle = content["execution_state"] == "idle"
        elif kind == "stream":
            talk.streams[content["name"]] = talk.streams.get(content["name"], "") + content["text"]
        elif kind == "error":
            talk.errors.append((content["ename"], content["evalue"]))
    while talk.reply.get("parent_header", {}).get("msg_id") != msg_id:
        talk.reply = client.get_shell_msg(timeout=timeout)
    talk.reply = talk.reply["content"]
    return talk


def interrupt_kernel(kernel: Kernel) -> None:
    kernel.manager.interrupt_kernel()


def both(
    native_and_ours: tuple[Kernel, Kernel], code: str, answers: list[str] = (), **options
) -> Conversation:
    """Run the same conversation on both kernels; assert they match; return ours."""
    native, ours = (converse(kernel, code, list(answers), **options) for kernel in native_and_ours)
    assert ours.comparable() == native.comparable()
    return ours


def test_debug_after_zero_division(native_and_ours: tuple[Kernel, Kernel]) -> None:
    """%debug opens the debugger at the failing frame: `p v`, `up`, `p w` fails there as
    natively, `q` leaves; the cell succeeds."""
    failed = both(native_and_ours, FAILING)
    assert failed.reply["ename"] == "ZeroDivisionError"
    talk = both(native_and_ours, "%debug", ["p v", "p w", "up", "p w", "q"])
    assert talk.prompts == ["ipdb> "] * 5
    assert "return w / 0" in normalise(talk.streams["stdout"])
    assert talk.reply["status"] == "ok"


def test_pdb_on_opens_the_debugger_on_failure(native_and_ours: tuple[Kernel, Kernel]) -> None:
    """With %pdb on, a failing cell shows its traceback, then the debugger at the failure;
    `c` leaves it and the cell ends with its error. %pdb off stops that."""
    assert "ON" in both(native_and_ours, "%pdb on").streams["stdout"]
    talk = both(native_and_ours, "x = 3\nf(x)", ["p v", "c"])
    assert talk.reply["ename"] == "ZeroDivisionError"
    assert len(talk.prompts) == 2
    both(native_and_ours, "%pdb off")
    assert both(native_and_ours, "f(1)").prompts == []


def test_interrupt_while_the_debugger_waits(native_and_ours: tuple[Kernel, Kernel]) -> None:
    """An interrupt while the debugger waits for a command leaves the debugger (as under
    ipykernel, whose debugger an interrupt ends) and the kernel keeps its state."""
    both(native_and_ours, FAILING)
    talk = both(native_and_ours, "%debug", ["p v"], when_out_of_answers=interrupt_kernel)
    assert "KeyboardInterrupt" in normalise(talk.streams.get("stdout", ""))
    assert both(native_and_ours, "print(f.__name__)").streams["stdout"] == "f\n"


def test_set_trace_opens_the_interruptible_debugger(native_and_ours: tuple[Kernel, Kernel]) -> None:
    """pdb.set_trace() stops in IPython's debugger, as ipykernel arranges, and an interrupt
    while it waits leaves the debugger and lets the cell finish. Compared without the
    debugger's listing: since Python 3.14 (the sandbox's runtime is 3.15) set_trace stops on
    its own line, where older Pythons stop on the next one."""
    code = "import pdb\ndef g(a):\n    pdb.set_trace()\n    b = a * 2\n    return b\n\ng(4)"
    for answers, interrupt in ((["n", "n", "p b", "c"], None), ([], interrupt_kernel)):
        native, ours = (
            converse(k, code, list(answers), when_out_of_answers=interrupt) for k in native_and_ours
        )
        listings = [talk.streams.pop("stdout") for talk in (native, ours)]
        assert ours.comparable() == native.comparable()
        assert ours.reply["status"] == "ok"
        assert len(ours.prompts) == max(len(answers), 1)
    assert all(text.endswith("KeyboardInterrupt: Interrupted by user\n") for text in listings)


def test_kernel_frames_stay_out_of_the_debugger(native_and_ours: tuple[Kernel, Kernel]) -> None:
    """A failure raised inside the kernel's own guest code (time.sleep, interrupted) opens at
    the user's frame, as natively, where sleep is C: `down` finds nothing below it."""
    sleeper = "import time\nprint('napping', flush=True)\ndef nap():\n    time.sleep(30)\n\nnap()"
    for kernel in native_and_ours:
        msg_id = kernel.client.execute(sleeper)
        while "napping" not in kernel.client.get_iopub_msg(timeout=60)["content"].get("text", ""):
            pass
        time.sleep(INTERRUPT_DELAY)  # into the sleep
        kernel.manager.interrupt_kernel()
        assert kernel.collect(msg_id).content["ename"] == "KeyboardInterrupt"
    talk = both(native_and_ours, "%debug", ["where", "down", "q"])
    assert "Newest frame" in talk.streams["stdout"]


def test_debug_without_stdin(native_and_ours: tuple[Kernel, Kernel]) -> None:
    """A client that takes no input requests gets what ipykernel gives it."""
    both(native_and_ours, FAILING)
    both(native_and_ours, "%debug", allow_stdin=False)
    both(native_and_ours, "%pdb on", allow_stdin=False)
    try:
        native, ours = (
            converse(kernel, FAILING, [], allow_stdin=False) for kernel in native_and_ours
        )
    finally:
        both(native_and_ours, "%pdb off", allow_stdin=False)  # and the kernel is intact after it
    # %pdb's debugger fails for want of stdin, and IPython debugs that failure too: natively
    # at ipykernel's raw_input, here where the kernel's frames end (they are hidden)
    listings = [normalise(talk.streams.pop("stdout")).split("\n\n") for talk in (native, ours)]
    assert ours.comparable() == native.comparable()
    assert listings[1][0] == listings[0][0]  # the failing frame, as natively
    assert ours.reply["ename"] == "StdinNotImplementedError"


def test_nothing_to_debug_in_a_fresh_kernel(start_kernel: Callable[..., Kernel]) -> None:
    """%debug before any error: IPython's message, as natively."""
    native, ours = start_kernel(kernel_name=NATIVE), start_kernel()
    talks = [converse(kernel, "%debug", []) for kernel in (native, ours)]
    assert talks[1].comparable() == talks[0].comparable()


def test_time_limit_stops_a_debugger_command(start_kernel: Callable[..., Kernel]) -> None:
    """A command typed in the debugger counts against the cell's time limit (waiting for the
    person does not): an endless one is interrupted, and the kernel carries on."""
    kernel = start_kernel(["--WasmKernel.time_limit=2", "--WasmKernel.interrupt_grace=1"])
    converse(kernel, "%pdb on", [])
    endless = "p sum(1 for _ in iter(int, 1))"
    talk = converse(kernel, "kept = 1\nf = 1 / 0", [endless])
    assert talk.reply["ename"] == "TimeLimitExceeded"
    shown = normalise(talk.streams["stdout"])
    assert "*** _wasm_kernel_sandbox.TimeLimitExceeded: the cell ran longer" in shown
    assert shown.endswith("--KeyboardInterrupt--\n\nKeyboardInterrupt: Interrupted by user\n")
    assert talk.prompts == ["ipdb> "] * 2  # the command, then the prompt the limit ended
    assert converse(kernel, "print(kept)", []).streams["stdout"] == "1\n"


def test_frames_that_fill_memory_are_let_go(start_kernel: Callable[..., Kernel]) -> None:
    """The failing cell's frames count against the memory limit: when a cell ends with memory
    nearly full they are let go (before, every later cell failed for want of memory), and
    %debug says so; a failure that leaves room stays debuggable."""
    kernel = start_kernel([f"--WasmKernel.memory_limit={256 << 20}"])
    fill = "def fill():\n    local = []\n    while True:\n        local.append(bytearray(1 << 16))"
    failed = converse(kernel, f"kept = 1\n{fill}\nfill()", [])
    assert failed.reply["ename"] == "MemoryLimitExceeded"
    assert converse(kernel, "y = list(range(10**6))\nprint(len(y), kept)", []).streams == {
        "stdout": "1000000 1\n"
    }
    talk = converse(kernel, "%debug", [])
    assert talk.reply["ename"] == "UsageError"
    assert "frames were let go" in talk.reply["evalue"] and talk.prompts == []
    converse(kernel, "del y\nkept / 0", [])
    assert converse(kernel, "%debug", ["p kept", "q"]).streams["stdout"].endswith("1\n")


def test_debug_in_jupyter_console() -> None:
    """The console answers the debugger's input_requests at its own prompt."""
    pexpect = pytest.importorskip("pexpect")
    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent))
    assert jupyter is not None
    console = pexpect.spawn(
        jupyter,
        ["console", "--kernel", KERNEL_NAME, "--simple-prompt"],
        encoding="utf-8",
        timeout=60,
        env={**os.environ, "TERM": "dumb"},
    )
    try:
        console.expect(r"In \[1\]: ")
        console.sendline("def f(v): return v / 0")
        console.expect(r"In \[2\]: ")
        console.sendline("f(41)")
        console.expect("ZeroDivisionError")
        console.expect(r"In \[3\]: ")
        console.sendline("%debug")
        console.expect("ipdb> ")
        console.sendline("p v + 1")
        console.expect("42")
        console.expect("ipdb> ")
        console.sendline("q")
        console.expect(r"In \[4\]: ")
        console.sendline("exit")
        console.expect(pexpect.EOF)
    finally:
        console.close(force=True)


def test_a_debugger_stopped_hard_leaves_the_failure_to_debug(
    start_kernel: Callable[..., Kernel],
) -> None:
    """A command that ignores the interrupt is stopped hard after the grace time: the %debug
    cell is rolled back, and the failure it was debugging is still there to debug again."""
    kernel = start_kernel(["--WasmKernel.interrupt_grace=1"])
    converse(kernel, FAILING, [])
    stubborn = (
        "p exec('while True:\\n try:\\n  while True: pass\\n except KeyboardInterrupt: pass')"
    )
    msg_id = kernel.client.execute("%debug", allow_stdin=True)
    kernel.client.get_stdin_msg(timeout=60)
    kernel.client.input(stubborn)
    time.sleep(1)  # into the loop
    kernel.manager.interrupt_kernel()
    stopped = kernel.collect(msg_id)
    assert stopped.content["status"] == "error"
    assert "rolled back" in stopped.content["evalue"]
    again = converse(kernel, "%debug", ["p v", "q"])
    assert normalise(again.streams["stdout"]).endswith("\n7\n")
