"""What a service request adds to the private /tmp, so that it can be taken back.

Completion, inspection and user_expressions run the user's code (a ``__repr__``, a property)
where no cell shows it: when such a turn takes /tmp past its size limit, the scratch watch
stops it as it stops a cell, but nobody is there to read "delete some files". So during a
service turn the descriptor guard (descriptors.py) notes every file it lets the guest create
or open for writing in /tmp, and every folder and link made there, with the size each file
had before; the files held open for writing since earlier cells are noted when the turn
begins, and what the host's half of the notebook's layer may write in /tmp for a call (a
copy-up and the folders above it) before it writes. If the turn ends past the limit,
``undo`` puts every noted file back to its earlier size and removes what the turn created:
/tmp is as the turn found it, in size.

Paths are host paths inside the private /tmp (see host_paths.py); the guest cannot make
links there, and nothing here follows one.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable

_CREATED = -1  # size noted for what did not exist before the turn
_OPEN_FILE = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class ScratchJournal:
    """Notes for one service turn at a time; ``note`` does nothing outside one."""

    def __init__(self) -> None:
        self._active = False
        self._noted: dict[bytes, int] = {}  # host path -> size before the turn, or _CREATED

    @property
    def active(self) -> bool:
        """Whether a service turn is being noted."""
        return self._active

    def begin(self, held: Iterable[bytes]) -> None:
        """A service turn starts; ``held`` are the files the guest holds open for writing."""
        self._active = True
        self._noted = {}
        for path in held:
            self.note(path)

    def end(self) -> None:
        self._active = False
        self._noted = {}

    def note(self, path: bytes) -> None:
        """The turn may create ``path`` or make it grow: remember what it was."""
        if not self._active or path in self._noted:
            return
        try:
            status = os.lstat(path)
        except FileNotFoundError:
            self._noted[path] = _CREATED
            return
        except OSError:
            return  # cannot be looked at: nor can it be put back
        if stat.S_ISREG(status.st_mode):
            self._noted[path] = status.st_size

    def undo(self) -> None:
        """Put back every noted file's size; remove what the turn created (newest first)."""
        for path, size in reversed(list(self._noted.items())):
            with contextlib.suppress(OSError):
                if size == _CREATED:
                    _remove(path)
                else:
                    _truncate(path, size)
        self.end()


def _remove(path: bytes) -> None:
    status = os.lstat(path)
    if stat.S_ISDIR(status.st_mode):
        os.rmdir(path)  # empty by now: what the turn put in it went first
    else:
        os.unlink(path)


def _truncate(path: bytes, size: int) -> None:
    descriptor = os.open(path, _OPEN_FILE)
    try:
        if stat.S_ISREG(os.fstat(descriptor).st_mode) and os.fstat(descriptor).st_size > size:
            os.ftruncate(descriptor, size)
    finally:
        os.close(descriptor)
