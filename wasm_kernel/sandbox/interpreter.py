"""One instance of the runtime: a wasmtime store with the host's functions on its linker, the
guest's memory and exports, and the turn ABI (``host_alloc`` + ``turn``).

An interpreter is replaced as a whole: when the guest restarts, and when an image is restored
in place (the old one is kept until the new one stands).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import wasmtime

from ..files.mounts import SCRATCH, Mount
from ..memory.checkpoints import GuestState, memory_address
from ..runtime import runtime as runtime_module
from ..runtime.cache import CompiledRuntime, exported
from ..runtime.rewrite import BRK_EXPORT, GLOBAL_EXPORT_PREFIX
from .descriptors import GuestFiles
from .host_functions import GuestMemory

GUEST_ARGV = ["/usr/local/bin/python.wasm"]
# Budget of the boot turn (importing IPython and creating its shell: 1.03e9 measured): the
# kernel's own code, not a cell's, so not the user's fuel limit, which may be smaller.
BOOT_FUEL = 20_000_000_000
IDLE_DEADLINE = 1 << 62  # epochs: no deadline between turns


def preopened(
    compiled: CompiledRuntime,
    scratch: Path,
    packages: Any,
    mounts: Sequence[Mount],
    sources: bool,
) -> list[tuple[Path, str, bool]]:
    """(host folder, guest path, writable) of every folder the guest sees, in the order
    they are pre-opened (and numbered, by WASI and GuestFiles): the runtime's folders and its
    packages read-only, the private /tmp ``scratch`` (GuestFiles' ``scratch_index``), the
    libraries' sources where installed, the operator's mounts."""
    runtime = compiled.runtime
    folders = [
        (compiled.lib_dir, runtime.lib_guest_dir, False),
        (compiled.mpl_data_dir, f"{runtime.stdlib_guest_path}/matplotlib/mpl-data", False),
        (scratch, SCRATCH, True),
        (packages.host, packages.guest, False),
    ]
    if sources:  # the libraries' sources, for tracebacks (see runtime_sources)
        folders.append((runtime.sources_dir, runtime.sources_guest_dir, False))
    # wasmtime keeps every path the guest opens inside these
    folders.extend((mount.host, mount.guest, mount.writable) for mount in mounts)
    return [(Path(host), guest, writable) for host, guest, writable in folders]


def wasi_config(
    folders: Sequence[tuple[Path, str, bool]],
    cwd: str,
    output: Callable[[str, bytes], int],
) -> wasmtime.WasiConfig:
    """What the guest sees of the host: ``folders`` (see ``preopened``), a handful of its own
    variables, and stdout/stderr streamed to ``output``."""
    wasi = wasmtime.WasiConfig()
    wasi.argv = GUEST_ARGV
    wasi.env = [
        ("HOME", SCRATCH),
        ("TMPDIR", SCRATCH),
        ("PWD", cwd),  # the guest's kernel module starts there
        ("PYTHONTZPATH", ""),
        ("MPLBACKEND", "module://matplotlib_inline.backend_inline"),  # as ipykernel's
    ]
    for host, guest, writable in folders:
        wasi.preopen_dir(str(host), guest, writable)
    wasi.stdout_custom = lambda data: output("stdout", data)
    wasi.stderr_custom = lambda data: output("stderr", data)
    return wasi


def has_sources(runtime: runtime_module.Runtime) -> bool:
    """Whether install fetched the sources of the runtime's packages (tracebacks show no
    library lines without them; nothing else changes)."""
    return runtime.sources_dir.is_dir()


class Interpreter:
    """A store and instance of the compiled runtime, with ``files`` guarding its descriptors
    and each of ``host_functions`` defining itself on the linker. ``state`` holds its
    checkpoints where rollback is on; ``fresh``: no cell has finished in it yet."""

    def __init__(
        self,
        compiled: CompiledRuntime,
        wasi: wasmtime.WasiConfig,
        memory_limit: int,
        files: GuestFiles,
        host_functions: Sequence[Any],
    ):
        engine = compiled.engine
        self.compiled = compiled
        store = wasmtime.Store(engine)
        store.set_wasi(wasi)
        store.set_limits(memory_size=memory_limit)
        store.set_fuel(BOOT_FUEL)
        store.set_epoch_deadline(IDLE_DEADLINE)
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        linker.allow_shadowing = True
        files.shadow(linker)
        for function in host_functions:
            function.define(linker)
        exports = linker.instantiate(store, compiled.module).exports(store)
        self.store = store
        self.memory = exported(exports, "memory", wasmtime.Memory)
        self.named: dict[str, Any] = {
            export.name: exports[export.name] for export in compiled.module.exports
        }
        files.bind(engine, compiled.adapter, store, self.memory, self._stack_pointer_name())
        self.files = files
        self.guest_memory = GuestMemory(self.memory)
        self.alloc = exported(exports, "host_alloc", wasmtime.Func)
        self._turn = exported(exports, "turn", wasmtime.Func)
        self.state: GuestState | None = None
        self.fresh = True
        # the boot memory file guest memory was mapped from, and its sha256 ("" unknown): a
        # fork names its pages, a save leaves out the pages still equal to it
        self.memory_base: tuple[Path, str] | None = None
        self._closed = False

    def initialize(self) -> None:
        """A runtime that was not pre-initialized (wizer) starts its C runtime first."""
        if not self.compiled.runtime.preinitialized:
            self.named["_initialize"](self.store)

    def call_turn(self, source: str) -> int:
        """One turn of the guest: ``source`` run as a cell's code; its status (see contract)."""
        data = source.encode("utf-8", "surrogatepass")
        pointer = self.alloc(self.store, len(data))
        self.guest_memory.write(self.store, pointer, data)
        return self._turn(self.store, pointer, len(data))

    def keep_checkpoints(self, mode: str) -> None:
        """Rollback on: the first checkpoint is taken after the first cell, off the start-up
        path (a trap before then restarts, which loses nothing but a fresh state)."""
        self.state = GuestState(self.memory, self.named, mode)

    def mutable_globals(self) -> dict[str, wasmtime.Global]:
        return {
            name: value
            for name, value in self.named.items()
            if name.startswith(GLOBAL_EXPORT_PREFIX) or name == BRK_EXPORT
        }

    def _stack_pointer_name(self) -> str:
        """The export of the guest's stack pointer: the runtime has one mutable global of its
        own (wasm-ld's layout), exported by the rewrite; "" where it is not."""
        found = [
            name
            for name, value in self.named.items()
            if name.startswith(GLOBAL_EXPORT_PREFIX) and isinstance(value, wasmtime.Global)
        ]
        return found[0] if len(found) == 1 else ""

    def stack_pointer(self) -> int:
        """Where the guest's stack is, between turns: below it, stack nobody uses now."""
        name = self._stack_pointer_name()
        if not name:
            raise ValueError("this runtime's stack pointer cannot be told apart")
        pointer = self.named[name].value(self.store)
        if not isinstance(pointer, int):
            raise ValueError("this runtime's stack pointer is not an address")
        return pointer & 0xFFFFFFFF

    @property
    def size(self) -> int:
        return self.memory.data_len(self.store)

    @property
    def heap_end(self) -> int:
        """Bytes of linear memory the guest uses: its program break, which only grows within
        a turn (sbrk never shrinks it), so at a turn's end it is the turn's peak; the memory's
        size where the break is not exported (a runtime that cannot roll back) or not set yet."""
        brk = self.named.get(BRK_EXPORT)
        end = brk.value(self.store) if isinstance(brk, wasmtime.Global) else 0
        return end if isinstance(end, int) and end > 0 else self.size

    def view(self) -> memoryview:
        """The guest's memory in place, as bytes: no copy of the whole guest on the host."""
        raw = (ctypes.c_char * self.size).from_address(memory_address(self.memory, self.store))
        return memoryview(raw).cast("B")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.store.close()
        if self.state is not None:  # after the store: its memory maps the checkpoint
            self.state.close()
