"""Files the guest holds open, carried by an image and opened again when it is resumed.

An image is resumed into a fresh instance, whose WASI descriptor table (the host's, not in
guest memory) holds only stdio and the pre-opened folders: every descriptor the guest's
memory still names would be dead, and matplotlib's cached fonts, a sqlite3 connection or an
open file object with it. So the host keeps, per descriptor, the guest path and flags it was
opened with (``GuestFiles``), the image records them with the offsets the guest reports,
and a resume opens each again at its number, before the guest runs. A file that cannot
come back (removed, its folder not mounted here, or now a FIFO, socket or device, which
path_open's guard refuses too) keeps its number, held by a folder descriptor with no rights,
so that nothing else is ever read or written through it; the guest is told which, to close
the file objects that hold them and say so.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

import wasmtime

from ..images.image_fields import MAX_RIGHTS, OFLAG_DIRECTORY, HeldFile
from .descriptors import ERRNO_SUCCESS, RIGHT_FD_WRITE, GuestFiles
from .guest_paths import FIRST_PREOPEN, OpenFile
from .host_functions import GuestMemory

# what a reopen never does again: create, truncate, insist on creating (O_CREAT|O_TRUNC|O_EXCL)
OFLAGS_KEPT = OFLAG_DIRECTORY
FDFLAGS_KEPT = 0x1F
SCRATCH_ROOM = 2048  # guest stack bytes used for a path and the new descriptor's number


def open_paths(files: GuestFiles) -> list[tuple[int, str]]:
    """(descriptor, guest path) of every file the guest holds that could come back."""
    return [(fd, held.path) for fd, held in sorted(files.open.items()) if held.path is not None]


def held_files(files: GuestFiles, offsets: dict[int, int | None]) -> list[HeldFile]:
    """What an image records of the guest's open files; ``offsets`` are the guest's
    answers, by descriptor (a descriptor it does not know goes unrecorded)."""
    kept = []
    for fd, held in sorted(files.open.items()):
        if held.path is None or fd not in offsets:
            continue
        kept.append(
            HeldFile(
                fd=fd,
                path=held.path,
                oflags=held.oflags & OFLAGS_KEPT,
                rights=held.rights & MAX_RIGHTS,
                inheriting=held.inheriting & MAX_RIGHTS,
                fdflags=held.fdflags & FDFLAGS_KEPT,
                lookup=held.lookup & 1,
                offset=offsets[fd],
            )
        )
    return kept


class Reopening:
    """Opens an image's files in a fresh instance, at their numbers (``run``).

    wasmtime hands out the lowest number never used in a fresh table, and renumbers only
    onto a descriptor that exists; so numbers are taken in order, each by its file or, in a
    gap, by a placeholder closed at the end (a placeholder standing for a lost file stays).
    Paths are written to guest memory below its stack pointer, unused between turns."""

    def __init__(self, files: GuestFiles, store: wasmtime.Store, memory: GuestMemory, room: int):
        self.files, self.store, self.memory = files, store, memory
        self.path_at, self.fd_at = room - SCRATCH_ROOM, room - 8

    def run(self, held: Sequence[HeldFile]) -> dict[int, str]:
        """Open ``held``; the files that could not come back, by descriptor."""
        if not held:
            return {}
        wanted = {entry.fd: entry for entry in held}
        lost: dict[int, str] = {}
        gaps = []
        try:
            for fd in range(self.files.protected, max(wanted) + 1):
                entry = wanted.get(fd)
                if entry is not None and self._open_file(entry) == fd:
                    continue
                if self._placeholder() != fd:
                    raise OSError(f"cannot hold descriptor {fd}")
                if entry is None:
                    gaps.append(fd)
                else:
                    lost[fd] = entry.path
            for entry in held:  # below this kernel's own folders: the mounts differ
                if entry.fd < self.files.protected:
                    lost[entry.fd] = entry.path
        finally:
            for fd in gaps:
                self.files.real("fd_close")(self.store, fd)
                self.files.open.pop(fd, None)
            self.memory.write(self.store, self.path_at, bytes(SCRATCH_ROOM))
        return lost

    def _open_file(self, entry: HeldFile) -> int | None:
        folder = self._folder_of(entry.path)
        if folder is None:
            return None
        start = self.files.folders[folder - FIRST_PREOPEN]
        relative = posixpath.relpath(entry.path, start)
        name = relative.encode("utf-8", "surrogateescape")
        if len(name) > SCRATCH_ROOM - 16:
            return None
        host = self.files.paths.resolve(folder, name)
        if host is not None and not self.files.paths.may_open(host, follow=bool(entry.lookup & 1)):
            return None  # now a FIFO, socket or device: the open would block (see host_paths)
        fd = self._open(
            folder, entry.lookup, name, entry.oflags, entry.rights, entry.inheriting, entry.fdflags
        )
        if fd is not None:
            self.files.paths.opened(fd, host)
            writable = bool(entry.rights & RIGHT_FD_WRITE)
            self.files.open[fd] = OpenFile(
                in_scratch=folder == self.files.scratch,
                writable=writable,
                path=entry.path,
                oflags=entry.oflags,
                rights=entry.rights,
                inheriting=entry.inheriting,
                fdflags=entry.fdflags,
                lookup=entry.lookup,
            )
        return fd

    def _placeholder(self) -> int | None:
        """A folder descriptor with no rights at all: every read, write or seek is refused."""
        fd = self._open(self.files.scratch, 0, b".", OFLAG_DIRECTORY, 0, 0, 0)
        if fd is not None:
            self.files.open[fd] = OpenFile(False, False, None, OFLAG_DIRECTORY, 0, 0, 0, 0)
        return fd

    def _folder_of(self, path: str) -> int | None:
        """The pre-opened folder holding ``path``: the longest guest path above it."""
        best = None
        for index, folder in enumerate(self.files.folders):
            inside = path == folder or path.startswith(folder.rstrip("/") + "/")
            if inside and (best is None or len(folder) > len(self.files.folders[best])):
                best = index
        return None if best is None else FIRST_PREOPEN + best

    def _open(
        self,
        folder: int,
        lookup: int,
        name: bytes,
        oflags: int,
        rights: int,
        inheriting: int,
        fdflags: int,
    ) -> int | None:
        self.memory.write(self.store, self.path_at, name)
        errno = self.files.real("path_open")(
            self.store,
            folder,
            lookup,
            self.path_at,
            len(name),
            oflags,
            rights,
            inheriting,
            fdflags,
            self.fd_at,
        )
        if errno != ERRNO_SUCCESS:
            return None
        return int.from_bytes(self.memory.read(self.store, self.fd_at, 4), "little")
