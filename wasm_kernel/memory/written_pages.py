"""Finding the pages of guest memory written since a checkpoint, for ``cow``.

Linux's ``PAGEMAP_SCAN`` (6.7 and later) lists a process's own (anonymous) pages in one call;
older kernels show them in ``/proc/self/pagemap``, read whole (``DirtyPages``). Where
userfaultfd's asynchronous write-protection works, written pages are found by it instead, and
pages can stay in place between checkpoints (``WrittenPages``); the pages every cell writes are
left writable (``HotPages``). The system calls go through ctypes, holding the GIL.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import re
from functools import cache

from .page_ranges import (
    PAGE,
    Bounds,
    Ranges,
    intersect,
    merged_across_gaps,
    page_parts,
    page_up,
    subtract,
)

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
libc = ctypes.PyDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
libc.syscall.restype = ctypes.c_long


def check(result: int | None, what: str) -> int:
    if result == -1 or result is None or result == MAP_FAILED:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def _scan_pages(
    pagemap: int, arguments: ScanArguments, regions: ctypes.Array, start: int, end: int
) -> Bounds:
    """The starts and ends of the regions ``PAGEMAP_SCAN`` lists for ``arguments`` within
    ``[start, end)``, asked in as many calls as ``regions`` needs. Read as one array of
    integers per call (start, end, categories for each region): field access per region was
    most of a checkpoint's scan."""
    fields = memoryview(regions).cast("B").cast("Q")
    found_fields: list[int] = []
    while start < end:
        arguments.start, arguments.end = start, end
        found = check(libc.ioctl(pagemap, PAGEMAP_SCAN, ctypes.byref(arguments)), "PAGEMAP_SCAN")
        found_fields += fields[: 3 * found].tolist()
        if arguments.walk_end <= start:
            raise OSError("PAGEMAP_SCAN made no progress")
        start = arguments.walk_end
    return found_fields[0::3], found_fields[1::3]


