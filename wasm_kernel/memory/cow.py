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
import hashlib
import mmap
import operator
import os
import platform
import secrets
import sys
from bisect import bisect_right
from functools import cache
from itertools import compress, repeat

import wasmtime

from .page_ranges import (
    PAGE,
    Ranges,
    cut_out,
    merged_across_gaps,
    page_parts,
    page_slices,
    page_up,
    pieces,
    subtract,
    union,
)
from .written_pages import (
    MAP_FAILED,
    DirtyPages,
    HotPages,
    WrittenPages,
    check,
    dirty_page_finder,
    drop_pages,
    libc,
    write_protect_works,
)

SEALS_BESIDE_WRITE = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
MAP_FIXED = 0x10  # same value on every Linux architecture this runs on
GUEST_SPAN = 1 << 32  # all a 32-bit guest memory can ever be
# Pieces of guest memory left mapped from another file: each costs the process a mapping or
# two (Linux allows ~65,000), so past this many the rest is copied into the checkpoint.
MAX_FOREIGN_PARTS = 2048
# Written pages a checkpoint leaves in place (private copies equal to the file's pages, so
# held twice) rather than dropping: the pages cells keep rewriting (reference counts,
# allocator state) stay, bulk data a cell wrote once is dropped as without write-protection.
KEPT_LIMIT = 64 << 20
WRITE_FROM = 1 << 20  # bytes from which a checkpoint writes a range into its file (see _save)
COPY_HOLDING_GIL = 64 << 10  # bytes up to which it copies a range holding the GIL (see _save)


def map_file(address: int, length: int, fd: int, offset: int) -> None:
    """Map ``length`` bytes of ``fd`` from ``offset`` privately (copy-on-write), read/write,
    exactly at ``address``, replacing whatever was mapped there."""
    flags = mmap.MAP_PRIVATE | MAP_FIXED
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    mapped = check(libc.mmap(address, length, prot, flags, fd, offset), "mmap")
    if mapped != address:
        raise OSError(f"mmap placed the mapping at {mapped:#x}, not {address:#x}")


FileKey = tuple[int, int]  # a file's st_dev, st_ino
MappedPiece = tuple[int, int, FileKey, int]  # [low, high) from base, its file, the file offset


def mapped_files(base: int, ranges: Ranges) -> list[MappedPiece]:
    """The parts of ``ranges`` (offsets from ``base``) that map a file (their pages need not
    be present to hold data), each with the file's (device, inode) and the offset in it, in
    order, from ``/proc/self/maps``. Each mapping finds its overlaps by bisection: a guest
    memory of many pieces has hundreds of mappings and hundreds of ranges."""
    found: list[MappedPiece] = []
    wanted = union([(start, end) for start, end in ranges if start < end])
    if not wanted:  # nothing to look for: /proc/self/maps is not read (every checkpoint asks)
        return found
    starts = [start for start, _ in wanted]
    first_wanted, last_wanted = base + wanted[0][0], base + wanted[-1][1]
    with open("/proc/self/maps", "rb") as maps:
        listing = maps.read()
    for line in listing.splitlines():
        span, _, offset, device, inode, *_ = line.split(maxsplit=5)
        low_text, high_text = span.split(b"-")
        low, high = int(low_text, 16), int(high_text, 16)
        if high <= first_wanted or low >= last_wanted or inode == b"0":
            continue
        low, high = low - base, high - base
        major, minor = (int(number, 16) for number in device.split(b":"))
        key = (os.makedev(major, minor), int(inode))
        index = max(bisect_right(starts, low) - 1, 0)
        for start, end in wanted[index:]:
            if start >= high:
                break
            if end > low:
                first, last = max(start, low), min(end, high)
                found.append((first, last, key, int(offset, 16) + first - low))
    return found


def file_mapped(base: int, start: int, end: int) -> Ranges:
    """The parts of memory ``[start, end)`` from ``base`` that map a file; offsets from
    ``base``."""
    return [(low, high) for low, high, _, _ in mapped_files(base, [(start, end)])]


_secret = (0, b"")  # (the process it is of, the secret)


def process_secret() -> bytes:
    """This kernel process's secret: the names of its checkpoint files carry its digest and
    its fork images the secret itself, so that an image can name only memory that the session
    which wrote it froze (``live_memory``). A process forked from this one makes its own."""
    global _secret
    if _secret[0] != os.getpid():
        _secret = (os.getpid(), secrets.token_bytes(32))
    return _secret[1]


