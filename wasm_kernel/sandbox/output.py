"""From the guest's raw stdout/stderr writes to Jupyter stream text, live and bounded.

wasmtime hands us each write synchronously on one of its threads. Sending one message per
write would flood the client on a printing loop, so writes are decoded incrementally (invalid
UTF-8 becomes U+FFFD, split characters are joined), merged while they arrive within a short
interval, and emitted in order by a background thread. Everything a cell prints or displays
counts against its output budget: printed text is cut where the budget ends, a message that
does not fit is left out whole (later ones that fit still show), and one notice says so.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable

Emit = Callable[[str, str], None]

FLUSH_INTERVAL = 0.05  # seconds a chunk may wait to be merged with the next one


class OutputPump:
    def __init__(self, interval: float = FLUSH_INTERVAL):
        self._interval = interval
        self._lock = threading.Lock()
        self._emit_lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._pending: list[tuple[str, str]] = []
        self._emit: Emit | None = None
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self._budget = 0
        self._used = 0
        self._limit_notice = ""
        self._told = False  # the notice was queued for this cell
        self._closed = False
        threading.Thread(target=self._flush_loop, name="wasm-kernel-output", daemon=True).start()

    def begin(self, emit: Emit, budget: int, limit_notice: str) -> None:
        """Start a cell: route output to ``emit`` and allow it ``budget`` bytes."""
        self.end()
        with self._lock:
            self._emit = emit
            self._budget, self._used = budget, 0
            self._limit_notice, self._told = limit_notice, False
            self._decoders = {
                name: codecs.getincrementaldecoder("utf-8")("replace")
                for name in ("stdout", "stderr")
            }

    def end(self) -> None:
        """Emit everything still pending, including half-decoded bytes, and detach."""
        with self._lock:
            for name, decoder in self._decoders.items():
                self._append(name, decoder.decode(b"", final=True))
            self._decoders = {}
        self.flush()
        with self._lock:
            self._emit = None

    def fits(self, size: int) -> bool:
        with self._lock:
            return self._used + size <= self._budget

    def charge(self, size: int) -> bool:
        """Count a message of ``size`` bytes against the cell's budget if it fits; if not, it
        is to be left out (False), the notice is queued, and nothing is counted."""
        with self._lock:
            if self._used + size <= self._budget:
                self._used += size
                return True
            self._tell_locked()
            return False

    def write(self, name: str, data: bytes) -> None:
        """wasmtime's stdout/stderr callback target. Must never raise."""
        with self._lock:
            decoder = self._decoders.get(name)
            if decoder is None:  # output outside a cell (boot, service calls): not shown
                return
            kept = bytes(data[: max(self._budget - self._used, 0)])
            self._append(name, decoder.decode(kept))
            self._used += len(kept)
            if len(kept) < len(data):
                self._tell_locked()
            self._ready.notify()

    def _tell_locked(self) -> None:
        if not self._told:
            self._told = True
            self._append("stderr", self._limit_notice)
            self._ready.notify()

    def _append(self, name: str, text: str) -> None:
        if not text:
            return
        if self._pending and self._pending[-1][0] == name:
            self._pending[-1] = (name, self._pending[-1][1] + text)
        else:
            self._pending.append((name, text))

    def flush(self) -> None:
        """Emit pending text now, in the order it was written."""
        with self._emit_lock:
            with self._lock:
                chunks, self._pending = self._pending, []
                emit = self._emit
            if emit is None:
                return
            for name, text in chunks:
                emit(name, text)

    def _flush_loop(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
            time.sleep(self._interval)
            self.flush()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._ready.notify()
