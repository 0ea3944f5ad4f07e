"""The host functions the guest imports, each defining itself on the linker.

``HostCall`` is ``host.call``, the guest's one channel for messages (see ``contract``): it
reads a message, checks it, answers what is about the turn itself and hands the rest to the
turn's receiver. ``GuestClock`` replaces WASI's clocks and ``poll_oneoff``, so that a resumed
guest's clocks never run backwards and a sleep can be woken by an interrupt. Symbolic links
are refused outright.
"""

from __future__ import annotations

import ctypes
import json
import logging
import struct
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

import wasmtime

from ..guest.modules import _wasm_kernel_contract as declared
from ..memory.checkpoints import memory_address
from ..runtime.immortal import make_immortal
from . import contract
from .contract import Verdict
from .interrupts import Interrupts
from .limits import Limits
from .output import OutputPump
from .stops import TIME, time_limit_interrupted

log = logging.getLogger(__name__)

MAX_MESSAGE = declared.MESSAGE_LIMIT  # largest host.call payload read from the guest
WASI = "wasi_snapshot_preview1"
WASI_EFAULT = 21
WASI_EPERM = 63
WASI_EINVAL = 28
CLOCKS = {0: time.time_ns, 1: time.monotonic_ns, 2: time.process_time_ns, 3: time.thread_time_ns}
_I32 = wasmtime.ValType.i32()
_I64 = wasmtime.ValType.i64()


class Receiver(Protocol):
    """Receives what the guest produces during one turn: a cell's Jupyter messages, or
    nothing (``Discard``, for service requests)."""

    def stream(self, name: str, text: str) -> None: ...

    def message(self, message: dict, verdict: Verdict, interrupts: Interrupts) -> dict: ...


class Discard:
    """The receiver of service requests: their prints and messages are not shown."""

    def stream(self, name: str, text: str) -> None:
        pass

    def message(self, message: dict, verdict: Verdict, interrupts: Interrupts) -> dict:
        return {}


class GuestMemory:
    """Bounded reads and writes of one interpreter's linear memory."""

    def __init__(self, memory: wasmtime.Memory):
        self.memory = memory

    def read(self, store: wasmtime.Caller | wasmtime.Store, pointer: int, length: int) -> bytes:
        """Exactly ``length`` bytes at a guest pointer; wasm i32 values arrive signed."""
        pointer, length = pointer & 0xFFFFFFFF, length & 0xFFFFFFFF
        if pointer + length > self.memory.data_len(store):
            raise IndexError("guest pointer out of bounds")
        return bytes(self.memory.read(store, pointer, pointer + length))

    def write(self, store: wasmtime.Caller | wasmtime.Store, pointer: int, data: bytes) -> None:
        self.memory.write(store, data, pointer & 0xFFFFFFFF)  # raises IndexError out of bounds


class SymlinkRefusal:
    """No symlinks: one made in a writable mount could point a host program that later opens
    it (a backup, the user's editor) at files the guest was never granted."""

    def define(self, linker: wasmtime.Linker) -> None:
        func_type = wasmtime.FuncType([_I32] * 5, [_I32])
        linker.define_func(WASI, "path_symlink", func_type, lambda *_: WASI_EPERM)


