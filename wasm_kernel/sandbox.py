"""One sandboxed CPython interpreter: a wasmtime store and instance, its limits and interrupts.

The sandbox owns everything that touches wasmtime after compilation: the WASI context (no
host files but the read-only runtime folders, a private /tmp and the operator's mounts, no
host environment, no sockets, no processes, no symlinks), the host functions the guest
imports, fuel and epoch deadlines, the memory cap, the scratch folder's size limit, and the
guest's turns. It knows nothing about Jupyter: a ``GuestHost`` supplied per turn receives the
guest's output and structured messages.

When a turn traps (fuel, deadline, hard interrupt, memory, stack, anything), the interpreter
cannot take further turns as it is: the sandbox writes back the checkpoint taken after the
last cell (see ``snapshot``), or with rollback off starts a fresh interpreter, and raises
``CellStopped``. Interrupts first trip CPython's own SIGINT flags so the cell gets a real
KeyboardInterrupt; a cell that ignores it is stopped with an epoch trap after a grace time.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import logging
import math
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import wasmtime

from . import guest_packages, images, protocol, scratch_folders
from .cache import CompiledRuntime, exported
from .cow import map_copy_on_write
from .descriptors import GuestFiles
from .guest.modules import _wasm_kernel_messages as ops
from .immortal import make_immortal
from .mounts import SCRATCH, Mount
from .output import OutputPump
from .rewrite import BRK_EXPORT, GLOBAL_EXPORT_PREFIX, RESET_PREOPENS_EXPORT
from .scratch import ScratchWatch, Usage, usage
from .snapshot import CheckpointStats, GuestState, SignalFlags, memory_address

log = logging.getLogger(__name__)

GUEST_ARGV = ["/usr/local/bin/python.wasm"]
GUEST_MODULE = "_wasm_kernel"
GUEST_FILE = "<wasm-kernel>"  # file name of the bootstrap; its frames are hidden from users
MAX_MESSAGE = 64 << 20  # largest host.call payload we read from the guest
WASI_EFAULT = 21
WASI_EPERM = 63
WASI_EINVAL = 28
TURN_REFUSED = -1
REPAIR_FUEL = 2_000_000_000  # budget of the short guest turn after a rollback
# Budget of the boot turn (importing IPython and creating its shell: 1.03e9 measured): the
# kernel's own code, not a cell's, so not the user's fuel limit, which may be smaller.
BOOT_FUEL = 20_000_000_000
REPAIR_SECONDS = 2.0
TIME_LIMIT_HINT = "Raise it with --WasmKernel.time_limit=SECONDS (0 for none)."


@dataclass(frozen=True)
class Limits:
    """Per-cell budgets. ``seconds`` of 0 means no wall-clock limit."""

    fuel: int
    seconds: float
    memory: int
    output: int
    interrupt_grace: float = 1.0
    scratch: int = 0  # bytes a cell may grow the private /tmp to; 0: no limit


class GuestHost(Protocol):
    """Receives what the guest produces during one turn (implemented by the kernel)."""

    def stream(self, name: str, text: str) -> None: ...

    def message(self, message: dict, interrupts: Interrupts) -> dict: ...


class QuietHost:
    """Guest host for service calls: their prints and messages are not shown."""

    def stream(self, name: str, text: str) -> None:
        pass

    def message(self, message: dict, interrupts: Interrupts) -> dict:
        return {}


class CellStopped(Exception):
    """A turn ended in a trap; the interpreter was replaced by a fresh one."""

    def __init__(self, ename: str, evalue: str, recovered: bool = False, fresh: bool = False):
        super().__init__(f"{ename}: {evalue}")
        self.ename = ename
        self.evalue = evalue
        self.recovered = recovered  # the sandbox already put the interpreter right
        self.fresh = fresh  # only a fresh interpreter will do (a rollback would not help)


class Interrupts:
    """Interrupt and stop requests for the running turn, shared with host-side waits.

    A soft interrupt is delivered to the guest as KeyboardInterrupt the next time it waits
    on the host (sleep, input). A hard stop ends the turn with an epoch trap. Requests carry
    the turn they were made for, so a late timer can never stop a later turn.
    """

    def __init__(self, engine: wasmtime.Engine):
        self._engine = engine
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._soft = False
        self._requested = False  # a soft interrupt was asked for in this turn
        self._turn = 0
        self._active = False
        self.stop_reason: str | None = None
        self.soft_reason: str | None = None  # "interrupt", or "time" (the cell's time limit)

    def begin(self, soft: bool = True) -> int:
        """A turn starts; returns its number. ``soft=False``: the kernel's own repair turns,
        which a user's interrupt must not break (their deadline still stops them)."""
        with self._lock:
            self._turn += 1
            self._active = True
            self._soft, self._requested, self.stop_reason = False, not soft, None
            self.soft_reason = None
            self._event.clear()
            return self._turn

    def end(self) -> None:
        with self._lock:
            self._active = False

    def request_soft(
        self,
        deliver: Callable[[], None] | None = None,
        reason: str = "interrupt",
        turn: int | None = None,
    ) -> int | None:
        """Ask the running turn (or turn ``turn``, if it still runs) to raise KeyboardInterrupt;
        returns its number, or None if idle, not interruptible or already asked (later
        requests merge into the first: its grace timer stops the turn hard if the
        KeyboardInterrupt does not end it).

        ``deliver`` (which trips CPython's own signal flags) runs under the lock, so it can
        never land in the next turn.
        """
        with self._lock:
            if not self._active or self._requested or turn not in (None, self._turn):
                return None
            self._soft = self._requested = True
            self.soft_reason = reason
            self._event.set()
            if deliver is not None:
                deliver()
            return self._turn

    def request_stop(self, reason: str, turn: int | None = None) -> None:
        """Stop turn ``turn`` (default: whichever runs) with an epoch trap, if it still runs."""
        with self._lock:
            turn = self._turn if turn is None else turn
            if not self._active or turn != self._turn or self.stop_reason is not None:
                return
            self.stop_reason = reason
            self._event.set()
            self._engine.increment_epoch()

    def take(self) -> bool:
        """True (once per request) if the guest should now raise KeyboardInterrupt."""
        with self._lock:
            if self.stop_reason is not None:
                return True
            if self._soft:
                self._soft = False
                self._event.clear()
                return True
            return False

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early on any interrupt or stop."""
        self._event.wait(timeout)


class Watchdog:
    """Runs callbacks at deadlines on one thread (a Timer thread per cell costs a thread start).

    Nothing may end that thread, or no deadline and no interrupt escalation would fire again:
    a callback's exception is logged, and a deadline too far off (or not a number) is capped.
    """

    LONGEST = 10 * 365 * 86400.0  # seconds: the furthest deadline kept, as a finite number
    NAP = 3600.0  # longest single wait; Condition.wait overflows past threading.TIMEOUT_MAX

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._jobs: dict[int, tuple[float, Callable[[], None]]] = {}
        self._tokens = itertools.count()
        self._closed = False
        # When the thread looks at the jobs next, if it waits (infinity: when notified). It
        # stays asleep through cells that arm and disarm later deadlines than the one it
        # waits for, and wakes then to find what is due next.
        self._wakes_at = math.inf
        threading.Thread(target=self._run, name="wasm-kernel-watchdog", daemon=True).start()

    def arm(self, seconds: float, callback: Callable[[], None]) -> int:
        if not seconds <= self.LONGEST:  # also NaN
            seconds = self.LONGEST
        with self._ready:
            token = next(self._tokens)
            due = time.monotonic() + seconds
            self._jobs[token] = (due, callback)
            if due < self._wakes_at:  # only then: a wake-up per cell costs the cell time
                self._ready.notify()
            return token

    def disarm(self, token: int) -> None:
        with self._ready:
            self._jobs.pop(token, None)

    @contextmanager
    def paused(self, token: int | None) -> Iterator[None]:
        """Stop one deadline's clock for a while (a person answering ``input()``)."""
        with self._ready:
            job = self._jobs.pop(token, None) if token is not None else None
            left = job[0] - time.monotonic() if job is not None else 0.0
        try:
            yield
        finally:
            if job is not None and token is not None:  # a job implies its token
                with self._ready:
                    self._jobs[token] = (time.monotonic() + left, job[1])
                    self._ready.notify()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._closed:
                    if not self._jobs:
                        self._wakes_at = math.inf
                        self._ready.wait()
                        continue
                    token, (due, callback) = min(self._jobs.items(), key=lambda job: job[1][0])
                    now = time.monotonic()
                    if due <= now:
                        del self._jobs[token]
                        break
                    nap = min(due - now, self.NAP)
                    self._wakes_at = now + nap
                    self._ready.wait(nap)
                else:
                    return
            try:
                callback()
            except Exception:
                log.exception("a watchdog callback failed; the watchdog carries on")


