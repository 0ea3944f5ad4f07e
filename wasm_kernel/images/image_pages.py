"""An image's stored pages, ready for the resumed guest to map.

An image stores the pages that differ from a fresh instance, each extent either as a zstd
frame or raw (``images``). The frames are decompressed, a thread per core, straight into a
memfd at their own offsets (holes elsewhere); the raw extents are mapped from the image file
itself where nobody else can change it (else copied into the memfd too). Resuming maps each
extent copy-on-write over guest memory, as a fork maps its parent's frozen checkpoint:
nothing is copied into guest memory, and the first checkpoint finds those pages another
file's view rather than copying them into its own. Those copies (the file into a buffer, the
pages into bytes, then into guest memory, then into the checkpoint) took longer than
decompressing: ~350 ms against ~250 ms for 108 MiB of pages; mapping raw pages takes
neither, and the page cache holds them once for every kernel resumed from the image.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import zstandard

from ..memory.cow import MAX_FOREIGN_PARTS, map_file

Extent = tuple[int, int]  # [start, end) of guest memory, in bytes
MAX_THREADS = 4  # decompressing threads at most (zstd releases the GIL while it works)


@dataclass(frozen=True)
class RawFile:
    """An open image file whose raw extents start at ``offset``; ``mappable`` if nobody else
    can change or truncate it (see ``images``), else its pages are copied."""

    fd: int
    offset: int
    mappable: bool


class ImagePages:
    """The stored pages of an image's extents: the decompressed ones in a file of the memory's
    size, the raw ones in the image file (or that file too); the files are closed by
    ``close`` or when this object is collected."""

    def __init__(
        self,
        memory_size: int,
        frames: list[tuple[int, int, memoryview]],
        raw: list[tuple[int, int, int]] | None = None,
        raw_file: RawFile | None = None,
    ):
        """Decompress ``frames`` ((start, end, zstd frame)) and take ``raw`` ((start, end,
        offset in ``raw_file``)): page-aligned, ordered, disjoint, within the memory's size,
        as checked already; each frame must hold exactly its bytes. Raises ValueError for one
        that does not, zstandard.ZstdError for a damaged one, OSError where no file can be
        had or read."""
        raw = raw or []
        self.extents: list[Extent] = sorted(
            [(start, end) for start, end, _ in frames] + [(start, end) for start, end, _ in raw]
        )
        self._sources: dict[int, tuple[int, int]] = {}  # extent start -> (file, offset)
        self._fd = _anonymous_file()
        self._open = [self._fd]  # closed with this object
        self._closer = weakref.finalize(self, _close, self._open)
        try:
            os.ftruncate(self._fd, memory_size)
            if raw and raw_file is None:
                raise ValueError("raw extents without their file")
            mapped = raw_file is not None and raw_file.mappable and bool(raw)
            if mapped:
                assert raw_file is not None
                self._open.append(os.dup(raw_file.fd))
            copied = [] if mapped else raw
            if frames or copied:
                self._fill(memory_size, frames, copied, raw_file)
            for start, _, _ in frames:
                self._sources[start] = (self._fd, start)
            for start, _, offset in raw:
                self._sources[start] = (self._open[1], offset) if mapped else (self._fd, start)
        except BaseException:
            self.close()
            raise

    def _fill(
        self,
        memory_size: int,
        frames: list[tuple[int, int, memoryview]],
        copied: list[tuple[int, int, int]],
        raw_file: RawFile | None,
    ) -> None:
        """Decompress ``frames`` and read the ``copied`` raw extents into the memfd."""
        with mmap.mmap(self._fd, memory_size) as area:
            view = memoryview(area)
            try:
                threads = min(len(frames) + len(copied), os.cpu_count() or 1, MAX_THREADS)
                with ThreadPoolExecutor(threads, thread_name_prefix="image-pages") as pool:
                    done = [
                        pool.submit(_inflate_into, frame, view, start, end)
                        for start, end, frame in frames
                    ]
                    done += [
                        pool.submit(_read_into, raw_file.fd, offset, view, start, end)
                        for start, end, offset in copied
                        if raw_file is not None  # always, where there are any
                    ]
                    for future in done:
                        future.result()
            finally:
                view.release()

    @property
    def size(self) -> int:
        """Bytes stored."""
        return sum(end - start for start, end in self.extents)

    def read(self, start: int, end: int) -> bytes:
        """The stored extent ``[start, end)`` of guest memory as the image has it."""
        fd, offset = self._sources[start]
        return os.pread(fd, end - start, offset)

    def map_into(self, base: int) -> None:
        """Each extent over guest memory at ``base``, copy-on-write; copied in instead where
        there are so many that their mappings would crowd the process (see cow)."""
        places = [(start, end, *self._sources[start]) for start, end in self.extents]
        if len(places) <= MAX_FOREIGN_PARTS:
            for start, end, fd, offset in places:
                map_file(base + start, end - start, fd, offset)
            return
        for start, end, fd, offset in places:
            target = (ctypes.c_char * (end - start)).from_address(base + start)
            if os.preadv(fd, [target], offset) != end - start:
                raise OSError("the image's pages file is shorter than its extents")

    def close(self) -> None:
        """Let the files go (mappings of them keep them for as long as they last)."""
        self._closer()


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _anonymous_file() -> int:
    """A file in memory only (a memfd; a deleted temporary file where there is none)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("wasm-kernel-image-pages", os.MFD_CLOEXEC)
    with tempfile.TemporaryFile() as file:
        return os.dup(file.fileno())


def _inflate_into(frame: memoryview, view: memoryview, start: int, end: int) -> None:
    """Decompress one zstd frame into ``view[start:end]``, which it must fill exactly."""
    size = end - start
    if zstandard.frame_content_size(frame) != size:
        raise ValueError("a memory extent has the wrong size")
    reader = zstandard.ZstdDecompressor().stream_reader(frame)
    with view[start:end] as target:
        filled = 0
        while filled < size:
            got = reader.readinto(target[filled:])
            if not got:
                raise ValueError("compressed data shorter than it says")
            filled += got
    if reader.read(1):
        raise ValueError("compressed data longer than it says")


def _read_into(fd: int, offset: int, view: memoryview, start: int, end: int) -> None:
    """Read ``end - start`` bytes of ``fd`` from ``offset`` into ``view[start:end]``."""
    with view[start:end] as target:
        filled = 0
        while filled < end - start:
            got = os.preadv(fd, [target[filled:]], offset + filled)
            if not got:
                raise OSError("the image file is shorter than its raw extents")
            filled += got
