"""Checkpoints of a guest interpreter and the memory writes of a soft interrupt.

Both act directly on the guest's linear memory through its host address. They rely on the
runtime having been rewritten by ``rewrite.make_restorable`` (exported mutable globals and a
program break in ``wasm_kernel.brk``) and on wasmtime never moving a 32-bit memory, which it
reserves whole up front.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

import wasmtime

from .rewrite import BRK_EXPORT, GLOBAL_EXPORT_PREFIX, GROW_FAILED_EXPORT, InterruptCells

Store = wasmtime.Store | wasmtime.Caller


def memory_address(memory: wasmtime.Memory, store: Store) -> int:
    return ctypes.addressof(memory.data_ptr(store).contents)


@dataclass
class CheckpointStats:
    bytes: int = 0
    seconds: float = 0.0


class GuestState:
    """Linear memory up to the program break plus every mutable global, kept for rollback.

    The copy lives in one buffer that is reused (and only ever grown), so taking a checkpoint
    after each cell costs a memory copy, not an allocation.
    """

    def __init__(self, memory: wasmtime.Memory, exports: dict[str, wasmtime.Global]):
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

    def take(self, store: wasmtime.Store) -> None:
        began = time.perf_counter()
        if self._brk.value(store) == 0:
            # sbrk sets the break lazily; fix it now so a rollback cannot lose it
            self._brk.set_value(store, self._memory.data_len(store))
        size = self._brk.value(store)
        if len(self._buffer) < size:
            self._buffer = bytearray(size + (16 << 20))  # head room: fewer reallocations
        buffer = (ctypes.c_char * len(self._buffer)).from_buffer(self._buffer)
        ctypes.memmove(buffer, memory_address(self._memory, store), size)
        self._size = size
        self._saved_globals = {name: value.value(store) for name, value in self._globals.items()}
        self._saved_globals[BRK_EXPORT] = size
        self.last = CheckpointStats(size, time.perf_counter() - began)

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
        base = memory_address(self._memory, store)
        dirty_end = min(self._brk.value(store), self._memory.data_len(store))
        buffer = (ctypes.c_char * len(self._buffer)).from_buffer(self._buffer)
        ctypes.memmove(base, buffer, self._size)
        if dirty_end > self._size:
            ctypes.memset(base + self._size, 0, dirty_end - self._size)
        for name, value in self._saved_globals.items():
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
