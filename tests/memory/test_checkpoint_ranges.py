"""A checkpoint's ranges of written pages, in process on scratch memory (no kernel): every size
of range is saved exactly, pieces of another file's view that a cell writes move into the
checkpoint file and only those, and the written ranges are merged across small gaps.

Memory as in a guest started from a boot image: parts of it a copy-on-write view of another
file. Each cell writes a pattern that crosses those parts' bounds, in ranges copied each of
the three ways a checkpoint saves (memoryview slices, memmove, pwrite); a rollback after
scribbling over all memory must bring back every byte the checkpoint saw.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import pytest

from wasm_kernel.memory import cow, page_ranges, written_pages

pytestmark = pytest.mark.nokernel

PAGE = cow.PAGE
PAGES = 1024
# pieces of the other file's view, in pages: single pages, short runs, one past 1 MiB
FOREIGN = [(10, 20), (22, 23), (30, 60), (100, 101), (300, 600)]
# what each cell writes, in pages: crossing the pieces' bounds, within them, beside them, in
# ranges small (slices), past COPY_HOLDING_GIL (memmove) and past WRITE_FROM (pwrite)
CELLS = [
    [(15, 16), (21, 23), (40, 60), (70, 76)],
    [(9, 12), (100, 101), (290, 560), (700, 720)],
    [(15, 16), (18, 31), (640, 1000)],
    [(0, PAGES)],
]


def _foreign_map(memory: cow.CopyOnWriteMemory) -> bytearray:
    """The page map of another file's pieces, from the pieces themselves."""
    pages = bytearray(memory.mapped // PAGE)
    for low, high in memory.foreign:
        pages[low // PAGE : high // PAGE] = b"\x01" * ((high - low) // PAGE)
    return pages


@pytest.mark.skipif(cow.copy_on_write_missing() is not None, reason="no copy-on-write here")
@pytest.mark.parametrize(
    ("finder", "kept_limit"),
    [
        ("userfaultfd", cow.KEPT_LIMIT),  # written pages left in place
        ("userfaultfd", 0),  # dropped
        ("PAGEMAP_SCAN", 0),
        ("/proc/self/pagemap", 0),
    ],
)
def test_ranges_of_every_size_across_another_files_pieces_roll_back_exactly(
    monkeypatch: pytest.MonkeyPatch, finder: str, kept_limit: int
) -> None:
    if finder == "userfaultfd" and not written_pages.write_protect_works():
        pytest.skip("no userfaultfd write-protection here")
    if finder == "/proc/self/pagemap":
        monkeypatch.setattr(written_pages, "pagemap_scan_works", lambda: False)
    monkeypatch.setattr(cow, "KEPT_LIMIT", kept_limit)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    area = mmap.mmap(-1, PAGES * PAGE, flags=flags)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    image = os.memfd_create("boot-image-like")
    memory = cow.CopyOnWriteMemory(track_writes=finder == "userfaultfd")
    try:
        os.write(image, bytes(range(256)) * (PAGES * PAGE // 256))
        for low, high in FOREIGN:
            cow.map_file(base + low * PAGE, (high - low) * PAGE, image, low * PAGE)
        area[0:PAGE] = b"\x05" * PAGE
        memory.take(base, PAGES * PAGE)
        assert memory.foreign == [(low * PAGE, high * PAGE) for low, high in FOREIGN]
        for value, cell in enumerate(CELLS, start=1):
            for low, high in cell:
                area[low * PAGE + value : high * PAGE : 97] = bytes([value]) * len(
                    range(low * PAGE + value, high * PAGE, 97)
                )
            seen = area[:]
            written = memory.take(base, PAGES * PAGE)
            assert written >= sum(high - low for low, high in cell) * PAGE
            assert area[:] == seen
            # the written parts of the pieces are the checkpoint's now, the rest still theirs
            still = page_ranges.subtract(
                [(low * PAGE, high * PAGE) for low, high in FOREIGN],
                [(low * PAGE, high * PAGE) for done in CELLS[:value] for low, high in done],
            )
            assert page_ranges.subtract(memory.foreign, still) == []
            assert ((100 * PAGE, 101 * PAGE) in memory.foreign) == (value == 1)
            assert _foreign_map(memory) == memory._foreign_pages
            area[:] = b"\xff" * (PAGES * PAGE)  # a cell that traps: everything scribbled
            memory.restore(base, PAGES * PAGE)
            assert area[:] == seen, f"cell {value}: the rollback lost bytes"
        assert memory.foreign == []
    finally:
        memory.close()
        os.close(image)
        area.close()


def test_written_ranges_merge_across_gaps_of_up_to_merge_gap() -> None:
    """Ranges closer than MERGE_GAP become one (saving the pages between costs less than a
    range), each less the offset asked; farther ones stay apart."""
    gap = page_ranges.MERGE_GAP
    base = 1 << 40
    # gaps of a page, of exactly MERGE_GAP, then of a page more
    starts = [base, base + 2 * PAGE, base + 3 * PAGE + gap, base + 5 * PAGE + 2 * gap]
    ends = [base + PAGE, base + 3 * PAGE, base + 4 * PAGE + gap, base + 6 * PAGE + 2 * gap]
    assert page_ranges.merged_across_gaps((starts, ends), base) == [
        (0, 4 * PAGE + gap),
        (5 * PAGE + 2 * gap, 6 * PAGE + 2 * gap),
    ]
    assert page_ranges.merged_across_gaps(([], [])) == []
