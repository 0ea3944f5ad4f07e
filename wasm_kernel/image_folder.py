"""The folder of saved images (``%snapshot``, hibernated sessions): names, listing, a quota
over all of them. The images themselves are ``images``' business."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .image_writer import staged
from .images import SUFFIX, ImageError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_name(name: str) -> str:
    """A snapshot name: letters, digits, '.', '_', '-' (not first), up to 64; no paths."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise ImageError(
            f"{name[:80]!r} is not a snapshot name: use up to 64 letters, digits, '.', '_' or"
            " '-', starting with a letter or digit"
        )
    return name


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

    def entries(self) -> list[Entry]:
        try:
            paths = sorted(self.directory.glob("*" + SUFFIX))
        except OSError:
            return []
        found = []
        for path in paths:
            try:
                stat = path.stat()
            except OSError:
                continue
            found.append(Entry(path.name[: -len(SUFFIX)], path, stat.st_size, stat.st_mtime))
        return found

    def used(self, besides: Path | None = None) -> int:
        return sum(entry.size for entry in self.entries() if entry.path != besides)

    def store(
        self,
        name: str,
        write: Callable[[BinaryIO], None],
        admit: Callable[[int], None] | None = None,
    ) -> Path:
        """Write an image under ``name`` (replacing one of that name) within the quota:
        ``write`` streams it into a staging file, ``admit`` may refuse (or make room for) its
        size before the quota is checked, and only then does it take the name."""
        target = self.path(name)
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            with staged(target, 0o600) as out:
                write(out)
                size = os.fstat(out.fileno()).st_size
                if admit is not None:
                    admit(size)
                used = self.used(besides=target)
                if self.quota and used + size > self.quota:
                    raise ImageError(
                        f"saving {name!r} ({size / (1 << 20):.1f} MiB) would pass the snapshot"
                        f" quota of {self.quota / (1 << 20):.0f} MiB ({used / (1 << 20):.1f} MiB"
                        " in use). Delete snapshots (%snapshot delete NAME) or raise"
                        " --WasmKernel.snapshot_quota."
                    )
        except OSError as exc:
            raise ImageError(f"cannot write {target}: {exc.strerror or exc}") from None
        return target

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
        entries = self.entries()
        if not entries:
            return f"No snapshots in {self.directory}."
        lines = [f"{entry.name}  {entry.size / (1 << 20):.1f} MiB" for entry in entries]
        quota = f" of {self.quota / (1 << 20):.0f} MiB" if self.quota else ""
        lines.append(f"{self.used() / (1 << 20):.1f} MiB used{quota} in {self.directory}")
        return "\n".join(lines)
