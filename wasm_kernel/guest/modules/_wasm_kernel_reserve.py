"""Bytes held back from the user's code, so that a full memory loses nothing.

When a cell fills memory up to the sandbox's limit and keeps it (a MemoryError it caught, or
objects it left referenced), the reserve is given back so that the error can still be
formatted and the next cell can run, and free that memory. The kernel's module calls this one
at boot and at the end of each cell, and the shell when it formats a MemoryError.
"""

import io
import sys

MEMORY_RESERVE = 8 << 20
MEMORY_LOW = 1 << 20  # less room than this at the end of a cell gives the reserve back

_reserve = None  # the held-back bytes; None once given back, until memory allows again


def release():
    """Memory ran out (the shell formats a MemoryError, or a cell ended with memory nearly
    full): give the reserve back, for the error and the next cell."""
    global _reserve
    _reserve = None


def keep_room(shell):
    """At the end of a cell: the reserve (see ``hold``); if memory is still nearly full, the
    last failure's frames, kept for %debug, are let go and the reserve taken again."""
    hold()
    if _reserve is None:
        try:
            released = sys.modules["_wasm_kernel_debugging"].release_frames_for_memory(shell)
        except Exception:  # a cell broke that module: only this memory rule is lost
            return
        if released:
            hold()


def hold():
    """At the end of a cell: give the reserve back if memory is nearly full (a cell that caught
    its MemoryError, or keeps what filled memory; it is done here, in a turn that is running
    already, since a new turn could not even compile its source), or take it again where twice
    its size is free, so that memory still full keeps the room it was given."""
    global _reserve
    if _reserve is not None:
        if not _room_for(MEMORY_LOW):
            release()
        return
    if not _room_for(2 * MEMORY_RESERVE):
        return
    try:
        _reserve = bytearray(MEMORY_RESERVE)
    except MemoryError:
        pass


def _room_for(size):
    """Whether ``size`` bytes can be allocated now, asked without writing them: a buffered
    reader's buffer is allocated and not filled, where a bytearray would be zeroed (pages a
    checkpoint then has to save)."""
    try:
        io.BufferedReader(io.BytesIO(), buffer_size=size)
    except MemoryError:
        return False
    return True
