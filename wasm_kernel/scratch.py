"""A size limit for the guest's private scratch folder (``/tmp``), which lives on the host's disk.

WASI gives the host no hook on file writes, so the folder is measured from outside: a thread
walks it a few times a second while a cell runs, and once more when the cell ends. Only growth
counts: a cell that starts over the limit may still delete files.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

POLL_SECONDS = 0.25
ENTRY_BYTES = 4096  # the least a file or folder costs, so that a million empty files count


def usage(folder: Path) -> int:
    """Disk bytes under ``folder``: allocated blocks (a sparse file counts what it really
    takes), at least ``ENTRY_BYTES`` per entry."""
    total = 0
    pending = [str(folder)]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    try:
                        status = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += max(status.st_blocks * 512, ENTRY_BYTES)
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
        except OSError:
            continue
    return total


class ScratchWatch:
    """Calls ``stop(turn)`` when the running cell grows ``folder`` past ``limit`` bytes."""

    def __init__(self, folder: Path, limit: int, stop: Callable[[int], None]):
        self.folder = folder
        self.limit = limit
        self._stop = stop
        self._lock = threading.Condition()
        self._turn: int | None = None
        self._baseline = 0
        self._closed = False
        if limit:
            threading.Thread(target=self._run, name="wasm-kernel-scratch", daemon=True).start()

    def begin(self, turn: int) -> None:
        if not self.limit:
            return
        baseline = usage(self.folder)
        with self._lock:
            self._turn, self._baseline = turn, baseline
            self._lock.notify()

    def end(self) -> int | None:
        """Stop watching; the folder's size if the cell took it over the limit, else None."""
        with self._lock:
            if self._turn is None:
                return None
            self._turn = None
            baseline = self._baseline
        size = usage(self.folder)
        return size if self._over(size, baseline) else None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()

    def _over(self, size: int, baseline: int) -> bool:
        return size > self.limit and size > baseline

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._turn is None and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                self._lock.wait(POLL_SECONDS)  # begin() has just measured the baseline
                if self._turn is None:
                    continue
                turn, baseline = self._turn, self._baseline
            if self._over(usage(self.folder), baseline):
                self._stop(turn)