def bootstrap_source() -> str:
    return (resources.files("wasm_kernel") / "guest" / "bootstrap.py").read_text()


def shipped_modules() -> dict[str, tuple[str, bool]]:
    """The kernel's guest modules under ``guest/modules``: dotted name -> (source, is_package)."""
    root = Path(str(resources.files("wasm_kernel") / "guest" / "modules"))
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = (path.read_text(), is_package)
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
        self._turn_lock = threading.Lock()
        scratch_folders.sweep()  # folders of killed kernels hold their guests' files
        self._tmp = scratch_folders.create()
        self._scratch = ScratchWatch(
            self._tmp,
            limits.scratch,
            partial(self.interrupts.request_stop, "scratch"),
            touches=True,  # GuestFiles reports every call that may grow /tmp
            writing=lambda: self._files.writing_to_scratch(),  # noqa: PLW0108 (set later)
        )
        self._host: GuestHost | None = None
        self._reply: dict | None = None
        self._store: wasmtime.Store | None = None
        self._state: GuestState | None = None
        self._signals: SignalFlags | None = None
        self._changed = False  # turns ran since the last checkpoint
        self._deadline: int | None = None  # watchdog token of the running turn's time limit
        self._closing = False
        self._fresh = True  # no cell has finished in this interpreter yet
        self._turn_limits = limits
        self._time_limit_reported = False
        self._memory_at_start = 0
        self._making_boot_image = False  # only then may the guest make objects immortal
        self._adapter: wasmtime.Module | None = None  # compiled once, reused by restarts
        # added to the host's clocks so that a resumed guest's never run backwards
        self._clock_offsets = dict.fromkeys(_CLOCKS, 0)
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

    def _start_interpreter(self, image: images.Image | None = None) -> None:
        """Instantiate the runtime and boot the guest, or resume it from ``image``."""
        engine = self.compiled.engine
        store = wasmtime.Store(engine)
        store.set_wasi(self._wasi())
        store.set_limits(memory_size=self.limits.memory)
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
        i32 = wasmtime.ValType.i32()
        i64 = wasmtime.ValType.i64()
        linker.define_func(
            "host", "call", wasmtime.FuncType([i32] * 4, [i32]), self._host_call, access_caller=True
        )
        linker.define_func(
            "wasi_snapshot_preview1",
            "poll_oneoff",
            wasmtime.FuncType([i32] * 4, [i32]),
            self._poll_oneoff,
            access_caller=True,
        )
        linker.define_func(
            "wasi_snapshot_preview1",
            "clock_time_get",
            wasmtime.FuncType([i32, i64, i32], [i32]),
            self._clock_time_get,
            access_caller=True,
        )
        # No symlinks: one made in a writable mount could point a host program that later
        # opens it (a backup, the user's editor) at files the guest was never granted.
        linker.define_func(
            "wasi_snapshot_preview1",
            "path_symlink",
            wasmtime.FuncType([i32] * 5, [i32]),
            lambda *_: WASI_EPERM,
        )
        instance = linker.instantiate(store, self.compiled.module)
        exports = instance.exports(store)
        self._instance_exports = exports
        self._store = store
        self._memory = exported(exports, "memory", wasmtime.Memory)
        self._adapter = files.bind(engine, store, self._memory, self._adapter)
        self._files = files
        self._turn_func = exported(exports, "turn", wasmtime.Func)
        self._alloc = exported(exports, "host_alloc", wasmtime.Func)
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
            raise images.ImageError(memory_limit_text(self.limits.memory)) from None
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
        now = {clock: read() for clock, read in _CLOCKS.items()}
        for clock, reading in image.host.clocks.items():
            self._clock_offsets[clock] = max(0, reading - now[clock])
        images.unpack_archive(image.scratch, self._tmp)
        settle = (
            "def _settle(cwd, start, paths):\n"
            "    import os, random, sys\n"
            "    sys.path += [path for path in paths if path not in sys.path]\n"
            "    if start != '/tmp' and start not in sys.path:\n"  # modules beside the notebook
            "        sys.path.insert(0, start)\n"
            "    for folder in (cwd, start):\n"
            "        try:\n"
            "            os.chdir(folder)\n"
            "            break\n"
            "        except (OSError, ValueError):\n"
            "            pass\n"
            "    os.environ['PWD'] = os.getcwd()\n"
            "    random.seed()\n"
            "    if 'numpy.random' in sys.modules:\n"
            "        sys.modules['numpy.random'].seed()\n"
            f"    __import__({GUEST_MODULE!r}).close_stale_files()\n"
            f"_settle({image.host.cwd!r}, {self.cwd!r}, {list(self.import_paths)!r})\n"
        )
        with self._metered(store, REPAIR_FUEL, REPAIR_SECONDS, interruptible=False):
            try:
                status = self._call_turn(f"exec({settle!r}, {{}})")
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
            self._reply = None
            self._output.begin(lambda *_: None, MAX_MESSAGE, "")
            with self._metered(store, REPAIR_FUEL, REPAIR_SECONDS, interruptible=False):
                try:
                    # a statement whose value is None: nothing reaches the display hook (and `_`)
                    self._call_turn(f"__import__({GUEST_MODULE!r}).serve('working_folder')")
                except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
                    raise images.ImageError(f"the interpreter could not be asked: {exc}") from None
                finally:
                    self._output.end()
            self._changed = True  # that turn ran: the next checkpoint keeps what it did
            cwd = self._reply.get("cwd") if self._reply else None
            host.cwd = cwd if isinstance(cwd, str) and cwd else self.cwd
            host.clocks = {clock: self._now(clock) for clock in _CLOCKS if clock}
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
                scratch=images.archive_folder(self._tmp, self.limits.scratch),
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
            offsets = dict(self._clock_offsets)
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
                self._clock_offsets = offsets
                shutil.rmtree(self._tmp, ignore_errors=True)
                backup.rename(self._tmp)
                raise
            kept["_store"].close()
            if kept["_state"] is not None:
                kept["_state"].close()
            shutil.rmtree(backup, ignore_errors=True)

    def _boot_source(self) -> str:
        """The turn that (re)installs the guest module and boots it (IPython's shell and all:
        one call, so that a boot image can capture it): used at start and to repair it."""
        boot = f"{self.packages.guest!r}, plain_tracebacks={self.plain_tracebacks!r}"
        return (
            "import sys as _sys, types as _types\n"
            f"_sys.path += [p for p in {list(self.import_paths)!r} if p not in _sys.path]\n"
            f"_module = _types.ModuleType({GUEST_MODULE!r})\n"
            f"exec(compile({bootstrap_source()!r}, {GUEST_FILE!r}, 'exec'), _module.__dict__)\n"
            f"_sys.modules[{GUEST_MODULE!r}] = _module\n"
            f"_module.install_modules({shipped_modules()!r})\n"
            f"_module.boot({boot})\n"
            "del _sys, _types, _module"
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
        self.interrupts.request_stop("shutdown")
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
        self, store: wasmtime.Store | wasmtime.Caller, memory_at_start: int, limit: int
    ) -> bool:
        """Did the turn fail to get memory? Exact with rollback (sbrk records failures),
        otherwise judged by growth to near the limit."""
        if self._state is not None:
            return self._state.growth_failed(store)
        size = self._memory.data_len(store)
        return size > memory_at_start and size + (64 << 20) >= limit

    # -- turns ----------------------------------------------------------------------------------

    def _call_turn(self, source: str) -> int:
        data = source.encode("utf-8", "surrogatepass")
        store = self._live_store
        pointer = self._alloc(store, len(data))
        self._write(store, pointer, data)
        return self._turn_func(store, pointer, len(data))

    def run_cell(
        self,
        source: str,
        execution_count: int,
        host: GuestHost,
        store_history: bool = True,
        silent: bool = False,
    ) -> None:
        """Run a notebook cell; output and messages go to ``host``. Raises CellStopped."""
        arguments = f"{source!r}, {int(execution_count)}, {bool(store_history)}, {bool(silent)}"
        call = f"__import__({GUEST_MODULE!r}).run_cell({arguments})"
        self._turn(call, host, self.limits, cell=True)

    def request(self, function: str, *args: object, host: GuestHost) -> dict:
        """Call a guest service function (completion, inspection...) and return its reply."""
        arguments = ", ".join(repr(arg) for arg in args)
        service_limits = Limits(
            fuel=min(self.limits.fuel, 20_000_000_000),
            seconds=min(self.limits.seconds or 10.0, 10.0),
            memory=self.limits.memory,
            output=MAX_MESSAGE,
            scratch=self.limits.scratch,
        )
        self._reply = None
        call = f"__import__({GUEST_MODULE!r}).serve({function!r}, {arguments})"
        self._turn(call, host, service_limits)
        return self._reply or {}

    def _turn(self, source: str, host: GuestHost, limits: Limits, cell: bool = False) -> None:
        """One guest turn (a cell or a request: every one can write to /tmp, so every one is
        measured), and the recovery from a trap."""
        with self._turn_lock:
            store = self._live_store
            self._host = host
            self._turn_limits = limits
            self._time_limit_reported = False
            self._changed = True
            self._signals = self._signal_flags(store)
            memory_at_start = self._memory_at_start = self._memory.data_len(store)
            if self._state is not None:
                self._state.growth_failed(store, reset=True)
            with self._metered(store, limits.fuel, limits.seconds) as turn:
                self._scratch.begin(turn)
                if self._scratch.over_limit:  # no growth until files are deleted, not even
                    self._scratch.stop_writers()  # through files kept open from earlier cells
                self._output.begin(host.stream, limits.output, self._output_notice(limits.output))
                stopped: CellStopped | None
                try:
                    status = self._call_turn(source)
                except wasmtime.ExitTrap as exit_trap:
                    stopped = CellStopped(
                        "GuestExited", f"the interpreter exited with status {exit_trap.code}."
                    )
                except wasmtime.Trap as trap:
                    stopped = self._explain_trap(trap, limits, memory_at_start)
                else:
                    stopped = self._check_status(status, limits, memory_at_start)
                finally:
                    grown = self._scratch.end()
                    self._output.end()
                    self._host = None
            if stopped is None and grown is not None:  # it finished before a check caught it
                stopped = CellStopped(
                    "ScratchLimitExceeded", self._scratch_text(grown, limits), recovered=True
                )
            timed_out = self.interrupts.soft_reason == "time" and not self._time_limit_reported
            if stopped is None and timed_out:  # it caught the interrupt and finished: kept
                stopped = CellStopped(
                    "TimeLimitExceeded", self._time_limit_text(limits), recovered=True
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
        deadline = self._deadline = None
        if seconds:
            deadline = self._deadline = self._watchdog.arm(seconds, partial(self._time_up, turn))
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
                status = self._call_turn(f"__import__({GUEST_MODULE!r}).close_stale_files()")
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

    def _check_status(
        self, status: int, limits: Limits, memory_at_start: int
    ) -> CellStopped | None:
        """A turn that returns non-zero escaped the guest's own error handling: it ran out of
        memory while reporting, or the cell broke the kernel's guest code (the guest checks
        its own integrity at the end of each cell). Either way the turn is undone."""
        if status == 0:
            return None
        if status == TURN_REFUSED:
            return CellStopped(
                "KernelSupportDamaged", "the interpreter refused to run further cells.", fresh=True
            )
        if self._hit_memory_limit(self._live_store, memory_at_start, limits.memory):
            return CellStopped("MemoryLimitExceeded", memory_limit_text(limits.memory))
        return CellStopped(
            "KernelSupportDamaged",
            "the cell changed or removed the kernel's own code inside the sandbox (its"
            " _wasm_kernel module or the import system), which later cells need.",
        )

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
        if self.interrupts.request_soft(self._trip_signal_flags, "time", turn) is None:
            self.interrupts.request_stop("time", turn)
            return
        self._watchdog.arm(
            self.limits.interrupt_grace, partial(self.interrupts.request_stop, "time", turn)
        )

    def interrupt(self) -> None:
        """Jupyter interrupt: KeyboardInterrupt in the cell, or a hard stop after the grace time."""
        turn = self.interrupts.request_soft(self._trip_signal_flags)
        if turn is None:
            return
        self._watchdog.arm(
            self.limits.interrupt_grace, partial(self.interrupts.request_stop, "interrupt", turn)
        )

    def _trip_signal_flags(self) -> None:
        if self._signals is None:
            return  # the guest learns of the interrupt when it next waits on the host
        try:
            self._signals.trip()
        except IndexError:
            log.warning("could not reach the interpreter's signal flags")

    def _explain_trap(
        self, trap: wasmtime.Trap, limits: Limits, memory_at_start: int
    ) -> CellStopped:
        code = trap.trap_code
        if code == wasmtime.TrapCode.OUT_OF_FUEL:
            return CellStopped(
                "FuelExhausted",
                f"the cell used up its fuel budget of {limits.fuel:,} units (about one per"
                " WebAssembly instruction). Raise it with --WasmKernel.fuel=N in the"
                " kernelspec argv or c.WasmKernel.fuel in jupyter_wasm_kernel_config.py.",
            )
        if code == wasmtime.TrapCode.INTERRUPT:
            if self.interrupts.stop_reason == "time":
                ignored = (
                    f" and did not stop within {limits.interrupt_grace:g} s of being interrupted,"
                    " so it was stopped hard"
                    if self.interrupts.soft_reason == "time"
                    else ""
                )
                return CellStopped(
                    "TimeLimitExceeded",
                    f"the cell ran longer than its wall-clock limit of {limits.seconds:g} s"
                    f"{ignored}. {TIME_LIMIT_HINT}",
                )
            if self.interrupts.stop_reason == "scratch":
                return CellStopped(
                    "ScratchLimitExceeded",
                    self._scratch_text(self._scratch.stopped or usage(self._tmp), limits),
                )
            return CellStopped(
                "KeyboardInterrupt",
                "the cell did not stop within"
                f" {limits.interrupt_grace:g} s of the interrupt, so it was stopped hard.",
            )
        if code == wasmtime.TrapCode.STACK_OVERFLOW:
            return CellStopped(
                "StackOverflow",
                "the cell overflowed the interpreter's native stack (very deep recursion in C"
                " code, or a raised sys.setrecursionlimit).",
            )
        if self._hit_memory_limit(self._live_store, memory_at_start, limits.memory):
            # an allocation failed at the limit, and then C code gave up (abort)
            return CellStopped("MemoryLimitExceeded", memory_limit_text(limits.memory))
        return CellStopped("GuestCrashed", f"the interpreter trapped: {trap.message}.")

    @staticmethod
    def _scratch_text(size: Usage, limits: Limits) -> str:
        if size.unmeasured:
            return (
                f"the kernel could not measure the private {SCRATCH} ({size.unmeasured}), so it"
                f" counts as past its limit of {limits.scratch >> 20} MiB. Its files stay: delete"
                " some (os.remove, shutil.rmtree) to go on."
            )
        return (
            f"the cell filled the private {SCRATCH} past its limit of {limits.scratch >> 20} MiB"
            f" ({size >> 20} MiB there now; files count at least 4 KiB each, and so do deleted"
            " files still open). Its files stay: delete some (os.remove, shutil.rmtree) to go"
            " on. The limit is --WasmKernel.scratch_limit=BYTES."
        )

    @staticmethod
    def _output_notice(budget: int) -> str:
        return (
            f"\n[wasm-kernel] output limit reached: this cell's output went past {budget:,}"
            " bytes; what did not fit is not shown. Raise it with"
            " --WasmKernel.output_limit=BYTES.\n"
        )

    # -- host functions the guest imports --------------------------------------------------

    def _guest_output(self, name: str, data: bytes) -> int:
        try:
            self._output.write(name, data)
        except Exception:  # a raising callback would abort the process inside wasmtime
            log.exception("dropping guest %s output", name)
        return len(data)

    def _read(self, store: wasmtime.Caller | wasmtime.Store, pointer: int, length: int) -> bytes:
        """Exactly ``length`` bytes at a guest pointer; wasm i32 values arrive signed."""
        pointer, length = pointer & 0xFFFFFFFF, length & 0xFFFFFFFF
        if pointer + length > self._memory.data_len(store):
            raise IndexError("guest pointer out of bounds")
        return bytes(self._memory.read(store, pointer, pointer + length))

    def _write(self, store: wasmtime.Caller | wasmtime.Store, pointer: int, data: bytes) -> None:
        self._memory.write(store, data, pointer & 0xFFFFFFFF)  # raises IndexError out of bounds

    def _host_call(
        self, caller: wasmtime.Caller, ptr: int, length: int, out_ptr: int, out_len_ptr: int
    ) -> int:
        try:
            size = length & 0xFFFFFFFF
            if size > MAX_MESSAGE or not self._output.fits(size + protocol.MESSAGE_COST):
                reply = self._oversized(caller, ptr, size)
            else:
                reply = self._dispatch(protocol.parse(self._read(caller, ptr, size)), size, caller)
            data = json.dumps(reply).encode()
            pointer = self._alloc(caller, len(data))
            self._write(caller, pointer, data)
            self._write(caller, out_ptr, struct.pack("<I", pointer & 0xFFFFFFFF))
            self._write(caller, out_len_ptr, struct.pack("<I", len(data)))
            return 0
        except protocol.ProtocolError as exc:
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
        op = protocol.peek_op(self._read(caller, ptr, min(size, protocol.PEEK_BYTES)))
        if size <= MAX_MESSAGE and op not in protocol.DROPPABLE_OPS:
            # not output, or an error: read it as any other message
            return self._dispatch(protocol.parse(self._read(caller, ptr, size)), size, caller)
        if op == ops.ERROR and self._host is not None:
            self._output.flush()
            return self._host.message(protocol.oversized_error(size), self.interrupts)
        self._output.charge(size)  # does not fit: queues the notice, counts nothing
        return {}

    def _dispatch(self, message: dict, size: int, caller: wasmtime.Caller) -> dict:
        op = message["op"]
        if op == ops.ERROR and self.interrupts.soft_reason == "time":
            self._time_limit_reported = True  # the cell's own error (TimeLimitExceeded) stands
        if op == ops.INTERRUPTION:
            if self.interrupts.soft_reason != "time":
                return {}
            return {"time_limit": self._time_limit_text(self._turn_limits)}
        if op == ops.IMMORTALIZE:
            if not self._making_boot_image:  # a session's guest runs user code: not there
                return {"immortal": 0}
            memory = self._memory.data_len(caller)
            view = (ctypes.c_char * memory).from_address(memory_address(self._memory, caller))
            return {"immortal": make_immortal(memoryview(view).cast("B"), message["addresses"])}
        if op == ops.ERROR and message["ename"] == "MemoryError":
            # host-side verdict (the guest cannot set it): was it the sandbox's memory limit?
            message["memory_limit"] = self._hit_memory_limit(
                caller, self._memory_at_start, self.limits.memory
            )
        if op in protocol.OUTPUT_OPS and not self._output.charge(size + protocol.MESSAGE_COST):
            if op != ops.ERROR:
                return {}  # over the cell's output budget: left out, with the notice
            message["shown"] = False  # an error still fails the cell, shown briefly at its end
        if op == ops.SLEEP:
            return {"interrupted": self._sleep(message["seconds"])}
        if op == ops.REPLY:
            self._reply = message["content"]
            return {}
        host = self._host
        if host is None:
            return {}
        self._output.flush()  # keep printed text ahead of what the message shows
        if op in (
            ops.INPUT,
            ops.PIP,
        ):  # a person answering, or pip on the host: not the cell's time
            with self._watchdog.paused(self._deadline):
                return host.message(message, self.interrupts)
        return host.message(message, self.interrupts)

    @staticmethod
    def _time_limit_text(limits: Limits) -> str:
        return (
            f"the cell ran longer than its wall-clock limit of {limits.seconds:g} s and was"
            " interrupted (TimeLimitExceeded, a KeyboardInterrupt, inside it); what it did"
            " until then stays."
            f" {TIME_LIMIT_HINT}"
        )

    def _sleep(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while True:
            if self.interrupts.take():
                return True
            remaining = end - time.monotonic()
            if remaining <= 0:
                return False
            self.interrupts.wait(remaining)

    def _now(self, clock_id: int) -> int:
        """The guest's reading of a clock: the host's, moved on past what a resumed guest saw."""
        return _CLOCKS[clock_id]() + self._clock_offsets[clock_id]

    def _clock_time_get(
        self, caller: wasmtime.Caller, clock_id: int, _precision: int, out_ptr: int
    ) -> int:
        """The guest's clocks, from the host's, so that poll deadlines agree with them."""
        if clock_id not in _CLOCKS:
            return WASI_EINVAL
        try:
            self._write(caller, out_ptr, struct.pack("<Q", self._now(clock_id)))
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
        raw = self._read(caller, in_ptr, 48 * count)
        ready: list[tuple[int, int]] = []  # (userdata, event type)
        timers: list[tuple[float, int]] = []  # (seconds from now, userdata)
        for index in range(count):
            userdata, tag = struct.unpack_from("<QB", raw, 48 * index)
            if tag == 0:
                clock_id, timeout, _precision, flags = struct.unpack_from(
                    "<I4xQQH", raw, 48 * index + 16
                )
                if clock_id not in _CLOCKS:
                    return WASI_EINVAL
                delay_ns = timeout - self._now(clock_id) if flags & 1 else timeout
                timers.append((max(delay_ns, 0) / 1e9, userdata))
            else:  # fd readiness: the guest has no real streams to wait on
                ready.append((userdata, tag))
        if not ready and timers:
            delay, userdata = min(timers)
            if self.interrupts.stop_reason is None:
                self.interrupts.wait(delay)
            ready.append((userdata, 0))
        events = b"".join(
            struct.pack("<QHBx4xQH6x", userdata, 0, kind, 0, 0) for userdata, kind in ready
        )
        self._write(caller, out_ptr, events)
        self._write(caller, nevents_ptr, struct.pack("<I", len(ready)))
        return 0


def build_boot_image(compiled: CompiledRuntime, limits: Limits, path: Path) -> int:
    """Boot a guest and save it as the image kernels start from; returns its size in bytes.

    The image holds nothing of any session: no mounts, an empty /tmp, no history."""
    sandbox = Sandbox(compiled, limits, rollback=False)
    try:
        sandbox._making_boot_image = True
        sandbox.request("warm_up", host=QuietHost())
        memory_file = images.boot_memory_path(path)
        data = sandbox.save_image(images.HostState(), [], memory_file=memory_file)
    finally:
        sandbox.close()
    staging = path.with_name(f".{path.name}.partial")
    staging.write_bytes(data)
    staging.chmod(0o644)  # shared by every user of the cache, as the compiled module is
    staging.replace(path)  # after the memory file: a kernel that finds the image finds both
    return len(data) + memory_file.stat().st_blocks * 512


_CLOCKS = {0: time.time_ns, 1: time.monotonic_ns, 2: time.process_time_ns, 3: time.thread_time_ns}
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


def memory_limit_text(limit: int) -> str:
    return (
        f"the cell needed more than the sandbox's memory limit of {limit / (1 << 20):,.0f} MiB."
        " Raise it with --WasmKernel.memory_limit=BYTES."
    )