class HostCall:
    """``host.call``: one guest message in, its reply out. The sandbox answers what is about
    the turn itself (a sleep, why it is interrupted, a service's answer, immortal objects);
    the turn's receiver everything else, with the host's verdict on it beside the message."""

    def __init__(
        self,
        output: OutputPump,
        interrupts: Interrupts,
        paused: Callable[[], AbstractContextManager[None]],
        hit_memory_limit: Callable[[wasmtime.Caller], bool],
    ):
        self._output = output
        self._interrupts = interrupts
        self._paused = paused  # the turn's time limit stopped meanwhile
        self._hit_memory_limit = hit_memory_limit
        self._memory: GuestMemory | None = None
        self._alloc: wasmtime.Func | None = None
        self._receiver: Receiver | None = None
        self._limits: Limits | None = None
        self.reply: dict | None = None  # the last service's answer
        self.time_limit_reported = False  # the cell reported its TimeLimitExceeded itself
        self.making_boot_image = False  # only then may the guest make objects immortal
        self._own = {
            declared.SLEEP.op: self._sleep,
            declared.REPLY.op: self._take_reply,
            declared.INTERRUPTION.op: self._interruption,
            declared.IMMORTALIZE.op: self._immortalize,
        }

    def define(self, linker: wasmtime.Linker) -> None:
        func_type = wasmtime.FuncType([_I32] * 4, [_I32])
        linker.define_func("host", "call", func_type, self._call, access_caller=True)

    def bind(self, memory: GuestMemory, alloc: wasmtime.Func) -> None:
        """The interpreter's memory and allocator, once it is instantiated."""
        self._memory, self._alloc = memory, alloc

    def begin(self, receiver: Receiver, limits: Limits) -> None:
        self._receiver, self._limits = receiver, limits
        self.time_limit_reported = False

    def end(self) -> None:
        self._receiver = None

    def _call(
        self, caller: wasmtime.Caller, ptr: int, length: int, out_ptr: int, out_len_ptr: int
    ) -> int:
        assert self._memory is not None and self._alloc is not None
        memory = self._memory
        try:
            size = length & 0xFFFFFFFF
            if size > MAX_MESSAGE or not self._output.fits(size + contract.MESSAGE_COST):
                reply = self._oversized(caller, ptr, size)
            else:
                reply = self._dispatch(contract.parse(memory.read(caller, ptr, size)), size, caller)
            data = json.dumps(reply).encode()
            pointer = self._alloc(caller, len(data))
            if not pointer & 0xFFFFFFFF:  # never write at address 0: the guest's own data
                log.warning("the guest had no room for a %d-byte reply", len(data))
                return -2
            memory.write(caller, pointer, data)
            memory.write(caller, out_ptr, struct.pack("<I", pointer & 0xFFFFFFFF))
            memory.write(caller, out_len_ptr, struct.pack("<I", len(data)))
            return 0
        except contract.ProtocolError as exc:
            log.warning("refused a guest message: %s", exc)
            return -2
        except wasmtime.Trap:
            raise
        except Exception:
            log.exception("host.call failed")
            return -2

    def _oversized(self, caller: wasmtime.Caller, ptr: int, size: int) -> dict:
        """A message too big for the cell's output budget, or to read at all: output (and
        anything unreadable) is left out with the notice, unread; an error too big to read
        still fails the cell."""
        assert self._memory is not None
        kind = contract.peek_op(self._memory.read(caller, ptr, min(size, contract.PEEK_BYTES)))
        if size <= MAX_MESSAGE and not (kind is not None and kind.droppable):
            # not output, or an error: read it as any other message
            message = contract.parse(self._memory.read(caller, ptr, size))
            return self._dispatch(message, size, caller)
        if kind is not None and size > kind.limit:  # a guest that skipped its own check
            refusal = contract.too_large(kind, size)
            if refusal is not None:
                return refusal
        if kind is declared.ERROR and self._receiver is not None:
            self._output.flush()
            error = contract.oversized_error(size)
            return self._receiver.message(error, Verdict(), self._interrupts)
        self._output.charge(size)  # does not fit: queues the notice, counts nothing
        return {}

    def _dispatch(self, message: dict, size: int, caller: wasmtime.Caller) -> dict:
        kind = contract.declaration(message)
        if size > kind.limit:
            return contract.too_large(kind, size) or {}
        if kind is declared.ERROR and self._interrupts.soft_reason == TIME:
            self.time_limit_reported = True  # the cell's own error (TimeLimitExceeded) stands
        own = self._own.get(kind.op)
        if own is not None:
            return own(message, caller)
        verdict = Verdict()
        if kind is declared.ERROR and message["ename"] == "MemoryError":
            verdict.memory_limit = self._hit_memory_limit(caller)  # the guest cannot say so
        if kind.output and not self._output.charge(size + contract.MESSAGE_COST):
            if kind.droppable:
                return {}  # over the cell's output budget: left out, with the notice
            verdict.shown = False  # an error still fails the cell, shown briefly at its end
        receiver = self._receiver
        if receiver is None:
            return {}
        self._output.flush()  # keep printed text ahead of what the message shows
        if kind.waits:  # a person answering, or pip on the host: not the cell's time
            with self._paused():
                return receiver.message(message, verdict, self._interrupts)
        return receiver.message(message, verdict, self._interrupts)

    def _sleep(self, message: dict, _caller: wasmtime.Caller) -> dict:
        end = time.monotonic() + message["seconds"]
        while True:
            if self._interrupts.take():
                return {"interrupted": True}
            remaining = end - time.monotonic()
            if remaining <= 0:
                return {"interrupted": False}
            self._interrupts.wait(remaining)

    def _take_reply(self, message: dict, _caller: wasmtime.Caller) -> dict:
        self.reply = message["content"]
        return {}

    def _interruption(self, _message: dict, _caller: wasmtime.Caller) -> dict:
        if self._interrupts.take_pause():
            return {"pause": True}
        if self._interrupts.soft_reason != TIME or self._limits is None:
            return {}
        return {"time_limit": time_limit_interrupted(self._limits)}

    def _immortalize(self, message: dict, caller: wasmtime.Caller) -> dict:
        if not self.making_boot_image:  # a session's guest runs user code: not there
            return {"immortal": 0}
        assert self._memory is not None
        memory = self._memory.memory
        size = memory.data_len(caller)
        view = (ctypes.c_char * size).from_address(memory_address(memory, caller))
        return {"immortal": make_immortal(memoryview(view).cast("B"), message["addresses"])}


