"""The host folders behind each kernel's private /tmp: made, removed, and swept after kills.

A scratch folder holds whatever the guest wrote (graded work, hidden tests it copied, data),
so it must not outlive its kernel. A clean shutdown removes it (``Sandbox.close``); SIGTERM,
which ends a Python process without cleanup, removes it here first; SIGKILL leaves it, so
every new sandbox sweeps the folders whose kernel is gone. Each folder's name carries its
kernel's pid and start time, so a live kernel's folder is never taken for an orphan, even
after the pid was reused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import psutil

PREFIX = "wasm-kernel-tmp-"
_NAME = re.compile(rf"{PREFIX}(\d+)-(\d+)-")
_LIVE: set[Path] = set()  # this process's folders, for the SIGTERM handler

log = logging.getLogger(__name__)


def _started(pid: int) -> int | None:
    """A process's start time in whole seconds, or None if it is gone."""
    try:
        return int(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def create() -> Path:
    """A new private folder named after this process."""
    pid = os.getpid()
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-{_started(pid) or 0}-"))
    _LIVE.add(path)
    return path


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    _LIVE.discard(path)


def sweep(folder: str | None = None) -> list[Path]:
    """Remove the scratch folders of kernels that are gone (ours only: same owner, real
    folders, named by ``create``); returns what was removed."""
    removed = []
    uid = os.getuid()
    with contextlib.suppress(OSError), os.scandir(folder or tempfile.gettempdir()) as entries:
        for entry in entries:
            match = _NAME.match(entry.name)
            if match is None:
                continue
            try:
                if (
                    not entry.is_dir(follow_symlinks=False)
                    or entry.stat(follow_symlinks=False).st_uid != uid
                ):
                    continue
            except OSError:
                continue
            started = _started(int(match.group(1)))
            if started is not None and abs(started - int(match.group(2))) <= 1:
                continue  # its kernel still runs
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    if removed:
        log.info("removed %d scratch folders left by kernels that were killed", len(removed))
    return removed


def remove_on_sigterm() -> None:
    """On the main thread: SIGTERM removes this process's folders, then does what it did."""
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        for path in list(_LIVE):
            remove(path)
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)
