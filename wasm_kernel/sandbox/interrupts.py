"""Interrupts and deadlines of the running turn.

``Metering`` puts fuel, a deadline and interrupts around each turn. ``Interrupts`` holds what
was asked of the running turn: a soft interrupt (KeyboardInterrupt in
the guest, delivered by tripping CPython's own signal flags, or when the guest next waits on
the host) or a hard stop (an epoch trap). Requests carry the turn they were made for, so a
late timer can never stop a later turn. ``Watchdog`` runs the deadlines (time limits, the
grace after an interrupt) on one thread.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial

import wasmtime

from ..memory.checkpoints import SignalFlags, memory_address
from ..runtime.rewrite import InterruptCells
from .stops import INTERRUPT, TIME

log = logging.getLogger(__name__)


class Interrupts:
    """Interrupt and stop requests for the running turn, shared with host-side waits.

    A soft interrupt is delivered to the guest as KeyboardInterrupt the next time it waits
    on the host (sleep, input). A hard stop ends the turn with an epoch trap. Requests carry
    the turn they were made for, so a late timer can never stop a later turn.
    """

    def __init__(self, engine: wasmtime.Engine):
        self._engine = engine
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._soft = False
        self._requested = False  # a soft interrupt was asked for in this turn
        self._turn = 0
        self._active = False
        self.stop_reason: str | None = None
        self.soft_reason: str | None = None  # stops.INTERRUPT, or stops.TIME (the time limit)
        self._pausing = False  # the visual debugger's pause: tripped, not yet taken

    def begin(self, soft: bool = True) -> int:
        """A turn starts; returns its number. ``soft=False``: the kernel's own repair turns,
        which a user's interrupt must not break (their deadline still stops them)."""
        with self._lock:
            self._turn += 1
            self._active = True
            self._soft, self._requested, self.stop_reason = False, not soft, None
            self.soft_reason, self._pausing = None, False
            self._event.clear()
            return self._turn

    def end(self) -> None:
        with self._lock:
            self._active = False

    def request_soft(
        self,
        deliver: Callable[[], None] | None = None,
        reason: str = INTERRUPT,
        turn: int | None = None,
    ) -> int | None:
        """Ask the running turn (or turn ``turn``, if it still runs) to raise KeyboardInterrupt;
        returns its number, or None if idle, not interruptible or already asked (later
        requests merge into the first: its grace timer stops the turn hard if the
        KeyboardInterrupt does not end it).

        ``deliver`` (which trips CPython's own signal flags) runs under the lock, so it can
        never land in the next turn.
        """
        with self._lock:
            if not self._active or self._requested or turn not in (None, self._turn):
                return None
            self._soft = self._requested = True
            self.soft_reason = reason
            self._event.set()
            if deliver is not None:
                deliver()
            return self._turn

    def request_pause(self, deliver: Callable[[], None]) -> bool:
        """The visual debugger's pause: ``deliver`` trips CPython's signal flags, and the
        guest, asking why (``take_pause``), stops at its next line instead of raising. No wait
        is cut short and no grace timer runs: a cell that never reaches Python code again is
        simply not paused. False if idle or already interrupted."""
        with self._lock:
            if not self._active or self._requested:
                return False
            self._pausing = True
            deliver()
            return True

    def take_pause(self) -> bool:
        """True (once) if the guest's interruption is the visual debugger's pause."""
        with self._lock:
            pausing, self._pausing = self._pausing, False
            return pausing and not self._requested

    def request_stop(self, reason: str, turn: int | None = None) -> None:
        """Stop turn ``turn`` (default: whichever runs) with an epoch trap, if it still runs."""
        with self._lock:
            turn = self._turn if turn is None else turn
            if not self._active or turn != self._turn or self.stop_reason is not None:
                return
            self.stop_reason = reason
            self._event.set()
            self._engine.increment_epoch()

    def take(self) -> bool:
        """True (once per request) if the guest should now raise KeyboardInterrupt."""
        with self._lock:
            if self.stop_reason is not None:
                return True
            if self._soft:
                self._soft = False
                self._event.clear()
                return True
            return False

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early on any interrupt or stop."""
        self._event.wait(timeout)


class Watchdog:
    """Runs callbacks at deadlines on one thread (a Timer thread per cell costs a thread start).

    Nothing may end that thread, or no deadline and no interrupt escalation would fire again:
    a callback's exception is logged, and a deadline too far off (or not a number) is capped.
    """

    LONGEST = 10 * 365 * 86400.0  # seconds: the furthest deadline kept, as a finite number
    NAP = 3600.0  # longest single wait; Condition.wait overflows past threading.TIMEOUT_MAX

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._jobs: dict[int, tuple[float, Callable[[], None]]] = {}
        self._tokens = itertools.count()
        self._closed = False
        # When the thread looks at the jobs next, if it waits (infinity: when notified). It
        # stays asleep through cells that arm and disarm later deadlines than the one it
        # waits for, and wakes then to find what is due next.
        self._wakes_at = math.inf
        threading.Thread(target=self._run, name="wasm-kernel-watchdog", daemon=True).start()

    def arm(self, seconds: float, callback: Callable[[], None]) -> int:
        if not seconds <= self.LONGEST:  # also NaN
            seconds = self.LONGEST
        with self._ready:
            token = next(self._tokens)
            due = time.monotonic() + seconds
            self._jobs[token] = (due, callback)
            if due < self._wakes_at:  # only then: a wake-up per cell costs the cell time
                self._ready.notify()
            return token

    def disarm(self, token: int) -> None:
        with self._ready:
            self._jobs.pop(token, None)

    @contextmanager
    def paused(self, token: int | None) -> Iterator[None]:
        """Stop one deadline's clock for a while (a person answering ``input()``)."""
        with self._ready:
            job = self._jobs.pop(token, None) if token is not None else None
            left = job[0] - time.monotonic() if job is not None else 0.0
        try:
            yield
        finally:
            if job is not None and token is not None:  # a job implies its token
                with self._ready:
                    self._jobs[token] = (time.monotonic() + left, job[1])
                    self._ready.notify()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._closed:
                    if not self._jobs:
                        self._wakes_at = math.inf
                        self._ready.wait()
                        continue
                    token, (due, callback) = min(self._jobs.items(), key=lambda job: job[1][0])
                    now = time.monotonic()
                    if due <= now:
                        del self._jobs[token]
                        break
                    nap = min(due - now, self.NAP)
                    self._wakes_at = now + nap
                    self._ready.wait(nap)
                else:
                    return
            try:
                callback()
            except Exception:
                log.exception("a watchdog callback failed; the watchdog carries on")


