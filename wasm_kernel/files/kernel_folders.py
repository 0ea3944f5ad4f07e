"""The host folders a kernel owns (its private /tmp, its %pip packages): made, removed, and
swept after kills.

A scratch folder holds whatever the guest wrote (graded work, hidden tests it copied, data),
and a package folder up to a quota of unpacked packages, so neither may outlive its kernel. A
clean shutdown removes them (``Sandbox.close``, ``Packages.close``), which SIGTERM leads to
too (``jupyter.termination``); a kernel that must end at once removes them here first
(``remove_all``); SIGKILL leaves them, so every new sandbox sweeps the folders whose kernel
is gone. Each folder's name carries its kernel's pid
and start time, so a live kernel's folder is never taken for an orphan, even after the pid
was reused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil

PREFIX = "wasm-kernel-tmp-"  # a private /tmp
PACKAGES_PREFIX = "wasm-kernel-packages-"  # a kernel's %pip packages
_NAME = re.compile(rf"(?:{PREFIX}|{PACKAGES_PREFIX})(\d+)-(\d+)-")
_LIVE: set[Path] = set()  # this process's folders, for remove_all
SWEEP_DELAY = 2.0  # seconds from a sandbox's start to its sweep: off the start's path

log = logging.getLogger(__name__)


def _started(pid: int) -> int | None:
    """A process's start time in whole seconds, or None if it is gone."""
    try:
        return int(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def create(prefix: str = PREFIX, folder: Path | None = None) -> Path:
    """A new private folder named after this process, in ``folder`` (default: TMPDIR)."""
    pid = os.getpid()
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{pid}-{_started(pid) or 0}-", dir=folder))
    _LIVE.add(path)
    return path


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    _LIVE.discard(path)


def _ours(folder: str | None) -> Iterator[tuple[os.DirEntry, bool]]:
    """This user's real folders named by ``create``, each with whether its kernel runs."""
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
            yield entry, started is not None and abs(started - int(match.group(2))) <= 1


def sweep(folder: str | None = None) -> list[Path]:
    """Remove the folders of kernels that are gone (ours only: same owner, real folders,
    named by ``create``); returns what was removed."""
    removed = []
    for entry, running in _ours(folder):
        if not running:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    if removed:
        log.info("removed %d folders left by kernels that were killed", len(removed))
    return removed


def sweep_beside(folder: str | None = None) -> None:
    """``sweep`` on a thread of its own, SWEEP_DELAY seconds from now: it reads /proc for
    every folder found (~2 ms each where /proc is slow, in Python, which would slow a start
    down beside it), and it never removes a running kernel's folder, this one's included."""
    sweeper = threading.Timer(SWEEP_DELAY, sweep, (folder,))
    sweeper.name, sweeper.daemon = "wasm-kernel-sweep", True
    sweeper.start()


def running(prefix: str, folder: str | None = None) -> list[Path]:
    """This user's folders of one kind whose kernels still run."""
    return [
        Path(entry.path)
        for entry, alive in _ours(folder)
        if alive and entry.name.startswith(prefix)
    ]


def remove_all() -> None:
    """Remove this process's folders: it is about to end without its clean shutdown."""
    for path in list(_LIVE):
        remove(path)
