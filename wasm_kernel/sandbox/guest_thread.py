"""The thread every guest turn runs on, and the relay that carries interrupts to the sandbox.

The kernel's event loop must stay free for control messages and signals while a cell runs, so
turns, checkpoints and images run on one worker thread, in order; an interrupt reaches the
sandbox from a thread of its own, with no Python code run in the signal handler.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ipykernel.kernelbase import Kernel

if TYPE_CHECKING:
    from .sandbox import Sandbox


class GuestThread(ThreadPoolExecutor):
    """The one thread that runs the guest: every turn, checkpoint and image in order. A job
    can be deferred (the checkpoint after a cell, so that the execute_reply and the idle
    status do not wait behind it); it runs when :meth:`run_deferred` is called or before the
    next job submitted, whichever comes first. Thread-safe: subshells dispatch on threads of
    their own."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="wasm-kernel-guest")
        self._deferred: Callable[[], Any] | None = None
        self._order = threading.Lock()  # a deferred job is queued before anything after it

    def defer(self, job: Callable[[], Any]) -> None:
        with self._order:
            self._queue_deferred()
            self._deferred = job

    def defer_checkpoint(self, sandbox: Sandbox) -> None:
        """The checkpoint after a turn, deferred; a sandbox without rollback takes none."""
        if sandbox.rollback:
            self.defer(sandbox.checkpoint)

    @property
    def deferring(self) -> bool:
        """A job waits for :meth:`run_deferred`."""
        return self._deferred is not None

    def run_deferred(self) -> None:
        with self._order:
            self._queue_deferred()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with self._order:
            self._queue_deferred()
            return super().submit(fn, *args, **kwargs)

    def _queue_deferred(self) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            with contextlib.suppress(RuntimeError):  # shut down: nothing to keep it for
                super().submit(deferred)


class InterruptRelay:
    """Carries SIGINTs to a thread that interrupts the sandbox, with no Python in between.

    A Python signal handler runs on the main thread between any two bytecodes, its own
    included: under a storm of signals its frames nest until a RecursionError breaks whatever
    the main thread was doing, and a handler that takes a lock can wait on itself forever. So
    while a request is handled, CPython's C-level handler writes each signal's number to a
    pipe (``signal.set_wakeup_fd``), the Python-level handler is a C function that does
    nothing (no frame: nothing nests), and a thread reading the pipe interrupts the sandbox,
    once per burst. A full pipe drops the extra bytes: the interrupts merge.

    The thread may read late (a loaded machine): when a request ends with signals not yet
    delivered (in the pipe, or read and not yet handled), a fence byte goes down the pipe
    behind them, and the next request starts only once the thread has passed it. Whatever
    it delivers meanwhile finds no turn running, so an interrupt reaches only the request it
    arrived in. The wait is at the next request's start, not at the end of
    this one: the idle status clients wait for does not wait for the thread to be scheduled,
    and by the time the next request arrives the thread has long passed the fence. A request
    that no signal reached sends no fence: nothing wakes the thread (on two cores, a thread
    woken as the idle status goes out delays it).

    The do-nothing handler stays installed between requests too, where ipykernel would put
    SIG_IGN back: a signal that lands while the handler changes to SIG_IGN is left tripped
    with no handler, and CPython then prints "Signal 2 ignored due to race condition" to the
    kernel's stderr (seen under a storm). Between requests the pipe is not the wakeup
    descriptor, so a signal then does nothing at all, as under SIG_IGN.
    """

    FENCE = 0  # no signal has number 0
    FENCE_WAIT = 5.0  # seconds; passed in microseconds unless the machine is stalled

    def __init__(self, interrupt: Callable[[], None]):
        self._interrupt = interrupt
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._passed = threading.Event()
        self._passed.set()  # no request has ended yet: no fence to pass
        self._fence_sent = 0.0  # when the last fence went down the pipe (monotonic seconds)
        self._handling = False  # the thread has taken signals from the pipe, not yet delivered
        self._unread = select.poll()  # the main thread's look into the pipe
        self._unread.register(self._read, select.POLLIN)
        threading.Thread(target=self._run, name="wasm-kernel-interrupts", daemon=True).start()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, _DO_NOTHING)

    def install(self) -> int:
        """On the main thread: once the thread has handled every signal of the requests
        before, route SIGINT to the pipe; returns the descriptor to restore."""
        self._await_fence()
        return signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)

    def uninstall(self, wakeup: int) -> None:
        signal.set_wakeup_fd(wakeup)
        if self._undelivered():
            self._send_fence()

    def _undelivered(self) -> bool:
        """Whether signals that arrived may not have reached the sandbox yet. The pipe is looked
        into first: signals the thread takes after that look keep it handling until delivered."""
        unread = bool(self._unread.poll(0))
        return unread or self._handling

    def _send_fence(self) -> None:
        """A fence behind the signals that arrived before now (see ``_await_fence``)."""
        self._passed.clear()
        self._fence_sent = time.monotonic()
        deadline = self._fence_sent + self.FENCE_WAIT
        while True:
            try:
                os.write(self._write, bytes([self.FENCE]))
                return
            except BlockingIOError:  # the pipe is full of signals: the thread is draining it
                if time.monotonic() > deadline:
                    self._passed.set()  # no fence went: none to wait for
                    return
                time.sleep(0.001)

    def _await_fence(self) -> None:
        """Wait until the thread has passed the last fence (at most FENCE_WAIT after it went)."""
        if self._passed.is_set():
            return
        left = self._fence_sent + self.FENCE_WAIT - time.monotonic()
        if not self._passed.wait(max(0.0, left)):
            logging.getLogger(__name__).warning(
                "the interrupt relay is %.0f s behind", self.FENCE_WAIT
            )

    def _run(self) -> None:
        readable = select.poll()
        readable.register(self._read, select.POLLIN)
        while readable.poll():
            self._handling = True  # before the read: see _undelivered
            data = os.read(self._read, 1 << 16)  # a whole pipe's worth: one per burst
            if not data:
                return
            if signal.SIGINT in data:  # the pipe carries every handled signal's number
                try:
                    self._interrupt()
                except Exception:
                    logging.getLogger(__name__).exception("could not interrupt the sandbox")
            if self.FENCE in data:
                self._passed.set()
            self._handling = False


