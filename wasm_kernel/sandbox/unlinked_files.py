"""Files of the private /tmp removed while the guest still holds them open.

``tempfile.TemporaryFile`` (and any code that removes a file it keeps using) leaves a file
with no name, which an image could neither archive nor open again. So a removal of a /tmp
file the guest holds open moves it into a folder of /tmp instead (``HELD``), where it
counts against the scratch quota as natively it would still count against the disk, images
carry it with the rest of /tmp, and it goes when its last descriptor is closed.

The host does the moving, inside the folder that is the guest's /tmp, by descriptor of that
folder; the guest cannot make symbolic links (``SymlinkRefusal``), and nothing here follows
one: the folder is opened with O_NOFOLLOW and only a regular file is moved.
"""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ..files.mounts import SCRATCH

if TYPE_CHECKING:
    from collections.abc import Iterator

HELD = ".wasm-kernel-held"  # in /tmp
HELD_GUEST = f"{SCRATCH}/{HELD}/"
NAMES_TRIED = 1000


class UnlinkedFiles:
    """Moves files out of the guest's sight and removes them when it lets go."""

    def __init__(self, folder: Path):
        self.folder = folder  # the host folder that is the guest's /tmp

    def hold(self, guest_path: str) -> str | None:
        """Move the regular file at ``guest_path`` (in /tmp) aside; its new guest path, or
        None where it is not one (the removal then goes ahead as asked)."""
        if not guest_path.startswith(SCRATCH + "/") or guest_path.startswith(HELD_GUEST):
            return None
        inner = guest_path[len(SCRATCH) + 1 :]
        try:
            with self._opened() as root:
                if not stat.S_ISREG(os.stat(inner, dir_fd=root, follow_symlinks=False).st_mode):
                    return None
                try:
                    os.mkdir(HELD, 0o700, dir_fd=root)
                except FileExistsError:
                    pass
                for number in range(NAMES_TRIED):
                    name = f"{HELD}/{number}"
                    try:
                        os.stat(name, dir_fd=root, follow_symlinks=False)
                    except FileNotFoundError:
                        os.rename(inner, name, src_dir_fd=root, dst_dir_fd=root)
                        return f"{SCRATCH}/{name}"
        except OSError:
            return None
        return None

    def release(self, guest_path: str) -> None:
        """Remove a held file, its last descriptor closed."""
        if not guest_path.startswith(HELD_GUEST):
            return
        try:
            with self._opened() as root:
                os.unlink(guest_path[len(SCRATCH) + 1 :], dir_fd=root)
        except OSError:
            pass

    @contextmanager
    def _opened(self) -> Iterator[int]:
        root = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            yield root
        finally:
            os.close(root)
