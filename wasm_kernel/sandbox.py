"""One sandboxed CPython interpreter: a wasmtime store and instance, its limits and interrupts.

The sandbox owns everything that touches wasmtime after compilation: the WASI context (no
host files but the read-only runtime folders, a private /tmp and the operator's mounts, no
host environment, no sockets, no processes, no symlinks), the host functions the guest
imports, fuel and epoch deadlines, the memory cap, the scratch folder's size limit, and the
guest's turns. It knows nothing about Jupyter: a ``Receiver`` supplied per turn receives the
guest's output and messages (see ``host_functions``).

When a turn traps (fuel, deadline, hard interrupt, memory, stack, anything), the interpreter
cannot take further turns as it is: the sandbox writes back the checkpoint taken after the
last cell (see ``checkpoints``), or with rollback off starts a fresh interpreter, and raises
``CellStopped``. Interrupts first trip CPython's own SIGINT flags so the cell gets a real
KeyboardInterrupt; a cell that ignores it is stopped with an epoch trap after a grace time.
"""

from __future__ import annotations

import ctypes
import logging
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any

import wasmtime

from . import guest_packages, images, scratch_folders
from .cache import CompiledRuntime, exported
from .checkpoints import CheckpointStats, GuestState, SignalFlags, memory_address
from .contract import guest_call
from .cow import map_copy_on_write
from .descriptors import GuestFiles
from .guest.modules import _wasm_kernel_contract as declared
from .host_functions import (
    MAX_MESSAGE,
    Discard,
    GuestClock,
    GuestMemory,
    HostCall,
    Receiver,
    refuse_symlinks,
)
from .interrupts import Interrupts, Watchdog
from .limits import Limits
from .mounts import SCRATCH, Mount
from .output import OutputPump
from .rewrite import BRK_EXPORT, GLOBAL_EXPORT_PREFIX, RESET_PREOPENS_EXPORT
from .scratch import ScratchWatch, usage
from .stops import (
    INTERRUPT,
    SCRATCH_FULL,
    SHUTDOWN,
    TIME,
    CellStopped,
    explain_status,
    explain_trap,
    memory_limit_text,
    output_notice,
    scratch_text,
    time_limit_interrupted,
)

log = logging.getLogger(__name__)

GUEST_ARGV = ["/usr/local/bin/python.wasm"]
REPAIR_FUEL = 2_000_000_000  # budget of the short guest turn after a rollback
# Budget of the boot turn (importing IPython and creating its shell: 1.03e9 measured): the
# kernel's own code, not a cell's, so not the user's fuel limit, which may be smaller.
BOOT_FUEL = 20_000_000_000
REPAIR_SECONDS = 2.0


def kernel_module_source() -> str:
    return (resources.files("wasm_kernel") / "guest" / f"{declared.GUEST_MODULE}.py").read_text()


def shipped_modules() -> dict[str, tuple[str, bool, str]]:
    """The kernel's guest modules under ``guest/modules``: dotted name -> (source, is_package,
    the file name its frames show, hidden from tracebacks as the kernel's)."""
    root = Path(str(resources.files("wasm_kernel") / "guest" / "modules"))
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = (path.read_text(), is_package, f"{declared.KERNEL_FILES}:{name}>")
    return modules


