"""Checkpoints of a guest interpreter and the memory writes of a soft interrupt.

Both act directly on the guest's linear memory through its host address. They rely on the
runtime having been rewritten by ``rewrite.make_restorable`` (exported mutable globals and a
program break in ``wasm_kernel.brk``) and on wasmtime never moving a 32-bit memory, which it
reserves whole up front.

Memory is checkpointed copy-on-write where the OS allows (``cow``: the cost follows the pages
a cell wrote), else copied whole into a buffer (the cost follows the heap).
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import wasmtime

from ..runtime.rewrite import BRK_EXPORT, GLOBAL_EXPORT_PREFIX, GROW_FAILED_EXPORT, InterruptCells
from . import live_memory
from .cow import CopyOnWriteMemory, FileKey, copy_on_write_missing, dirty_page_finder
from .live_memory import LiveMemory

Store = wasmtime.Store | wasmtime.Caller
log = logging.getLogger(__name__)

COPY_ON_WRITE = "copy-on-write"
COPY = "a copy of guest memory after each cell"


def memory_address(memory: wasmtime.Memory, store: Store) -> int:
    return ctypes.addressof(memory.data_ptr(store).contents)


def checkpoint_method(mode: str) -> str:
    """How checkpoints are taken here under ``mode`` ('auto': copy-on-write where the OS can)."""
    if mode == "copy":
        return f"{COPY} (checkpoint_mode 'copy')"
    missing = copy_on_write_missing()
    if missing is not None:
        return f"{COPY} ({missing})"
    return (
        f"{COPY_ON_WRITE} (the pages a cell wrote, found with {dirty_page_finder()}, kept in a"
        " memfd mapped over guest memory)"
    )


@dataclass
class CheckpointStats:
    bytes: int = 0  # guest memory the checkpoint holds
    seconds: float = 0.0
    written: int = 0  # bytes copied to take it


class GuestState:
    """Linear memory up to the program break plus every mutable global, kept for rollback.

    Copy-on-write, memory is a private view of the checkpoint file (see ``cow``). Otherwise
    the copy lives in one buffer that is reused (and only ever grown), so taking a checkpoint
    after each cell costs a memory copy, not an allocation.
    """

    def __init__(
        self, memory: wasmtime.Memory, exports: dict[str, wasmtime.Global], mode: str = "auto"
    ):
        self.method = checkpoint_method(mode)
        self._cow: CopyOnWriteMemory | None = None
        self._start_file()
        self._memory = memory
        self._brk = exports[BRK_EXPORT]
        self._grow_failed = exports[GROW_FAILED_EXPORT]
        self._globals = {
            name: value for name, value in exports.items() if name.startswith(GLOBAL_EXPORT_PREFIX)
        }
        self._buffer = bytearray()
        self._saved_globals: dict[str, int] = {}
        self._size = 0
        self.last = CheckpointStats()
        self.last_restore_seconds = 0.0
        # files handed to forks that guest memory still maps, by (device, inode): a later
        # fork names them rather than copying their pages
        self._frozen: dict[FileKey, int] = {}

    def take(self, store: wasmtime.Store) -> None:
        began = time.perf_counter()
        if self._brk.value(store) == 0:
            # sbrk sets the break lazily; fix it now so a rollback cannot lose it
            self._brk.set_value(store, self._memory.data_len(store))
        # sbrk keeps the break within memory; never read (or map) past what the guest can reach
        size = min(self._brk.value(store), self._memory.data_len(store))
        written = self._take_memory(store, size)
        self._size = size
        self._saved_globals = self.global_values(store)
        self.last = CheckpointStats(size, time.perf_counter() - began, written)

    def _take_memory(self, store: wasmtime.Store, size: int) -> int:
        base = memory_address(self._memory, store)
        if self._cow is not None:
            try:
                return self._cow.take(base, size)
            except OSError as exc:  # e.g. no memory for the file: copy from now on
                log.warning("copy-on-write checkpoint failed, copying from now on: %s", exc)
                self.method = f"{COPY} (copy-on-write failed: {exc})"
                self._cow.close()  # the mapping keeps its file; the guest still reads it
                self._cow = None
        if len(self._buffer) < size:
            self._buffer = bytearray(size + (16 << 20))  # head room: fewer reallocations
        buffer = (ctypes.c_char * len(self._buffer)).from_buffer(self._buffer)
        ctypes.memmove(buffer, base, size)
        return size

    def _start_file(self) -> None:
        if self.method.startswith(COPY_ON_WRITE):
            try:
                self._cow = CopyOnWriteMemory()
            except OSError as exc:
                self.method = f"{COPY} (copy-on-write unavailable: {exc})"

    @property
    def shares(self) -> bool:
        """Whether a forked kernel can map these checkpoints (they are copy-on-write files)."""
        return self._cow is not None

    def hand_over(self, store: wasmtime.Store, boot_file: Path | None) -> LiveMemory:
        """Freeze the checkpoint just taken for a forked kernel to map (``live_memory``) and
        go on with a new one, which starts out mapping the frozen one's pages. The returned
        descriptors are the caller's to close. Only where the checkpoints are ``shares``."""
        if self._cow is None:
            raise OSError(f"checkpoints here are {self.method}, which a fork cannot share")
        base = memory_address(self._memory, store)
        live, key, still_mapped = live_memory.freeze(self._cow, base, boot_file, self._frozen)
        for old in [old for old in self._frozen if old not in still_mapped]:
            os.close(self._frozen.pop(old))  # no page maps it any more
        self._frozen[key] = live.fds[0]
        self._cow = None
        self._start_file()
        self.take(store)
        fds = [os.dup(fd) for fd in live.fds]
        return replace(live, fds=fds)

    def forget(self) -> None:
        """Drop the checkpoint, after guest memory was mapped anew (a boot image, a saved
        session): the next checkpoint starts from what is mapped then. Until it is taken, a
        trap restarts the interpreter."""
        self.close()
        self._start_file()

    def close(self) -> None:
        """Free the checkpoint; the guest memory must be gone already or never used again."""
        for fd in self._frozen.values():
            os.close(fd)
        self._frozen.clear()
        if self._cow is not None:
            self._cow.close()
            self._cow = None
        self._buffer = bytearray()
        self._size = 0

    def growth_failed(self, store: Store, reset: bool = False) -> bool:
        """Whether sbrk failed to grow memory (the memory limit) since the last reset."""
        failed = self._grow_failed.value(store) != 0
        if reset:
            self._grow_failed.set_value(store, 0)
        return failed

    @property
    def taken(self) -> bool:
        return self._size > 0

    def restore(self, store: wasmtime.Store) -> None:
        """Put memory and globals back; memory the cell added past the break becomes zero again.

        dlmalloc assumes that fresh memory from sbrk is zeroed, so the region between the
        checkpoint's break and the trapped cell's break is cleared.
        """
        began = time.perf_counter()
        base = memory_address(self._memory, store)
        if self._cow is not None:  # every page the cell wrote, up to the end of memory
            self._cow.restore(base, self._memory.data_len(store))
        else:
            dirty_end = min(self._brk.value(store), self._memory.data_len(store))
            buffer = (ctypes.c_char * len(self._buffer)).from_buffer(self._buffer)
            ctypes.memmove(base, buffer, self._size)
            if dirty_end > self._size:
                ctypes.memset(base + self._size, 0, dirty_end - self._size)
        self.set_global_values(store, self._saved_globals)
        self.last_restore_seconds = time.perf_counter() - began

    def global_values(self, store: Store) -> dict[str, int]:
        """Every mutable global and the program break, by export name (what an image needs
        besides memory)."""
        values = {name: value.value(store) for name, value in self._globals.items()}
        values[BRK_EXPORT] = self._brk.value(store)
        return values

    def set_global_values(self, store: Store, values: dict[str, int]) -> None:
        for name, value in values.items():
            target = self._brk if name == BRK_EXPORT else self._globals[name]
            target.set_value(store, value)


class SignalFlags:
    """Writes what CPython's SIGINT handler writes, so the guest raises KeyboardInterrupt."""

    def __init__(self, cells: InterruptCells, base: int, size: int):
        self._cells = cells
        self._base = base
        self._size = size

    def _word(self, address: int) -> ctypes.c_uint32:
        if not 0 <= address <= self._size - 4:
            raise IndexError(f"guest address {address:#x} outside memory")
        return ctypes.c_uint32.from_address(self._base + address)

    def _breaker(self) -> ctypes.c_uint32:
        thread_state = self._word(self._cells.breaker_pointer).value
        return self._word(thread_state + self._cells.breaker_offset)

    def trip(self) -> None:
        self._word(self._cells.handler_tripped).value = 1
        self._word(self._cells.is_tripped).value = 1
        breaker = self._breaker()
        breaker.value |= self._cells.breaker_bit

    def clear(self) -> None:
        self._word(self._cells.handler_tripped).value = 0
        self._word(self._cells.is_tripped).value = 0
        breaker = self._breaker()
        breaker.value &= ~self._cells.breaker_bit & 0xFFFFFFFF
