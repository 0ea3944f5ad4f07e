"""Guest memory as a copy-on-write view of a file: checkpoints that cost what a cell wrote.

The checkpoint lives in a memfd that is mapped ``MAP_PRIVATE | MAP_FIXED`` over the guest's
linear memory (wasmtime reserves a 32-bit memory whole and never moves it, and grows it with
``mprotect`` only, so the mapping stays in place). A page the guest writes becomes a private
anonymous copy; a page it does not write stays the file's page, shared with the checkpoint.
Linux's ``PAGEMAP_SCAN`` (6.7 and later) lists the anonymous pages in one call; older kernels
show them in ``/proc/self/pagemap``, read whole (8 bytes a page). So:

- checkpoint: write those pages into the file, then drop them (``MADV_DONTNEED``) so that they
  read from the file again; memory the guest grew into is added to the file and mapped;
- rollback: drop them; they read the checkpoint again. Past the mapping, dropping anonymous
  memory makes it read as zeros, which is what ``sbrk`` promises of fresh memory.

Where userfaultfd's asynchronous write-protection works (Linux 6.7 and later, where
userfaultfd is allowed), written pages are found by it instead, and a checkpoint keeps them
in place, protected again, rather than dropping them: dropping made the next cell fault
every one of them back in, copying it from the file, which cost more than the checkpoint
itself (about 700 pages for a bare ``x + 1``). The copies kept this way are bounded
(``KEPT_LIMIT``); past that they are dropped as above. The pages every cell writes are not
even protected again (``HotPages``): each protected page costs the next cell a write fault.

Where the OS lacks any of this, ``copy_on_write_missing`` says what, and the caller copies.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import platform
import re
import sys
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from functools import cache

import wasmtime

PAGE = mmap.PAGESIZE
Ranges = list[tuple[int, int]]  # [start, end) pairs
SEALS_BESIDE_WRITE = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
MAP_FIXED = 0x10  # same value on every Linux architecture this runs on
MAP_FAILED = ctypes.c_void_p(-1).value
# fs/proc PAGEMAP_SCAN (include/uapi/linux/fs.h): page categories and the ioctl number
PAGE_IS_FILE = 1 << 2
PAGE_IS_PRESENT = 1 << 3
PAGE_IS_SWAPPED = 1 << 4
PAGE_IS_PFNZERO = 1 << 5
REGIONS_PER_CALL = 512
# /proc/self/pagemap: the top byte of each page's entry has bit 7 "present", bit 6 "swapped",
# bit 5 "file page or shared"; this table maps it to 1 for the process's own pages
OWN_PAGE = bytes(int((top & 0xE0) in (0x80, 0x40)) for top in range(256))
OWN_PRESENT_PAGE = bytes(int((top & 0xE0) == 0x80) for top in range(256))
MERGE_GAP = 8 * PAGE
GUEST_SPAN = 1 << 32  # all a 32-bit guest memory can ever be
# Pieces of guest memory left mapped from another file: each costs the process a mapping or
# two (Linux allows ~65,000), so past this many the rest is copied into the checkpoint.
MAX_FOREIGN_PARTS = 2048
# Written pages a checkpoint leaves in place (private copies equal to the file's pages, so
# held twice) rather than dropping: the pages cells keep rewriting (reference counts,
# allocator state) stay, bulk data a cell wrote once is dropped as without write-protection.
KEPT_LIMIT = 64 << 20
# Pages found written by two checkpoints in a row are left writable (see HotPages), up to
# this many bytes; every HOT_REVIEW checkpoints all are protected again and must requalify.
HOT_LIMIT = 4 << 20
HOT_REVIEW = 32
# userfaultfd (linux/userfaultfd.h)
SYS_USERFAULTFD = {"x86_64": 323, "aarch64": 282}
UFFD_USER_MODE_ONLY = 1
UFFD_API = 0xAA
UFFD_FEATURE_WP_UNPOPULATED = 1 << 13
UFFD_FEATURE_WP_ASYNC = 1 << 15
UFFDIO_REGISTER_MODE_WP = 1 << 1
UFFDIO_WRITEPROTECT_MODE_WP = 1 << 0
PAGE_IS_WRITTEN = 1 << 1
PM_SCAN_WP_MATCHING = 1 << 0
PM_SCAN_CHECK_WPASYNC = 1 << 1


class ScanArguments(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "size",
            "flags",
            "start",
            "end",
            "walk_end",
            "vec",
            "vec_len",
            "max_pages",
            "category_inverted",
            "category_mask",
            "category_anyof_mask",
            "return_mask",
        )
    ]


class PageRegion(ctypes.Structure):
    _fields_ = [
        ("start", ctypes.c_uint64),
        ("end", ctypes.c_uint64),
        ("categories", ctypes.c_uint64),
    ]


class UffdApi(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("api", "features", "ioctls")]


class UffdRegister(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("start", "len", "mode", "ioctls")]


class UffdWriteProtect(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("start", "len", "mode")]


def _iowr(kind: int, number: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (kind << 8) | number


PAGEMAP_SCAN = _iowr(ord("f"), 16, ctypes.sizeof(ScanArguments))
UFFDIO_API = _iowr(UFFD_API, 0x3F, ctypes.sizeof(UffdApi))
UFFDIO_REGISTER = _iowr(UFFD_API, 0x00, ctypes.sizeof(UffdRegister))
UFFDIO_WRITEPROTECT = _iowr(UFFD_API, 0x06, ctypes.sizeof(UffdWriteProtect))

# Called holding the GIL (PyDLL): each of these system calls takes microseconds, and a
# checkpoint makes dozens; letting go of the GIL at each let the kernel's other threads in
# between, and the checkpoint, which the next cell waits for, took twice as long.
_libc = ctypes.PyDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_libc.syscall.restype = ctypes.c_long


def _check(result: int | None, what: str) -> int:
    if result == -1 or result is None or result == MAP_FAILED:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def page_up(size: int) -> int:
    return -(-size // PAGE) * PAGE


def map_file(address: int, length: int, fd: int, offset: int) -> None:
    """Map ``length`` bytes of ``fd`` from ``offset`` privately (copy-on-write), read/write,
    exactly at ``address``, replacing whatever was mapped there."""
    flags = mmap.MAP_PRIVATE | MAP_FIXED
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    mapped = _check(_libc.mmap(address, length, prot, flags, fd, offset), "mmap")
    if mapped != address:
        raise OSError(f"mmap placed the mapping at {mapped:#x}, not {address:#x}")


def union(ranges: Ranges) -> Ranges:
    """Overlapping or touching ranges merged, in order."""
    merged: Ranges = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _pieces(a: Ranges, b: Ranges) -> Iterator[tuple[int, int, bool]]:
    """``a`` cut at the bounds of ``b``: ``(low, high, inside b)``, in order. Both merged
    (ordered, disjoint); each range of ``a`` finds its place in ``b`` by bisection, so a few
    ranges against many cost little."""
    starts = [low for low, _ in b]
    for low, high in a:
        index = max(bisect_right(starts, low) - 1, 0)
        while low < high:
            while index < len(b) and b[index][1] <= low:
                index += 1
            if index == len(b) or b[index][0] >= high:
                yield low, high, False
                break
            other_low, other_high = b[index]
            if other_low > low:
                yield low, other_low, False
                low = other_low
            yield low, min(high, other_high), True
            low = min(high, other_high)


def _cut_out(ranges: Ranges, pieces: Ranges) -> Ranges:
    """Merged ``ranges`` less ordered ``pieces``, each within one of them (found by bisection:
    cheap for a few pieces)."""
    result = list(ranges)
    starts = [low for low, _ in ranges]
    for low, high in reversed(pieces):  # from the end: the places found stay right
        index = bisect_right(starts, low) - 1
        outer_low, outer_high = result[index]
        result[index : index + 1] = [
            (start, stop) for start, stop in ((outer_low, low), (high, outer_high)) if start < stop
        ]
    return result


def intersect(a: Ranges, b: Ranges) -> Ranges:
    """The parts of ranges ``a`` within ranges ``b``."""
    return union([(low, high) for low, high, inside in _pieces(union(a), union(b)) if inside])


def subtract(a: Ranges, b: Ranges) -> Ranges:
    """The parts of ranges ``a`` outside ranges ``b``."""
    return union([(low, high) for low, high, inside in _pieces(union(a), union(b)) if not inside])


def file_mapped(base: int, start: int, end: int) -> Ranges:
    """The parts of memory ``[start, end)`` from ``base`` that map a file (their pages need not
    be present to hold data), from ``/proc/self/maps``; offsets from ``base``."""
    parts = []
    if start < end:
        with open("/proc/self/maps", "rb") as maps:
            for line in maps:
                span, _, _, _, inode, *_ = line.split(maxsplit=5)
                low, high = (int(bound, 16) - base for bound in span.split(b"-"))
                if int(inode) and low < end and high > start:
                    parts.append((max(low, start), min(high, end)))
    return parts


def merged_across_gaps(ranges: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Ordered ranges, merged across gaps of up to ``MERGE_GAP``: saving or dropping pages that
    equal the checkpoint's too is harmless, and one system call per range is most of a
    checkpoint's cost."""
    pending: tuple[int, int] | None = None
    for low, high in ranges:
        if pending is not None and low - pending[1] <= MERGE_GAP:
            pending = (pending[0], high)
            continue
        if pending is not None:
            yield pending
        pending = (low, high)
    if pending is not None:
        yield pending


