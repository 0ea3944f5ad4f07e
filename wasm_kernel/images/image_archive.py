"""The private ``/tmp`` inside an image: checking its tar archive and unpacking it.

The archive is hostile input. tar lets a member declare any size (a PAX header can make it
negative) and a sparse member unpacks to far more than it stores, so a sum of declared sizes
says little. Here only plain files and folders are taken, each with a size inside the archive
itself, and what they will take on disk (at least a block per file or folder, as the scratch
limit counts) is summed before anything is written; the unpack counts again as it writes and
stops at the same limit, so a flaw in the check cannot fill the host's disk either.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path, PurePosixPath

from .names import ImageError

MAX_MEMBERS = 100_000  # files and folders an unpack may create
MAX_GUEST_PATH = 4096
BLOCK = 4096  # the least a file or folder takes on disk, as scratch.py measures it
_PLAIN = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


def footprint(size: int) -> int:
    """Bytes a file of ``size`` bytes (or a folder, 0) takes on disk, as the limit counts."""
    return max(BLOCK, -(-size // BLOCK) * BLOCK)


class TooLarge(ValueError):
    """An archive past the kernel's limits: not malformed, too large for this kernel."""


class _Budget:
    """What an archive may take: ``limit`` bytes (0: no limit) in at most MAX_MEMBERS."""

    def __init__(self, limit: int, what: str):
        self.limit, self.what = limit, what
        self.used = self.entries = 0

    def charge(self, size: int) -> None:
        self.entries += 1
        self.used += footprint(size)
        if self.entries > MAX_MEMBERS:
            raise TooLarge(
                f"the image's /tmp {self.what} more than {MAX_MEMBERS} files and folders"
            )
        if self.limit and self.used > self.limit:
            raise TooLarge(
                f"the image's /tmp {self.what} more than this kernel's /tmp limit of"
                f" {self.limit >> 20} MiB (--WasmKernel.scratch_limit)"
            )


def _members(archive: bytes) -> tarfile.TarFile:
    return tarfile.open(fileobj=io.BytesIO(archive), mode="r:")


def _checked_member(member: tarfile.TarInfo, archive_size: int) -> PurePosixPath:
    """The member's relative path, if it is a plain file or folder inside /tmp whose data
    lies inside the archive; raises ValueError otherwise."""
    shown = repr(member.name[:80])
    if member.type not in _PLAIN or member.sparse is not None:
        raise ValueError(f"archive member {shown} is not a plain file or folder")
    name = PurePosixPath(member.name)
    if (
        not name.parts
        or name.is_absolute()
        or ".." in name.parts
        or len(member.name) > MAX_GUEST_PATH
        or "\0" in member.name
    ):
        raise ValueError(f"archive member {shown} escapes /tmp")
    if member.size < 0 or (member.isdir() and member.size != 0):
        raise ValueError(f"archive member {shown} declares a size of {member.size} bytes")
    if member.size > archive_size - member.offset_data:
        raise ValueError(f"archive member {shown} declares {member.size} bytes it does not hold")
    return name


def check_archive(archive: bytes, limit: int) -> None:
    """Refuse anything but plain files and folders under /tmp that fit ``limit`` bytes on
    disk (0: no limit); raises ValueError (TooLarge for an archive past the limits)."""
    budget = _Budget(limit, "holds")
    with _members(archive) as tar:
        for member in tar:
            _checked_member(member, len(archive))
            budget.charge(member.size if member.isfile() else 0)


def unpack(archive: bytes, folder: Path, limit: int) -> None:
    """Extract a checked archive into ``folder`` (files private to this user), writing no
    more than ``limit`` bytes on disk (0: no limit) whatever the archive says; raises
    OSError, ValueError or tarfile.TarError."""
    budget = _Budget(limit, "would take")
    made: set[PurePosixPath] = set()  # folders known to exist, so each is counted once

    def folders(name: PurePosixPath) -> None:
        for parent in reversed([name, *name.parents][:-1]):  # "a", "a/b", ... name
            if parent not in made:
                try:
                    folder.joinpath(parent).mkdir(mode=0o700)
                    budget.charge(0)
                except FileExistsError:
                    pass
                made.add(parent)

    root = folder.resolve()
    with _members(archive) as tar:
        for member in tar:
            name = _checked_member(member, len(archive))
            target = folder.joinpath(name)
            if not target.resolve().is_relative_to(root):
                raise ValueError(f"archive member {member.name[:80]!r} escapes /tmp")
            if member.isdir():
                folders(name)
                continue
            folders(name.parent)
            budget.charge(member.size)  # before a byte of it is written
            source = tar.extractfile(member)
            assert source is not None
            fd = os.open(target, _CREATE, 0o600)
            os.fchmod(fd, 0o600)  # a file of that name may exist (a member given twice)
            with source, open(fd, "wb") as out:
                left = member.size
                while left and (chunk := source.read(min(left, 1 << 20))):
                    out.write(chunk)
                    left -= len(chunk)


def unpack_checked(archive: bytes, folder: Path, limit: int) -> None:
    """``unpack``, what goes wrong said as an ``ImageError``."""
    try:
        unpack(archive, folder, limit)
    except (OSError, ValueError, tarfile.TarError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ImageError(f"cannot unpack the image's /tmp: {reason}") from None