def drop_pages(address: int, length: int) -> None:
    """Forget private copies: a private file page reads the file again, anonymous memory zero."""
    check(libc.madvise(address, length, mmap.MADV_DONTNEED), "madvise")


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

    def ranges(self, start: int, end: int, present_only: bool = False, offset: int = 0) -> Ranges:
        """``(start, end)`` address ranges of the anonymous pages within ``[start, end)``,
        merged across small gaps (``merged_across_gaps``). ``present_only``: not those
        swapped out, nor (the same to the kernel) the marks userfaultfd write-protection
        leaves on pages that are not present. Each less ``offset``."""
        return merged_across_gaps(self._scan(start, end, present_only), offset)

    def _read_pagemap(self, start: int, end: int, present_only: bool) -> Bounds:
        entries = os.pread(self._pagemap, (end - start) // PAGE * 8, start // PAGE * 8)
        own = entries[7::8].translate(OWN_PRESENT_PAGE if present_only else OWN_PAGE)
        runs = [run.span() for run in re.finditer(b"\x01+", own)]
        return [start + low * PAGE for low, _ in runs], [start + high * PAGE for _, high in runs]

    def _ask_kernel(self, start: int, end: int, present_only: bool) -> Bounds:
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
        return _scan_pages(self._pagemap, arguments, self._regions, start, end)


class WrittenPages:
    """Pages written since they were last protected, from userfaultfd's asynchronous
    write-protection: a write to a protected page only clears its mark, in the kernel (no
    thread waits on the userfaultfd), and ``PAGEMAP_SCAN`` lists and protects the marked
    pages again in one call. Only ranges passed to ``watch`` are tracked."""

    def __init__(self) -> None:
        number = SYS_USERFAULTFD.get(platform.machine())
        if number is None:
            raise OSError(f"no userfaultfd system call known on {platform.machine()}")
        self._fd = check(
            libc.syscall(number, os.O_CLOEXEC | os.O_NONBLOCK | UFFD_USER_MODE_ONLY), "userfaultfd"
        )
        try:
            wanted = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED
            api = UffdApi(api=UFFD_API, features=wanted)
            check(libc.ioctl(self._fd, UFFDIO_API, ctypes.byref(api)), "UFFDIO_API")
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
        check(libc.ioctl(self._fd, UFFDIO_REGISTER, ctypes.byref(register)), "UFFDIO_REGISTER")

    def protect(self, start: int, end: int) -> None:
        """Mark ``[start, end)`` unwritten (pages not present too: their first write counts)."""
        protect = UffdWriteProtect(start=start, len=end - start, mode=UFFDIO_WRITEPROTECT_MODE_WP)
        check(
            libc.ioctl(self._fd, UFFDIO_WRITEPROTECT, ctypes.byref(protect)),
            "UFFDIO_WRITEPROTECT",
        )

    def collect(self, start: int, end: int) -> Ranges:
        """``(start, end)`` ranges of the pages written within ``[start, end)``, each marked
        unwritten again as it is listed, merged across small gaps (``merged_across_gaps``)."""
        return merged_across_gaps(self._scan(start, end, PM_SCAN_WP_MATCHING))

    def found(self, start: int, end: int) -> Bounds:
        """The runs of pages written within ``[start, end)`` as the kernel lists them
        (unmerged); unlike ``collect``, the pages stay marked written (``protect`` marks them)."""
        return self._scan(start, end, 0)

    def _scan(self, start: int, end: int, flags: int) -> Bounds:
        arguments = ScanArguments(
            size=ctypes.sizeof(ScanArguments),
            flags=flags | PM_SCAN_CHECK_WPASYNC,
            vec=ctypes.addressof(self._regions),
            vec_len=REGIONS_PER_CALL,
            category_mask=PAGE_IS_WRITTEN,
            return_mask=PAGE_IS_WRITTEN,
        )
        return _scan_pages(self._pagemap, arguments, self._regions, start, end)


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

    def settle(self, found: Ranges, pages: int, slices: list[slice]) -> Ranges:
        """Of ``found`` (ordered, within ``pages`` pages; ``slices`` its ``page_slices``), the
        written pages that stay in place, the ranges to protect again; the rest stay
        writable."""
        self._checkpoints += 1
        if self._checkpoints % HOT_REVIEW == 0:
            self.forget()
            self._cold_before = found
            return found
        if len(self._hot) < pages:
            self._hot.extend(bytes(pages - len(self._hot)))
        cold = self._cold_parts(found, slices)
        rising = intersect(cold, self._cold_before)
        count = sum(high - low for low, high in rising) // PAGE
        if rising and (self._hot_pages + count) * PAGE <= HOT_LIMIT:
            for low, high in rising:
                self._hot[low // PAGE : high // PAGE] = b"\x01" * ((high - low) // PAGE)
            self._hot_pages += count
            cold = subtract(cold, rising)
        self._cold_before = cold
        return cold

    def _cold_parts(self, ranges: Ranges, slices: list[slice]) -> Ranges:
        """The parts of ordered ``ranges`` (``slices`` their pages) not left writable: the
        ranges with any are found in C, then searched (few, once the pages every cell
        writes are known)."""
        hot = self._hot
        cold = []
        parts = page_parts(hot, slices)
        for low, high in [r for r, part in zip(ranges, parts, strict=True) if 0 in part]:
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


@cache
def pagemap_scan_works() -> bool:
    """Whether this kernel has ``PAGEMAP_SCAN`` (else pagemap is read: slower, same answer)."""
    page = ctypes.create_string_buffer(2 * PAGE)
    start = page_up(ctypes.addressof(page))
    arguments = ScanArguments(size=ctypes.sizeof(ScanArguments), start=start, end=start + PAGE)
    arguments.category_anyof_mask = arguments.return_mask = PAGE_IS_PRESENT
    pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return libc.ioctl(pagemap, PAGEMAP_SCAN, ctypes.byref(arguments)) >= 0
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
        area = check(libc.mmap(None, 4 * PAGE, prot, mmap.MAP_PRIVATE, fd, 0), "mmap")
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
            libc.munmap(area, 4 * PAGE)
        if fd >= 0:
            os.close(fd)


def dirty_page_finder() -> str:
    finder = "PAGEMAP_SCAN" if pagemap_scan_works() else "/proc/self/pagemap"
    return f"userfaultfd write-protection and {finder}" if write_protect_works() else finder