_DO_NOTHING = operator.is_  # a C function of two arguments: a signal handler with no frame


def sent_before(request: dict, running: dict | None) -> bool:
    """Whether ``request`` was sent before the ``running`` request was, by the same client
    (the same session: the same clock), so that it cannot be meant for it. A message-mode
    interrupt that waited behind others on the control channel (a storm of them) must not
    stop a cell sent after it."""
    if not running:
        return False
    mine, theirs = request.get("header", {}), running.get("header", {})
    if mine.get("session") != theirs.get("session"):
        return False
    sent, started = mine.get("date"), theirs.get("date")
    return isinstance(sent, datetime) and isinstance(started, datetime) and sent < started


class RelayedInterrupts(Kernel):
    """The kernel's side of interrupts. Jupyter interrupts (signal mode, or interrupt_request,
    which ipykernel turns into a SIGINT to this process) reach the sandbox through the relay
    while a handler runs. Signal handlers can only be set on the main thread; subshell
    handlers run elsewhere and keep the main one's."""

    _interrupt_relay: InterruptRelay
    _saved_wakeup: int
    _latest_shell_request: dict | None = None

    def pre_handler_hook(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._saved_wakeup = self._interrupt_relay.install()

    def post_handler_hook(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._interrupt_relay.uninstall(self._saved_wakeup)

    def set_parent(self, ident: Any, parent: dict, channel: str = "shell") -> None:
        """Also kept where the control thread sees it (ipykernel keeps the shell's parent in
        a context variable): a message-mode interrupt is checked against it."""
        super().set_parent(ident, parent, channel)
        if channel == "shell":
            self._latest_shell_request = parent

    async def interrupt_request(self, stream: Any, ident: Any, parent: dict) -> None:
        if self.session is not None and sent_before(parent, self._latest_shell_request):
            # for a request that has ended: what ipykernel answers, and nothing interrupted
            self.session.send(stream, "interrupt_reply", {"status": "ok"}, parent, ident=ident)
            return
        await super().interrupt_request(stream, ident, parent)
