"""Writing interpreter images (the format is ``images``', which reads and checks them).

An image is streamed into its file piece by piece: memory extents are written straight from
the guest's memory, the private ``/tmp`` is archived straight from its files, so a save costs
the host a small, fixed amount of memory whatever the size of the guest's state (building the
file in memory took over four times the state at its peak).

Memory is written raw, page-aligned, for a resume to map rather than read. Measured on the
bench's images (a 2-core machine under load, 2026-11-28): compressing the extents with zstd
level 1 made the numpy+pandas+64 MiB image 62 MiB on disk instead of 123 MiB, and an idle
session's 17 MiB instead of 45 MiB, but its resume spent 250-500 ms reading, summing and
decompressing them (1.2-1.6x a native kernel's start), where mapping them costs 2-5 ms
(0.34-0.45x); keeping zstd for only the frames it shrinks to an eighth or less saved 11 MiB
of the 123 and cost ~30 ms. ``images`` still reads compressed extents (format 1).

The header comes first in the file but holds the compressed size of the blobs after it,
known only once they are written: the writer reserves room for the header with each size at
its worst case, writes the blobs after that room, then fills it with the real header padded
with spaces (which JSON ignores), and reads the checked part back for its checksum.
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
import stat
import struct
import tarfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import zstandard

from ..memory.live_memory import LiveMemory
from .image_fields import PAGE, HostState
from .images import CHECKSUM, FIRST_FORMAT, FORMAT, MAGIC, PREFIX, raw_offset
from .names import ImageError

COMPRESSION = 1  # zstd level (history, /tmp): saving fast matters more than the last few per cent
CHUNK = 1 << 20  # most stand-in bytes handed to the tar writer at a time while measuring
_ZEROS = memoryview(bytes(CHUNK))


@contextmanager
def staged(path: Path, mode: int) -> Iterator[BinaryIO]:
    """A new file for ``path``'s next contents, under a hidden name beside it: renamed onto
    ``path`` when the block ends, removed if it raises. Whatever holds the staging name already
    (a file a killed save left, a planted link) is removed, never written through."""
    staging = path.with_name(f".{path.name}.partial")
    staging.unlink(missing_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(staging, flags, mode)
    try:
        with open(fd, "w+b") as out:
            os.fchmod(out.fileno(), mode)  # whatever the umask
            yield out
        staging.replace(path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def changed_extents(memory: bytes | memoryview, base: bytes | mmap.mmap) -> list[tuple[int, int]]:
    """(first page, page count) runs of ``memory`` that differ from ``base`` (zero past its end).

    Pages are compared as bytes (memcmp); memoryviews would compare byte by byte."""
    zero = bytes(PAGE)
    runs: list[tuple[int, int]] = []
    for page in range(len(memory) // PAGE):
        start = page * PAGE
        reference = base[start : start + PAGE] if start < len(base) else zero
        if bytes(memory[start : start + PAGE]) == reference:
            continue
        if runs and runs[-1][0] + runs[-1][1] == page:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((page, 1))
    return runs


class _Sink:
    """Counts what a tar writer writes, passing it on to ``target`` if there is one."""

    def __init__(self, target: BinaryIO | zstandard.ZstdCompressionWriter | None):
        self.target = target
        self.count = 0

    def write(self, data: bytes | memoryview) -> int:
        if self.target is not None:
            self.target.write(data)
        self.count += len(data)
        return len(data)

    def tell(self) -> int:
        return self.count


class _Zeros:
    """Stands in for a file's data while only the archive's size is measured."""

    def __init__(self, size: int):
        self.left = size

    def read(self, count: int) -> memoryview:
        count = min(count, self.left, CHUNK)
        self.left -= count
        return _ZEROS[:count]


@dataclass
class ScratchArchive:
    """The private ``/tmp``, listed and measured when the save begins, archived (tar) when
    the image is written: the tar's size goes in its zstd frame, for the reader to check
    before it inflates anything. Links and special files are left out."""

    members: list[tuple[Path, tarfile.TarInfo]]
    size: int

    @classmethod
    def of(cls, folder: Path, limit: int) -> ScratchArchive:
        """``folder``'s files and folders, refused past ``limit`` bytes of content."""
        try:
            members = _members(folder, limit)
            measured = _Sink(None)
            _write_tar(members, measured, lambda _, size: nullcontext(_Zeros(size)))
        except OSError as exc:
            raise ImageError(f"cannot archive the private /tmp: {exc.strerror or exc}") from None
        return cls(members, measured.count)

    def write(self, out: BinaryIO) -> int:
        """The archive as one zstd frame at ``out``'s position; returns its compressed size."""
        start = out.tell()
        try:
            with _compressor().stream_writer(out, size=self.size, closefd=False) as frame:
                _write_tar(self.members, _Sink(frame), _open_member)
        except zstandard.ZstdError:  # the size measured at first is not what was written
            raise ImageError("the private /tmp changed while it was being saved") from None
        except OSError as exc:
            raise ImageError(f"cannot archive the private /tmp: {exc.strerror or exc}") from None
        return out.tell() - start