class Sandbox:
    """One guest interpreter. With a restorable runtime, a trap rolls it back to the state
    checkpointed after the last cell; otherwise it is replaced by a fresh one."""

    def __init__(
        self,
        compiled: CompiledRuntime,
        limits: Limits,
        rollback: bool = True,
        mounts: Sequence[Mount] = (),
        cwd: str = SCRATCH,
        import_paths: Sequence[str] = (),
        image: images.Image | None = None,
        checkpoint_mode: str = "auto",
        plain_tracebacks: bool = False,
    ):
        self.compiled = compiled
        self.checkpoint_mode = checkpoint_mode
        self.packages = guest_packages.site_mount(compiled)  # raises if not installed
        self.plain_tracebacks = plain_tracebacks
        self.limits = limits
        self.mounts = tuple(mounts)
        self.import_paths = tuple(import_paths)  # guest folders appended to sys.path at boot
        self.cwd = cwd
        self.rollback = rollback and compiled.runtime.restorable
        self.interrupts = Interrupts(compiled.engine)
        self._watchdog = Watchdog()
        self._output = OutputPump()
        self._host_call = HostCall(
            self._output,
            self.interrupts,
            self._watchdog,
            lambda caller: self._hit_memory_limit(caller, self._memory_at_start),
        )
        self._clock = GuestClock(self.interrupts)
        self._turn_lock = threading.Lock()
        scratch_folders.sweep()  # folders of killed kernels hold their guests' files
        self._tmp = scratch_folders.create()
        self._scratch = ScratchWatch(
            self._tmp,
            limits.scratch_limit,
            partial(self.interrupts.request_stop, SCRATCH_FULL),
            touches=True,  # GuestFiles reports every call that may grow /tmp
            writing=lambda: self._files.writing_to_scratch(),  # noqa: PLW0108 (set later)
        )
        self._store: wasmtime.Store | None = None
        self._state: GuestState | None = None
        self._signals: SignalFlags | None = None
        self._changed = False  # turns ran since the last checkpoint
        self._closing = False
        self._fresh = True  # no cell has finished in this interpreter yet
        self._memory_at_start = 0
        self._adapter: wasmtime.Module | None = None  # compiled once, reused by restarts
        # a boot image (memory mapped from the cache) also serves restarts: no second boot
        self._boot_image = image if image is not None and image.memory_file is not None else None
        try:
            self._start_interpreter(image)
        except BaseException:
            self.close()  # no interpreter: remove the private /tmp and stop the helper threads
            raise

    # -- life cycle ---------------------------------------------------------------------------

    def _wasi(self) -> wasmtime.WasiConfig:
        wasi = wasmtime.WasiConfig()
        wasi.argv = GUEST_ARGV
        wasi.env = [
            ("HOME", SCRATCH),
            ("TMPDIR", SCRATCH),
            ("PWD", self.cwd),  # the bootstrap starts the guest there
            ("PYTHONTZPATH", ""),
            ("MPLBACKEND", "module://matplotlib_inline.backend_inline"),  # as ipykernel's
        ]
        runtime = self.compiled.runtime
        wasi.preopen_dir(str(self.compiled.lib_dir), runtime.lib_guest_dir, False)
        wasi.preopen_dir(
            str(self.compiled.mpl_data_dir),
            f"{runtime.stdlib_guest_path}/matplotlib/mpl-data",
            False,
        )
        wasi.preopen_dir(str(self._tmp), SCRATCH, True)
        wasi.preopen_dir(str(self.packages.host), self.packages.guest, False)
        for mount in self.mounts:  # wasmtime keeps every path the guest opens inside these
            wasi.preopen_dir(str(mount.host), mount.guest, mount.writable)
        wasi.stdout_custom = lambda data: self._guest_output("stdout", data)
        wasi.stderr_custom = lambda data: self._guest_output("stderr", data)
        return wasi

    def _guest_output(self, name: str, data: bytes) -> int:
        try:
            self._output.write(name, data)
        except Exception:  # a raising callback would abort the process inside wasmtime
            log.exception("dropping guest %s output", name)
        return len(data)

    def _start_interpreter(self, image: images.Image | None = None) -> None:
        """Instantiate the runtime and boot the guest, or resume it from ``image``."""
        engine = self.compiled.engine
        store = wasmtime.Store(engine)
        store.set_wasi(self._wasi())
        store.set_limits(memory_size=self.limits.memory_limit)
        store.set_fuel(BOOT_FUEL)
        store.set_epoch_deadline(1 << 62)
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        linker.allow_shadowing = True
        # the runtime's two folders, then /tmp, the guest's packages, the mounts (see _wasi)
        files = GuestFiles(
            preopens=4 + len(self.mounts),
            scratch_index=2,
            touched=self._scratch.touched,
            room=self._scratch.has_room,
        )
        files.shadow(linker)
        self._host_call.define(linker)
        self._clock.define(linker)
        refuse_symlinks(linker)
        instance = linker.instantiate(store, self.compiled.module)
        exports = instance.exports(store)
        self._instance_exports = exports
        self._store = store
        self._memory = exported(exports, "memory", wasmtime.Memory)
        self._adapter = files.bind(engine, store, self._memory, self._adapter)
        self._files = files
        self._turn_func = exported(exports, "turn", wasmtime.Func)
        self._alloc = exported(exports, "host_alloc", wasmtime.Func)
        self._guest_memory = GuestMemory(self._memory)
        self._host_call.bind(self._guest_memory, self._alloc)
        self._clock.memory = self._guest_memory
        named: dict[str, Any] = {
            export.name: exports[export.name] for export in self.compiled.module.exports
        }
        if image is not None:
            self._resume(store, named, image)
            self._changed = True  # a checkpoint now keeps the resumed state
            # a boot image (no cell ever ran in it) is as fresh as a boot
            self._fresh = image.host.execution_count == 0
        else:
            if not self.compiled.runtime.preinitialized:
                exported(exports, "_initialize", wasmtime.Func)(store)
            if self._call_turn(self._boot_source()) != 0:
                raise RuntimeError("the guest bootstrap failed to load")
        self._state = None
        if self.rollback:
            # No checkpoint yet: it is taken after the first cell, off the start-up path. A trap
            # before then restarts the interpreter, which loses nothing but a fresh state.
            self._state = GuestState(self._memory, named, self.checkpoint_mode)

    # -- images ---------------------------------------------------------------------------------

    def _mutable_globals(self, named: dict) -> dict[str, wasmtime.Global]:
        return {
            name: value
            for name, value in named.items()
            if name.startswith(GLOBAL_EXPORT_PREFIX) or name == BRK_EXPORT
        }

    def _resume(self, store: wasmtime.Store, named: dict, image: images.Image) -> None:
        """Put an image's memory and globals into the fresh instance, point wasi-libc at this
        kernel's folders, and let the guest settle (working folder, import paths, random seed,
        stale files)."""
        reset_preopens = named.get(RESET_PREOPENS_EXPORT)
        targets = self._mutable_globals(named)
        if reset_preopens is None or not targets:
            raise images.ImageError("this runtime build cannot resume images")
        if set(image.globals) != set(targets):
            raise images.ImageError("the image's globals do not match this runtime's")
        current = self._memory.data_len(store)
        if image.memory_size < current:
            raise images.ImageError("the image's memory is smaller than a fresh interpreter's")
        try:
            self._memory.grow(store, (image.memory_size - current) // images.PAGE)
        except wasmtime.WasmtimeError:
            raise images.ImageError(memory_limit_text(self.limits.memory_limit)) from None
        if image.memory_file is not None:
            self._load_memory_file(store, image.memory_file, image.memory_size)
        base = memory_address(self._memory, store)
        for first, data in image.extents:
            ctypes.memmove(base + first * images.PAGE, data, len(data))
        try:
            for name, value in image.globals.items():
                targets[name].set_value(store, value)
        except (ValueError, TypeError, OverflowError, wasmtime.WasmtimeError) as exc:
            raise images.ImageError(f"the image's globals do not fit this runtime: {exc}") from None
        try:  # runs wasi-libc's code on the image's memory: it may trap like any guest code
            reset_preopens(store)
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            raise images.ImageError(f"the resumed interpreter trapped: {exc}") from None
        self._clock.resume(image.host.clocks)
        images.unpack_archive(image.scratch, self._tmp)
        settle = guest_call(declared.SETTLE, image.host.cwd, self.cwd, list(self.import_paths))
        with self._metered(store, REPAIR_FUEL, REPAIR_SECONDS, interruptible=False):
            try:
                status = self._call_turn(settle)
            except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
                raise images.ImageError(f"the resumed interpreter trapped: {exc}") from None
        if status != 0:
            raise images.ImageError("the resumed interpreter could not run the kernel's code")

    def _load_memory_file(self, store: wasmtime.Store, path: Path, size: int) -> None:
        """Guest memory as a copy-on-write view of a boot image's raw memory file: the guest
        reads only the pages it touches, shared with every kernel mapping the file, and its
        writes stay private. Where the file cannot be mapped, the kernel boots instead."""
        try:
            map_copy_on_write(self._memory, store, path, 0, size)
        except (OSError, ValueError) as exc:
            raise images.ImageError(f"cannot map {path.name}: {exc}") from None

    def save_image(
        self, host: images.HostState, mounts: list[str], memory_file: Path | None = None
    ) -> bytes:
        """This interpreter as an image file's bytes, taken between turns (its memory as a raw
        file at ``memory_file`` instead, for a boot image)."""
        with self._turn_lock:
            store = self._live_store
            self._host_call.reply = None
            self._output.begin(lambda *_: None, MAX_MESSAGE, "")
            with self._metered(store, REPAIR_FUEL, REPAIR_SECONDS, interruptible=False):
                try:
                    # a statement whose value is None: nothing reaches the display hook (and `_`)
                    self._call_turn(guest_call(declared.SERVE, declared.WORKING_FOLDER))
                except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
                    raise images.ImageError(f"the interpreter could not be asked: {exc}") from None
                finally:
                    self._output.end()
            self._changed = True  # that turn ran: the next checkpoint keeps what it did
            reply = self._host_call.reply
            cwd = reply.get("cwd") if reply else None
            host.cwd = cwd if isinstance(cwd, str) and cwd else self.cwd
            host.clocks = self._clock.readings()
            exports = {
                export.name: self._instance_exports[export.name]
                for export in self.compiled.module.exports
            }
            globals_ = self._mutable_globals(exports)
            size = self._memory.data_len(store)
            if globals_[BRK_EXPORT].value(store) == 0:
                globals_[BRK_EXPORT].set_value(store, size)  # as GuestState.take does
            # read in place, page by page: no copy of the whole guest on the host
            memory = (ctypes.c_char * size).from_address(memory_address(self._memory, store))
            return images.write_image(
                needs=images.identity(self.compiled.runtime.module.sha256),
                mounts=mounts,
                memory=memoryview(memory).cast("B"),
                base=self._fresh_memory(),
                globals_={name: value.value(store) for name, value in globals_.items()},
                host=host,
                scratch=images.archive_folder(self._tmp, self.limits.scratch_limit),
                taken=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                memory_file=memory_file,
            )

    def _fresh_memory(self) -> bytes:
        """Linear memory of a just-instantiated module: what an image leaves out."""
        store = wasmtime.Store(self.compiled.engine)
        try:
            store.set_wasi(wasmtime.WasiConfig())
            linker = wasmtime.Linker(self.compiled.engine)
            linker.define_wasi()
            i32 = wasmtime.ValType.i32()
            linker.define_func("host", "call", wasmtime.FuncType([i32] * 4, [i32]), lambda *_: -1)
            exports = linker.instantiate(store, self.compiled.module).exports(store)
            memory = exported(exports, "memory", wasmtime.Memory)
            return ctypes.string_at(memory_address(memory, store), memory.data_len(store))
        finally:
            store.close()

    def restore_image(self, image: images.Image) -> None:
        """Replace this interpreter by the image's, in place (like a rollback); on failure the
        current one stays as it was."""
        with self._turn_lock:
            kept = {name: getattr(self, name) for name in _INTERPRETER_ATTRIBUTES}
            offsets = dict(self._clock.offsets)
            backup = self._tmp.with_name(self._tmp.name + "-before-restore")
            self._tmp.rename(backup)  # the current store keeps its handle on the folder
            self._tmp.mkdir(mode=0o700)
            try:
                self._start_interpreter(image)
                if self._state is not None:
                    self._take_checkpoint(self._live_store)
            except BaseException:
                if self._store is not kept["_store"] and self._store is not None:
                    self._store.close()
                if self._state is not kept["_state"] and self._state is not None:
                    self._state.close()  # after the store: its memory maps the checkpoint
                for name, value in kept.items():
                    setattr(self, name, value)
                self._clock.offsets = offsets
                shutil.rmtree(self._tmp, ignore_errors=True)
                backup.rename(self._tmp)
                raise
            kept["_store"].close()
            if kept["_state"] is not None:
                kept["_state"].close()
            shutil.rmtree(backup, ignore_errors=True)

    def _boot_source(self) -> str:
        """The turn that (re)installs the guest's kernel module and boots it (IPython's shell
        and all: one call, so that a boot image can capture it): used at start and to repair
        it. The module must exist before any entry point of it can be called."""
        module = declared.GUEST_MODULE
        return (
            "import sys as _sys, types as _types\n"
            f"_module = _types.ModuleType({module!r})\n"
            f"exec(compile({kernel_module_source()!r}, {declared.GUEST_FILE!r}, 'exec'),"
            " _module.__dict__)\n"
            f"_sys.modules[{module!r}] = _module\n"
            "del _sys, _types, _module\n"
            f"{guest_call(declared.INSTALL_MODULES, shipped_modules())}\n"
            + guest_call(
                declared.BOOT, self.packages.guest, list(self.import_paths), self.plain_tracebacks
            )
        )

    def restart(self) -> None:
        """Replace the interpreter with a fresh one (same private /tmp)."""
        self._free_interpreter()
        if self._boot_image is not None:
            try:
                self._start_interpreter(self._boot_image)
                self._fresh = True
                return
            except images.ImageError as exc:
                log.warning("restarting without the boot image: %s", exc)
                self._free_interpreter()
        self._start_interpreter()
        self._fresh = True

    @property
    def _live_store(self) -> wasmtime.Store:
        """The interpreter's store, which exists from its start until it is freed."""
        store = self._store
        if store is None:
            raise RuntimeError("the sandbox has no running interpreter")
        return store

    def _free_interpreter(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._state is not None:  # after the store: its memory maps the checkpoint
            self._state.close()
            self._state = None

    def close(self) -> None:
        """Stop any running turn, then free the interpreter and its private /tmp."""
        self._closing = True
        self.interrupts.request_stop(SHUTDOWN)
        with self._turn_lock:
            self._output.close()
            self._watchdog.close()
            self._scratch.close()
            self._free_interpreter()
            scratch_folders.remove(self._tmp)

    def checkpoint(self) -> None:
        """Keep the current state as the one a trapping cell rolls back to."""
        with self._turn_lock:
            if self._state is not None and self._changed and self._store is not None:
                self._take_checkpoint(self._store)

    def _take_checkpoint(self, store: wasmtime.Store) -> None:
        assert self._state is not None
        self._state.take(store)
        self._files.checkpoint()
        self._changed = False

    @property
    def checkpoint_stats(self) -> CheckpointStats | None:
        return self._state.last if self._state is not None else None

    @property
    def restore_seconds(self) -> float | None:
        """How long the last rollback took to put memory and globals back."""
        return self._state.last_restore_seconds if self._state is not None else None

    @property
    def checkpoint_method(self) -> str | None:
        """How checkpoints are taken (None: rollback is off)."""
        return self._state.method if self._state is not None else None

    def _hit_memory_limit(
        self, store: wasmtime.Store | wasmtime.Caller, memory_at_start: int
    ) -> bool:
        """Did the turn fail to get memory? Exact with rollback (sbrk records failures),
        otherwise judged by growth to near the limit."""
        if self._state is not None:
            return self._state.growth_failed(store)
        size = self._memory.data_len(store)
        return size > memory_at_start and size + (64 << 20) >= self.limits.memory_limit

    # -- turns ----------------------------------------------------------------------------------

    def _call_turn(self, source: str) -> int:
        data = source.encode("utf-8", "surrogatepass")
        store = self._live_store
        pointer = self._alloc(store, len(data))
        self._guest_memory.write(store, pointer, data)
        return self._turn_func(store, pointer, len(data))

    def run_cell(
        self,
        source: str,
        execution_count: int,
        receiver: Receiver,
        store_history: bool = True,
        silent: bool = False,
    ) -> None:
        """Run a notebook cell; output and messages go to ``receiver``. Raises CellStopped."""
        call = guest_call(
            declared.RUN_CELL, source, int(execution_count), bool(store_history), bool(silent)
        )
        self._turn(call, receiver, self.limits, cell=True)

    def request(self, service: str, *args: object) -> dict:
        """Run a guest service (completion, inspection...) and return its answer; what it
        prints or displays is not shown."""
        self._host_call.reply = None
        call = guest_call(declared.SERVE, service, *args)
        self._turn(call, Discard(), self.limits.for_service(MAX_MESSAGE))
        return self._host_call.reply or {}

    def _turn(self, source: str, receiver: Receiver, limits: Limits, cell: bool = False) -> None:
        """One guest turn (a cell or a request: every one can write to /tmp, so every one is
        measured), and the recovery from a trap."""
        with self._turn_lock:
            store = self._live_store
            self._host_call.begin(receiver, limits)
            self._changed = True
            self._signals = self._signal_flags(store)
            memory_at_start = self._memory_at_start = self._memory.data_len(store)
            if self._state is not None:
                self._state.growth_failed(store, reset=True)
            with self._metered(store, limits.fuel, limits.time_limit) as turn:
                self._scratch.begin(turn)
                if self._scratch.over_limit:  # no growth until files are deleted, not even
                    self._scratch.stop_writers()  # through files kept open from earlier cells
                notice = output_notice(limits.output_limit)
                self._output.begin(receiver.stream, limits.output_limit, notice)
                stopped: CellStopped | None
                try:
                    status = self._call_turn(source)
                except wasmtime.ExitTrap as exit_trap:
                    stopped = CellStopped(
                        "GuestExited", f"the interpreter exited with status {exit_trap.code}."
                    )
                except wasmtime.Trap as trap:
                    stopped = explain_trap(
                        trap,
                        limits,
                        self.interrupts.stop_reason,
                        self.interrupts.soft_reason,
                        lambda: self._scratch.stopped or usage(self._tmp),
                        lambda: self._hit_memory_limit(store, memory_at_start),
                    )
                else:
                    memory_hit = status != 0 and self._hit_memory_limit(store, memory_at_start)
                    stopped = explain_status(status, limits, memory_hit)
                finally:
                    grown = self._scratch.end()
                    self._output.end()
                    self._host_call.end()
            if stopped is None and grown is not None:  # it finished before a check caught it
                stopped = CellStopped(
                    "ScratchLimitExceeded", scratch_text(grown, limits), recovered=True
                )
            reported = self._host_call.time_limit_reported
            if stopped is None and self.interrupts.soft_reason == TIME and not reported:
                # it caught the interrupt and finished: what it did is kept
                stopped = CellStopped(
                    "TimeLimitExceeded", time_limit_interrupted(limits), recovered=True
                )
            if cell and (stopped is None or stopped.recovered):
                self._fresh = False  # this cell's changes stand
            if stopped is not None:
                if not (self._closing or stopped.recovered):
                    stopped.evalue += " " + self._recover(store, stopped.fresh)
                raise stopped

    def _recover(self, store: wasmtime.Store, fresh: bool) -> str:
        """Make the interpreter usable after a failed turn; returns what became of the user's
        state, for the error. Roll back to the checkpoint where there is one; if even the
        checkpoint cannot run the kernel's code, reinstall that code; else start afresh."""
        if fresh:
            pass  # only a new interpreter will do
        elif self._state is not None and self._state.taken:
            self._state.restore(store)
            if self._after_rollback(store):
                return (
                    "The interpreter was rolled back to its state before this cell:"
                    " names, imports and objects from earlier cells are intact."
                )
            self._state.restore(store)
            if self._reinstall(store):
                return (
                    "The interpreter was rolled back to its state before this cell and the"
                    " kernel's code inside it reinstalled: your names are intact."
                )
        elif not self._fresh and self._reinstall(store):  # no checkpoint (rollback off): an
            # interpreter that did not trap takes its code again (one that trapped refuses)
            return (
                "The kernel's code inside the interpreter was reinstalled: names, imports and"
                " objects from earlier cells are kept, with this cell's changes."
            )
        was_fresh = self._fresh
        self.restart()
        if was_fresh:  # no cell had finished: a fresh interpreter is the state before this one
            return (
                "The interpreter was rolled back to its fresh state: no earlier cell had"
                " finished, so nothing was lost."
            )
        return (
            "The interpreter was restarted: variables, imports and objects from"
            " earlier cells are gone."
        )

    @contextmanager
    def _metered(
        self, store: wasmtime.Store, fuel: int, seconds: float, interruptible: bool = True
    ) -> Iterator[int]:
        """Fuel, a wall-clock deadline (none if 0) and interrupts around one guest call;
        yields the turn's number."""
        turn = self.interrupts.begin(soft=interruptible)
        store.set_fuel(fuel)
        store.set_epoch_deadline(1)
        deadline = self._host_call.deadline = None
        if seconds:
            deadline = self._watchdog.arm(seconds, partial(self._time_up, turn))
            self._host_call.deadline = deadline
        try:
            yield turn
        finally:
            self.interrupts.end()
            if deadline is not None:
                self._watchdog.disarm(deadline)
            store.set_epoch_deadline(1 << 62)

    def _after_rollback(self, store: wasmtime.Store) -> bool:
        """Close the descriptors the rolled-back cell opened, and let the restored guest close
        file objects whose descriptor that cell closed (the host's descriptor table is not
        part of the checkpoint). False if the kernel's guest code cannot run even there.

        This runs the user's interpreter, so it is bounded like a cell (fuel, a deadline); if
        it traps, the checkpoint is simply restored again and the file check skipped.
        """
        self._signal_flags(store)  # clears any the trapped cell's interrupt left tripped
        with self._metered(store, REPAIR_FUEL, REPAIR_SECONDS, interruptible=False):
            try:
                self._files.close_newer(store)
                status = self._call_turn(guest_call(declared.CLOSE_STALE_FILES))
            except (wasmtime.Trap, wasmtime.WasmtimeError):  # any trap, or the guest exiting
                self._state.restore(store)  # type: ignore[union-attr]
                return True  # the checkpoint stands; only the file check was skipped
        self._changed = True  # the next checkpoint keeps the files closed
        return status == 0

    def _reinstall(self, store: wasmtime.Store) -> bool:
        """Load the kernel's guest code again (names in __main__ stay); True if it worked."""
        self._signal_flags(store)
        with self._metered(store, REPAIR_FUEL, REPAIR_SECONDS, interruptible=False):
            try:
                if self._call_turn(self._boot_source()) != 0:
                    return False
            except (wasmtime.Trap, wasmtime.WasmtimeError):
                return False
        if self._state is not None:
            self._take_checkpoint(store)
        return True

    def _signal_flags(self, store: wasmtime.Store) -> SignalFlags | None:
        """CPython's SIGINT flags for this turn, cleared of any left from an earlier one."""
        cells = self.compiled.interrupt_cells
        if cells is None:
            return None
        flags = SignalFlags(
            cells, memory_address(self._memory, store), self._memory.data_len(store)
        )
        try:
            flags.clear()
        except IndexError:
            log.warning("the interpreter's signal flags are out of reach; interrupts stop hard")
            return None
        return flags

    def _time_up(self, turn: int) -> None:
        """The wall-clock limit, first as an interrupt (what the cell did so far stays, as
        under nbgrader's timeout on the native kernel), then hard after the grace time. A turn
        that takes no interrupts (the kernel's own repairs), or one already interrupted, is
        stopped hard at once."""
        if self.interrupts.request_soft(self._trip_signal_flags, TIME, turn) is None:
            self.interrupts.request_stop(TIME, turn)
            return
        self._watchdog.arm(
            self.limits.interrupt_grace, partial(self.interrupts.request_stop, TIME, turn)
        )

    def interrupt(self) -> None:
        """Jupyter interrupt: KeyboardInterrupt in the cell, or a hard stop after the grace time."""
        turn = self.interrupts.request_soft(self._trip_signal_flags)
        if turn is None:
            return
        self._watchdog.arm(
            self.limits.interrupt_grace, partial(self.interrupts.request_stop, INTERRUPT, turn)
        )

    def _trip_signal_flags(self) -> None:
        if self._signals is None:
            return  # the guest learns of the interrupt when it next waits on the host
        try:
            self._signals.trip()
        except IndexError:
            log.warning("could not reach the interpreter's signal flags")


def build_boot_image(compiled: CompiledRuntime, limits: Limits, path: Path) -> int:
    """Boot a guest and save it as the image kernels start from; returns its size in bytes.

    The image holds nothing of any session: no mounts, an empty /tmp, no history."""
    sandbox = Sandbox(compiled, limits, rollback=False)
    try:
        sandbox._host_call.making_boot_image = True
        sandbox.request(declared.WARM_UP)
        memory_file = images.boot_memory_path(path)
        data = sandbox.save_image(images.HostState(), [], memory_file=memory_file)
    finally:
        sandbox.close()
    staging = path.with_name(f".{path.name}.partial")
    staging.write_bytes(data)
    staging.chmod(0o644)  # shared by every user of the cache, as the compiled module is
    staging.replace(path)  # after the memory file: a kernel that finds the image finds both
    return len(data) + memory_file.stat().st_blocks * 512


# what one interpreter consists of, swapped as a whole when an image is restored in place
_INTERPRETER_ATTRIBUTES = (
    "_store",
    "_fresh",
    "_memory",
    "_adapter",
    "_files",
    "_turn_func",
    "_alloc",
    "_state",
    "_instance_exports",
)
