"""Run Python in the sandbox from a program: the interface agents and graders call.

A ``Session`` is one wasm-kernel in its own process, started by jupyter_client from the
installed kernelspec of a profile (``wasm-python`` or ``wasm-python-strict``), with settings
passed as ``--WasmKernel.NAME=VALUE`` arguments that the kernel validates itself. ``run``
returns an ``Execution`` instead of a stream of Jupyter messages; a timeout interrupts the
cell and the session goes on. Files move in and out through the kernel (silent cells and
``user_expressions``, base64 in bounded chunks), so the client never guesses host paths.
``snapshot``, ``restore`` and ``install`` are the kernel's own ``%snapshot`` and ``%pip``, sent
as silent cells; ``fork`` starts a second session that resumes from an image of this one.
``AsyncSession`` is the same for asyncio code: each operation is one coroutine, which
``AsyncSession`` awaits and ``Session`` runs to its end with jupyter_core's ``run_sync``.
``tools``: functions the session's cells may call (``from sandbox_tools import NAME``); they
run here, in the client's process, served by ``tool_server``.

Everything the kernel sends back is the guest's: it is parsed as data (``client_code``), never
trusted.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import queue
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from jupyter_client.manager import AsyncKernelManager, KernelManager
from jupyter_core.utils import ensure_async, run_sync

from . import client_code
from .client_code import SessionError
from .execution import Callback, Collector, Execution, ExecutionError
from .images import NOT_RESUMED
from .kernelspecs import KERNEL_NAME, kernelspec_name
from .limits import DEFAULT_GRACE
from .profiles import DEFAULT_PROFILE, PROFILES
from .tool_server import ToolServer
from .tools import ToolDeclarationError, tools_of

UPLOAD_CHUNK = 512 << 10  # raw bytes per upload cell (~0.7 MB of source)
DOWNLOAD_CHUNK = 1 << 20  # raw bytes per download request
DOWNLOAD_LIMIT = 256 << 20  # default largest file ``download`` accepts
START_TIMEOUT = 120.0  # seconds for a kernel to start (a first compile is reported, not awaited)
STOP_MARGIN = 10.0  # seconds past interrupt_grace that an interrupted cell may take to end
POLL = 1.0  # seconds between liveness checks while waiting for a cell
READY_POLL = 0.02  # seconds to wait for IOPub after each kernel_info_reply while connecting
FILE_OP_TIMEOUT = 60.0  # seconds for one chunk of a file transfer
PIP_TIMEOUT = 600.0  # seconds for an install (downloads, and the kernel's own pip limits)

S = TypeVar("S", bound="_Session")
P = ParamSpec("P")
T = TypeVar("T")


def kernel_arguments(profile: str, settings: dict[str, Any]) -> list[str]:
    """``--WasmKernel.NAME=VALUE`` for each setting. Names are checked here (a misspelt limit
    would otherwise leave the profile's default in force unnoticed); values by the kernel."""
    from .kernel_settings import setting_names

    known = set(setting_names())
    arguments = []
    for name, value in settings.items():
        if name not in known or name == "profile":
            names = ", ".join(sorted(known - {"profile"}))
            raise SessionError(f"unknown setting {name!r}; the settings are: {names}")
        if name == "mounts":
            if not PROFILES[profile].mounts:
                raise SessionError(
                    f"the {profile} profile grants no host folder (its kernelspec pins"
                    " an empty mount list); use profile='notebook' to mount folders"
                )
            if isinstance(value, str):
                value = [value]
            value = json.dumps([str(spec) for spec in value])
        elif isinstance(value, (list, tuple)):  # network_allow: one list literal
            value = json.dumps([str(item) for item in value])
        arguments.append(f"--WasmKernel.{name}={value}")
    return arguments


class _Session:
    """One kernel and its client. Each operation is a coroutine written once, here:
    ``AsyncSession`` awaits it and ``Session`` runs it to its end (``_blocking``), the way
    nbclient derives its blocking API. Manager and client calls go through ``ensure_async``,
    as nbclient's do, so the blocking manager and client that ``Session`` keeps serve too."""

    manager_class: type[KernelManager] = AsyncKernelManager

    def __init__(
        self,
        profile: str = DEFAULT_PROFILE,
        *,
        kernel_name: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        startup_timeout: float = START_TIMEOUT,
        kernel_stdout: int | None = None,
        tools: Any = None,
        **settings: Any,
    ):
        if profile not in PROFILES:
            raise SessionError(f"unknown profile {profile!r}; choose {' or '.join(PROFILES)}")
        self.profile = profile
        self.kernel_name = kernel_name or kernelspec_name(PROFILES[profile], KERNEL_NAME)
        self.settings = dict(settings)
        try:  # callables, HostTools, or a mapping name -> either
            self.tools = tools_of(tools)
        except ToolDeclarationError as exc:
            raise SessionError(str(exc)) from None
        self._tool_server: ToolServer | None = None
        self._launch: dict[str, Any] = {"extra_arguments": kernel_arguments(profile, self.settings)}
        if cwd is not None:
            self._launch["cwd"] = str(cwd)
        if env is not None:
            self._launch["env"] = {**os.environ, **env}
        if kernel_stdout is not None:  # e.g. DEVNULL when our own stdout carries a protocol
            self._launch["stdout"] = kernel_stdout
        self.startup_timeout = startup_timeout
        self.grace = float(settings.get("interrupt_grace", DEFAULT_GRACE))
        self._options: dict[str, Any] = {
            "kernel_name": kernel_name,
            "cwd": cwd,
            "env": env,
            "startup_timeout": startup_timeout,
            "kernel_stdout": kernel_stdout,
            "tools": self.tools,
        }

    @property
    def started(self) -> bool:
        return getattr(self, "manager", None) is not None

    def _forked(self, image: str) -> Self:
        """A session like this one (same class, profile, settings), resuming from ``image``."""
        settings = {**self.settings, "resume_from": image}
        return type(self)(self.profile, **self._options, **settings)

    def _file_reply_limit(self, length: int) -> int:
        return 4 * length // 3 + 64

    async def _start(self) -> None:
        """Start the kernel and wait for its sandbox; a session asked to resume an image fails
        if its kernel could not, and started afresh (a restart later starts as it can)."""
        self.manager = self.manager_class(kernel_name=self.kernel_name)
        await ensure_async(self.manager.start_kernel(**self._launch))
        await self._connect()
        if self.settings.get("resume_from"):
            try:
                await self._check_resumed()
            except BaseException:
                await self._close()
                raise

    async def _connect(self) -> None:
        """Open the channels and wait for a silent empty cell, which fails on refused settings."""
        self.client = self.manager.client()
        self.client.start_channels(stdin=not self.tools)  # with tools, the server's
        self._serve_tools()
        try:
            await self._until_connected()
            reply = await self._request("", timeout=self.startup_timeout)
            content = reply.get("content") or {}
            if content.get("status") != "ok":
                raise SessionError(f"{content.get('ename')}: {content.get('evalue')}")
        except BaseException:
            await self._close()
            raise

    async def _until_connected(self) -> None:
        """Wait until the kernel answers and its IOPub reaches this client, as jupyter_client's
        ``wait_for_ready`` does, asking again after READY_POLL seconds rather than its 0.2 s
        (a subscription not yet in place misses the first status messages)."""
        end = time.monotonic() + self.startup_timeout
        while True:
            reply = await self._kernel_info(end)
            try:
                await ensure_async(self.client.get_iopub_msg(timeout=READY_POLL))
            except queue.Empty:
                if not await ensure_async(self.manager.is_alive()):
                    raise SessionError("the kernel ended while starting") from None
                _left(end)
                continue
            self.client._handle_kernel_info_reply(reply)
            return

    async def _check_resumed(self) -> None:
        """Raise if the kernel says, in its banner (final once a cell has run), that it could
        not resume the image it was asked to."""
        reply = await self._kernel_info(time.monotonic() + self.startup_timeout)
        for line in str(reply["content"].get("banner", "")).splitlines():
            if NOT_RESUMED in line:
                raise SessionError(line[line.index(NOT_RESUMED) :].removesuffix(")"))

    async def _kernel_info(self, end: float) -> dict:
        msg_id = self.client.kernel_info()
        reply = await _within(self.client.get_shell_msg, end)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = await _within(self.client.get_shell_msg, end)
        return reply

    def _serve_tools(self) -> None:
        """A tool server for this connection (its own stdin socket: the client's is off)."""
        if self._tool_server is not None:
            self._tool_server.close()
            self._tool_server = None
        if self.tools:
            loop = asyncio.get_running_loop() if self.manager_class is AsyncKernelManager else None
            self._tool_server = ToolServer(self.client, self.tools, loop)

    def _execute(self, code: str, **options: Any) -> str:
        """Send an execute_request; with tools, declared in its metadata and served."""
        if self._tool_server is None:
            return self.client.execute(code, allow_stdin=False, **options)
        content = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
            **options,
        }
        message = self.client.session.msg(
            "execute_request", content, metadata=self._tool_server.metadata()
        )
        msg_id: str = message["header"]["msg_id"]
        self._tool_server.begin(msg_id)
        self.client.shell_channel.send(message)
        return msg_id

    def _executed(self, msg_id: str) -> None:
        if self._tool_server is not None:
            self._tool_server.end(msg_id)

    async def _close(self) -> None:
        """Shut the kernel down."""
        if self._tool_server is not None:
            self._tool_server.close()
            self._tool_server = None
        client = getattr(self, "client", None)
        if client is not None:
            client.stop_channels()
        manager = getattr(self, "manager", None)
        if manager is not None and manager.has_kernel:
            await ensure_async(manager.shutdown_kernel(now=False))

    async def _run(
        self,
        code: str,
        timeout: float | None = None,
        on_stdout: Callback | None = None,
        on_stderr: Callback | None = None,
        on_result: Callback | None = None,
    ) -> Execution:
        """Run ``code`` as a notebook cell. After ``timeout`` seconds the cell is interrupted
        (KeyboardInterrupt inside it; stopped hard and rolled back if it ignores that) and
        the Execution says ``timed_out``; the session stays usable."""
        msg_id = self._execute(code)
        try:
            return await self._collect(msg_id, timeout, on_stdout, on_stderr, on_result)
        finally:
            self._executed(msg_id)

    async def _collect(
        self,
        msg_id: str,
        timeout: float | None,
        on_stdout: Callback | None,
        on_stderr: Callback | None,
        on_result: Callback | None,
    ) -> Execution:
        collector = Collector(msg_id, on_stdout, on_stderr, on_result)
        deadline = None if timeout is None else collector.started + timeout
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                if collector.execution.timed_out:
                    return await self._restart_after_stuck(collector)
                collector.execution.timed_out = True
                await ensure_async(self.manager.interrupt_kernel())
                deadline = now + self.grace + STOP_MARGIN
            wait = POLL if deadline is None else max(min(POLL, deadline - now), 0.01)
            try:
                message = await ensure_async(self.client.get_iopub_msg(timeout=wait))
            except queue.Empty:
                if not await ensure_async(self.manager.is_alive()):
                    raise SessionError("the kernel process ended") from None
                continue
            if collector.feed(message):
                break
        return collector.finish(await self._reply(msg_id, STOP_MARGIN))

    async def _restart_after_stuck(self, collector: Collector) -> Execution:
        """The kernel did not end an interrupted cell (it cannot happen unless the kernel is
        broken): start it again so that the session stays usable, and say what was lost."""
        await ensure_async(self.manager.restart_kernel(now=True))
        self.client.stop_channels()
        await self._connect()
        execution = collector.finish(None)
        execution.error = ExecutionError(
            "KernelRestarted",
            "the cell did not stop after its timeout and the kernel was restarted: names from"
            " earlier cells are gone.",
            "",
        )
        return execution

    async def _reply(self, msg_id: str, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while True:
            message = await _within(self.client.get_shell_msg, end)
            if message.get("parent_header", {}).get("msg_id") == msg_id:
                return message

    async def _request(
        self,
        code: str,
        user_expressions: dict[str, str] | None = None,
        timeout: float = FILE_OP_TIMEOUT,
    ) -> dict:
        """A silent request (no history, no execution count, no output); its shell reply."""
        msg_id = self._execute(
            code, silent=True, store_history=False, user_expressions=user_expressions or {}
        )
        try:
            collector = Collector(msg_id, None, None, None)
            end = time.monotonic() + timeout
            while not collector.feed(await _within(self.client.get_iopub_msg, end)):
                pass
            return await self._reply(msg_id, _left(end))
        finally:
            self._executed(msg_id)

    async def _upload(self, guest_path: str, data: bytes) -> None:
        """Write ``data`` to ``guest_path`` in the guest (in /tmp or a writable mount)."""
        guest_path = client_code.check_path(guest_path)
        data = bytes(data)
        for offset in range(0, max(len(data), 1), UPLOAD_CHUNK):
            chunk = data[offset : offset + UPLOAD_CHUNK]
            reply = await self._request(
                client_code.write_code(guest_path, chunk, append=offset > 0)
            )
            _raise_for(reply, f"cannot write {guest_path}")

    async def _download(self, guest_path: str, limit: int = DOWNLOAD_LIMIT) -> bytes:
        """The contents of ``guest_path`` in the guest; refuses files larger than ``limit``."""
        guest_path = client_code.check_path(guest_path)
        size = int(await self._expression(client_code.size_expression(guest_path), 32))
        if size > limit:
            raise SessionError(f"{guest_path} has {size:,} bytes, more than the limit {limit:,}")
        parts = []
        for offset in range(0, size, DOWNLOAD_CHUNK):
            length = min(DOWNLOAD_CHUNK, size - offset)
            text = await self._expression(
                client_code.read_expression(guest_path, offset, length),
                self._file_reply_limit(length),
            )
            parts.append(client_code.decoded(text, length))
        return b"".join(parts)

    async def _files(self, guest_path: str = "/tmp") -> list[dict[str, Any]]:
        """The entries of a guest folder: name, is_dir, size (bytes; 0 for folders)."""
        guest_path = client_code.check_path(guest_path)
        return client_code.entries(
            await self._expression(client_code.list_expression(guest_path), 16 << 20)
        )

    async def _expression(self, expression: str, limit: int) -> str:
        reply = await self._request("", user_expressions={"value": expression})
        return client_code.literal_string(reply, "value", limit)

    async def _reset(self) -> None:
        """A fresh interpreter and an empty /tmp: the kernel is restarted with its settings."""
        self.client.stop_channels()
        await ensure_async(self.manager.restart_kernel(now=False))
        await self._connect()

    async def _snapshot(self, name: str) -> None:
        """Save this session's image as ``name`` (the kernel's ``%snapshot save``; the
        ``snapshots`` setting must allow it, and the strict profile has it off)."""
        _raise_for(await self._request(client_code.snapshot_code("save", name)), "snapshot failed")

    async def _restore(self, name: str) -> None:
        """Bring this session back to the image saved as ``name``."""
        _raise_for(
            await self._request(client_code.snapshot_code("restore", name)), "restore failed"
        )

    async def _fork(self, name: str | None = None) -> Self:
        """A new, started session that resumes from an image of this one, saved as ``name``
        (kept), or under a name of its own that is deleted once the fork has started: a
        fork image, whose memory the new kernel maps from this one's, copy-on-write."""
        image, own = (name, False) if name is not None else (f"fork-{uuid.uuid4().hex[:16]}", True)
        if own:
            code = client_code.snapshot_code("fork", image)
            _raise_for(await self._request(code), "fork failed")
        else:
            await self._snapshot(image)
        try:
            forked = self._forked(image)
            await forked._start()
        finally:
            if own:
                reply = await self._request(client_code.snapshot_code("delete", image))
                _raise_for(reply, "delete failed")
        return forked

    async def _install(self, *requirements: str) -> None:
        """Install packages into this session (the kernel's ``%pip install``, from the
        index or wheelhouse its ``packages`` setting names; off in the strict profile)."""
        reply = await self._request(client_code.install_code(requirements), timeout=PIP_TIMEOUT)
        _raise_for(reply, "install failed")


class AsyncSession(_Session):
    """``Session`` for asyncio code: ``async with AsyncSession(...)``, ``await s.run(code)``,
    ``await s.upload(...)``; the same arguments, results and errors."""

    async def __aenter__(self) -> Self:
        if not self.started:  # a fork comes started
            await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    start = _Session._start
    close = _Session._close
    run = _Session._run
    upload = _Session._upload
    download = _Session._download
    files = _Session._files
    reset = _Session._reset
    snapshot = _Session._snapshot
    restore = _Session._restore
    fork = _Session._fork
    install = _Session._install


def _blocking(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], T]:
    """``method`` run to its end by jupyter_core's run_sync, as nbclient makes its blocking
    API: on an event loop of the calling thread, or of a helper thread when this one runs a
    loop already (a Jupyter cell). Name, signature and docstring are the coroutine's."""
    return functools.wraps(method)(run_sync(method))


