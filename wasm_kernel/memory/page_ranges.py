"""Ranges of guest memory as ordered ``[start, end)`` pairs, and their algebra: what the
checkpoints (``cow``) and the finders of written pages (``written_pages``) compute with."""

from __future__ import annotations

import mmap
from bisect import bisect_right
from collections.abc import Iterator
from operator import itemgetter

PAGE = mmap.PAGESIZE
Ranges = list[tuple[int, int]]  # [start, end) pairs
Bounds = tuple[list[int], list[int]]  # the starts of ordered ranges, and their ends
MERGE_GAP = 8 * PAGE


def page_up(size: int) -> int:
    return -(-size // PAGE) * PAGE


def union(ranges: Ranges) -> Ranges:
    """Overlapping or touching ranges merged, in order."""
    merged: Ranges = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def pieces(a: Ranges, b: Ranges) -> Iterator[tuple[int, int, bool]]:
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


def page_slices(ranges: Ranges) -> list[slice]:
    """The page numbers of each of ``ranges`` (page-aligned), as slices of a byte-per-page map."""
    return [slice(low // PAGE, high // PAGE) for low, high in ranges]


def page_parts(pages: bytearray, slices: list[slice]) -> tuple[bytearray, ...]:
    """The parts of a byte-per-page map that ``slices`` select, cut in C (``itemgetter``)."""
    if len(slices) < 2:
        return tuple(pages[part] for part in slices)
    return itemgetter(*slices)(pages)


def cut_out(ranges: Ranges, pieces: Ranges) -> Ranges:
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
    return union([(low, high) for low, high, inside in pieces(union(a), union(b)) if inside])


def subtract(a: Ranges, b: Ranges) -> Ranges:
    """The parts of ranges ``a`` outside ranges ``b``."""
    return union([(low, high) for low, high, inside in pieces(union(a), union(b)) if not inside])


def merged_across_gaps(bounds: Bounds, offset: int = 0) -> Ranges:
    """Ordered ranges (their starts and ends), merged across gaps of up to ``MERGE_GAP``, each
    less ``offset``: saving or dropping pages that equal the checkpoint's too is harmless, and
    each range costs a checkpoint a system call or more. In list comprehensions: a loop over
    the ranges in Python cost a checkpoint more than its scan."""
    starts, ends = bounds
    if not starts:
        return []
    pairs = list(zip(ends, starts[1:], strict=False))  # each range's end, the next one's start
    lows = [starts[0] - offset]
    lows += [start - offset for end, start in pairs if start - end > MERGE_GAP]
    highs = [end - offset for end, start in pairs if start - end > MERGE_GAP]
    highs.append(ends[-1] - offset)
    return list(zip(lows, highs, strict=True))
