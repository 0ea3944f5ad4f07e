"""The per-user cache of downloaded wheels, by sha256, shared between a user's kernels: a
folder of the user's only (0700), made so whatever the umask (what a user installs is theirs
to know)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

from ..files import host_files
from ..files.private_files import private_folder
from .wheels import PackageError


class WheelCache:
    """Downloaded wheels, per user, by sha256: shared between kernels, checked on every use,
    and trimmed least recently used first to what the user's quota leaves."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _place(self, sha256: str, filename: str) -> Path:
        return self.folder / sha256[:2] / sha256 / filename

    def get(self, sha256: str | None, filename: str) -> Path | None:
        if not sha256 or not re.fullmatch(r"[0-9a-f]{64}", sha256) or not plain_name(filename):
            return None
        path = self._place(sha256, filename)
        if path.is_file() and not path.is_symlink() and file_sha256(path) == sha256:
            with contextlib.suppress(OSError):  # its time of last use, for trimming
                os.utime(path)
            return path
        return None

    def trim(self, limit: int) -> None:
        """Remove the least recently used wheels until the cache holds at most ``limit``
        bytes (another kernel reading one keeps its open file)."""
        wheels = []
        for path in self.folder.glob("??/*/*.whl"):
            with contextlib.suppress(OSError):
                status = path.stat()
                wheels.append((status.st_mtime, status.st_size, path))
        total = sum(size for _, size, _ in wheels)
        for _, size, path in sorted(wheels):
            if total <= limit:
                break
            try:
                path.unlink()
            except OSError:
                continue
            total -= size
            with contextlib.suppress(OSError):
                path.parent.rmdir()

    def put(self, path: Path, sha256: str) -> Path:
        """Copy a downloaded wheel in (atomically: another kernel may be reading)."""
        place = self._place(sha256, path.name)
        private_folder(self.folder)
        place.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=place.parent, prefix=".incoming-")
        with os.fdopen(handle, "wb") as out, open(path, "rb") as source:
            shutil.copyfileobj(source, out)
        os.replace(temporary, place)
        return place


def open_regular(path: Path) -> BinaryIO:
    """A wheel file opened for reading: never through a link, and only a regular file."""
    try:
        descriptor = host_files.open_regular(path)
    except host_files.NotAFile:
        raise PackageError(f"{path.name} is not a regular file") from None
    except OSError as exc:
        raise PackageError(f"{path.name} cannot be opened: {exc.strerror}") from None
    return os.fdopen(descriptor, "rb")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open_regular(path) as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def plain_name(filename: str) -> bool:
    """A file name that is only a name: no folder, no way up, nothing hidden in it."""
    return (
        filename not in ("", ".", "..")
        and "/" not in filename
        and "\\" not in filename
        and filename.isprintable()
    )