class Session(_Session):
    """One sandboxed kernel in its own process; use it as a context manager.

    ``Session(profile="strict", time_limit=10, memory_limit=256 << 20)`` starts the installed
    ``wasm-python-strict`` kernelspec with those settings; the kernel refuses values outside
    their ranges, and the session then fails to start with the kernel's explanation.
    """

    # Blocking, as before: ``manager`` stays callable without a loop, and the client's plain
    # zmq sockets serve any thread. Asynchronous sockets used once from run_sync's helper
    # thread (a call from a Jupyter cell) stay watched by its loop and race for messages.
    manager_class = KernelManager

    def __enter__(self) -> Self:
        if not self.started:  # a fork comes started
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    start = _blocking(_Session._start)
    close = _blocking(_Session._close)
    run = _blocking(_Session._run)
    upload = _blocking(_Session._upload)
    download = _blocking(_Session._download)
    files = _blocking(_Session._files)
    reset = _blocking(_Session._reset)
    snapshot = _blocking(_Session._snapshot)
    restore = _blocking(_Session._restore)
    fork = _blocking(_Session._fork)
    install = _blocking(_Session._install)


def _left(end: float) -> float:
    left = end - time.monotonic()
    if left <= 0:
        raise SessionError("the kernel did not answer in time")
    return left


async def _within(receive: Callable[..., Any], end: float) -> dict:
    """One message from a channel before ``end``, or SessionError."""
    try:
        return await ensure_async(receive(timeout=_left(end)))
    except queue.Empty:
        raise SessionError("the kernel did not answer in time") from None


def _raise_for(reply: dict, what: str) -> None:
    content = reply.get("content") or {}
    if content.get("status") != "ok":
        raise SessionError(f"{what}: {content.get('ename')}: {content.get('evalue')}")
