"""Which host file a guest's path names, so that the host can look at it before wasmtime opens
it (see descriptors.py: a FIFO must never be opened, since the open would block out of reach of
every interrupt).

wasmtime keeps the guest's descriptors and resolves its paths itself; this keeps, beside them,
the host path of each pre-opened folder and of everything opened under one. It is only ever
used to refuse more, never to allow: a path it cannot place (an unknown descriptor, ``..``
leading out, a link out of the folder) is left to wasmtime, which refuses what escapes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

HostPath = tuple[bytes, bytes]  # (the pre-opened folder's real path, the path under it)


def _inside(path: bytes, root: bytes) -> bool:
    return path == root or path.startswith(root.rstrip(b"/") + b"/")


class HostPaths:
    """Host paths of the guest's descriptors: the pre-opened ``folders`` from ``first`` on."""

    def __init__(self, first: int, folders: Sequence[Path]):
        self._paths: dict[int, HostPath] = {}
        self._preopened = range(first, first + len(folders))
        for index, folder in enumerate(folders):
            root = os.fsencode(os.path.realpath(folder))
            self._paths[first + index] = (root, root)

    def resolve(self, fd: int, name: bytes | None) -> HostPath | None:
        """The host path ``name`` (relative to descriptor ``fd``) stands for, if known."""
        known = self._paths.get(fd)
        if known is None or name is None or name.startswith(b"/") or b"\0" in name:
            return None
        root, folder = known
        path = os.path.normpath(folder + b"/" + name)
        return (root, path) if _inside(path, root) else None

    def may_open(self, host: HostPath, follow: bool) -> bool:
        """False for a FIFO, socket or device inside the folder; True for anything else,
        including what cannot be looked at (the real call decides)."""
        root, path = host
        try:
            # links resolved as the real call would: it never leaves the folder
            if not _inside(os.path.realpath(os.path.dirname(path)), root):
                return True
            if follow and not _inside(os.path.realpath(path), root):
                return True
            mode = os.stat(path, follow_symlinks=follow).st_mode
        except (OSError, ValueError):
            return True
        return stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)

    def paths_of(self, fds: Iterable[int]) -> list[bytes]:
        """The host paths of those of ``fds`` that are known."""
        return [self._paths[fd][1] for fd in fds if fd in self._paths]

    def opened(self, fd: int, host: HostPath | None) -> None:
        if host is None:
            self._paths.pop(fd, None)
        else:
            self._paths[fd] = host

    def renamed(self, before: HostPath | None, after: HostPath | None) -> None:
        """Descriptors at or under a renamed path follow it; where the new name cannot be
        placed, they are no longer placed (left to wasmtime, as an unknown descriptor)."""
        if before is None:
            return
        old = before[1]
        for fd, (_, path) in list(self._paths.items()):
            if not _inside(path, old) or fd in self._preopened:
                continue
            if after is None:
                del self._paths[fd]
            else:
                self._paths[fd] = (after[0], after[1] + path[len(old) :])

    def forget(self, fd: int) -> None:
        self._paths.pop(fd, None)

    def move(self, fd: int, to: int) -> None:
        self.opened(to, self._paths.pop(fd, None))