class GuestClock:
    """WASI's clocks and ``poll_oneoff``, from the host's: a resumed guest's clocks are moved
    on past what it saw, and a poll (a sleep) wakes on any interrupt or stop (wasmtime's
    own poll cannot be woken)."""

    def __init__(self, interrupts: Interrupts):
        self._interrupts = interrupts
        self.offsets = dict.fromkeys(CLOCKS, 0)  # added to the host's readings
        self.memory: GuestMemory | None = None

    def define(self, linker: wasmtime.Linker) -> None:
        linker.define_func(
            WASI,
            "poll_oneoff",
            wasmtime.FuncType([_I32] * 4, [_I32]),
            self._poll_oneoff,
            access_caller=True,
        )
        linker.define_func(
            WASI,
            "clock_time_get",
            wasmtime.FuncType([_I32, _I64, _I32], [_I32]),
            self._clock_time_get,
            access_caller=True,
        )

    def now(self, clock_id: int) -> int:
        """The guest's reading of a clock: the host's, moved on past what a resumed guest saw."""
        return CLOCKS[clock_id]() + self.offsets[clock_id]

    def readings(self) -> dict[int, int]:
        """What an image keeps: the guest's clocks, but the real-time one (the host's stands)."""
        return {clock: self.now(clock) for clock in CLOCKS if clock}

    def resume(self, readings: dict[int, int]) -> None:
        """Never behind what an image's guest read last."""
        for clock, reading in readings.items():
            self.offsets[clock] = max(0, reading - CLOCKS[clock]())

    def _clock_time_get(
        self, caller: wasmtime.Caller, clock_id: int, _precision: int, out_ptr: int
    ) -> int:
        """The guest's clocks, from the host's, so that poll deadlines agree with them."""
        if clock_id not in CLOCKS:
            return WASI_EINVAL
        assert self.memory is not None
        try:
            self.memory.write(caller, out_ptr, struct.pack("<Q", self.now(clock_id)))
        except (IndexError, ValueError, wasmtime.WasmtimeError):
            return WASI_EFAULT
        return 0

    def _poll_oneoff(
        self, caller: wasmtime.Caller, in_ptr: int, out_ptr: int, count: int, nevents_ptr: int
    ) -> int:
        """WASI poll that an interrupt or stop can wake (wasmtime's own cannot be woken)."""
        if count <= 0 or count > 4096:
            return WASI_EINVAL
        try:
            return self._poll(caller, in_ptr, out_ptr, count, nevents_ptr)
        except (IndexError, ValueError, struct.error, wasmtime.WasmtimeError):
            return WASI_EFAULT

    def _poll(
        self, caller: wasmtime.Caller, in_ptr: int, out_ptr: int, count: int, nevents_ptr: int
    ) -> int:
        assert self.memory is not None
        raw = self.memory.read(caller, in_ptr, 48 * count)
        ready: list[tuple[int, int]] = []  # (userdata, event type)
        timers: list[tuple[float, int]] = []  # (seconds from now, userdata)
        for index in range(count):
            userdata, tag = struct.unpack_from("<QB", raw, 48 * index)
            if tag == 0:
                clock_id, timeout, _precision, flags = struct.unpack_from(
                    "<I4xQQH", raw, 48 * index + 16
                )
                if clock_id not in CLOCKS:
                    return WASI_EINVAL
                delay_ns = timeout - self.now(clock_id) if flags & 1 else timeout
                timers.append((max(delay_ns, 0) / 1e9, userdata))
            else:  # fd readiness: the guest has no real streams to wait on
                ready.append((userdata, tag))
        if not ready and timers:
            delay, userdata = min(timers)
            if self._interrupts.stop_reason is None:
                self._interrupts.wait(delay)
            ready.append((userdata, 0))
        events = b"".join(
            struct.pack("<QHBx4xQH6x", userdata, 0, kind, 0, 0) for userdata, kind in ready
        )
        self.memory.write(caller, out_ptr, events)
        self.memory.write(caller, nevents_ptr, struct.pack("<I", len(ready)))
        return 0