def _scan_pages(
    pagemap: int, arguments: ScanArguments, regions: ctypes.Array, start: int, end: int
) -> Iterator[tuple[int, int]]:
    """The regions ``PAGEMAP_SCAN`` lists for ``arguments`` within ``[start, end)``, asked in
    as many calls as ``regions`` needs."""
    while start < end:
        arguments.start, arguments.end = start, end
        found = _check(_libc.ioctl(pagemap, PAGEMAP_SCAN, ctypes.byref(arguments)), "PAGEMAP_SCAN")
        for region in regions[:found]:
            yield region.start, region.end
        if arguments.walk_end <= start:
            raise OSError("PAGEMAP_SCAN made no progress")
        start = arguments.walk_end


def drop_pages(address: int, length: int) -> None:
    """Forget private copies: a private file page reads the file again, anonymous memory zero."""
    _check(_libc.madvise(address, length, mmap.MADV_DONTNEED), "madvise")


class DirtyPages:
    """Finds, with one ``PAGEMAP_SCAN`` call per few hundred regions, the pages of a range that
    hold this process's own data: anonymous pages, present or swapped out (in a private file
    mapping, the pages written since it was mapped or last dropped)."""

    def __init__(self) -> None:
        self._pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        self._regions = (PageRegion * REGIONS_PER_CALL)()
        self._scan = self._ask_kernel if pagemap_scan_works() else self._read_pagemap

    def close(self) -> None:
        if self._pagemap >= 0:
            os.close(self._pagemap)
            self._pagemap = -1

    def ranges(self, start: int, end: int, present_only: bool = False) -> Iterable[tuple[int, int]]:
        """``(start, end)`` address ranges of the anonymous pages within ``[start, end)``,
        merged across small gaps (``merged_across_gaps``). ``present_only``: not those
        swapped out, nor (the same to the kernel) the marks userfaultfd write-protection
        leaves on pages that are not present."""
        return merged_across_gaps(self._scan(start, end, present_only))

    def _read_pagemap(self, start: int, end: int, present_only: bool) -> Iterator[tuple[int, int]]:
        entries = os.pread(self._pagemap, (end - start) // PAGE * 8, start // PAGE * 8)
        own = entries[7::8].translate(OWN_PRESENT_PAGE if present_only else OWN_PAGE)
        for run in re.finditer(b"\x01+", own):
            yield start + run.start() * PAGE, start + run.end() * PAGE

    def _ask_kernel(self, start: int, end: int, present_only: bool) -> Iterator[tuple[int, int]]:
        wanted = PAGE_IS_PRESENT if present_only else PAGE_IS_PRESENT | PAGE_IS_SWAPPED
        arguments = ScanArguments(
            size=ctypes.sizeof(ScanArguments),
            vec=ctypes.addressof(self._regions),
            vec_len=REGIONS_PER_CALL,
            # never the shared zero page (memory read but never written: it reads as zeros)
            category_inverted=PAGE_IS_PFNZERO | PAGE_IS_FILE,
            category_mask=PAGE_IS_PFNZERO | PAGE_IS_FILE,
            category_anyof_mask=wanted,
            return_mask=wanted,
        )
        yield from _scan_pages(self._pagemap, arguments, self._regions, start, end)


class WrittenPages:
    """Pages written since they were last protected, from userfaultfd's asynchronous
    write-protection: a write to a protected page only clears its mark, in the kernel (no
    thread waits on the userfaultfd), and ``PAGEMAP_SCAN`` lists and protects the marked
    pages again in one call. Only ranges passed to ``watch`` are tracked."""

    def __init__(self) -> None:
        number = SYS_USERFAULTFD.get(platform.machine())
        if number is None:
            raise OSError(f"no userfaultfd system call known on {platform.machine()}")
        self._fd = _check(
            _libc.syscall(number, os.O_CLOEXEC | os.O_NONBLOCK | UFFD_USER_MODE_ONLY), "userfaultfd"
        )
        try:
            wanted = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED
            api = UffdApi(api=UFFD_API, features=wanted)
            _check(_libc.ioctl(self._fd, UFFDIO_API, ctypes.byref(api)), "UFFDIO_API")
            if api.features & wanted != wanted:
                raise OSError("userfaultfd has no asynchronous write-protection here")
            self._pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(self._fd)
            raise
        self._regions = (PageRegion * REGIONS_PER_CALL)()

    def close(self) -> None:
        """Stop tracking (closing the userfaultfd unregisters its ranges)."""
        if self._fd >= 0:
            os.close(self._pagemap)
            os.close(self._fd)
            self._fd = -1

    def watch(self, start: int, end: int) -> None:
        """Track ``[start, end)`` (all of it mapped; parts tracked already stay so)."""
        register = UffdRegister(start=start, len=end - start, mode=UFFDIO_REGISTER_MODE_WP)
        _check(_libc.ioctl(self._fd, UFFDIO_REGISTER, ctypes.byref(register)), "UFFDIO_REGISTER")

    def protect(self, start: int, end: int) -> None:
        """Mark ``[start, end)`` unwritten (pages not present too: their first write counts)."""
        protect = UffdWriteProtect(start=start, len=end - start, mode=UFFDIO_WRITEPROTECT_MODE_WP)
        _check(
            _libc.ioctl(self._fd, UFFDIO_WRITEPROTECT, ctypes.byref(protect)),
            "UFFDIO_WRITEPROTECT",
        )

    def collect(self, start: int, end: int) -> Iterable[tuple[int, int]]:
        """``(start, end)`` ranges of the pages written within ``[start, end)``, each marked
        unwritten again as it is listed, merged across small gaps (``merged_across_gaps``)."""
        return merged_across_gaps(self._scan(start, end, PM_SCAN_WP_MATCHING))

    def written(self, start: int, end: int) -> Iterable[tuple[int, int]]:
        """As ``collect``, but the pages stay marked written (``protect`` marks them)."""
        return merged_across_gaps(self._scan(start, end, 0))

    def _scan(self, start: int, end: int, flags: int) -> Iterator[tuple[int, int]]:
        arguments = ScanArguments(
            size=ctypes.sizeof(ScanArguments),
            flags=flags | PM_SCAN_CHECK_WPASYNC,
            vec=ctypes.addressof(self._regions),
            vec_len=REGIONS_PER_CALL,
            category_mask=PAGE_IS_WRITTEN,
            return_mask=PAGE_IS_WRITTEN,
        )
        yield from _scan_pages(self._pagemap, arguments, self._regions, start, end)


class HotPages:
    """Which written pages a checkpoint leaves writable instead of protecting them again.

    Most pages a cell writes are written by every cell (reference counts, allocator state,
    the interpreter's counters in the code that runs each cell): protected again at each
    checkpoint, each costs the next cell a write fault. A page found written by two
    checkpoints in a row is left writable, so it faults no more; userfaultfd then reports it
    written at every checkpoint, which saves it whether it changed or not: a copy of a page
    costs less than a fault. Bounded by ``HOT_LIMIT``; every ``HOT_REVIEW`` checkpoints all
    are protected again, and only pages still written qualify anew.
    """

    def __init__(self) -> None:
        self._hot = bytearray()  # a byte per page: 1 where left writable
        self._hot_pages = 0
        self._cold_before: Ranges = []  # what the previous checkpoint protected again
        self._checkpoints = 0

    def settle(self, found: Ranges, pages: int) -> Ranges:
        """Of ``found`` (ordered, within ``pages`` pages), the written pages that stay in
        place, the ranges to protect again; the rest stay writable."""
        self._checkpoints += 1
        if self._checkpoints % HOT_REVIEW == 0:
            self.forget()
            self._cold_before = found
            return found
        if len(self._hot) < pages:
            self._hot.extend(bytes(pages - len(self._hot)))
        cold = self._cold_parts(found)
        rising = intersect(cold, self._cold_before)
        count = sum(high - low for low, high in rising) // PAGE
        if rising and (self._hot_pages + count) * PAGE <= HOT_LIMIT:
            for low, high in rising:
                self._hot[low // PAGE : high // PAGE] = b"\x01" * ((high - low) // PAGE)
            self._hot_pages += count
            cold = subtract(cold, rising)
        self._cold_before = cold
        return cold

    def _cold_parts(self, ranges: Ranges) -> Ranges:
        """The parts of ordered ``ranges`` not left writable (one search per range that has
        none, as most have once the pages every cell writes are known)."""
        hot = self._hot
        cold = []
        for low, high in ranges:
            last = high // PAGE
            page = hot.find(0, low // PAGE, last)
            while page >= 0:
                end = hot.find(1, page, last)
                end = last if end < 0 else end
                cold.append((page * PAGE, end * PAGE))
                page = hot.find(0, end, last)
        return cold

    def forget(self) -> None:
        """All pages were protected again (dropped, or rolled back)."""
        self._hot = bytearray(len(self._hot))
        self._hot_pages = 0
        self._cold_before = []


class CopyOnWriteMemory:
    """The checkpoint of guest memory ``[0, mapped)``: a memfd mapped privately over it, except
    where another file is mapped (wasmtime's view of the module's data, a boot image) and the
    guest has not written since: those pages stay that file's, shared with whoever else maps
    it, and move into the memfd when a checkpoint finds them written."""

    FILE_NAME = "wasm-kernel-checkpoint"  # the memfd's name (a forked kernel checks it)

    def __init__(self, track_writes: bool = True) -> None:
        self._file = os.memfd_create(self.FILE_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            self._dirty = DirtyPages()
        except OSError:
            os.close(self._file)
            raise
        # The file shared over all the address space a guest can have (only its first
        # ``mapped`` bytes exist): a checkpoint copies written pages in with no system call,
        # holding the GIL for a memory copy only.
        shared = mmap.MAP_SHARED | getattr(mmap, "MAP_NORESERVE", 0)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        self._view_address = _libc.mmap(None, GUEST_SPAN, prot, shared, self._file, 0)
        if self._view_address in (None, MAP_FAILED):
            self._dirty.close()
            os.close(self._file)
            _check(-1, "mmap")
        self._view = memoryview((ctypes.c_char * GUEST_SPAN).from_address(self._view_address))
        self._view = self._view.cast("B")
        self.mapped = 0  # bytes of guest memory that are a view of the checkpoint
        self._foreign: Ranges = []  # parts of it that are another file's view
        self._tracker: WrittenPages | None = None  # on [0, mapped), where it works
        if track_writes and write_protect_works():
            self._tracker = WrittenPages()
        self._hot = HotPages()
        # Pages left in place written since they were last dropped, a byte per page of
        # [0, mapped): a page rewritten by every cell counts once towards KEPT_LIMIT.
        self._kept_pages = bytearray()
        self._kept = 0  # bytes of those pages

    def close(self) -> None:
        """Free the checkpoint (after the guest memory is gone or no longer needs it)."""
        self._dirty.close()
        if self._tracker is not None:
            self._tracker.close()
        if self._view_address is not None:
            self._view.release()
            _libc.munmap(self._view_address, GUEST_SPAN)
            self._view_address = None
        if self._file >= 0:
            os.close(self._file)
            self._file = -1

    @property
    def foreign(self) -> Ranges:
        """Parts of the checkpointed memory that are still another file's view."""
        return list(self._foreign)

    def freeze(self, base: int, copy: Ranges) -> int:
        """End this checkpoint for a fork (``live_memory``): the guest pages of ``copy`` go
        into the file, which is then sealed and returned open; this object is closed, and
        guest memory keeps mapping the file."""
        guest = memoryview((ctypes.c_char * self.mapped).from_address(base)).cast("B")
        for low, high in copy:
            self._save(guest, low, high)
        # pages left in place (equal to the file's) are dropped: they read the file again,
        # and the next checkpoint, in a new file, need not copy them
        for start, stop in list(self._dirty.ranges(base, base + self.mapped, present_only=True)):
            drop_pages(start, stop - start)
        file, self._file = self._file, -1
        self.close()
        try:
            fcntl.fcntl(file, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | SEALS_BESIDE_WRITE)
        except BaseException:
            os.close(file)
            raise
        return file

    def _save(self, guest: memoryview, start: int, end: int) -> int:
        self._view[start:end] = guest[start:end]
        return end - start

    def _written(self, base: int, start: int, end: int) -> Ranges:
        return [
            (low - base, high - base) for low, high in self._dirty.ranges(base + start, base + end)
        ]

    def take(self, base: int, size: int) -> int:
        """Make guest memory ``[0, size)`` (``size`` within its accessible part) the checkpoint;
        returns the bytes written to the file."""
        end = max(page_up(size), self.mapped)
        grown = [(self.mapped, end)] if end > self.mapped else []
        # Memory past the old end holds data where pages are present (absent anonymous pages
        # read as zeros, like the file's holes) or where another file is mapped.
        foreign = file_mapped(base, self.mapped, end)
        tracker = self._tracker
        if tracker is None:
            written = self._written(base, 0, end)
        else:  # the tracked part, then the grown part, which is not tracked yet
            written = [
                (low - base, high - base)
                for low, high in (tracker.written(base, base + self.mapped) if self.mapped else ())
            ]
            written += self._written(base, self.mapped, end)
        old_foreign = self._foreign
        if len(old_foreign) + len(foreign) > MAX_FOREIGN_PARTS:  # too many mappings: copy
            written = union(written + old_foreign + foreign)
        if grown:
            os.ftruncate(self._file, end)
        guest = memoryview((ctypes.c_char * end).from_address(base)).cast("B")
        saved = sum(self._save(guest, low, high) for low, high in written)
        # Written pages read from the file again: where it is mapped already, dropped (or, if
        # tracked, left in place, equal to the file now, and protected again); mapped where
        # another file was. The grown part is mapped whole, less what stays foreign (its
        # absent anonymous pages map the file's holes).
        within = [(low, min(high, self.mapped)) for low, high in written if low < self.mapped]
        pieces = list(_pieces(within, old_foreign))
        remapped = [(low, high) for low, high, was_foreign in pieces if was_foreign]
        staying = [(low, high) for low, high, was_foreign in pieces if not was_foreign]
        self._foreign = _cut_out(old_foreign, remapped)
        if foreign:
            self._foreign = union(self._foreign + subtract(foreign, written))
        keep = tracker is not None and self._kept + self._not_kept(staying) <= KEPT_LIMIT
        for low, high in remapped:
            map_file(base + low, high - low, self._file, low)
        if not keep:
            for low, high in staying:
                drop_pages(base + low, high - low)
        for low, high in subtract(grown, self._foreign) if grown else ():
            map_file(base + low, high - low, self._file, low)
        if tracker is not None and end > 0:
            if remapped or grown:  # new mappings are tracked first: protecting any part of
                tracker.watch(base, base + end)  # a mapping that is not tracked fails
            if keep:
                self._mark_kept(staying)
                cold = self._hot.settle(staying, end // PAGE)
            else:
                self._hot.forget()
                cold = staying
                if self._kept:  # over the limit: drop the pages left earlier too
                    self._drop_kept(base)
            for low, high in (*remapped, *grown, *cold):
                tracker.protect(base + low, base + high)
        self.mapped = end
        self._kept_pages.extend(bytes(end // PAGE - len(self._kept_pages)))
        return saved

    def _not_kept(self, ranges: Ranges) -> int:
        """Bytes of ``ranges`` (within ``[0, mapped)``) not left in place already."""
        kept = self._kept_pages
        return PAGE * sum(kept.count(0, low // PAGE, high // PAGE) for low, high in ranges)

    def _mark_kept(self, ranges: Ranges) -> None:
        self._kept += self._not_kept(ranges)
        for low, high in ranges:
            self._kept_pages[low // PAGE : high // PAGE] = b"\x01" * ((high - low) // PAGE)

    def _collect(self, base: int) -> Iterable[tuple[int, int]]:
        if self._tracker is None or not self.mapped:
            return iter(())
        return self._tracker.collect(base, base + self.mapped)

    def _drop_kept(self, base: int) -> None:
        """Drop every private page of the checkpointed memory (each equal to the file's) and
        protect it again."""
        assert self._tracker is not None
        for start, stop in list(self._dirty.ranges(base, base + self.mapped, present_only=True)):
            drop_pages(start, stop - start)
            self._tracker.protect(start, stop)
        self._kept_pages = bytearray(len(self._kept_pages))
        self._kept = 0
        self._hot.forget()

    def restore(self, base: int, accessible: int) -> None:
        """Guest memory back to the checkpoint, and zeros from its end to ``accessible``."""
        if self._tracker is None:
            changed = list(self._dirty.ranges(base, base + self.mapped))
        else:  # pages left in place at the checkpoint are the file's unless written since
            changed = list(self._collect(base))
        for start, stop in changed:
            drop_pages(start, stop - start)
            if self._tracker is not None:  # dropping forgets the mark: set it again
                self._tracker.protect(start, stop)
        self._hot.forget()
        if accessible > self.mapped:
            drop_pages(base + self.mapped, accessible - self.mapped)


def map_copy_on_write(
    memory: wasmtime.Memory,
    store: wasmtime.Store | wasmtime.Caller,
    fd_or_path: int | str | os.PathLike[str],
    offset: int,
    length: int,
) -> None:
    """Make the guest's memory ``[0, length)`` a copy-on-write view of ``length`` bytes of a
    file from ``offset`` (for starting a guest from a boot image): the guest reads the file's
    pages, shared by every kernel mapping the same file, and its writes stay private. Memory
    is grown to ``length`` first if it is smaller; ``offset`` must be page-aligned. The file
    must not change while mapped. Later checkpoints keep the pages the guest does not write
    shared with the file; a checkpoint taken before the mapping must be dropped
    (``GuestState.forget``)."""
    if offset % PAGE:
        raise ValueError(f"the file offset must be a multiple of {PAGE}, not {offset}")
    wasm_page = 1 << 16
    missing = -(-(length - memory.data_len(store)) // wasm_page)
    if missing > 0 and memory.grow(store, missing) < 0:
        raise ValueError(f"guest memory cannot grow to {length} bytes")
    base = ctypes.addressof(memory.data_ptr(store).contents)
    if base % PAGE:
        raise ValueError("guest memory does not start on a page boundary")
    if isinstance(fd_or_path, int):
        map_file(base, page_up(length), fd_or_path, offset)
        return
    fd = os.open(fd_or_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        map_file(base, page_up(length), fd, offset)
    finally:
        os.close(fd)  # the mapping keeps the file


@cache
def pagemap_scan_works() -> bool:
    """Whether this kernel has ``PAGEMAP_SCAN`` (else pagemap is read: slower, same answer)."""
    page = ctypes.create_string_buffer(2 * PAGE)
    start = page_up(ctypes.addressof(page))
    arguments = ScanArguments(size=ctypes.sizeof(ScanArguments), start=start, end=start + PAGE)
    arguments.category_anyof_mask = arguments.return_mask = PAGE_IS_PRESENT
    pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _libc.ioctl(pagemap, PAGEMAP_SCAN, ctypes.byref(arguments)) >= 0
    finally:
        os.close(pagemap)


@cache
def write_protect_works() -> bool:
    """Whether userfaultfd's asynchronous write-protection tracks writes here, tried for real
    on a scratch file mapping: a written page must be listed, then no page."""
    if not pagemap_scan_works():
        return False
    area = -1
    fd = -1
    tracker = None
    try:
        tracker = WrittenPages()
        fd = os.memfd_create("wasm-kernel-probe", os.MFD_CLOEXEC)
        os.ftruncate(fd, 4 * PAGE)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        area = _check(_libc.mmap(None, 4 * PAGE, prot, mmap.MAP_PRIVATE, fd, 0), "mmap")
        tracker.watch(area, area + 4 * PAGE)
        tracker.protect(area, area + 4 * PAGE)
        ctypes.memset(area + 2 * PAGE, 1, 1)
        first = list(tracker.collect(area, area + 4 * PAGE))
        second = list(tracker.collect(area, area + 4 * PAGE))
        return first == [(area + 2 * PAGE, area + 3 * PAGE)] and second == []
    except OSError:  # no userfaultfd (a seccomp filter, an older kernel): pages are dropped
        return False
    finally:
        if tracker is not None:
            tracker.close()
        if area not in (-1, None):
            _libc.munmap(area, 4 * PAGE)
        if fd >= 0:
            os.close(fd)


def dirty_page_finder() -> str:
    finder = "PAGEMAP_SCAN" if pagemap_scan_works() else "/proc/self/pagemap"
    return f"userfaultfd write-protection and {finder}" if write_protect_works() else finder


@cache
def copy_on_write_missing() -> str | None:
    """Why copy-on-write checkpoints cannot work in this process, or None if they can. Tried
    for real on a scratch mapping: a written page must be found, an unwritten one not, and a
    rollback must bring the file's contents back."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"):
        return f"copy-on-write checkpoints need Linux on x86_64 or aarch64, not {sys.platform}"
    area = -1
    memory = None
    try:
        memory = CopyOnWriteMemory(track_writes=False)  # write_protect_works tries that part
        length = 4 * PAGE
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        area = _check(
            _libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0), "mmap"
        )
        ctypes.memset(area, 7, 2 * PAGE)
        memory.take(area, 2 * PAGE)
        ctypes.memset(area + PAGE, 9, 1)  # dirty the second page only
        ctypes.memset(area + 2 * PAGE, 5, 1)  # and memory past the checkpoint
        found = list(memory._dirty.ranges(area, area + 2 * PAGE))
        if found != [(area + PAGE, area + 2 * PAGE)]:
            return f"{dirty_page_finder()} does not show written pages as expected ({found})"
        memory.restore(area, 3 * PAGE)
        restored = ctypes.string_at(area, 3 * PAGE)
        if restored != b"\x07" * (2 * PAGE) + b"\x00" * PAGE:
            return "a rolled-back copy-on-write mapping did not read its checkpoint again"
    except (OSError, AttributeError) as exc:  # AttributeError: no os.memfd_create
        return f"copy-on-write checkpoints are unavailable here ({exc})"
    finally:
        if memory is not None:
            memory.close()
        if area not in (-1, None):
            _libc.munmap(area, 4 * PAGE)
    return None
