"""Files and folders the kernel keeps for one user: only that user may read them.

History, snapshots and hibernated sessions, staging files, the kernel server's folder, the
wheel cache: on a shared server every other user has a home next to this one, often 0755, so
a file left at the umask's 0644 is readable by all of them. So these are made 0600 (files)
and 0700 (folders) whatever the umask, missing parents included, and one that exists with a
wider mode (made by an older version, or under another umask) is narrowed on first use, with
one log line. A folder or file that is not this user's is refused: it cannot be narrowed,
and someone else could read or replace what is put in it.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from .host_files import open_regular

log = logging.getLogger(__name__)

FOLDER_MODE = 0o700
_OTHERS = 0o077  # the bits that let anyone but the owner in


class NotPrivate(PermissionError):
    """A folder or file that cannot be made private to this user (someone else's, a link)."""


def private_folder(path: Path, follow_links: bool = True) -> Path:
    """``path`` as a folder of this user's only: made 0700 with its missing parents, or
    narrowed (group and others lose their bits) when it exists wider. ``follow_links``: a
    link to a folder of this user's is taken (a home's ``~/.local`` may be one); else a link
    is refused (for folders in shared places such as /tmp, where another could plant one)."""
    make_parents(path / "_")
    if not follow_links and os.path.islink(path):
        raise NotPrivate(f"{path} is a symbolic link, not a folder of this user's")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _narrow(fd, path)
    finally:
        os.close(fd)
    return path


def make_parents(path: Path) -> None:
    """Make the missing folders on the way to ``path`` 0700, whatever the umask; the
    existing ones are left as they are (they may be the user's own choice, or Jupyter's)."""
    missing = []
    for folder in path.parents:
        if os.path.lexists(folder):
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, FOLDER_MODE)
        except FileExistsError:  # made meanwhile by another kernel
            continue
        os.chmod(folder, FOLDER_MODE)  # whatever the umask took away (0o077 leaves it)


def private_file(path: Path, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """A descriptor on the regular file ``path`` (no link followed), made 0600 when
    ``flags`` create it, narrowed to its owner when it exists wider; its folder must exist."""
    fd = open_regular(path, flags)
    try:
        _narrow(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def narrow_existing(path: Path) -> None:
    """Narrow the regular file ``path`` to its owner if it exists (a database's side files,
    which the database library makes with the main file's mode)."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        _narrow(fd, path)
    finally:
        os.close(fd)


def _narrow(fd: int, path: Path) -> None:
    """Take group's and others' bits off ``fd``'s file; NotPrivate if it is not this user's."""
    status = os.fstat(fd)
    if status.st_uid != os.geteuid():
        raise NotPrivate(
            f"{path} belongs to uid {status.st_uid}, not to this user ({os.geteuid()}): it"
            " cannot be kept private; remove it or give it to this user"
        )
    current = stat.S_IMODE(status.st_mode)
    if current & _OTHERS:
        os.fchmod(fd, current & ~_OTHERS)
        log.warning(
            "%s was open to other users (mode %04o); narrowed to %04o, its owner's only",
            path,
            current,
            current & ~_OTHERS,
        )
