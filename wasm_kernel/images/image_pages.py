"""An image's stored pages, decompressed into a file that the resumed guest maps.

An image stores the pages that differ from a fresh instance as zstd frames, one per extent.
They are decompressed, a thread per core, straight into a memfd at their own offsets (holes
elsewhere), and resuming maps each extent copy-on-write over guest memory, as a fork maps its
parent's frozen checkpoint: nothing is copied into guest memory, and the first checkpoint
finds those pages another file's view rather than copying them into its own. Those copies
(the file into a buffer, the pages into bytes, then into guest memory, then into the
checkpoint) took longer than decompressing: ~350 ms against ~250 ms for 108 MiB of pages.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile
import weakref
from concurrent.futures import ThreadPoolExecutor

import zstandard

from ..memory.cow import MAX_FOREIGN_PARTS, map_file

Extent = tuple[int, int]  # [start, end) of guest memory, in bytes
MAX_THREADS = 4  # decompressing threads at most (zstd releases the GIL while it works)


class ImagePages:
    """The decompressed pages of an image's extents, in a file of the memory's size; the file
    is closed by ``close`` or when this object is collected."""

    def __init__(self, memory_size: int, frames: list[tuple[int, int, memoryview]]):
        """Decompress ``frames`` ((start, end, zstd frame): page-aligned, ordered, within the
        memory's size, as checked already); each must hold exactly its bytes. Raises
        ValueError for one that does not, zstandard.ZstdError for a damaged one, OSError
        where no file can be had."""
        self.extents: list[Extent] = [(start, end) for start, end, _ in frames]
        self._fd = _anonymous_file()
        self._closer = weakref.finalize(self, os.close, self._fd)
        try:
            os.ftruncate(self._fd, memory_size)
            if frames:
                self._decompress(memory_size, frames)
        except BaseException:
            self.close()
            raise

    def _decompress(self, memory_size: int, frames: list[tuple[int, int, memoryview]]) -> None:
        with mmap.mmap(self._fd, memory_size) as area:
            view = memoryview(area)
            try:
                threads = min(len(frames), os.cpu_count() or 1, MAX_THREADS)
                with ThreadPoolExecutor(threads, thread_name_prefix="image-pages") as pool:
                    done = [
                        pool.submit(_inflate_into, frame, view, start, end)
                        for start, end, frame in frames
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
        """Guest memory ``[start, end)`` as the image has it (zeros outside its extents)."""
        return os.pread(self._fd, end - start, start)

    def map_into(self, base: int) -> None:
        """Each extent over guest memory at ``base``, copy-on-write; copied in instead where
        there are so many that their mappings would crowd the process (see cow)."""
        if len(self.extents) <= MAX_FOREIGN_PARTS:
            for start, end in self.extents:
                map_file(base + start, end - start, self._fd, start)
            return
        for start, end in self.extents:
            target = (ctypes.c_char * (end - start)).from_address(base + start)
            if os.preadv(self._fd, [target], start) != end - start:
                raise OSError("the image's pages file is shorter than its extents")

    def close(self) -> None:
        """Let the file go (mappings of it keep it for as long as they last)."""
        self._closer()


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