def _members(folder: Path, limit: int) -> list[tuple[Path, tarfile.TarInfo]]:
    """The plain files and folders under ``folder``, each with its tar header."""
    members = []
    total = 0
    # an archive of nothing, for its gettarinfo (which reads a file's metadata, not its data)
    with tarfile.open(fileobj=io.BytesIO(), mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(folder.rglob("*")):
            kind = path.lstat().st_mode
            if not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
                continue
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(folder)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isfile():
                total += info.size
                if limit and total > limit:
                    raise ImageError(
                        f"the private /tmp holds more than {limit >> 20} MiB; delete files there"
                        " before saving"
                    )
            members.append((path, info))
    return members


def _write_tar(
    members: list[tuple[Path, tarfile.TarInfo]],
    sink: _Sink,
    opener: Callable[[Path, int], AbstractContextManager[Any]],
) -> None:
    with tarfile.open(fileobj=cast(BinaryIO, sink), mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, info in members:
            if info.isfile():
                with opener(path, info.size) as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)


def _open_member(path: Path, size: int) -> BinaryIO:
    """A file of the archive, opened without following a link, checked to be the regular
    file of ``size`` bytes that was listed."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or found.st_size != size:
        os.close(fd)
        raise ImageError("the private /tmp changed while it was being saved")
    return open(fd, "rb")


def _compressor() -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=COMPRESSION)


def _worst_case(size: int) -> int:
    """At least the compressed size of ``size`` bytes in one zstd frame (its compress bound
    is the size plus 1/256 and a few hundred bytes)."""
    return size + (size >> 7) + (64 << 10)


def _write_raw(out: BinaryIO, view: memoryview, runs: list[tuple[int, int]]) -> str:
    """The pages of ``runs`` as they are, at ``out``'s position; returns their sha256 (hex)."""
    digest = hashlib.sha256()
    for first, count in runs:
        pages = view[first * PAGE : (first + count) * PAGE]
        digest.update(pages)
        out.write(pages)
    return digest.hexdigest()


def _digest_of_start(out: BinaryIO, end: int) -> bytes:
    """The sha256 of ``out``'s first ``end`` bytes, read back a piece at a time."""
    digest = hashlib.sha256()
    out.seek(0)
    left = end
    while left > 0:
        chunk = out.read(min(left, CHUNK))
        if not chunk:
            raise ImageError("the image file is shorter than what was written to it")
        digest.update(chunk)
        left -= len(chunk)
    return digest.digest()


def write_image(
    out: BinaryIO,
    *,
    needs: dict[str, object],
    mounts: list[str],
    memory: bytes | memoryview,
    base: bytes | mmap.mmap,
    globals_: dict[str, int],
    host: HostState,
    scratch: ScratchArchive,
    taken: str,
    memory_file: Path | None = None,
    live: LiveMemory | None = None,
    base_digest: str = "",
) -> None:
    """The image file, written into ``out`` (an empty file open for reading and writing).
    With ``memory_file`` (a boot image), the memory goes there as raw pages instead, for
    kernels to map, and the image only says that it lives elsewhere; with ``live`` (a fork),
    it stays where it is, and the image says where (``live_memory``). Pages equal to
    ``base`` (zero past its end) are left out: a fresh instance's memory, or, with
    ``base_digest`` (its sha256), a boot image's memory file, which a resume maps first."""
    view = memoryview(memory)
    runs: list[tuple[int, int]] = []
    file_digest = ""
    if memory_file is not None:
        file_digest = write_memory_file(memory_file, view)
    elif live is None:
        runs = changed_extents(view, base)
    history = _compressor().compress(json.dumps(host.history).encode())

    def header(digest: str, scratch_length: int) -> bytes:
        return json.dumps(
            {
                "needs": needs,
                "mounts": mounts,
                "taken": taken,
                "memory": {
                    "size": len(view),
                    "extents": [],  # zstd frames: read, not written (see the module's doc)
                    "raw": [list(run) for run in runs],
                    "raw_sha256": digest,
                    "separate": memory_file is not None,
                    **({"file_sha256": file_digest} if file_digest else {}),
                    **({"base": base_digest} if base_digest else {}),
                    **({"live": live.header()} if live is not None else {}),
                },
                "globals": globals_,
                "host": {
                    "execution_count": host.execution_count,
                    "cwd": host.cwd,
                    "clocks": {str(clock): value for clock, value in host.clocks.items()},
                    "packages": host.packages,
                    "held_files": [held.fields() for held in host.held_files],
                },
                "history": len(history),
                "scratch": scratch_length,
            }
        ).encode()

    room = len(header("0" * 64, _worst_case(scratch.size)))
    out.seek(PREFIX + room)
    out.write(history)
    scratch_length = scratch.write(out)
    checked_end = out.tell()  # the checksum goes here, the raw pages after it
    digest = ""
    if runs:
        out.seek(raw_offset(checked_end + CHECKSUM))
        digest = _write_raw(out, view, runs)
    encoded = header(digest, scratch_length)
    if len(encoded) > room:  # only if zstd wrote more than its own bound
        raise ImageError("the image's header outgrew the room kept for it")
    out.seek(0)
    # without raw extents or a base, older kernels read it as they did
    version = FORMAT if runs or base_digest else FIRST_FORMAT
    out.write(MAGIC + struct.pack("<II", version, room) + encoded.ljust(room))
    out.flush()
    checksum = _digest_of_start(out, checked_end)
    out.seek(checked_end)
    out.write(checksum)
    out.flush()


def write_memory_file(path: Path, memory: memoryview) -> str:
    """Raw pages, zero pages left as holes (the file is sparse), written under a temporary name
    and renamed: a kernel mapping the previous file keeps reading that one. Returns the
    sha256 (hex) of what it holds: images that build on the file name it so."""
    zero = bytes(PAGE)
    digest = hashlib.sha256()
    # shared by every user of the cache, as the compiled module is
    with staged(path, 0o644) as out:
        for start in range(0, len(memory), PAGE):
            page = memory[start : start + PAGE]
            digest.update(page)
            if bytes(page) == zero:  # memcmp, where a memoryview compares item by item
                out.seek(PAGE, io.SEEK_CUR)
            else:
                out.write(page)
        out.truncate(len(memory))
    return digest.hexdigest()
