"""One sandboxed CPython interpreter's life: start, turns, limits, recovery, images.

The sandbox owns everything that touches wasmtime after compilation, each part an object of
its own: the instance (``interpreter``), the host functions the guest imports
(``host_functions``), fuel, deadlines and interrupts (``interrupts.Metering``), the private
/tmp and its size limit (``scratch``), checkpoints (``checkpoints``) and images
(``image_transfer``), the state kept between turns (``sandbox_state``). It knows nothing
about Jupyter: a ``Receiver`` supplied per turn gets the guest's output and messages.

When a turn traps (fuel, deadline, hard interrupt, memory, stack, anything), the interpreter
cannot take further turns as it is: the sandbox writes back the checkpoint taken after the
last cell, or with rollback off starts a fresh interpreter, and raises ``CellStopped`` with
what became of the user's state (``stops`` words why).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import wasmtime

from ..files import kernel_folders
from ..files.layer_opens import LayerOpens
from ..files.mounts import SCRATCH, Mount
from ..files.notebook_writes import GUEST_LAYER
from ..files.scratch import ScratchWatch, Usage, usage
from ..guest.modules import _wasm_kernel_cell_files as cell_files
from ..guest.modules import _wasm_kernel_contract as declared
from ..images import images
from ..images.image_fields import HostState
from ..images.image_writer import staged
from ..runtime import guest_packages
from ..runtime.cache import CompiledRuntime
from .contract import guest_turn
from .descriptors import GuestFiles
from .guest_code import install_source
from .host_functions import MAX_MESSAGE, Discard, GuestClock, HostCall, Receiver, SymlinkRefusal
from .interpreter import Interpreter, has_sources, preopened, wasi_config
from .interrupts import Interrupts, Metering
from .limits import Limits
from .metrics import CellMeter, CellMetrics
from .output import OutputPump
from .recovery import UNDONE, SandboxRecovery
from .stops import (
    SCRATCH_FULL,
    SCRATCH_STOP,
    SHUTDOWN,
    TIME,
    CellStopped,
    explain_status,
    explain_trap,
    output_notice,
    scratch_text,
    service_scratch_text,
    time_limit_interrupted,
)

log = logging.getLogger(__name__)


def cell_call(
    source: str,
    execution_count: int,
    store_history: bool,
    silent: bool,
    breakpoints: dict[str, list[int]] | None,
) -> str:
    """The turn that runs a cell: the guest's run_cell, given the murmur2 that names the cell's
    file, hashed here, natively (in the guest's interpreter it cost ~2,300 fuel a character)."""
    flags = (bool(store_history), bool(silent), breakpoints or None)
    digest = cell_files.source_hash(source)
    return guest_turn(declared.RUN_CELL, source, int(execution_count), digest, *flags)


class Sandbox(SandboxRecovery):
    """One guest interpreter. With a restorable runtime, a trap rolls it back to the state
    checkpointed after the last cell; otherwise it is replaced by a fresh one."""

    def __init__(
        self,
        compiled: CompiledRuntime,
        limits: Limits,
        rollback: bool = True,
        mounts: Sequence[Mount] = (),
        cwd: str = SCRATCH,
        layered: Sequence[str] = (),
        import_paths: Sequence[str] = (),
        image: images.Image | None = None,
        checkpoint_mode: str = "auto",
        plain_tracebacks: bool = False,
        network: bool = False,
    ):
        self.compiled = compiled
        self.network = network  # the guest's HTTP goes through the kernel (see network.py)
        self.checkpoint_mode = checkpoint_mode
        # raises if not installed; whether they are as built is checked beside the start
        self.packages, self._packages_checked = guest_packages.site_mount(compiled)
        self.plain_tracebacks = plain_tracebacks
        self.limits = limits
        self.mounts = tuple(mounts)
        self.import_paths = tuple(import_paths)  # guest folders appended to sys.path at boot
        self.cwd = cwd
        self.layered = tuple(layered)  # read-only mounts whose writes go to a private layer
        self.rollback = rollback and compiled.runtime.restorable
        self._metering = Metering(compiled.engine, compiled.interrupt_cells, limits.interrupt_grace)
        self.interrupts: Interrupts = self._metering.interrupts
        self._output = OutputPump()
        self._memory_at_start = 0
        self._host_call = HostCall(
            self._output,
            self.interrupts,
            self._metering.paused,
            lambda caller: self._hit_memory_limit(caller, self._memory_at_start),
        )
        self._clock = GuestClock(self.interrupts)
        self._turn_lock = threading.Lock()
        kernel_folders.sweep_beside()  # folders of killed kernels hold their guests' files
        self._tmp = kernel_folders.create()
        self._scratch = ScratchWatch(
            self._tmp,
            limits.scratch_limit,
            partial(self.interrupts.request_stop, SCRATCH_FULL),
            touches=True,  # GuestFiles reports every call that may grow /tmp
            writing=lambda: self._interpreter.files.writing_to_scratch(),  # noqa: PLW0108
        )
        self._changed = False  # turns ran since the last checkpoint
        self._closing = False
        self.last_cell: CellMetrics | None = None  # what the last cell that ran cost
        # a boot image (memory mapped from the cache) also serves restarts: no second boot
        self._boot_image = image if image is not None and image.memory_file is not None else None
        try:
            self._interpreter = self._start(image)
        except BaseException:
            self._release()  # no interpreter: remove the private /tmp, stop the helper threads
            raise

    # -- life cycle ---------------------------------------------------------------------------

    def _start(self, image: images.Image | None = None) -> Interpreter:
        """A new interpreter, booted, or resumed from ``image``."""
        sources = has_sources(self.compiled.runtime)
        folders = preopened(self.compiled, self._tmp, self.packages, self.mounts, sources)
        wasi = wasi_config(folders, self.cwd, self._guest_output)
        files = GuestFiles(
            folders=[(host, guest) for host, guest, _ in folders],
            scratch_index=[guest for _, guest, _ in folders].index(SCRATCH),
            touched=self._scratch.touched,
            room=self._scratch.has_room,
            removed=self._scratch.removed,
            scratch_folder=self._tmp,
            layer=self._layer_opens(),
        )
        host_functions = (self._host_call, self._clock, SymlinkRefusal())
        interpreter = Interpreter(
            self.compiled, wasi, self.limits.memory_limit, files, host_functions
        )
        self._host_call.bind(interpreter.guest_memory, interpreter.alloc)
        self._clock.memory = interpreter.guest_memory
        try:
            self._packages_checked.result()  # before the guest runs, and reads them
            if image is not None:
                self._resume(interpreter, image)
                self._changed = True  # a checkpoint now keeps the resumed state
                # a boot image (no cell ever ran in it) is as fresh as a boot
                interpreter.fresh = image.host.execution_count == 0
            else:
                interpreter.initialize()
                if interpreter.call_turn(self._install_source()) != 0:
                    raise RuntimeError("the guest's kernel module failed to load")
            layer = guest_turn(declared.LAYER_WRITES, list(self.layered), GUEST_LAYER)
            if self._repair_turn(interpreter, layer, "the guest could not set its layer") != 0:
                raise RuntimeError("the guest could not set up writes beside the notebook")
            if self.network:
                allow = guest_turn(declared.ALLOW_NETWORK)
                if self._repair_turn(interpreter, allow, "the network adapter trapped") != 0:
                    raise RuntimeError("the guest's network adapter failed to load")
        except BaseException:
            interpreter.close()
            raise
        if self.rollback:
            interpreter.keep_checkpoints(self.checkpoint_mode)
        return interpreter

    def _layer_opens(self) -> LayerOpens | None:
        """The host's half of the layer over the notebook's folder (see layer_opens)."""
        folders = {mount.guest: mount.host for mount in self.mounts if mount.guest in self.layered}
        if not folders:
            return None
        return LayerOpens(folders, self._tmp, self.limits.scratch_limit)

    @property
    def scratch_folder(self) -> Path:
        """The host folder that is the guest's /tmp (for %sandbox's list of written files)."""
        return self._tmp

    def _guest_output(self, name: str, data: bytes) -> int:
        try:
            self._output.write(name, data)
        except Exception:  # a raising callback would abort the process inside wasmtime
            log.exception("dropping guest %s output", name)
        return len(data)

    def _install_source(self) -> str:
        return install_source(self.packages.guest, list(self.import_paths), self.plain_tracebacks)

    def restart(self) -> None:
        """Replace the interpreter with a fresh one (same private /tmp)."""
        self._interpreter.close()
        if self._boot_image is not None:
            try:
                self._interpreter = self._start(self._boot_image)
                return
            except images.ImageError as exc:
                log.warning("restarting without the boot image: %s", exc)
        self._interpreter = self._start()

    def stop_running_turn(self) -> None:
        """At shutdown: end the running turn, if any, at once (rolled back like any stopped
        cell), so that what follows it need not wait."""
        self.interrupts.request_stop(SHUTDOWN)

    def close(self) -> None:
        """Stop any running turn, then free the interpreter and its private /tmp."""
        self._closing = True
        self.interrupts.request_stop(SHUTDOWN)
        with self._turn_lock:
            self._interpreter.close()
            self._release()

    def _release(self) -> None:
        self._output.close()
        self._metering.close()
        self._scratch.close()
        kernel_folders.remove(self._tmp)

    def interrupt(self, pause: bool = False) -> None:
        """Jupyter interrupt (see Metering.interrupt); ``pause``: the visual debugger's."""
        self._metering.interrupt(pause)

    def _hit_memory_limit(
        self, store: wasmtime.Store | wasmtime.Caller, memory_at_start: int
    ) -> bool:
        """Did the turn fail to get memory? Exact with rollback (sbrk records failures),
        otherwise judged by growth to near the limit."""
        interpreter = self._interpreter
        if interpreter.state is not None:
            return interpreter.state.growth_failed(store)
        size = interpreter.memory.data_len(store)
        return size > memory_at_start and size + (64 << 20) >= self.limits.memory_limit

    # -- turns ----------------------------------------------------------------------------------

    def run_cell(
        self,
        source: str,
        execution_count: int,
        receiver: Receiver,
        store_history: bool = True,
        silent: bool = False,
        breakpoints: dict[str, list[int]] | None = None,
    ) -> CellMetrics:
        """Run a notebook cell (with the visual debugger's ``breakpoints``); output and messages
        go to ``receiver``; returns what it cost. Raises CellStopped (with what it cost)."""
        call = cell_call(source, execution_count, store_history, silent, breakpoints)
        measured = self._turn(call, receiver, self.limits, cell=True)
        assert measured is not None
        return measured

    def comm_received(self, message: str, receiver: Receiver) -> None:
        """A front end's comm message (JSON text), run as a cell is. Raises CellStopped."""
        self._turn(guest_turn(declared.COMM_RECEIVED, message), receiver, self.limits, cell=True)

    def request(self, service: str, *args: object) -> dict:
        """Run a guest service (completion, inspection...) and return its answer; what it
        prints or displays is not shown."""
        self._host_call.reply = None
        call = guest_turn(declared.SERVE, service, *args)
        self._turn(call, Discard(), self.limits.for_service(MAX_MESSAGE))
        return self._host_call.reply or {}

    def _turn(
        self, source: str, receiver: Receiver, limits: Limits, cell: bool = False
    ) -> CellMetrics | None:
        """One guest turn (a cell or a request: every one can write to /tmp, so every one is
        measured), and the recovery from a trap; a cell's costs (see ``metrics``)."""
        with self._turn_lock:
            interpreter = self._interpreter
            store = interpreter.store
            self._host_call.begin(receiver, limits)
            self._changed = True
            self._metering.watch_signals(interpreter.memory, store)
            memory_at_start = self._memory_at_start = interpreter.size
            if interpreter.state is not None:
                interpreter.state.growth_failed(store, reset=True)
            with self._metering.turn(store, limits.fuel, limits.time_limit) as turn:
                self._scratch.begin(turn)
                if self._scratch.over_limit:  # no growth until files are deleted, not even
                    self._scratch.stop_writers()  # through files kept open from earlier cells
                notice = output_notice(limits.output_limit)
                self._output.begin(receiver.stream, limits.output_limit, notice)
                meter = CellMeter(limits.fuel, self._checkpoint_held(interpreter)) if cell else None
                if cell:  # a cell's files stay, past the limit too (it says so)
                    interpreter.files.journal.end()
                else:  # a service request: what it adds to /tmp may be taken back
                    interpreter.files.journal.begin(interpreter.files.held_writers())
                try:
                    stopped = self._outcome(interpreter, source, limits, memory_at_start)
                finally:
                    if meter is not None:
                        meter.stop(store.get_fuel(), interpreter.heap_end)
                    grown = self._scratch.end()
                    self._output.end()
                    self._host_call.end()
            stopped = stopped or self._kept_stop(grown, limits)
            if not cell:
                self._settle_service_writes(interpreter, stopped, limits)
            if cell and (stopped is None or stopped.recovered):
                interpreter.fresh = False  # this cell's changes stand
            rolled_back = False
            if stopped is not None and not (self._closing or stopped.recovered):
                recovery = self._recover(stopped.fresh)
                stopped.evalue += " " + recovery
                rolled_back = recovery in UNDONE
            if meter is not None:
                self.last_cell = meter.metrics(self._scratch.size(), rolled_back)
            if stopped is not None:
                stopped.metrics = self.last_cell if cell else None
                raise stopped
            return self.last_cell if cell else None

    def _outcome(
        self, interpreter: Interpreter, source: str, limits: Limits, memory_at_start: int
    ) -> CellStopped | None:
        """Run the turn's source; how it stopped, if it did not finish."""
        store = interpreter.store
        try:
            status = interpreter.call_turn(source)
        except wasmtime.ExitTrap as exit_trap:
            return CellStopped(
                "GuestExited", f"the interpreter exited with status {exit_trap.code}."
            )
        except wasmtime.Trap as trap:
            return explain_trap(
                trap,
                limits,
                self.interrupts.stop_reason,
                self.interrupts.soft_reason,
                lambda: self._scratch.stopped or usage(self._tmp),
                lambda: self._hit_memory_limit(store, memory_at_start),
            )
        memory_hit = status != 0 and self._hit_memory_limit(store, memory_at_start)
        return explain_status(status, limits, memory_hit)

    def _settle_service_writes(
        self, interpreter: Interpreter, stopped: CellStopped | None, limits: Limits
    ) -> None:
        """A service request that took /tmp past its limit: no one reads its error to delete
        files, so what it wrote there is removed (see scratch_journal)."""
        if stopped is not None and stopped.ename == SCRATCH_STOP:
            interpreter.files.journal.undo()
            self._scratch.removed()
            stopped.evalue = service_scratch_text(limits)
        else:
            interpreter.files.journal.end()

    def _kept_stop(self, grown: Usage | None, limits: Limits) -> CellStopped | None:
        """A turn that finished but went past a limit first: its changes are kept."""
        if grown is not None:  # it finished before a check of /tmp caught it
            return CellStopped(SCRATCH_STOP, scratch_text(grown, limits), recovered=True)
        if self.interrupts.soft_reason == TIME and not self._host_call.time_limit_reported:
            # it caught the time limit's interrupt and finished: what it did is kept
            return CellStopped("TimeLimitExceeded", time_limit_interrupted(limits), recovered=True)
        return None


def build_boot_image(compiled: CompiledRuntime, limits: Limits, path: Path) -> int:
    """Boot a guest and save it as the image kernels start from; returns its size in bytes.

    The image holds nothing of any session: no mounts, an empty /tmp, no history."""
    sandbox = Sandbox(compiled, limits, rollback=False)
    memory_file = images.boot_memory_path(path)
    try:
        sandbox._host_call.making_boot_image = True
        sandbox.request(declared.WARM_UP)
        # shared by every user of the cache, as the compiled module is; renamed after the
        # memory file: a kernel that finds the image finds both
        with staged(path, 0o644) as out:
            sandbox.save_image(out, HostState(), [], memory_file=memory_file)
            size = out.tell()
    finally:
        sandbox.close()
    return size + memory_file.stat().st_blocks * 512
