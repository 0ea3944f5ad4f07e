"""Running a cell and interrupting it once it shows it runs: shared by the interrupt,
rollback and image tests."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MARKER = "cell-is-running"
TRIGGER_DELAY = 0.2  # seconds between seeing the cell run and interrupting it
SOFT_BOUND = 3.0  # generous: a soft interrupt ends a sleep or input() almost at once


@dataclass
class Interrupted:
    """One cell that was interrupted while running."""

    reply: dict
    messages: list[dict] = field(default_factory=list)
    interrupted_at: float | None = None  # monotonic time the interrupt was sent
    replied_at: float = 0.0

    @property
    def content(self) -> dict:
        return self.reply["content"]

    @property
    def stop_delay(self) -> float:
        assert self.interrupted_at is not None, "the interrupt was never sent"
        return self.replied_at - self.interrupted_at

    def stdout(self) -> str:
        return "".join(
            m["content"]["text"]
            for m in self.messages
            if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
        )


def run_and_interrupt(
    kernel,
    code: str,
    interrupt: Callable[[], object],
    allow_stdin: bool = False,
    timeout: float = 60,
) -> Interrupted:
    """Run ``code``; once it is running (MARKER printed or input requested), interrupt it.

    Our own message loop: the cell must not wait for idle before we can see its
    input_request, and the stdin channel is watched alongside iopub.
    """
    client = kernel.client
    msg_id = client.execute(code, allow_stdin=allow_stdin)
    result = Interrupted(reply={})
    timer: threading.Timer | None = None

    def send_interrupt() -> None:
        result.interrupted_at = time.monotonic()
        interrupt()

    def arm() -> None:
        nonlocal timer
        if timer is None:
            timer = threading.Timer(TRIGGER_DELAY, send_interrupt)
            timer.start()

    deadline = time.monotonic() + timeout
    idle = False
    try:
        while not idle:
            assert time.monotonic() < deadline, "the interrupted cell never finished"
            if allow_stdin:
                try:
                    request = client.get_stdin_msg(timeout=0.01)
                except queue.Empty:
                    pass
                else:
                    if request["msg_type"] == "input_request":
                        arm()  # and never answer it
            try:
                msg = client.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status":
                idle = msg["content"]["execution_state"] == "idle"
                continue
            result.messages.append(msg)
            if msg["msg_type"] == "stream" and MARKER in msg["content"]["text"]:
                arm()
        result.reply = client.get_shell_msg(timeout=timeout)
        while result.reply["msg_type"] == "kernel_info_reply":  # a late answer to wait_for_ready
            result.reply = client.get_shell_msg(timeout=timeout)
        result.replied_at = time.monotonic()
    finally:
        if timer is not None:
            timer.join()
    assert result.reply["parent_header"]["msg_id"] == msg_id
    return result


# Swallows every KeyboardInterrupt. The busy loop's own back-edge is inside the try as well
# (CPython checks for signals there): with a plain ``while True: try: ... except: pass`` the
# interrupt sometimes lands on the back-edge outside the try and ends the cell softly.
SWALLOWING_CELL = (
    "x = 0\n"
    "while True:\n"
    "    try:\n"
    f"        print({MARKER!r})\n"
    "        while True:\n"
    "            x += sum(range(100))\n"
    "    except BaseException:\n"
    "        pass\n"
)