def file_name(secret: bytes) -> str:
    """The name of the checkpoint files of the process whose secret is ``secret``."""
    return f"{CopyOnWriteMemory.FILE_NAME}-{hashlib.sha256(secret).hexdigest()[:32]}"


class CopyOnWriteMemory:
    """The checkpoint of guest memory ``[0, mapped)``: a memfd mapped privately over it, except
    where another file is mapped (wasmtime's view of the module's data, a boot image) and the
    guest has not written since: those pages stay that file's, shared with whoever else maps
    it, and move into the memfd when a checkpoint finds them written."""

    FILE_NAME = "wasm-kernel-checkpoint"  # how the memfd's name starts (see file_name)

    def __init__(self, track_writes: bool = True) -> None:
        name = file_name(process_secret())
        self._file = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            self._dirty = DirtyPages()
        except OSError:
            os.close(self._file)
            raise
        # The file shared over all the address space a guest can have (only its first
        # ``mapped`` bytes exist): a checkpoint copies runs of written pages in with no system
        # call (see _save).
        shared = mmap.MAP_SHARED | getattr(mmap, "MAP_NORESERVE", 0)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        self._view_address = libc.mmap(None, GUEST_SPAN, prot, shared, self._file, 0)
        if self._view_address in (None, MAP_FAILED):
            self._dirty.close()
            os.close(self._file)
            check(-1, "mmap")
        self.mapped = 0  # bytes of guest memory that are a view of the checkpoint
        self._foreign: Ranges = []  # parts of it that are another file's view
        self._foreign_pages = bytearray()  # the same, a byte per page of [0, mapped): 1 there
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
            libc.munmap(self._view_address, GUEST_SPAN)
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
        self._save(base, copy)
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

    def _save(self, base: int, ranges: Ranges) -> int:
        """Guest memory ``ranges`` (offsets from ``base``) into the file; returns the
        bytes saved. A small range is copied through the shared view by memoryview slices (a
        fraction of a microsecond each, where a ctypes call cost half a microsecond: a
        checkpoint copies a hundred small ranges or more), holding the GIL for no longer than
        one copy of up to ``COPY_HOLDING_GIL`` bytes; a larger one by ``ctypes.memmove``, or,
        from ``WRITE_FROM``, by ``pwrite`` (both without the GIL). Copied through the view,
        each page the file does not hold yet faults in, allocated and zeroed, before it is
        filled: a cell's fresh 100 MiB took ~160-230 ms that way, against ~85-95 ms written
        (measured 2026-11-28, 2 loaded cores); the first fork after such a cell waits for that
        checkpoint."""
        if not ranges:
            return 0
        view = self._view_address
        span = max(high for _, high in ranges)  # slices past a memoryview's end shrink
        guest = memoryview((ctypes.c_char * span).from_address(base)).cast("B")
        into = memoryview((ctypes.c_char * span).from_address(view)).cast("B")
        with guest, into:
            for low, high in ranges:
                length = high - low
                if length <= COPY_HOLDING_GIL:
                    into[low:high] = guest[low:high]
                elif length < WRITE_FROM:
                    ctypes.memmove(view + low, base + low, length)
                else:
                    done = 0
                    while done < length:
                        done += os.pwrite(self._file, guest[low + done : high], low + done)
        return sum(high - low for low, high in ranges)

    def _written(self, base: int, start: int, end: int) -> Ranges:
        return self._dirty.ranges(base + start, base + end, offset=base) if start < end else []

    def take(self, base: int, size: int) -> int:
        """Make guest memory ``[0, size)`` (``size`` within its accessible part) the checkpoint;
        returns the bytes written to the file."""
        end = max(page_up(size), self.mapped)
        grown = [(self.mapped, end)] if end > self.mapped else []
        # Memory past the old end holds data where pages are present (absent anonymous pages
        # read as zeros, like the file's holes) or where another file is mapped.
        foreign = file_mapped(base, self.mapped, end)
        tracker = self._tracker
        exact: Ranges | None = None  # the pages written, unmerged (see below)
        if tracker is None:
            written = self._written(base, 0, end)
        else:  # the tracked part, then the grown part, which is not tracked yet
            found = tracker.found(base, base + self.mapped) if self.mapped else ([], [])
            written = merged_across_gaps(found, base)
            starts, ends = found
            exact = list(
                zip(
                    map(operator.sub, starts, repeat(base)),
                    map(operator.sub, ends, repeat(base)),
                    strict=True,
                )
            )
            written += self._written(base, self.mapped, end)
        old_foreign = self._foreign
        if len(old_foreign) + len(foreign) > MAX_FOREIGN_PARTS:  # too many mappings: copy
            written = union(written + old_foreign + foreign)
            exact = None
        if grown:
            os.ftruncate(self._file, end)
            exact = None
        # Written pages read from the file again: where it is mapped already, dropped (or, if
        # tracked, left in place, equal to the file now, and protected again); mapped where
        # another file was. The grown part is mapped whole, less what stays foreign (its
        # absent anonymous pages map the file's holes).
        within = written
        if end > self.mapped:
            within = [(low, min(high, self.mapped)) for low, high in written if low < self.mapped]
        remapped, staying, pages = self._split_foreign(within)
        # Tracked, a page in a gap that merging spans is unwritten since it was protected: the
        # file's already, unless another file's (then it is mapped anew, and copied): so the
        # pages written and those are all there is to copy (about half the merged ranges').
        saved = self._save(base, written if exact is None else exact + remapped)
        if remapped:
            self._foreign = cut_out(old_foreign, remapped)
            self._mark_foreign(remapped, 0)
        self._foreign_pages.extend(bytes(end // PAGE - len(self._foreign_pages)))
        if foreign:
            self._mark_foreign(subtract(foreign, written), 1)
            self._foreign = union(self._foreign + subtract(foreign, written))
        fresh = self._not_kept(pages) if tracker is not None else []
        added = PAGE * sum(self._kept_pages.count(0, part.start, part.stop) for part in fresh)
        keep = tracker is not None and self._kept + added <= KEPT_LIMIT
        for low, high in remapped:
            map_file(base + low, high - low, self._file, low)
        if not keep:
            for low, high in staying:
                drop_pages(base + low, high - low)
        for low, high in subtract(grown, self._foreign) if grown else ():
            map_file(base + low, high - low, self._file, low)
        if tracker is not None and end > 0:
            for low, high in (*remapped, *grown):  # new mappings are tracked first:
                tracker.watch(base + low, base + high)  # protecting untracked ones fails
            if keep:
                self._mark_kept(fresh, added)
                cold = self._hot.settle(staying, end // PAGE, pages)
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

    def _split_foreign(self, ranges: Ranges) -> tuple[Ranges, Ranges, list[slice]]:
        """Ordered ``ranges`` (within ``[0, mapped)``) cut into their parts that are another
        file's view and those that are not, the latter with their ``page_slices``. Which
        ranges touch another file's pages is found in C (``page_parts``); only those are cut:
        a checkpoint asks with a hundred ranges, and few or none touch one."""
        pages = page_slices(ranges)
        touching = [1 in part for part in page_parts(self._foreign_pages, pages)]
        if not any(touching):
            return [], ranges, pages
        inside: Ranges = []
        outside = list(compress(ranges, map(operator.not_, touching)))
        for low, high, within in pieces(list(compress(ranges, touching)), self._foreign):
            (inside if within else outside).append((low, high))
        outside.sort()
        return inside, outside, page_slices(outside)

    def _mark_foreign(self, ranges: Ranges, value: int) -> None:
        for part in page_slices(ranges):
            self._foreign_pages[part] = bytes([value]) * (part.stop - part.start)

    def _not_kept(self, pages: list[slice]) -> list[slice]:
        """Those of ``pages`` (within ``[0, mapped)``) with any page not left in place already."""
        kept = self._kept_pages
        return [part for part, was in zip(pages, page_parts(kept, pages), strict=True) if 0 in was]

    def _mark_kept(self, pages: list[slice], count: int) -> None:
        """Count ``pages`` (``count`` bytes of them new) as left in place."""
        self._kept += count
        for part in pages:
            self._kept_pages[part] = b"\x01" * (part.stop - part.start)

    def _collect(self, base: int) -> Ranges:
        if self._tracker is None or not self.mapped:
            return []
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
        area = check(
            libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0), "mmap"
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
            libc.munmap(area, 4 * PAGE)
    return None
