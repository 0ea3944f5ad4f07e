"""The Jupyter side: an ipykernel ``Kernel`` whose cells run in the WebAssembly sandbox.

The handlers live here, dispatched by ipykernel by message type; each job they need is an
object of its own: the settings (``kernel_settings``), the sandbox's start (``boot``), one
cell's messages (``cell_messages``), the session's images (``session_images``), the guest
thread and interrupt relay (``guest_thread``), the checks of malformed requests
(``request_checks``) and input history (``history``). Everything about wasmtime lives in
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
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import platformdirs
import psutil
from ipykernel._version import kernel_protocol_version
from ipykernel.kernelbase import Kernel
from jupyter_client.session import Session
from traitlets import Float

from . import __version__, images, iopub, scratch_folders
from .active_output import ActiveOutput
from .boot import SandboxStart
from .cell_messages import CellMessages, KernelDoors, Request
from .checkpoints import checkpoint_method
from .guest.modules import _wasm_kernel_contract as declared
from .guest_thread import GuestThread, InterruptRelay
from .history import History
from .interrupts import Interrupts
from .kernel_settings import KernelSettings, screened
from .limits import Limits
from .mounts import SCRATCH, Mount, MountError, guest_cwd, holds_home, parse_mounts
from .packages import GUEST_FOLDER, INDEX, OFF, Cancelled, Packages, Source, WheelCache
from .request_checks import (
    COMPLETION_TYPES,
    bounded,
    clamp,
    clean_request,
    completion_types,
    malformed,
)
from .runtime import DEFAULT_RUNTIME, Runtime, RuntimeUnavailable, load_runtime
from .sandbox import Sandbox
from .session_images import SessionImages
from .settings import ENV_PREFIX, InvalidSettings, config_source
from .stops import CellStopped
from .wheels import PackageError

BACKLOG_FLOOR = 64 << 20  # bytes of cell output that may wait for slow IOPub clients
HIBERNATE_SECONDS = 60.0  # longest a shutdown waits for a running cell before it hibernates
# requests whose content ipykernel reads without checking: the fields each must hold
CHECKED_REQUESTS: dict[str, tuple[str, dict[str, type]]] = {
    "execute_request": ("execute_reply", {"code": str}),
    "complete_request": ("complete_reply", {"code": str, "cursor_pos": int}),
    "inspect_request": ("inspect_reply", {"code": str, "cursor_pos": int}),
    "is_complete_request": ("is_complete_reply", {"code": str}),
    "comm_info_request": ("comm_info_reply", {}),
    "history_request": ("history_reply", {"hist_access_type": str}),
}


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


class WasmKernel(KernelSettings, Kernel):
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
            scratch_folders.remove_on_sigterm()  # SIGTERM would leave the guest's files
        configured = self.read_settings()
        self.runtime = self._load_runtime()
        self._settings_error = InvalidSettings(self.refused) if self.refused else None
        self.limits = Limits.of(self)
        self.history = History(self.history_file)
        self.granted: list[Mount] = []
        self.start_dir = SCRATCH
        self._mount_error: MountError | None = None
        here = Path.cwd()
        self.withheld = self._withheld_folder(here, configured)
        self._withheld_told = False  # said once, on the first cell's stderr
        try:
            specs = [] if self.withheld else self.mounts
            reserved = (self.runtime.lib_guest_dir, GUEST_FOLDER)
            self.granted = parse_mounts(specs, here, reserved=reserved)
            self.start_dir = guest_cwd(self.granted, here, self.working_dir)
        except MountError as exc:
            self._mount_error = exc  # reported by every cell; the kernel itself stays up
        self.package_set = self._package_set()
        self.session_images = SessionImages(
            images.ImageFolder(Path(self.snapshot_dir).expanduser(), self.snapshot_quota),
            self.runtime.module.sha256,
            self.limits,
            self.package_set,
            self.history,
            self.granted,
            snapshots=self.snapshots,
            hibernate=self.hibernate,
        )
        self._doors = KernelDoors(
            publish=self._publish_guest_output,
            stdin=lambda: (self.live_session, self.stdin_socket),
            describe=self.describe_sandbox,
            pip=self.run_pip,
            snapshot=self.session_images.snapshot_message,
            active_output=self.active_output,
            memory_limit=self.limits.memory_limit,
            reachable=self._reachable_without_host_folders(),
        )
        self._start = SandboxStart(
            self,
            self.runtime,
            self.limits,
            self.granted,
            self.start_dir,
            self.package_set,
            self.session_images,
        )
        self._interrupt_relay = InterruptRelay(self._interrupt_sandbox)
        self._worker = GuestThread()
        problems = [p for p in (self._settings_error, self._mount_error) if p is not None]
        self._boot: Future[Sandbox] = self._worker.submit(self._start.run, problems)

    def _load_runtime(self) -> Runtime:
        """The configured runtime; if there is none by that name, the setting is refused and
        the default one describes the kernel (no sandbox starts)."""
        try:
            return load_runtime(self.runtime_name)
        except RuntimeUnavailable as exc:
            if self.runtime_name == DEFAULT_RUNTIME:
                raise
            source = config_source(self.parent, "runtime_name")
            self.refuse_setting("runtime_name", self.runtime_name, source, str(exc))
            return load_runtime(DEFAULT_RUNTIME)

    def _withheld_folder(self, here: Path, configured: set[str]) -> str:
        """Why the profile's folder is not mounted, or "". A notebook in the home folder would
        expose keys and tokens; mounts set explicitly (config, argv, env) are the operator's."""
        explicit = "mounts" in configured or ENV_PREFIX + "MOUNTS" in os.environ
        if explicit or not self.mounts or not holds_home(here):
            return ""
        return (
            f"the notebook's folder {here} is (or holds) the home folder, with its keys and"
            " settings, so it is not mounted. Keep notebooks and their data in a project"
            " folder, or mount one with --WasmKernel.mounts."
        )

    def _package_set(self) -> Packages | None:
        """This kernel's %pip packages (None with invalid settings: no sandbox starts)."""
        if self._settings_error is not None:
            return None
        source = None
        if self.packages != OFF:
            source = Source(None if self.packages == INDEX else Path(self.packages))
        wheels = Path(platformdirs.user_cache_dir("wasm-kernel")) / "wheels"  # per user
        return Packages(
            source,
            self.packages_quota,
            self.packages_user_quota,
            self.runtime.stdlib.path,
            self.runtime.stdlib_guest_path,
            WheelCache(wheels),
            self.runtime.python_version,
        )

    def run_pip(self, message: dict, interrupts: Interrupts) -> dict:
        """A %pip command from the guest, run while its cell waits (the cell's time limit is
        paused, see Sandbox); an interrupt kills pip and the cell gets KeyboardInterrupt."""
        if self.package_set is None:
            return {"error": "packages are not available: the kernel has invalid settings"}

        def cancelled(seconds: float) -> bool:
            interrupts.wait(seconds)
            return interrupts.take()

        try:
            text = self.package_set.run(
                message["command"], message["args"], message["upgrade"], cancelled
            )
        except Cancelled:
            return {"error": declared.INTERRUPTED}
        except PackageError as exc:
            return {"error": str(exc)}
        except OSError as exc:
            self.log.exception("%pip failed")
            return {"error": f"the host could not complete this: {exc.strerror or exc}"}
        return {"text": text}

    def _publish_guest_output(self, msg_type: str, content: dict, parent: dict) -> bool:
        """A cell's output on IOPub; False if left out: too much waits for slow clients."""
        return self.guest_output.publish(msg_type, content, parent, self._topic(msg_type))

    def _reachable_without_host_folders(self) -> tuple[str, ...] | None:
        """The guest folders of a kernel with no host folder, for the hint on a path only the
        host has; None where the kernel has host folders (or could not mount them)."""
        if self.granted or self._mount_error is not None:
            return None
        return (SCRATCH, self.runtime.lib_guest_dir)

    @property
    def live_session(self) -> Session:
        """ipykernel's ``session``: declared optional, but the kernel app always gives one."""
        session = self.session
        assert session is not None, "the kernel was started without a Jupyter session"
        return session

    @property
    def kernel_info(self) -> dict[str, Any]:
        """ipykernel's version imports its debugger to offer it whenever debugpy is installed:
        the guest has none, and importing debugpy prints a warning about frozen modules that
        reaches clients as stderr output (``jupyter console`` shows it after the banner)."""
        return {
            "protocol_version": kernel_protocol_version,
            "implementation": self.implementation,
            "implementation_version": self.implementation_version,
            "language_info": self.language_info,
            "banner": self.banner,
            "help_links": self.help_links,
            "supported_features": ["kernel subshells"] if self._supports_kernel_subshells else [],
        }

    @property
    def language_info(self) -> dict[str, Any]:  # type: ignore[override]
        return {
            "name": "python",
            "version": self.runtime.python_version,
            "mimetype": "text/x-python",
            "file_extension": ".py",
            "pygments_lexer": "ipython3",
            "codemirror_mode": {"name": "ipython", "version": 3},
            "nbconvert_exporter": "python",
        }

    @property
    def banner(self) -> str:  # type: ignore[override]
        return self.describe_sandbox()

    def describe_sandbox(self) -> str:
        """The running configuration, for the banner and ``%sandbox``; or why there is none."""
        limits = self.limits
        if self._settings_error is not None:
            return (
                f"Python {self.runtime.python_version} in a WebAssembly sandbox"
                f" (wasm-kernel {__version__}): not started.\n{self._settings_error}"
            )
        if self._mount_error is not None or self.withheld:
            folders = f"  none: {self._mount_error or self.withheld}"
        else:
            folders = "\n".join(f"  {mount}" for mount in self.granted) or "  none"
        scratch_size = (
            f"up to {limits.scratch_limit >> 20} MiB" if limits.scratch_limit else "no size limit"
        )
        return (
            f"Python {self.runtime.python_version} in a WebAssembly sandbox"
            f" (wasm-kernel {__version__}, runtime {self.runtime.name})\n"
            f"Profile: {self.profile}\n"
            f"Host folders:\n{folders}\n"
            f"  {SCRATCH}: private scratch, deleted when the kernel stops, {scratch_size}\n"
            f"Starting folder: {self.start_dir}\n"
            f"Interpreter: from {self._start.started_from}\n"
            f"Per cell: fuel {limits.fuel:,},"
            f" {f'time {limits.time_limit:.10g} s' if limits.time_limit else 'no time limit'},"
            f" memory {_size(limits.memory_limit)}, output {_size(limits.output_limit)}\n"
            f"Packages: {self.package_set.describe() if self.package_set else 'off'}\n"
            f"Rollback: {self._describe_rollback()}\n"
            "No host environment, network or processes."
        )

    def _describe_rollback(self) -> str:
        """What a trapping cell rolls back to, and how checkpoints are taken (the running
        sandbox's way once it has started: it may have had to fall back to copying)."""
        if not (self.rollback and self.runtime.restorable):
            return "off (a trap restarts the interpreter)"
        if self._boot.done() and self._boot.exception() is None:
            method = self._boot.result().checkpoint_method
            if method is None:
                return "off (a trap restarts the interpreter)"
        else:
            method = checkpoint_method(self.checkpoint_mode)
        return f"to the state after the last cell; checkpoints by {method}"

    # -- execution --------------------------------------------------------------------------------

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: Any = None,
        cell_id: Any = None,
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
        except InvalidSettings as exc:
            return cell.fail(exc.ename, str(exc))
        except Exception as exc:
            return cell.fail("SandboxUnavailable", f"the sandbox could not start: {exc}")
        if self.withheld and not self._withheld_told:
            cell.stream("stderr", f"wasm-kernel: {self.withheld}\n")
            self._withheld_told = True
        if self._start.resume_note:
            cell.stream("stderr", self._start.resume_note)
            self._start.resume_note = ""
        if store_history and not silent:
            self.history.store(self.execution_count, code)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                self._worker,
                partial(sandbox.run_cell, store_history=store_history, silent=silent),
                code,
                self.execution_count,
                cell,
            )
        except CellStopped as stop:
            if stop.recovered:  # the cell's changes stand: keep them
                self._worker.defer(sandbox.checkpoint)
            return cell.fail(stop.ename, stop.evalue)
        if cell.asks_exit():
            self._end_after_reply()
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
        self._worker.defer(sandbox.checkpoint)
        if cell.error:
            return cell.reply()
        expressions = {}
        if user_expressions and isinstance(user_expressions, dict):
            expressions = await self._service(
                declared.EVALUATE_EXPRESSIONS,
                {str(k): str(v) for k, v in user_expressions.items()},
            )
            expressions = cell.active_output.expressions(expressions)  # active-output policy
        return cell.reply(expressions)

    async def _sandbox(self, notify: Any) -> Sandbox:
        return await self._start.wait(self._boot, notify)

    async def _service(self, service: str, *args: Any) -> dict:
        """Run a guest service (completion, inspection...) and return its answer."""
        try:
            sandbox = await self._sandbox(lambda _: None)
        except Exception:  # no sandbox (bad settings or mounts): cells say why; this answers empty
            return {}
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._worker, partial(sandbox.request, service, *args)
            )
        except CellStopped as stop:
            self.log.warning("%s request stopped: %s", service, stop)
            return {}

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

    # Jupyter interrupts (signal mode, or interrupt_request, which ipykernel turns into a
    # SIGINT to this process) reach the sandbox while a handler runs. Signal handlers can
    # only be set on the main thread; subshell handlers run elsewhere and keep the main one's.
    def pre_handler_hook(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._saved_signals = self._interrupt_relay.install()

    def post_handler_hook(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._interrupt_relay.uninstall(self._saved_signals)

    def _interrupt_sandbox(self) -> None:
        if self._boot.done() and not self._boot.exception():
            self._boot.result().interrupt()

    # -- malformed requests -----------------------------------------------------------------

    async def dispatch_shell(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().dispatch_shell(*args, **kwargs)
        finally:
            # The checkpoint once the idle status is on its way (the IOPub thread sends in
            # order): taken earlier, it would hold the thread back, and clients wait for idle.
            if self.iopub_thread is not None:
                self.iopub_thread.schedule(self._worker.run_deferred)
            else:
                self._worker.run_deferred()

    async def execute_request(self, stream: Any, ident: Any, parent: dict) -> None:
        if not self._refuse_malformed(stream, ident, parent, "execute_request"):
            resuming = self.session_images.to_resume(self.resume_from) is not None
            if not self._boot.done() and resuming:
                # a resumed session numbers this cell after its own
                await asyncio.wait([asyncio.wrap_future(self._boot)])
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

    async def complete_request(self, stream: Any, ident: Any, parent: dict) -> None:
        if not self._refuse_malformed(stream, ident, parent, "complete_request"):
            await super().complete_request(stream, ident, parent)

    async def inspect_request(self, stream: Any, ident: Any, parent: dict) -> None:
        if not self._refuse_malformed(stream, ident, parent, "inspect_request"):
            await super().inspect_request(stream, ident, parent)

    async def is_complete_request(self, stream: Any, ident: Any, parent: dict) -> None:
        if not self._refuse_malformed(stream, ident, parent, "is_complete_request"):
            await super().is_complete_request(stream, ident, parent)

    async def comm_info_request(self, stream: Any, ident: Any, parent: dict) -> None:
        if not self._refuse_malformed(stream, ident, parent, "comm_info_request"):
            await super().comm_info_request(stream, ident, parent)

    async def history_request(self, stream: Any, ident: Any, parent: dict) -> None:
        if not self._refuse_malformed(stream, ident, parent, "history_request"):
            await super().history_request(stream, ident, parent)

    def _refuse_malformed(self, stream: Any, ident: Any, parent: dict, msg_type: str) -> bool:
        """Send an error reply when the request's content is not what the protocol says."""
        reply_type, fields = CHECKED_REQUESTS[msg_type]
        problem = malformed(parent, fields)
        if problem is None:
            return False
        reply: dict[str, Any] = {
            "status": "error",
            "ename": "MalformedRequest",
            "evalue": problem,
            "traceback": [],
        }
        if reply_type == "execute_reply":  # the protocol gives every execute_reply a count
            reply["execution_count"] = self.execution_count
        self.live_session.send(stream, reply_type, reply, parent, ident=ident)
        return True

    # -- introspection requests ------------------------------------------------------------

    async def do_complete(self, code: str, cursor_pos: int | None) -> dict:
        code, cursor = clean_request(code, cursor_pos)
        reply = await self._service(declared.COMPLETE, code, cursor)
        types = (reply.get("metadata") or {}).get(COMPLETION_TYPES)
        return {
            "status": "ok",
            "matches": [m for m in reply.get("matches", []) if isinstance(m, str)],
            "cursor_start": clamp(reply.get("cursor_start"), cursor, len(code)),
            "cursor_end": clamp(reply.get("cursor_end"), cursor, len(code)),
            "metadata": {COMPLETION_TYPES: completion_types(types, len(code))},
        }

    async def do_inspect(
        self, code: str, cursor_pos: int | None, detail_level: int = 0, omit_sections: Any = ()
    ) -> dict:
        code, cursor = clean_request(code, cursor_pos)
        omit = [str(name) for name in omit_sections] if isinstance(omit_sections, list) else []
        reply = await self._service(declared.INSPECT, code, cursor, 1 if detail_level else 0, omit)
        data = reply.get("data") if isinstance(reply.get("data"), dict) else {}
        data = ActiveOutput(self.active_output).inspect(data)  # active-output policy
        return {"status": "ok", "found": bool(reply.get("found")), "data": data, "metadata": {}}

    async def do_is_complete(self, code: str) -> dict:
        code, _ = clean_request(code, 0)
        reply = await self._service(declared.IS_COMPLETE, code)
        status = reply.get("status")
        if status not in ("complete", "incomplete", "invalid"):
            return {"status": "unknown"}
        result = {"status": status}
        if status == "incomplete":
            result["indent"] = str(reply.get("indent", ""))
        return result

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
        try:
            if hist_access_type == "tail":
                entries = self.history.tail(bounded(n, 10), bool(unique))
            elif hist_access_type == "range":
                stop_line = None if stop is None else bounded(stop, 0)
                entries = self.history.range(bounded(session, 0), bounded(start, 0), stop_line)
            elif hist_access_type == "search":
                entries = self.history.search(
                    str(pattern or "*"), bounded(n, 0) or None, bool(unique)
                )
            else:
                entries = []
        except (TypeError, ValueError) as exc:
            return {
                "status": "error",
                "ename": "MalformedRequest",
                "evalue": str(exc),
                "traceback": [],
            }
        if output:
            return {"status": "ok", "history": [(s, n_, (src, None)) for s, n_, src in entries]}
        return {"status": "ok", "history": entries}

    def _end_after_reply(self) -> None:
        """exit() or quit() in a cell: as ipykernel does, the kernel process ends just after
        the cell's reply is sent. The user ended the session, so it does not hibernate."""

        async def end() -> None:
            await asyncio.sleep(0.1)  # ipykernel's delay: the reply is sent meanwhile
            await self._close(hibernate=False)
            self.io_loop.add_callback(self.io_loop.stop)

        self._ending = asyncio.ensure_future(end())

    async def do_shutdown(self, restart: bool) -> dict:
        await self._close(hibernate=not restart)
        return {"status": "ok", "restart": restart}

    async def _close(self, hibernate: bool) -> None:
        if self._closed:  # exit() and a shutdown request, both
            return
        self._closed = True
        if self._boot.done() and not self._boot.exception():
            sandbox = self._boot.result()
            if hibernate:
                count = self.execution_count
                save = partial(self.session_images.hibernate, sandbox, count)
                hibernation = asyncio.wrap_future(self._worker.submit(save))
                done, _ = await asyncio.wait([hibernation], timeout=HIBERNATE_SECONDS)
                if not done:
                    self.log.warning("a cell was still running: this session did not hibernate")
            sandbox.close()
            sandbox.compiled.close()
        self._worker.shutdown(wait=False, cancel_futures=True)
        self.history.close()
        if self.package_set is not None:
            self.package_set.close()


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count % (1 << 20) == 0 else f"{count:,} bytes"
