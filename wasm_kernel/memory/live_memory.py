"""A live session's guest memory handed to a forked kernel without copying it.

A session's checkpoint (``cow``) is a memfd mapped privately over guest memory, except where
the boot image's memory file is mapped and the guest has not written since. A fork
(``%snapshot fork``) freezes that memfd: sealed, no one can write, grow or shrink it again;
the session goes on with a new one for its own checkpoints, which maps the frozen one's pages
until they are written. The fork's image then holds no memory of its own, only where the pages
are: parts of frozen memfds (this fork's, and earlier forks' the session still maps), reached
as ``/proc/PID/fd/N`` of the forking kernel (which keeps them open while the image exists),
and parts of the boot memory file. The forked kernel maps both privately: the two kernels share
every page neither writes, as the boot image's pages are shared, and each one's writes stay
its own. Such an image lives as long as the kernel that forked; a kernel started from it
after that starts fresh and says why.

What the forked kernel opens is checked, since an image is hostile input: each memfd must be
one of ours (by its name), sealed against writes, this user's, as large as the parts need, and
the very file the forking kernel froze (device and inode), frozen by the session that wrote
the image: the image carries that session's secret, whose digest the files' names carry
(``cow.process_secret``), so an image naming another session's memory, even of the same
user, is refused;
the boot memory file is the kernel's own cache's, and must be the very file the forking
kernel mapped (device, inode, size, modification time).
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cow import (
    PAGE,
    CopyOnWriteMemory,
    FileKey,
    file_name,
    map_file,
    mapped_files,
    process_secret,
    subtract,
)

BOOT = "boot"
MEMFD_NAME = "/memfd:" + CopyOnWriteMemory.FILE_NAME
SEALED = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
MAX_PARTS = 65536  # parts an image may list (each one costs the forked kernel a mapping)
MAX_FILES = 16  # frozen files one image may name (past that, pages are copied instead)
HEADER_KEYS = ("pid", "fds", "files", "parts", "boot", "secret")
SECRET = re.compile(r"[0-9a-f]{64}")
Part = tuple[int, int, int | str, int]  # guest [start, end), its file (an index of ``fds``, or
# BOOT), the offset in that file


@dataclass
class LiveMemory:
    """Where a forked session's memory is: the forking kernel's frozen checkpoint and the
    boot memory file, part by part (guest offsets, page-aligned)."""

    pid: int
    fds: list[int]
    parts: list[Part]
    boot: list[int] = field(default_factory=list)  # st_dev, st_ino, st_size, st_mtime_ns
    # each of ``fds``' (st_dev, st_ino): a process that took the forking kernel's pid later
    # cannot pass off another session's memory at the same descriptor number
    files: list[list[int]] = field(default_factory=list)
    secret: str = ""  # the forking session's (hex), whose digest its files' names carry

    def header(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "fds": self.fds,
            "files": self.files,
            "parts": self.parts,
            "boot": self.boot,
            "secret": self.secret,
        }

    @classmethod
    def from_header(cls, value: object, memory_size: int) -> LiveMemory:
        """The image's description, checked; ValueError says what is wrong."""
        if not isinstance(value, dict) or set(value) != {*HEADER_KEYS}:
            raise ValueError("bad live memory")
        pid, fds, parts, boot = value["pid"], value["fds"], value["parts"], value["boot"]
        files, secret = value["files"], value["secret"]
        if not (isinstance(secret, str) and SECRET.fullmatch(secret)):
            raise ValueError("bad live memory: its secret")
        if not (
            _is_int(pid, 1, 1 << 22)
            and isinstance(fds, list)
            and 0 < len(fds) <= MAX_FILES
            and all(_is_int(fd, 0, 1 << 20) for fd in fds)
            and isinstance(files, list)
            and len(files) == len(fds)
            and all(
                isinstance(key, list) and len(key) == 2 and all(_is_int(n, 0, 1 << 63) for n in key)
                for key in files
            )
        ):
            raise ValueError("bad live memory: its process or descriptors")
        if not (isinstance(boot, list) and len(boot) in (0, 4)):
            raise ValueError("bad live memory: its boot file")
        if not all(_is_int(item, 0, 1 << 63) for item in boot):
            raise ValueError("bad live memory: its boot file")
        if not isinstance(parts, list) or len(parts) > MAX_PARTS:
            raise ValueError("bad live memory: its parts")
        checked: list[Part] = []
        next_free = 0
        for part in parts:
            if not (isinstance(part, list) and len(part) == 4):
                raise ValueError("bad live memory part")
            start, end, source, offset = part
            if not (
                _is_int(start, next_free, memory_size)
                and _is_int(end, start + 1, memory_size)
                and _is_int(offset, 0, 1 << 40)
                and (source == BOOT or _is_int(source, 0, len(fds) - 1))
                and not (start % PAGE or end % PAGE or offset % PAGE)
                and (source != BOOT or boot)
            ):
                raise ValueError("live memory parts overlap, pass the memory's end or are bad")
            checked.append((start, end, source, offset))
            next_free = end
        return cls(pid, fds, checked, boot, files, secret)


