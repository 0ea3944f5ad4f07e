"""Immortal objects in the boot image: CPython stops writing their reference counts.

Every object a cell merely uses (IPython's functions and dicts, a module's globals, the
strings they hold) has its reference count raised and lowered by CPython, which writes the
page it lives on. After a checkpoint each such page costs a write fault, a place in the next
checkpoint and a private copy of the boot image's shared page: about half of the ~750 pages a
bare ``x + 1`` cell wrote were written only for reference counts. CPython 3.12+ skips those
writes for immortal objects (PEP 683), which it recognises by the count itself; the guest
cannot set that from Python, so while the boot image is built the guest names the objects
it holds then and the host sets their counts, as CPython does for its own immortal objects.

An immortal object is never freed: a boot-image object a session drops stays in memory, which
is bounded by the image and costs what the pages saved would have.
"""

from __future__ import annotations

import sys
from array import array

#: CPython's counts for 32-bit builds (Include/refcount.h): a count at or above the minimum
#: is immortal; it is set to the initial value, mid-range, so that stray increments and
#: decrements from code unaware of immortality keep it so.
IMMORTAL_MINIMUM = 1 << 30
IMMORTAL_INITIAL = 5 << 28


def make_immortal(memory: memoryview, addresses: bytes) -> int:
    """Set the reference count of the objects at ``addresses`` (little-endian u32 guest
    addresses) in guest ``memory`` (bytes) to immortal; returns how many changed. Addresses
    out of bounds or unaligned, and counts that are not a live object's, are left alone.
    On a big-endian host nothing is changed (the guest's memory is little-endian)."""
    if sys.byteorder != "little":
        return 0
    counts = memory[: len(memory) // 4 * 4].cast("i")
    changed = 0
    for address in array("I", addresses):
        if address % 4 or address // 4 >= len(counts):
            continue
        count = counts[address // 4]
        if 0 < count < IMMORTAL_MINIMUM:
            counts[address // 4] = IMMORTAL_INITIAL
            changed += 1
    return changed
