"""The folder of saved images (``%snapshot``, hibernated sessions): names, listing, a quota
over all of them, and writing into a folder that other kernels (and other people's files)
share. The images themselves are ``images``' business.

An image is written to a staging file of its own, created new (``O_EXCL``, ``O_NOFOLLOW``:
a link planted under any name is never followed) and locked (``flock``) while it is
written; it is renamed into place under the folder's lock, where the quota is checked, so
two kernels saving at once cannot both pass it. Staging files count in the quota. One whose
writer is gone (a killed kernel, a hibernation cut short) holds no lock: the next save or
kernel start removes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import secrets
import select
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..files.private_files import private_file, private_folder
from .names import SUFFIX, ImageError, check_name

STAGING = ".partial"  # staging files: ".NAME.wkimg.<random>.partial"
LOCK = ".lock"
LOCK_WAIT = 10.0  # seconds; the lock is held for a rename or a sweep, milliseconds
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
POLL = 0.002  # seconds between looks for an awaited image, where inotify is missing
RECHECK = 1.0  # seconds between looks for an awaited image all the same
GIVE_UP_CHECK = 0.1  # seconds between looks at whether to stop waiting for it
SAVED_POLL = 0.05  # seconds between looks at a save in progress that is waited for
WATCH_READ = 64 << 10  # bytes of inotify events read at a time (they are only a wake-up)
IN_CREATE, IN_MOVED_TO = 0x100, 0x80  # <sys/inotify.h>
_libc = ctypes.CDLL(None, use_errno=True)
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]


def wait_for(path: Path, seconds: float, give_up: threading.Event | None = None) -> bool:
    """Whether ``path`` exists, waiting up to ``seconds`` for it to appear (an image is renamed
    into place): woken by inotify on its folder, so a long wait costs nothing, and looking
    again every RECHECK seconds all the same; where inotify is missing, looking every
    POLL seconds. Setting ``give_up`` ends the wait within GIVE_UP_CHECK seconds (a cell
    waiting on it was interrupted or ran out of time)."""
    found = path.exists()
    if found or seconds <= 0:
        return found
    deadline = time.monotonic() + seconds
    recheck = RECHECK if give_up is None else GIVE_UP_CHECK
    watch = _watch(path.parent)
    try:
        while not path.exists():
            left = deadline - time.monotonic()
            if left <= 0 or (give_up is not None and give_up.is_set()):
                return False
            if watch is None:
                time.sleep(min(POLL, left))
            elif select.select([watch], [], [], min(recheck, left))[0]:
                with contextlib.suppress(BlockingIOError):  # what changed does not matter
                    os.read(watch, WATCH_READ)
        return True
    finally:
        if watch is not None:
            os.close(watch)


def _watch(folder: Path) -> int | None:
    """An inotify descriptor that becomes readable when an entry is created in ``folder`` or
    renamed into it; None where that cannot be had."""
    watch = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if watch < 0:
        return None
    if _libc.inotify_add_watch(watch, os.fsencode(folder), IN_CREATE | IN_MOVED_TO) < 0:
        os.close(watch)
        return None
    return watch


def is_staging(name: str) -> bool:
    return name.startswith(".") and name.endswith(STAGING) and SUFFIX + "." in name


@dataclass(frozen=True)
class Entry:
    name: str
    path: Path
    size: int
    modified: float


class ImageFolder:
    """The folder of saved images, with a size quota over all of them."""

    HIBERNATED = "hibernated-"

    def __init__(self, directory: Path, quota: int):
        self.directory = directory
        self.quota = quota

    def path(self, name: str) -> Path:
        return self.directory / (check_name(name) + SUFFIX)

    def _listed(self, wanted: Callable[[str], bool]) -> list[Entry]:
        """Regular files whose names ``wanted`` takes; links and special files are not."""
        found = []
        try:
            with os.scandir(self.directory) as scan:
                for entry in scan:
                    if wanted(entry.name) and entry.is_file(follow_symlinks=False):
                        with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                            found.append((entry.name, entry.stat(follow_symlinks=False)))
        except OSError:
            return []
        return [
            Entry(name, self.directory / name, status.st_size, status.st_mtime)
            for name, status in sorted(found)
        ]

    def entries(self) -> list[Entry]:
        """The images, named without their suffix."""
        listed = self._listed(lambda name: name.endswith(SUFFIX) and not name.startswith("."))
        return [
            Entry(entry.name[: -len(SUFFIX)], entry.path, entry.size, entry.modified)
            for entry in listed
        ]

    def staged(self) -> list[Entry]:
        """Staging files: saves in progress, or left by kernels that were stopped."""
        return self._listed(is_staging)

    def saving(self, name: str) -> bool:
        """Whether an image of ``name`` is being written now: a staging file of its own that
        its writer holds locked (one a stopped writer left holds no lock)."""
        prefix = f".{self.path(name).name}."
        for entry in self._listed(lambda found: is_staging(found) and found.startswith(prefix)):
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            except OSError:
                pass
            finally:
                os.close(fd)
        return False

    def wait_saved(self, name: str, seconds: float) -> None:
        """Return once no image of ``name`` is being written, or after ``seconds``."""
        deadline = time.monotonic() + seconds
        while self.saving(name) and time.monotonic() < deadline:
            time.sleep(SAVED_POLL)

    def used(self, besides: Path | None = None) -> int:
        """Bytes the images and the staging files take, but the file ``besides``."""
        return sum(entry.size for entry in self.entries() + self.staged() if entry.path != besides)

    def store(
        self,
        name: str,
        write: Callable[[BinaryIO], object],
        admit: Callable[[int], None] | None = None,
    ) -> Path:
        """Write an image under ``name`` (replacing one of that name) within the quota:
        ``write`` streams it into the (seekable) staging file it is given. ``admit`` may
        refuse, or make room for, its size before the quota is checked."""
        target = self.path(name)
        try:
            private_folder(self.directory)
            with self._locked():
                self._sweep_locked()
                staging, fd = self._new_staging(target)
            try:
                with open(fd, "w+b", closefd=False) as out:
                    write(out)
                size = os.fstat(fd).st_size
                with self._locked():
                    try:
                        if admit is not None:
                            admit(size)
                        self._check_quota(name, target, size, besides=staging)
                    except ImageError:
                        os.unlink(staging)  # under the lock: no other save counts it
                        raise
                    os.replace(staging, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(staging)
                raise
            finally:
                os.close(fd)
        except OSError as exc:
            raise ImageError(f"cannot write {target}: {exc.strerror or exc}") from None
        return target

    def _new_staging(self, target: Path) -> tuple[Path, int]:
        """A staging file of this save's own, created new, private, and locked while it is
        written (under the folder's lock, so that no sweep sees it unlocked)."""
        staging = target.with_name(f".{target.name}.{secrets.token_hex(8)}{STAGING}")
        fd = os.open(staging, _CREATE, 0o600)
        try:
            os.fchmod(fd, 0o600)  # the descriptor's file, whatever the umask made it
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: nobody else has it
        except OSError:
            os.close(fd)
            os.unlink(staging)
            raise
        return staging, fd

    def _check_quota(self, name: str, target: Path, size: int, besides: Path) -> None:
        """Refuse an image of ``size`` bytes that the others (but ``target``, which it
        replaces, and ``besides``, its own staging file) leave no room for."""
        images = sum(entry.size for entry in self.entries() if entry.path != target)
        staged = sum(entry.size for entry in self.staged() if entry.path != besides)
        if self.quota and images + staged + size > self.quota:
            pending = f", {staged / (1 << 20):.1f} MiB of it saves in progress" if staged else ""
            raise ImageError(
                f"saving {name!r} ({size / (1 << 20):.1f} MiB) would pass the snapshot quota of"
                f" {self.quota / (1 << 20):.0f} MiB ({(images + staged) / (1 << 20):.1f} MiB in"
                f" use{pending}). Delete snapshots (%snapshot delete NAME) or raise"
                " --WasmKernel.snapshot_quota."
            )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The folder's lock, shared with every kernel using it; a lock file that is a link
        or not a regular file is refused."""
        fd = private_file(self.directory / LOCK)
        try:
            deadline = time.monotonic() + LOCK_WAIT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise OSError(
                            errno.EAGAIN,
                            f"another process has held {self.directory / LOCK} for"
                            f" {LOCK_WAIT:.0f} s",
                        ) from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)

    def sweep(self) -> None:
        """Remove staging files whose writer is gone (killed kernels, cut hibernations); a
        folder an older version left readable by others is narrowed to this user first."""
        with contextlib.suppress(OSError):
            if self.directory.is_dir():
                private_folder(self.directory)
        if not self.staged():  # nothing to do: no lock file made in a folder never written
            return
        try:
            with self._locked():
                self._sweep_locked()
        except OSError:
            pass  # a folder this kernel cannot write: its saves will say so

    def _sweep_locked(self) -> None:
        """Under the folder's lock, so that no staging file is between its creation and its
        own lock."""
        for entry in self.staged():
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.unlink(entry.path)
            except OSError:
                pass  # locked: a save in progress
            finally:
                os.close(fd)

    def delete(self, name: str) -> None:
        try:
            self.path(name).unlink()
        except FileNotFoundError:
            raise ImageError(f"there is no snapshot named {name!r}") from None
        except OSError as exc:
            raise ImageError(f"cannot delete {name!r}: {exc.strerror or exc}") from None

    def hibernation_name(self, session: str) -> str:
        return self.HIBERNATED + hashlib.sha256(session.encode()).hexdigest()[:24]

    def describe(self) -> str:
        entries, staged = self.entries(), self.staged()
        if not entries and not staged:
            return f"No snapshots in {self.directory}."
        lines = [f"{entry.name}  {entry.size / (1 << 20):.1f} MiB" for entry in entries]
        if staged:
            size = sum(entry.size for entry in staged)
            lines.append(
                f"({len(staged)} unfinished: saves in progress or left by stopped kernels,"
                f" {size / (1 << 20):.1f} MiB)"
            )
        quota = f" of {self.quota / (1 << 20):.0f} MiB" if self.quota else ""
        lines.append(f"{self.used() / (1 << 20):.1f} MiB used{quota} in {self.directory}")
        return "\n".join(lines)
