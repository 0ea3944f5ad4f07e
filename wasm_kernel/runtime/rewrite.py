"""A small WebAssembly binary rewriter that makes the runtime restorable in place.

Rolling a trapped interpreter back means writing back its linear memory and every mutable
global. The runtime module keeps its globals private and derives the program break from
``memory.size``, so this rewrite, done once per runtime build before compiling:

- exports each defined mutable global as ``wasm_kernel.global.<index>``;
- adds a mutable global ``wasm_kernel.brk`` holding the program break, and replaces the body
  of ``sbrk`` with one that moves that break and grows memory only when the break passes the
  end. Memory grown by a rolled-back cell is then reused instead of leaked (memory never
  shrinks, so otherwise each trap could strand hundreds of MiB);
- adds ``wasm_kernel.grow_failed``, which that ``sbrk`` sets when memory cannot grow (the
  memory limit), so the host can tell a trap that followed an allocation failure;
- exports wasi-libc's ``__wasilibc_reset_preopens`` as ``wasm_kernel.reset_preopens`` where
  the module has it: wasi-libc keeps its table of preopened folders in linear memory, so a
  guest resumed from an image must forget the table it was saved with and read the folders
  the resuming kernel grants.

It reads and writes only the sections it needs and refuses, with a clear error, any module
whose shape it does not recognise (no name for ``sbrk``, an unexpected signature, imported
globals, more than one memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAGIC = b"\x00asm\x01\x00\x00\x00"
VERSION = 4  # bump when the rewrite changes: it is part of the compiled-cache key

SECTION_TYPE, SECTION_IMPORT, SECTION_FUNCTION = 1, 2, 3
SECTION_GLOBAL, SECTION_EXPORT, SECTION_CODE = 6, 7, 10
I32, MUTABLE = 0x7F, 0x01
EXPORT_GLOBAL = 0x03
BRK_EXPORT = "wasm_kernel.brk"
GROW_FAILED_EXPORT = "wasm_kernel.grow_failed"  # set to 1 when sbrk could not grow memory
GLOBAL_EXPORT_PREFIX = "wasm_kernel.global."
RESET_PREOPENS_EXPORT = "wasm_kernel.reset_preopens"
EXPORT_FUNCTION = 0x00
PAGE = 65536


class UnsupportedModule(ValueError):
    """The module is not one this rewriter knows how to make restorable."""


# -- LEB128 -----------------------------------------------------------------------------------


def read_u32(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 35:
            raise UnsupportedModule("malformed LEB128 integer")


def write_u32(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def write_s32(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        done = (value == 0 and not byte & 0x40) or (value == -1 and byte & 0x40)
        out.append(byte if done else byte | 0x80)
        if done:
            return bytes(out)


def write_name(name: str) -> bytes:
    raw = name.encode()
    return write_u32(len(raw)) + raw


def read_name(data: bytes, pos: int) -> tuple[str, int]:
    length, pos = read_u32(data, pos)
    return data[pos : pos + length].decode("utf-8"), pos + length


# -- module structure -------------------------------------------------------------------------


@dataclass
class Section:
    id: int
    body: bytes
    name: str = ""  # for custom sections


@dataclass
class ModuleLayout:
    sections: list[Section] = field(default_factory=list)

    def find(self, section_id: int, name: str = "") -> Section:
        for section in self.sections:
            if section.id == section_id and section.name == name:
                return section
        raise UnsupportedModule(f"the module has no section {section_id} {name}".strip())


def parse_sections(data: bytes) -> ModuleLayout:
    if not data.startswith(MAGIC):
        raise UnsupportedModule("not a WebAssembly 1.0 binary module")
    layout = ModuleLayout()
    pos = len(MAGIC)
    while pos < len(data):
        section_id = data[pos]
        size, body_start = read_u32(data, pos + 1)
        body = data[body_start : body_start + size]
        name = read_name(body, 0)[0] if section_id == 0 else ""
        layout.sections.append(Section(section_id, body, name))
        pos = body_start + size
    return layout


def serialize(layout: ModuleLayout) -> bytes:
    parts = [MAGIC]
    for section in layout.sections:
        parts += [bytes([section.id]), write_u32(len(section.body)), section.body]
    return b"".join(parts)


def imported_counts(layout: ModuleLayout) -> tuple[int, int]:
    """Number of imported functions and globals (they come first in each index space)."""
    if not any(section.id == SECTION_IMPORT for section in layout.sections):
        return 0, 0
    body = layout.find(SECTION_IMPORT).body
    count, pos = read_u32(body, 0)
    functions = globals_ = 0
    for _ in range(count):
        _, pos = read_name(body, pos)
        _, pos = read_name(body, pos)
        kind = body[pos]
        pos += 1
        if kind == 0x00:  # function: type index
            _, pos = read_u32(body, pos)
            functions += 1
        elif kind == 0x03:  # global: valtype, mutability
            pos += 2
            globals_ += 1
        elif kind == 0x02:  # memory: limits
            flags = body[pos]
            _, pos = read_u32(body, pos + 1)
            if flags & 1:
                _, pos = read_u32(body, pos)
        else:
            raise UnsupportedModule(f"import of kind {kind} is not supported")
    return functions, globals_


def function_names(layout: ModuleLayout) -> dict[str, int]:
    """Function name -> function index, from the custom "name" section."""
    body = layout.find(0, "name").body
    _, pos = read_name(body, 0)
    names: dict[str, int] = {}
    while pos < len(body):
        subsection = body[pos]
        size, start = read_u32(body, pos + 1)
        if subsection == 1:
            count, cursor = read_u32(body, start)
            for _ in range(count):
                index, cursor = read_u32(body, cursor)
                name, cursor = read_name(body, cursor)
                names[name] = index
        pos = start + size
    return names


def code_bodies(layout: ModuleLayout) -> list[bytes]:
    body = layout.find(SECTION_CODE).body
    count, pos = read_u32(body, 0)
    bodies = []
    for _ in range(count):
        size, start = read_u32(body, pos)
        bodies.append(body[start : start + size])
        pos = start + size
    return bodies


def defined_globals(layout: ModuleLayout) -> list[tuple[int, bool, bytes]]:
    """(valtype, mutable, init expression) of each global the module defines."""
    body = layout.find(SECTION_GLOBAL).body
    count, pos = read_u32(body, 0)
    found = []
    for _ in range(count):
        valtype, mutable = body[pos], body[pos + 1] == MUTABLE
        end = _constant_end(body, pos + 2)
        found.append((valtype, mutable, body[pos + 2 : end]))
        pos = end
    return found


def _constant_end(body: bytes, pos: int) -> int:
    """End of a one-instruction constant expression (``i32.const 5 end`` and the like)."""
    opcode = body[pos]
    if opcode in (0x41, 0x42, 0x23):  # i32.const / i64.const (signed LEB), global.get
        pos += 1
        while body[pos] & 0x80:
            pos += 1
        pos += 1
    elif opcode in (0x43, 0x44):  # f32.const, f64.const
        pos += 5 if opcode == 0x43 else 9
    else:
        raise UnsupportedModule(f"unsupported global initializer opcode {opcode:#x}")
    if body[pos] != 0x0B:
        raise UnsupportedModule("global initializers must be a single constant")
    return pos + 1


# -- the rewrite --------------------------------------------------------------------------------


def _sbrk_body(brk: int, grow_failed: int) -> bytes:
    """``sbrk(increment)`` over the ``brk`` global: grow memory only past its current end."""
    get_brk = b"\x23" + write_u32(brk)
    set_brk = b"\x24" + write_u32(brk)
    fail = b"\x41\x01\x24" + write_u32(grow_failed) + b"\x41\x7f\x0f"  # flag it, return -1
    memory_bytes = b"\x3f\x00" + b"\x41" + write_s32(16) + b"\x74"  # memory.size << 16
    code = b"".join(
        [
            # first call: the break starts at the end of the initial memory
            get_brk,
            b"\x45",
            b"\x04\x40",
            memory_bytes,
            set_brk,
            b"\x0b",
            # a negative increment is not supported (dlmalloc never trims with sbrk here)
            b"\x20\x00",
            b"\x41\x00",
            b"\x48",
            b"\x04\x40",
            b"\x41\x7f",
            b"\x0f",
            b"\x0b",
            # new = brk + increment, in 64 bits so that passing 4 GiB is seen
            get_brk,
            b"\xad",
            b"\x20\x00",
            b"\xad",
            b"\x7c",
            b"\x22\x01",
            b"\x42" + write_s32(1 << 32),
            b"\x56",
            b"\x04\x40",
            fail,
            b"\x0b",
            # past the end of memory: grow by the missing pages, or fail with -1
            b"\x20\x01",
            b"\x3f\x00",
            b"\xad",
            b"\x42\x10",
            b"\x86",
            b"\x56",
            b"\x04\x40",
            b"\x20\x01",
            b"\x3f\x00",
            b"\xad",
            b"\x42\x10",
            b"\x86",
            b"\x7d",
            b"\x42" + write_s32(PAGE - 1),
            b"\x7c",
            b"\x42\x10",
            b"\x88",
            b"\xa7",
            b"\x40\x00",
            b"\x41\x7f",
            b"\x46",
            b"\x04\x40",
            fail,
            b"\x0b",
            b"\x0b",
            # return the old break and move it
            get_brk,
            b"\x20\x01",
            b"\xa7",
            set_brk,
            b"\x0b",
        ]
    )
    locals_ = write_u32(1) + write_u32(1) + b"\x7e"  # one i64 local: the new break
    return locals_ + code


def make_restorable(wasm: bytes) -> bytes:
    """Return ``wasm`` with its mutable globals exported and sbrk driven by an exported break."""
    layout = parse_sections(wasm)
    imported_functions, imported_globals = imported_counts(layout)
    if imported_globals:
        raise UnsupportedModule("modules that import globals are not supported")
    names = function_names(layout)
    sbrk = names.get("sbrk")
    if sbrk is None or sbrk < imported_functions:
        raise UnsupportedModule("the module has no defined function named sbrk")
    globals_ = defined_globals(layout)
    brk, grow_failed = len(globals_), len(globals_) + 1

    global_section = layout.find(SECTION_GLOBAL)
    count, pos = read_u32(global_section.body, 0)
    new_global = bytes([I32, MUTABLE]) + b"\x41\x00\x0b"  # mutable i32 = 0
    global_section.body = write_u32(count + 2) + global_section.body[pos:] + new_global * 2

    exports = [
        (f"{GLOBAL_EXPORT_PREFIX}{index}", index)
        for index, (_, mutable, _) in enumerate(globals_)
        if mutable
    ]
    exports += [(BRK_EXPORT, brk), (GROW_FAILED_EXPORT, grow_failed)]
    entries = [
        write_name(name) + bytes([EXPORT_GLOBAL]) + write_u32(index) for name, index in exports
    ]
    reset_preopens = names.get("__wasilibc_reset_preopens")
    if reset_preopens is not None:
        entries.append(
            write_name(RESET_PREOPENS_EXPORT) + bytes([EXPORT_FUNCTION]) + write_u32(reset_preopens)
        )
    export_section = layout.find(SECTION_EXPORT)
    count, pos = read_u32(export_section.body, 0)
    export_section.body = (
        write_u32(count + len(entries)) + export_section.body[pos:] + b"".join(entries)
    )

    bodies = code_bodies(layout)
    bodies[sbrk - imported_functions] = _sbrk_body(brk, grow_failed)
    layout.find(SECTION_CODE).body = write_u32(len(bodies)) + b"".join(
        write_u32(len(body)) + body for body in bodies
    )
    return serialize(layout)


# -- where CPython keeps its "SIGINT arrived" flags ---------------------------------------------


@dataclass(frozen=True)
class InterruptCells:
    """Linear-memory locations that ``PyErr_SetInterruptEx(SIGINT)`` writes.

    Writing them from the host is what a SIGINT handler would do inside the guest: the
    interpreter then raises KeyboardInterrupt at its next eval-breaker check.
    """

    handler_tripped: int  # Handlers[SIGINT].tripped
    is_tripped: int
    breaker_pointer: int  # holds the address of the main thread state
    breaker_offset: int  # eval_breaker's offset in that thread state
    breaker_bit: int

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


SIGINT = 2

# Immediate kinds of the opcodes these small functions use.
_NO_IMMEDIATE = set(range(0x45, 0xC5)) | {0x00, 0x01, 0x0F, 0x1A, 0x1B, 0x05, 0x0B}
_ONE_U32 = {0x0C, 0x0D, 0x10, 0x20, 0x21, 0x22, 0x23, 0x24}
_MEMARG = set(range(0x28, 0x3F))


def decode(body: bytes) -> list[tuple[int, tuple[int, ...]]]:
    """Instructions of a function body, as (opcode, immediates); refuses unknown opcodes."""
    local_groups, pos = read_u32(body, 0)
    for _ in range(local_groups):
        _, pos = read_u32(body, pos)
        pos += 1
    code: list[tuple[int, tuple[int, ...]]] = []
    while pos < len(body):
        opcode = body[pos]
        pos += 1
        if opcode in (0x02, 0x03, 0x04):  # block, loop, if: an empty or value block type
            pos += 1
            code.append((opcode, ()))
        elif opcode in _ONE_U32:
            value, pos = read_u32(body, pos)
            code.append((opcode, (value,)))
        elif opcode in _MEMARG:
            align, pos = read_u32(body, pos)
            offset, pos = read_u32(body, pos)
            code.append((opcode, (align, offset)))
        elif opcode in (0x3F, 0x40):  # memory.size, memory.grow
            pos += 1
            code.append((opcode, ()))
        elif opcode == 0x41:  # i32.const
            value, pos = _read_s32(body, pos)
            code.append((opcode, (value,)))
        elif opcode in _NO_IMMEDIATE:
            code.append((opcode, ()))
        else:
            raise UnsupportedModule(f"opcode {opcode:#x} is not understood by the analysis")
    return code


def _read_s32(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            if byte & 0x40:
                result -= 1 << shift
            return result & 0xFFFFFFFF, pos


I32_CONST, I32_LOAD, I32_STORE, I32_ADD, I32_OR, I32_SHL = 0x41, 0x28, 0x36, 0x6A, 0x72, 0x74
LOCAL_GET, LOCAL_TEE = 0x20, 0x22


def _windows(code, size):
    return (code[i : i + size] for i in range(len(code) - size + 1))


def find_interrupt_cells(wasm: bytes) -> InterruptCells:
    """Read the flag addresses out of ``PyErr_SetInterruptEx`` and ``_PyEval_SignalReceived``.

    Both are small functions of straight-line code storing constants at constant addresses;
    the patterns below are what clang emits for them. Anything else is refused.
    """
    layout = parse_sections(wasm)
    imported_functions, _ = imported_counts(layout)
    names = function_names(layout)
    bodies = code_bodies(layout)
    try:
        set_interrupt = decode(bodies[names["PyErr_SetInterruptEx"] - imported_functions])
        signal_received = decode(bodies[names["_PyEval_SignalReceived"] - imported_functions])
    except KeyError as missing:
        raise UnsupportedModule(f"the module has no function named {missing}") from None

    handlers = is_tripped = tripped_offset = None
    for window in _windows(set_interrupt, 6):
        ops = [op for op, _ in window]
        # &Handlers[signum]: i32.const BASE; local.get 0; i32.const 3; i32.shl; i32.add; tee
        if ops == [I32_CONST, LOCAL_GET, I32_CONST, I32_SHL, I32_ADD, LOCAL_TEE] and window[2][
            1
        ] == (3,):
            handlers, entry_local = window[0][1][0], window[5][1][0]
    for window in _windows(set_interrupt, 5):
        ops = [op for op, _ in window]
        # Handlers[signum].tripped = 1: local.get E; i32.const T; i32.add; i32.const 1; store
        if (
            handlers is not None
            and ops == [LOCAL_GET, I32_CONST, I32_ADD, I32_CONST, I32_STORE]
            and window[0][1] == (entry_local,)
            and window[3][1] == (1,)
        ):
            tripped_offset = window[1][1][0] + window[4][1][1]
    for window in _windows(set_interrupt, 3):
        ops = [op for op, _ in window]
        # is_tripped = 1: i32.const ADDR; i32.const 1; i32.store offset=O
        if ops == [I32_CONST, I32_CONST, I32_STORE] and window[1][1] == (1,):
            is_tripped = window[0][1][0] + window[2][1][1]
    breaker = None
    for window in _windows(signal_received, 10):
        ops = [op for op, _ in window]
        # *(*(PTR) + K) |= BIT
        if ops == [
            I32_CONST,
            I32_LOAD,
            I32_CONST,
            I32_ADD,
            LOCAL_TEE,
            LOCAL_GET,
            I32_LOAD,
            I32_CONST,
            I32_OR,
            I32_STORE,
        ]:
            breaker = (
                window[0][1][0] + window[1][1][1],
                window[2][1][0] + window[9][1][1],
                window[7][1][0],
            )
    if handlers is None or tripped_offset is None or is_tripped is None or breaker is None:
        raise UnsupportedModule("PyErr_SetInterruptEx does not have the expected shape")
    return InterruptCells(
        handler_tripped=handlers + 8 * SIGINT + tripped_offset,
        is_tripped=is_tripped,
        breaker_pointer=breaker[0],
        breaker_offset=breaker[1],
        breaker_bit=breaker[2],
    )
