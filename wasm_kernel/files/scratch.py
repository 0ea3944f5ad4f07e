"""A size limit for the guest's private scratch folder (``/tmp``), which lives on the host's disk.

WASI gives the host no hook on file writes, so the folder is measured from outside, by
:func:`usage`: a walk of the folder through directory descriptors (so no path is ever too long
and no symlink is followed, holding at most four descriptors however deep it goes), plus the
files the guest has unlinked but still holds open, which the walk cannot see: wasmtime opened
them in this process, so they are among its own descriptors (``/proc/self/fd``).

:class:`ScratchWatch` applies the limit to turns. Only growth in a turn counts: a cell that
starts over the limit may still delete files. Walking costs about 3 µs per file, so the watch
walks only when something may have changed: the sandbox calls :meth:`ScratchWatch.touched`
when the guest does anything that can grow the folder, and the watch keeps the last size it
measured. While a touched turn runs, a thread measures a few times a second (what stops a
cell writing in a loop), and once more when it ends. Whatever cannot be measured counts as
over the limit.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Self

POLL_SECONDS = 0.25
ROOM_SECONDS = 0.5  # while over the limit, how often a growth attempt may re-measure
ENTRY_BYTES = 4096  # the least a file or folder costs, so that a million empty files count
_ENTRY_BLOCKS = ENTRY_BYTES // 512
_OPEN_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_HELD = "/proc/self/fd"  # this process's descriptors, where wasmtime opened the guest's files
_SKIPPED = {errno.ENOENT, errno.ENOTDIR, errno.ELOOP}  # gone or replaced while measuring


class Usage(int):
    """Bytes a folder takes on disk. ``unmeasured`` is why part of it could not be measured
    (empty when all of it was); then the number is only what was found, and the folder counts
    as over any limit."""

    unmeasured: str

    def __new__(cls, size: int = 0, unmeasured: str = "") -> Self:
        self = super().__new__(cls, size)
        self.unmeasured = unmeasured
        return self

    def __repr__(self) -> str:
        if self.unmeasured:
            return f"Usage({int(self)}, {self.unmeasured!r})"
        return f"Usage({int(self)})"


class _Place:
    """Where the folder is, as the kernel names it in ``/proc/self/fd``: its device and its
    real path as bytes (any byte may be in it)."""

    def __init__(self, folder: Path):
        self.folder = os.fsencode(folder)
        try:
            self.prefix = os.fsencode(os.path.realpath(folder)).rstrip(b"/") + b"/"
            self.device: int | None = os.stat(folder).st_dev
        except (OSError, ValueError):
            self.prefix, self.device = b"", None

    def held_files(self) -> tuple[list[tuple[int, os.stat_result]], str]:
        """This process's descriptors of regular files in the folder: (descriptor, status)
        pairs, and why they could not be listed (empty when they could)."""
        try:
            names = os.listdir(_HELD)
        except OSError as error:
            if sys.platform.startswith("linux"):
                return [], _unreadable(error, "list its open files")
            return [], ""  # elsewhere there is no /proc: unlinked open files go unseen
        held = []
        for name in names:
            link = f"{_HELD}/{name}"
            try:
                status = os.stat(link)  # follows the descriptor to its file, however named
            except OSError:
                continue  # closed meanwhile
            if not stat.S_ISREG(status.st_mode) or status.st_dev != self.device:
                continue
            try:
                target = os.readlink(os.fsencode(link))
            except OSError as error:
                # a path longer than a page cannot be named: only the guest makes those
                if error.errno != errno.ENAMETOOLONG:
                    continue
            else:
                # an unlinked file is named "<its last path> (deleted)"; a file can be renamed
                # within the folder before it is unlinked, and then still starts with it
                if not target.startswith(self.prefix):
                    continue
            held.append((int(name), status))
        return held, ""

    def writable_open(self) -> bool:
        """Whether this process holds a file in the folder open for writing."""
        for descriptor, _ in self.held_files()[0]:
            try:
                mode = fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_ACCMODE
            except OSError:
                continue
            if mode != os.O_RDONLY:
                return True
        return False

    def stop_writers(self) -> int:
        """Make every file in the folder that this process holds open for writing read-only,
        in place: the same descriptor number now leads to a read-only opening of the same
        file (deleted or not), so the guest's writes through it fail. Returns how many."""
        stopped = 0
        for descriptor, _ in self.held_files()[0]:
            try:
                if fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
                    continue
                reader = os.open(f"{_HELD}/{descriptor}", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.dup2(reader, descriptor)
                finally:
                    os.close(reader)
            except OSError:
                continue  # closed meanwhile
            stopped += 1
        return stopped

    def usage(self, cancel: Callable[[], bool] | None = None) -> Usage | None:
        """The folder's size; None if ``cancel()`` became true meanwhile."""
        try:
            return _measure(self, cancel)
        except Exception as error:
            return Usage(0, f"the host failed to measure it ({type(error).__name__}: {error})")


def usage(folder: Path) -> Usage:
    """Disk bytes under ``folder``: allocated blocks (a sparse file counts what it really
    takes), at least ``ENTRY_BYTES`` per entry (a file's further links cost an entry each, its
    blocks once), and the files unlinked in it that this process still holds open. Never
    raises."""
    size = _Place(folder).usage()
    assert size is not None
    return size


def _measure(place: _Place, cancel: Callable[[], bool] | None) -> Usage | None:
    if place.device is None:
        return Usage(0, "the host could not find it")
    total = 0
    unmeasured = ""
    held, why = place.held_files()  # before the walk: a file unlinked later is not seen twice
    unmeasured = unmeasured or why
    counted: set[tuple[int, int]] = set()
    for _, status in held:
        if status.st_nlink:
            continue  # still linked: the walk finds it where it is linked
        key = (status.st_dev, status.st_ino)
        if key not in counted:
            counted.add(key)
            blocks = status.st_blocks
            total += blocks * 512 if blocks > _ENTRY_BLOCKS else ENTRY_BYTES

    try:
        root = os.open(place.folder, _OPEN_FOLDER)
    except OSError as error:
        if error.errno == errno.ENOENT:
            return Usage(total, unmeasured)
        return Usage(total, unmeasured or _unreadable(error, "open it"))

    linked: set[tuple[int, int]] = set()  # files with several links, counted once
    is_dir = stat.S_ISDIR

    def scan(descriptor: int) -> list[str]:
        """Count one folder's entries; the names of its subfolders."""
        nonlocal total, unmeasured
        folders: list[str] = []
        blocks = 0  # in 512-byte units, summed locally: this loop is the whole cost
        least = _ENTRY_BLOCKS
        try:
            with os.scandir(descriptor) as entries:
                for entry in entries:
                    try:
                        status = entry.stat(follow_symlinks=False)  # fstatat: never a long path
                    except OSError as error:
                        if error.errno not in _SKIPPED:
                            unmeasured = unmeasured or _unreadable(error)
                        continue
                    if is_dir(status.st_mode):
                        folders.append(entry.name)
                    elif status.st_nlink > 1:
                        key = (status.st_dev, status.st_ino)
                        if key in linked:  # its blocks are counted: this name is an entry
                            blocks += least
                            continue
                        linked.add(key)
                    used = status.st_blocks
                    blocks += used if used > least else least
        except OSError as error:
            if error.errno not in _SKIPPED:
                unmeasured = unmeasured or _unreadable(error)
        total += blocks * 512
        return folders

    # Depth first, holding only the root and the folder being read: a folder's subfolders are
    # opened by name from it, and the walk climbs back with "..", checking that it arrives
    # where it left. Only folders with subfolders still to read are remembered, so a chain
    # of any depth costs constant memory and descriptors.
    current, depth = root, 0
    try:
        root_status = os.fstat(root)
        pending: list[tuple[int, tuple[int, int], list[str]]] = []
        folders = scan(root)
        if folders:
            pending.append((0, (root_status.st_dev, root_status.st_ino), folders))
        while pending:
            if cancel is not None and cancel():
                return None
            level, identity, names = pending[-1]
            name = names.pop()
            if not names:
                pending.pop()  # nothing more to read here: never come back
            if depth != level:
                if level == 0:  # the root is at hand
                    os.close(current)
                    current = root
                else:
                    climbed = _climb(current, root, depth - level, identity)
                    if climbed is None:  # the folders moved while it was read (only while
                        current = root  # the guest runs; _climb closed what it held): what
                        break  # was found is a lower bound, as good as any
                    current = climbed
                depth = level
            try:
                child = os.open(name, _OPEN_FOLDER, dir_fd=current)
            except OSError as error:
                if error.errno not in _SKIPPED:
                    unmeasured = unmeasured or _unreadable(error)
                continue
            try:
                folders = scan(child)
                if folders:
                    status = os.fstat(child)
                    pending.append((level + 1, (status.st_dev, status.st_ino), folders))
            except BaseException:
                os.close(child)
                raise
            if folders:
                if current != root:
                    os.close(current)
                current, depth = child, level + 1
            else:
                os.close(child)
    finally:
        if current is not None and current != root:
            os.close(current)
        os.close(root)
    return Usage(total, unmeasured)


def _climb(current: int, root: int, steps: int, identity: tuple[int, int]) -> int | None:
    """Go ``steps`` folders up from ``current`` (closing it) to the folder ``identity``; None
    if that is not where it arrives."""
    try:
        for _ in range(steps):
            parent = os.open("..", _OPEN_FOLDER, dir_fd=current)
            if current != root:
                os.close(current)
            current = parent
        status = os.fstat(current)
    except OSError:
        if current != root:
            os.close(current)
        return None
    if (status.st_dev, status.st_ino) != identity:
        if current != root:
            os.close(current)
        return None
    return current


def _unreadable(error: OSError, what: str = "read a folder in it") -> str:
    if error.errno in (errno.EMFILE, errno.ENFILE):
        return "the host ran out of file descriptors while measuring it"
    return f"the host could not {what} ({error.strerror})"


class ScratchWatch:
    """Calls ``stop(turn)`` when a running turn grows ``folder`` past ``limit`` bytes.

    The sandbox calls :meth:`begin` before each turn (cells and every other request) and
    :meth:`end` after it, both on the thread that runs the guest, and :meth:`touched` (any
    thread) whenever the guest may have grown the folder. A turn nothing touched costs a look
    at this process's descriptors, not a walk. Until the sandbox says it reports touches
    (``touches=True``), every turn counts as touched. ``writing`` says whether the guest holds
    a file in the folder open for writing; by default the watch looks at the process's
    descriptors (about a millisecond), the sandbox knows it at once.
    """

    def __init__(
        self,
        folder: Path,
        limit: int,
        stop: Callable[[int], None],
        touches: bool = False,
        writing: Callable[[], bool] | None = None,
    ):
        self.folder = folder
        self.limit = limit
        self.touches = touches  # the sandbox calls touched(); else every turn is touched
        self._stop = stop
        self._place = _Place(folder)
        self._writing = writing or self._place.writable_open
        self._lock = threading.Condition()
        self._turn: int | None = None
        self._baseline = Usage(0)
        self._full = False  # the running turn began over the limit and may not grow yet
        self._room_checked = 0.0
        self._last: Usage | None = None  # the size measured last while no guest ran
        self._dirty = True  # touched since _last was measured
        self._active = False  # the running turn (or the next one) may grow the folder
        self._closed = False
        self._idle = False  # the thread waits for a turn with no timeout: begin() wakes it
        self.walks = 0  # folder walks at the start or end of a turn, for tests and diagnostics
        self.polls = 0  # folder walks while a turn ran
        self.stopped: Usage | None = None  # the size that made the watch stop the last turn
        if limit:
            threading.Thread(target=self._run, name="wasm-kernel-scratch", daemon=True).start()

    def touched(self) -> None:
        """The guest may have grown the folder: it opened a file for writing (or created or
        truncated one), made a folder, renamed or linked something into it. Cheap and
        thread-safe; call it from the host function that did the operation, in or between
        turns. A turn touched keeps being measured until it ends, so writes through a
        descriptor opened earlier in the turn need no further call."""
        self._dirty = True  # plain stores: atomic, and no lock on the guest's file calls
        self._active = True

    def begin(self, turn: int) -> None:
        """A turn starts (the guest is not running): remember the folder's size as its baseline,
        walking only if something touched it since it was last measured."""
        if not self.limit:
            return
        last = self._last
        if self._dirty or last is None or last.unmeasured or last > self.limit:
            # over the limit, the baseline must be exact: deleting files touches nothing
            self._dirty = False
            last = self._last = self._measure()
        # a file left open for writing may still grow
        writing = not self.touches or self._writing()
        with self._lock:
            self._turn, self._baseline = turn, last
            self._full, self._room_checked = bool(last.unmeasured) or last > self.limit, 0.0
            self._active = self._active or writing
            self.stopped = None
            if self._idle:  # else it is counting down to a poll already: no wake-up per turn
                self._lock.notify()

    @property
    def over_limit(self) -> bool:
        """Whether the running turn began with the folder over the limit (or unmeasurable)."""
        return self._full

    def has_room(self) -> bool:
        """Whether the running turn may grow the folder now (called by the sandbox, while the
        guest waits, before anything that would). A turn that began over the limit may once
        it has deleted enough: the folder is measured again, at most every ROOM_SECONDS."""
        if not self._full:
            return True
        now = time.monotonic()
        if now - self._room_checked < ROOM_SECONDS:
            return False
        self._room_checked = now
        size = self._last = self._measure()
        self._dirty = False
        if size.unmeasured or size > self.limit:
            return False
        with self._lock:
            self._baseline, self._full = size, False
        return True

    def stop_writers(self) -> int:
        """Turn files open for writing in the folder read-only (see ``_Place.stop_writers``):
        while it is over the limit, a file kept open from an earlier cell must not let each
        new cell grow it again before a measurement catches it."""
        self._dirty = True
        return self._place.stop_writers()

    def end(self) -> Usage | None:
        """The turn ended (the guest is not running): the folder's size if the turn took it
        over the limit (or it could not be measured), else None. Walks only if the turn was
        touched or left a file open for writing."""
        with self._lock:
            if self._turn is None:
                return None
            self._turn = None
            baseline, active = self._baseline, self._active
            self._active = False
        if not (active or self._dirty or self._writing()):
            return None
        self._dirty = False
        size = self._last = self._measure()
        return size if self._over(size, baseline) else None

    def removed(self) -> None:
        """The guest may have shrunk the folder (removed or moved something out): measure it
        again before its size is next reported. Cheap and thread-safe, like ``touched``."""
        self._dirty = True

    def size(self) -> Usage:
        """The folder's size between turns (a cell's ``scratch_bytes``, with or without a
        limit): the last measurement, walking again only if the guest touched the folder
        since, or holds a file in it open for writing."""
        last = self._last
        if last is None or self._dirty or self._writing():
            self._dirty = False
            last = self._last = self._measure()
        return last

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._turn = None
            self._lock.notify()

    def _measure(self) -> Usage:
        self.walks += 1
        size = self._place.usage()
        assert size is not None
        return size

    def _moved_on(self, turn: int) -> bool:
        """Whether the turn being measured has ended (the walk can stop)."""
        return self._turn != turn

    def _over(self, size: Usage, baseline: Usage) -> bool:
        return bool(size.unmeasured) or (size > self.limit and size > baseline)

    def _run(self) -> None:
        pause = POLL_SECONDS
        while True:
            with self._lock:
                while self._turn is None and not self._closed:
                    self._idle = True
                    self._lock.wait()
                self._idle = False
                if self._closed:
                    return
                self._lock.wait(pause)  # begin() has just measured the baseline
                if self._turn is None:
                    continue
                turn, baseline = self._turn, self._baseline
                active = self._active
            if not active:
                if not self._writing():
                    continue  # nothing can grow: no walk
                with self._lock:
                    if self._turn != turn:
                        continue
                    self._active = True
            started = time.monotonic()
            self.polls += 1
            size = self._place.usage(cancel=partial(self._moved_on, turn))
            # walking a large folder takes a while: never spend more than half the time on it
            pause = max(POLL_SECONDS, time.monotonic() - started)
            if size is None or not self._over(size, baseline):
                continue
            with self._lock:
                if self._turn != turn:
                    continue
                self.stopped = size
            self._stop(turn)
