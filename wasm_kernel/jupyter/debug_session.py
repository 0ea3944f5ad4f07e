"""One visual debugger session on the host: the state that must outlive a rolled-back cell
(started or not, breakpoints, the dumped cells) and the hand-over to a cell stopped at a
breakpoint.

A stopped cell waits inside its host call (``debug_stop``, on the guest thread) as a cell
waits for ``input()``: the control channel's handlers put requests on a queue, the waiting
call takes each in turn and returns it to the guest as its reply; the guest answers with
``debug_answer``, which waits again. ``next``, ``stepIn``, ``stepOut`` and ``continue`` end the
wait; so do an interrupt and the kernel's shutdown.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from ..guest.modules import _wasm_kernel_contract as declared

if TYPE_CHECKING:
    from ..sandbox.interrupts import Interrupts

POLL = 0.05  # seconds between checks for an interrupt while a cell is stopped
ANSWER_WAIT = 30.0  # seconds a request waits for the stopped guest's answer
THREAD = 1  # the one thread of the guest
STOPPED_LIMIT = 1024  # requests that may wait for the stopped guest at once


class NotStopped(RuntimeError):
    """The cell went on (or ended) before the guest could answer."""


class DebugSession:
    """The panel's session: breakpoints and dumped cells, and the stopped cell's queue."""

    def __init__(self, publish: Callable[[dict, dict], object]):
        self._publish = publish  # (event, parent): a debug_event on IOPub
        self.started = False
        self.breakpoints: dict[str, list[int]] = {}  # cell file -> lines
        self.sources: dict[str, str] = {}  # cell file -> the code dumped under it
        self.stopped = False
        self.cell_running = False
        self._parent: dict = {}
        self._seq = itertools.count(1)
        self._waiting: queue.Queue[tuple[dict, Future[dict]] | str] = queue.Queue(STOPPED_LIMIT)
        self._answering: Future[dict] | None = None

    def next_seq(self) -> int:
        """The number of the kernel's next DAP message (responses and events)."""
        return next(self._seq)

    def event(self, name: str, body: dict | None = None, parent: dict | None = None) -> None:
        """A DAP event on IOPub; with no ``body``, none is sent (as debugpy's ``initialized``)."""
        message = {"seq": self.next_seq(), "type": "event", "event": name}
        if body is not None:
            message["body"] = body
        self._publish(message, self._parent if parent is None else parent)

    def for_cell(self) -> dict[str, list[int]]:
        """The breakpoints a cell runs with (none: no session, no tracing)."""
        return dict(self.breakpoints) if self.started else {}

    def end(self) -> None:
        """``disconnect``: no breakpoints, and a stopped cell goes on."""
        self.started = False
        self.breakpoints.clear()
        if self.stopped:
            self.resume("continue")

    # -- the event loop's side -------------------------------------------------------------

    async def ask(self, request: dict) -> dict:
        """The stopped guest's answer to ``request`` (raises NotStopped)."""
        if not self.stopped:
            raise NotStopped("no cell is stopped")
        answer: Future[dict] = Future()
        try:
            self._waiting.put_nowait((request, answer))
        except queue.Full:
            raise NotStopped("too many requests wait for the stopped cell") from None
        return await asyncio.wait_for(asyncio.wrap_future(answer), ANSWER_WAIT)

    def resume(self, how: str) -> None:
        """``continue``, ``next``, ``stepIn`` or ``stepOut`` for the stopped cell."""
        self._waiting.put(how)

    # -- the guest thread's side -----------------------------------------------------------

    def stop(self, reason: str, parent: dict, interrupts: Interrupts) -> dict:
        """A cell stopped: tell the panel, then wait for what to do. Without a session (no
        panel to answer), it goes on at once: a cell cannot pause its own time limit so."""
        if not self.started:
            return {"resume": "continue", "breakpoints": {}}
        self._parent, self.stopped = parent, True
        body = {"reason": reason, "threadId": THREAD, "preserveFocusHint": False}
        self.event("stopped", {**body, "allThreadsStopped": True})
        return self._next(interrupts)

    def answered(self, message: dict, interrupts: Interrupts) -> dict:
        """The guest's answer to the request it was given; then wait again."""
        if not self.stopped:  # an answer nobody asked for
            return {"resume": "continue", "breakpoints": self.for_cell()}
        answering, self._answering = self._answering, None
        if answering is not None and not answering.done():
            answering.set_result(message)
        return self._next(interrupts)

    def _next(self, interrupts: Interrupts) -> dict:
        """The next request for the stopped guest, or how it goes on."""
        while True:
            if interrupts.take():
                self._go_on()
                return {"resume": declared.INTERRUPTED}
            try:
                item = self._waiting.get(timeout=POLL)
            except queue.Empty:
                continue
            if isinstance(item, str):
                self._go_on()
                return {"resume": item, "breakpoints": self.for_cell()}
            request, answer = item
            if answer.set_running_or_notify_cancel():
                self._answering = answer
                return {"request": request, "breakpoints": self.for_cell()}

    def _go_on(self) -> None:
        self.stopped = False
        self.event("continued", {"threadId": THREAD, "allThreadsContinued": True})

    def cell_started(self) -> dict[str, list[int]]:
        """A cell starts: the breakpoints it runs with."""
        self.cell_running = True
        return self.for_cell()

    def cell_ended(self) -> None:
        """Whatever still waits for a guest that no longer stops gets its refusal."""
        self.stopped = self.cell_running = False
        pending = [self._answering] if self._answering is not None else []
        self._answering = None
        while True:
            try:
                item = self._waiting.get_nowait()
            except queue.Empty:
                break
            if not isinstance(item, str):
                pending.append(item[1])
        for answer in pending:
            if not answer.done():
                answer.set_exception(NotStopped("the cell is no longer stopped"))