def _is_int(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


# -- the forking kernel -----------------------------------------------------------------------


def freeze(
    cow: CopyOnWriteMemory, base: int, boot_file: Path | None, frozen: dict[FileKey, int]
) -> tuple[LiveMemory, FileKey, set[FileKey]]:
    """Seal the checkpoint ``cow`` (just taken) for a fork and describe guest memory: parts
    of the boot file and of the ``frozen`` files of earlier forks stay theirs, parts of any
    other file are copied in first (and those of frozen files past the newest MAX_FILES - 1
    that guest memory maps). Returns the description (its ``fds`` this process's,
    the sealed file first), the sealed file's key, and the keys of every file guest memory
    mapped besides it."""
    boot_identity: list[int] = []
    boot_key = None
    if boot_file is not None:
        status = os.stat(boot_file)
        boot_key = (status.st_dev, status.st_ino)
        boot_identity = [status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns]
    mapped = mapped_files(base, cow.foreign)
    mapped_keys = {key for _, _, key, _ in mapped}
    named = set([key for key in frozen if key in mapped_keys][1 - MAX_FILES :])  # the newest
    pieces = [piece for piece in mapped if piece[2] == boot_key or piece[2] in named]
    kept = [(low, high) for low, high, _, _ in pieces]
    fd = cow.freeze(base, subtract(cow.foreign, kept))
    status = os.fstat(fd)
    keys: list[FileKey] = [(status.st_dev, status.st_ino)]
    own = subtract([(0, cow.mapped)], kept) if cow.mapped else []
    parts: list[Part] = [(low, high, 0, low) for low, high in own]
    for low, high, key, offset in pieces:
        if key == boot_key:
            parts.append((low, high, BOOT, offset))
            continue
        if key not in keys:
            keys.append(key)
        parts.append((low, high, keys.index(key), offset))
    parts.sort(key=lambda part: part[0])
    fds = [fd] + [frozen[key] for key in keys[1:]]
    uses_boot = any(source == BOOT for _, _, source, _ in parts)
    files = [list(key) for key in keys]
    boot = boot_identity if uses_boot else []
    live = LiveMemory(os.getpid(), fds, parts, boot, files, process_secret().hex())
    return live, keys[0], mapped_keys


# -- the forked kernel ------------------------------------------------------------------------


def open_files(live: LiveMemory) -> list[int]:
    """The forking kernel's frozen checkpoints, opened and checked; OSError or ValueError
    saying why they cannot be used (the forking kernel has ended, most often)."""
    opened: list[int] = []
    try:
        for index, number in enumerate(live.fds):
            opened.append(_open_frozen(live.pid, number))
            status = os.fstat(opened[-1])
            if [status.st_dev, status.st_ino] != live.files[index]:
                raise ValueError("its memory is not the file the forking kernel froze")
            name = "/memfd:" + file_name(bytes.fromhex(live.secret))
            if os.readlink(f"/proc/self/fd/{opened[-1]}") not in (name, f"{name} (deleted)"):
                raise ValueError(
                    "its memory was frozen by another session than the one that wrote the"
                    " image (the image's secret is not that memory's)"
                )
            ends = [o + e - b for b, e, source, o in live.parts if source == index]
            if status.st_size < max(ends, default=0):
                raise ValueError("its memory is smaller than its parts")
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    return opened


def _open_frozen(pid: int, number: int) -> int:
    try:
        fd = os.open(f"/proc/{pid}/fd/{number}", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ValueError("the kernel that forked it has ended (or let go of its memory)") from None
    try:
        status = os.fstat(fd)
        name = os.readlink(f"/proc/self/fd/{fd}")
        if not stat.S_ISREG(status.st_mode) or not name.startswith(MEMFD_NAME):
            raise ValueError("its memory is not a wasm-kernel checkpoint")
        if status.st_uid != os.getuid():
            raise ValueError("its memory belongs to another user")
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALED != SEALED:
            raise ValueError("its memory is not sealed against writes")
    except BaseException:
        os.close(fd)
        raise
    return fd


def map_parts(base: int, live: LiveMemory, files: list[int], boot_file: Path | None) -> None:
    """Map every part of ``live`` over guest memory at ``base`` (grown to its size already),
    privately: reads share the files' pages, writes stay this kernel's."""
    boot_fd = -1
    if any(source == BOOT for _, _, source, _ in live.parts):
        if boot_file is None:
            raise ValueError("its memory maps a boot image this kernel does not have")
        boot_fd = os.open(boot_file, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        if boot_fd >= 0:
            status = os.fstat(boot_fd)
            found = [status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns]
            if not stat.S_ISREG(status.st_mode) or found != live.boot:
                raise ValueError("it was forked with another boot image than this kernel's")
            boot_ends = [o + e - b for b, e, source, o in live.parts if source == BOOT]
            if max(boot_ends) > found[2]:
                raise ValueError("its boot parts pass the boot image's end")
        for start, end, source, offset in live.parts:
            fd = boot_fd if source == BOOT else files[int(source)]
            map_file(base + start, end - start, fd, offset)
    finally:
        if boot_fd >= 0:
            os.close(boot_fd)
