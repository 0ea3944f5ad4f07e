"""The Jupyter side: an ipykernel ``Kernel`` whose cells run in the WebAssembly sandbox.

The handlers live here, dispatched by ipykernel by message type; each job they need is an
object of its own: the settings (``kernel_settings``), the sandbox's start (``boot``), one
cell's messages (``cell_messages``), the session's images (``session_images``), the guest
thread and interrupts (``guest_thread``), completion and the other services
(``guest_services``), the checks of malformed requests (``request_checks``) and input
history (``history``). Everything about wasmtime lives in
``sandbox``. Every guest turn runs on the one guest thread, so the event loop stays free for
control messages and SIGINT while a cell runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import psutil
from traitlets import Float

from .. import __version__
from ..files import tenancy
from ..files.write_through import WriteThrough
from ..images import images
from ..images.image_folder import ImageFolder
from ..network.network import Network, NetworkLimits
from ..sandbox.guest_thread import GuestThread, InterruptRelay, RelayedInterrupts
from ..sandbox.limits import Limits
from ..sandbox.metrics import CellMetrics
from ..sandbox.sandbox import Sandbox
from ..sandbox.stops import CellStopped
from ..settings.kernel_settings import KernelSettings, screened
from ..settings.settings import InvalidSettings
from . import iopub, lifeline, termination
from .accounting import CellAccounting
from .boot import SandboxStart, WaitStopped
from .cell_messages import CellMessages, KernelDoors
from .comms import HostComms
from .debug_requests import DebugRequests
from .debug_session import DebugSession
from .early_abort import EarlyAbort
from .execute_request import Request
from .grants import Grants, configured_runtime
from .guest_services import GuestServices
from .hibernation import Hibernation
from .history import History
from .kernel_info import KernelInfo
from .kernel_tools import for_kernel as kernel_tools
from .request_checks import CheckedRequests
from .session_images import SessionImages

BACKLOG_FLOOR = 64 << 20  # bytes of cell output that may wait for slow IOPub clients


def _keep_working_folder_off_sys_path() -> None:
    """The working folder is the notebook's, which a writable mount lets the guest fill, so
    the host must not import from it. Our kernelspec runs python with -P; launchers that use
    ipykernel's own application (Enterprise Gateway's) put it on sys.path all the same."""
    here = os.getcwd()
    sys.path[:] = [entry for entry in sys.path if entry not in ("", ".", here)]


def _log_to_process_stderr() -> None:
    """Send this package's log records to the process's own stderr (the kernel log).

    Without a handler they would reach Python's last-resort handler, which writes to
    ``sys.stderr``: ipykernel forwards that to every client as stream output, so host
    diagnostics (quoting guest-controlled bytes) would appear in notebooks.
    """
    package = logging.getLogger("wasm_kernel")
    if not package.handlers:
        handler = logging.StreamHandler(sys.__stderr__)
        handler.setFormatter(logging.Formatter("[wasm-kernel] %(levelname)s | %(message)s"))
        package.addHandler(handler)
        package.propagate = False


def _tenant_folders(settings: Any) -> tuple[str | None, str, Path]:
    """The tenant a gateway names (or None), and the history file and snapshot folder that
    are this user's, or this tenant's own (see files.tenancy). Where a tenant's folder cannot
    be trusted, the setting is refused: no cell runs rather than sharing."""
    tenant = tenancy.tenant()
    snapshot_dir = Path(settings.snapshot_dir).expanduser()
    try:
        return (
            tenant,
            tenancy.keyed_file(settings.history_file, tenant),
            tenancy.keyed(snapshot_dir, tenant),
        )
    except tenancy.ForeignFolder as exc:
        settings.refuse_setting("snapshot_dir", str(snapshot_dir), "the tenant's folder", str(exc))
        return tenant, ":memory:", snapshot_dir / tenancy.TENANTS / "refused"


class WasmKernel(
    KernelSettings,
    KernelInfo,
    GuestServices,
    RelayedInterrupts,
    EarlyAbort,
    CheckedRequests,
    CellAccounting,
    termination.Ending,
    DebugRequests,
    HostComms,  # after CheckedRequests: it checks comm_info_request first
):
    implementation = "wasm-kernel"
    implementation_version = __version__
    language = "python"
    help_links = [{"text": "Python", "url": "https://docs.python.org/3/"}]
    # ipykernel sleeps this long before each execute_reply so that output its OutStream holds
    # reaches the clients first; cells' output here never passes through an OutStream (the
    # sandbox publishes it) and the kernel process has none (see WasmKernelApp).
    _execute_sleep = Float(0.0)

    def __init__(self, **kwargs: Any):
        self._ending: asyncio.Future | None = None  # exit() in a cell: the kernel's end
        self._aborted_before_reply: set[str | None] = set()  # see EarlyAbort
        self._closed = False
        parent = kwargs.get("parent")
        config = kwargs.get("config") or getattr(parent, "config", None)
        early: list[tuple] = []  # refusals found before the settings exist
        if config is not None:
            kwargs["config"] = screened(config, parent, lambda *refusal: early.append(refusal))
        super().__init__(**kwargs)
        for refusal in early:
            self.refuse_setting(*refusal)
        self.live_session.pack = iopub.pack  # guest text may hold what UTF-8 cannot
        self.guest_output = iopub.GuestPublisher(
            self.live_session, self.iopub_thread, max(BACKLOG_FLOOR, 2 * self.output_limit)
        )
        _keep_working_folder_off_sys_path()
        _log_to_process_stderr()
        if threading.current_thread() is threading.main_thread():
            termination.hibernate_on_sigterm(self._end_from_outside)
        configured = self.read_settings()
        runtime = configured_runtime(self)
        self.host_tools = kernel_tools(self)  # the operator's, imported now
        self._settings_error = InvalidSettings(self.refused) if self.refused else None
        self.runtime = runtime
        self.limits = Limits.of(self)
        tenant, history_file, snapshot_dir = _tenant_folders(self)
        self.history = History(history_file)
        self.grants = Grants(
            self, runtime, configured, valid=self._settings_error is None, tenant=tenant
        )
        self.open_audit_log([mount.host for mount in self.grants.granted], configured)
        self._settings_error = InvalidSettings(self.refused) if self.refused else None
        self._withheld_told = False  # said once, on the first cell's stderr
        layered = {m.guest: m.host for m in self.grants.granted if m.guest in self.grants.layered}
        self.write_through = WriteThrough(self.notebook_writes, layered, self.limits.scratch_limit)
        folder = ImageFolder(snapshot_dir, self.snapshot_quota)
        self.session_images = SessionImages(
            folder,
            runtime.module.sha256,
            self.limits,
            self.grants.packages,
            self.history,
            self.grants.granted,
            snapshots=self.snapshots,
            fork_memory_limit=self.fork_memory_limit,
            hibernation=Hibernation(
                folder, self.hibernate, self.hibernation_quota, self.hibernation_days
            ),
        )
        self.network = Network(self.network_allow, NetworkLimits.of(self))
        self.debug_session = DebugSession(
            lambda event, parent: self._publish_guest_output("debug_event", event, parent)
        )
        self._doors = KernelDoors(
            publish=self._publish_guest_output,
            stdin=lambda: (self.live_session, self.stdin_socket),
            output_sent=self.guest_output.handed_over,
            describe=self.describe_sandbox,
            pip=self.grants.pip,
            snapshot=self.session_images.snapshot_message,
            comm=self.comm_outgoing,
            active_output=self.active_output,
            memory_limit=self.limits.memory_limit,
            host_folders=self.grants.host_folders_in_guest(),
            own_folders=self.grants.own_folders(),
            tools=self.host_tools,
            network=self.network.cell,
            audit=lambda: self.audit,
            debugger=self.debug_session,
        )
        self._start = SandboxStart(self, self.limits, self.grants, self.session_images)
        self._interrupt_relay = InterruptRelay(self._interrupt_sandbox)
        self._worker = GuestThread()
        problems = [p for p in (self._settings_error, self.grants.mount_error) if p is not None]
        self._boot: Future[Sandbox] = self._worker.submit(self._start.run, problems)
        self._worker.submit(self._start.checkpoint_resumed, self._boot)

    def start(self) -> None:
        """A served kernel tells its launcher that clients may connect once its "starting"
        status has gone out (from the IOPub thread, behind that status): a client that
        subscribed just before would get the status ahead of its iopub_welcome, which JEP 65
        clients and jupyter_kernel_test expect first (a CI run caught it)."""
        super().start()
        if self.iopub_thread is not None:
            self.iopub_thread.schedule(lifeline.tell_started)
        else:
            lifeline.tell_started()

    def _publish_guest_output(self, msg_type: str, content: dict, parent: dict) -> bool:
        """A cell's output on IOPub; False if left out: too much waits for slow clients."""
        return self.guest_output.publish(msg_type, content, parent, self._topic(msg_type))

    # -- execution --------------------------------------------------------------------------------

    async def _execute(
        self,
        code: str,
        silent: bool,
        store_history: bool,
        user_expressions: dict | None,
        allow_stdin: bool,
    ) -> dict:
        request = Request(
            parent=self.get_parent("shell"),
            stdin_ident=self._get_shell_context_var(self._shell_parent_ident),
            silent=silent,
            allow_stdin=allow_stdin,
            execution_count=self.execution_count,
        )
        cell = CellMessages(self._doors, request)
        if not isinstance(code, str):
            return cell.fail("TypeError", "the code of an execute_request must be a string")
        try:
            sandbox = await self._sandbox(lambda text: cell.stream("stderr", text))
        except (InvalidSettings, WaitStopped) as exc:
            return cell.fail(exc.ename, str(exc))
        except Exception as exc:
            return cell.fail("SandboxUnavailable", f"the sandbox could not start: {exc}")
        if not silent:  # a silent request shows no output: what is told waits for a cell
            self._tell_pending(cell)
        loop = asyncio.get_running_loop()
        debugged = self.debug_session.cell_started()  # the breakpoints it runs with
        flags = (store_history, silent, debugged)  # run_cell's store_history, silent, breakpoints
        run = partial(sandbox.run_cell, code, self.execution_count, cell, *flags)
        turn = loop.run_in_executor(self._worker, _cell_then_files, self, sandbox, cell, run)
        if store_history and not silent:  # while the guest thread runs the cell, not before
            self.history.store(self.execution_count, code)  # (what reads it runs after it)
        try:
            measured = await turn
        except CellStopped as stop:
            self.cell_measured(request.parent, stop.metrics)
            if stop.recovered:  # the cell's changes stand: keep them
                self._worker.defer_checkpoint(sandbox)
            return cell.fail(stop.ename, stop.evalue)
        finally:
            self.debug_session.cell_ended()
        self.cell_measured(request.parent, measured)
        if cell.asks_exit():
            self._end_process(hibernate=False, delay=0.1)
        if cell.snapshot is not None:  # %snapshot save/restore: now that the turn is over
            act = partial(self.session_images.act, sandbox, *cell.snapshot, self.execution_count)
            try:
                told = await loop.run_in_executor(self._worker, act)
            except images.ImageError as exc:
                return cell.fail("SnapshotError", str(exc))
            except Exception as exc:  # a bug, not a refusal: the session must still go on
                self.log.exception("the snapshot %s failed", cell.snapshot[0])
                return cell.fail("SnapshotError", f"{type(exc).__name__}: {exc}")
            cell.stream("stdout", told + "\n")
        # Checkpoint once the client has the reply and the kernel is idle (see dispatch_shell),
        # while the user reads the output; the next cell queues behind it.
        self._worker.defer_checkpoint(sandbox)
        if cell.error:
            return cell.reply()
        expressions = {}
        if user_expressions and isinstance(user_expressions, dict):
            expressions = await self.user_expressions(
                {str(k): str(v) for k, v in user_expressions.items()}
            )
            expressions = cell.active_output.expressions(expressions)  # active-output policy
        return cell.reply(expressions)

    def _tell_pending(self, cell: CellMessages) -> None:
        """What the kernel has to say once, on a cell's stderr: settings withheld, a service
        stopped since the last cell, how a resume went."""
        if self.grants.withheld and not self._withheld_told:
            cell.stream("stderr", f"wasm-kernel: {self.grants.withheld}\n")
            self._withheld_told = True
        if notice := self.take_service_notice():
            cell.stream("stderr", notice)
        if self._start.resume_note:
            cell.stream("stderr", self._start.resume_note)
            self._start.resume_note = ""

    async def _sandbox(self, notify: Any) -> Sandbox:
        return await self._start.wait(self._boot, notify)

    def _interrupt_sandbox(self) -> None:
        if not self._boot.done():
            self._start.interrupt()
        elif not self._boot.exception():
            self._boot.result().interrupt()

    def _process_children(self) -> list[Any]:
        """Children ipykernel waits for at shutdown, less zombies. The kernel starts none
        (the guest cannot), but a launcher's helper that has exited unreaped (Enterprise
        Gateway's) would otherwise hold every shutdown for ipykernel's whole retry schedule."""
        alive = []
        for child in super()._process_children():
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE:
                    alive.append(child)
        return alive

    # -- malformed requests -----------------------------------------------------------------

    async def dispatch_shell(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().dispatch_shell(*args, **kwargs)
        finally:
            # The checkpoint once the idle status is on its way (the IOPub thread sends in
            # order): taken earlier, it would hold the thread back, and clients wait for idle.
            # With none waiting (rollback off), no thread is woken for it.
            if self._worker.deferring and self.iopub_thread is not None:
                self.iopub_thread.schedule(self._worker.run_deferred)
            elif self._worker.deferring:
                self._worker.run_deferred()

    async def execute_request(self, stream: Any, ident: Any, parent: dict) -> None:
        if not self._refuse_malformed(stream, ident, parent, "execute_request"):
            if (
                not self._boot.done()
                and self.session_images.to_resume(self.resume_from) is not None
            ):
                # a resumed session numbers this cell after its own (the cell's wait is
                # bounded and interruptible: see SandboxStart.wait)
                await self._start.settle(self._boot, lambda _: None)
            self._take_resumed_state()
            await super().execute_request(stream, ident, parent)

    def _take_resumed_state(self) -> None:
        """Once, on the event loop: a resumed image's execution count and input history."""
        resumed, self._start.resumed = self._start.resumed, None
        if resumed is None:
            return
        self.execution_count = resumed.execution_count
        for line, source in resumed.history:
            self.history.store(line, source)

    # -- introspection requests ------------------------------------------------------------

    async def do_history(
        self,
        hist_access_type: str,
        output: bool = False,
        raw: bool = True,
        session: int | None = None,
        start: int | None = None,
        stop: int | None = None,
        n: int | None = None,
        pattern: str | None = None,
        unique: bool = False,
    ) -> dict:
        return self.history.reply(
            hist_access_type, output, session, start, stop, n, pattern, unique
        )

    async def do_shutdown(self, restart: bool) -> dict:
        await self._close(hibernate=not restart)
        return {"status": "ok", "restart": restart}

    async def _close(self, hibernate: bool) -> None:
        if self._closed:  # exit() and a shutdown request, both
            return
        self._closed = True
        if not self._boot.done():
            self._start.abandon()
        if self._boot.done() and not self._boot.exception():
            sandbox = self._boot.result()
            if hibernate:
                # A running cell is stopped now and rolled back: what hibernates is the state
                # before it, as after any cell that did not finish.
                sandbox.stop_running_turn()
                count = self.execution_count
                save = partial(self.session_images.hibernate, sandbox, count)
                hibernation = asyncio.wrap_future(self._worker.submit(save))
                limit = termination.HIBERNATE_SECONDS
                done, _ = await asyncio.wait([hibernation], timeout=limit)
                if not done:
                    self.log.warning("the session could not hibernate in %g s", limit)
            sandbox.close()
            sandbox.compiled.close()
        self._worker.shutdown(wait=False, cancel_futures=True)
        self.history.close()
        self.close_audit_log()
        if self.grants.packages is not None:
            self.grants.packages.close()


def _cell_then_files(
    kernel: WasmKernel, sandbox: Sandbox, cell: CellMessages, run: Callable[[], CellMetrics]
) -> CellMetrics:
    """On the guest thread: the cell's turn, then its files (stopped or not), in one hand-off
    from the event loop rather than two (each wakes a thread, on a machine of two cores)."""
    try:
        measured = run()
    except CellStopped:
        cell.release()
        _after_cell_files(kernel, sandbox, cell)
        raise
    cell.release()
    _after_cell_files(kernel, sandbox, cell)
    return measured


def _after_cell_files(kernel: WasmKernel, sandbox: Sandbox, cell: CellMessages) -> None:
    """New files beside the notebook written through, or the notice that a write stays private
    (files/write_through), before the reply: nbclient and papermill read the folder then."""
    try:
        told = kernel.write_through.after_cell(sandbox.scratch_folder, not cell.request.silent)
    except Exception:  # a bug, not a refusal: the cell's own result stands
        kernel.log.exception("writing files through to the notebook's folder failed")
        return
    if told:
        cell.stream("stderr", told)