class Metering:
    """Fuel, a wall-clock deadline and interrupts around each guest turn.

    An interrupt (or the time limit) first trips CPython's own SIGINT flags, so the cell gets
    a real KeyboardInterrupt (TimeLimitExceeded); a cell that ignores it is stopped with an
    epoch trap after the grace time. A turn that takes no interrupts (the kernel's own
    repairs), or one already interrupted, is stopped hard at once."""

    def __init__(self, engine: wasmtime.Engine, cells: InterruptCells | None, grace: float):
        self.interrupts = Interrupts(engine)
        self.watchdog = Watchdog()
        self._cells = cells
        self._grace = grace
        self._signals: SignalFlags | None = None
        self._deadline: int | None = None  # watchdog token of the running turn's time limit

    @contextmanager
    def turn(
        self, store: wasmtime.Store, fuel: int, seconds: float, interruptible: bool = True
    ) -> Iterator[int]:
        """One metered guest call (no time limit if ``seconds`` is 0); yields its number."""
        turn = self.interrupts.begin(soft=interruptible)
        store.set_fuel(fuel)
        store.set_epoch_deadline(1)
        self._deadline = None
        if seconds:
            self._deadline = self.watchdog.arm(seconds, partial(self._time_up, turn))
        try:
            yield turn
        finally:
            self.interrupts.end()
            if self._deadline is not None:
                self.watchdog.disarm(self._deadline)
            store.set_epoch_deadline(1 << 62)

    def paused(self) -> AbstractContextManager[None]:
        """The running turn's time limit stopped while the host waits (a person, pip)."""
        return self.watchdog.paused(self._deadline)

    def watch_signals(self, memory: wasmtime.Memory, store: wasmtime.Store) -> None:
        """CPython's SIGINT flags for the next turn, cleared of any an earlier one left."""
        self._signals = None
        if self._cells is None:
            return
        flags = SignalFlags(self._cells, memory_address(memory, store), memory.data_len(store))
        try:
            flags.clear()
        except IndexError:
            log.warning("the interpreter's signal flags are out of reach; interrupts stop hard")
            return
        self._signals = flags

    def interrupt(self, pause: bool = False) -> None:
        """Jupyter interrupt: KeyboardInterrupt in the cell, or a hard stop after the grace time;
        ``pause``: the visual debugger's, which stops the cell at its next line, nothing more."""
        if pause:
            self.interrupts.request_pause(self._trip)
            return
        turn = self.interrupts.request_soft(self._trip)
        if turn is not None:
            self.watchdog.arm(self._grace, partial(self.interrupts.request_stop, INTERRUPT, turn))

    def _time_up(self, turn: int) -> None:
        """The wall-clock limit, first as an interrupt (what the cell did so far stays, as
        under nbgrader's timeout on the native kernel), then hard after the grace time."""
        if self.interrupts.request_soft(self._trip, TIME, turn) is None:
            self.interrupts.request_stop(TIME, turn)
            return
        self.watchdog.arm(self._grace, partial(self.interrupts.request_stop, TIME, turn))

    def _trip(self) -> None:
        if self._signals is None:
            return  # the guest learns of the interrupt when it next waits on the host
        try:
            self._signals.trip()
        except IndexError:
            log.warning("could not reach the interpreter's signal flags")

    def close(self) -> None:
        self.watchdog.close()
