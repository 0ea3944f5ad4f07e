"""Opening files that others could have placed: the host's side of hostile input.

An image to resume, a snapshot folder's entries: a name there may be a symbolic link to a
file elsewhere, a device that never ends (``/dev/zero``) or a FIFO that blocks the reader for
ever. So such files are opened without following a link and without blocking, taken only if
they are regular files, and read no further than a bound known beforehand. A tree's files
are compared with what was recorded of them (``file_stamps``) without following links either.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotAFile(OSError):
    """A name that is not a regular file of its own (a link, a device, a FIFO, a folder)."""


def open_regular(path: Path | str, flags: int = os.O_RDONLY) -> int:
    """A descriptor on the regular file ``path``, opened without following a link or
    blocking; raises NotAFile for anything else. A device is refused before it is opened
    (opening some has effects); what is opened is checked again. With O_CREAT in ``flags``
    a missing file is created (mode 0600)."""
    try:
        before = os.lstat(path).st_mode
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
        before = stat.S_IFREG
    if stat.S_ISLNK(before):
        raise NotAFile(errno.ELOOP, f"{path} is a symbolic link")
    if not stat.S_ISREG(before):
        raise NotAFile(errno.EINVAL, f"{path} is {_kind(before)}, not a regular file")
    try:
        fd = os.open(path, flags | _NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since
            raise NotAFile(errno.ELOOP, f"{path} is a symbolic link") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotAFile(errno.EINVAL, f"{path} is {_kind(mode)}, not a regular file")
    os.set_blocking(fd, True)  # a regular file: reads never wait for a writer
    return fd


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def read_exactly(fd: int, into: memoryview) -> None:
    """Fill ``into`` from ``fd``; a file that ends sooner (it shrank while read) is an error."""
    done = 0
    while done < len(into):
        count = os.readv(fd, [into[done:]])
        if count == 0:
            raise OSError(errno.EIO, "the file became shorter while it was read")
        done += count


def file_stamps(folder: Path, suffix: str = "") -> dict[str, list[int]]:
    """Size and modification time (ns) of every file under ``folder`` whose name ends with
    ``suffix``, by path from ``folder``: whether a tree changed, at a stat per file (one
    ``scandir`` per folder; links are not followed)."""
    stamps = {}
    folders = [str(folder)]
    prefix = len(str(folder)) + 1
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.path)
                elif entry.name.endswith(suffix):
                    status = entry.stat(follow_symlinks=False)
                    stamps[entry.path[prefix:]] = [status.st_size, status.st_mtime_ns]
    return stamps
