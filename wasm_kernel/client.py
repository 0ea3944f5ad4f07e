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

import functools
import json
import os
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from jupyter_client.manager import KernelManager
from jupyter_core.utils import ensure_async, run_sync

from .agents import client_code
from .agents.client_code import SessionError
from .agents.client_connection import FILE_OP_TIMEOUT, KernelConnection, raise_for
from .agents.execution import Callback, Execution
from .agents.tools import ToolDeclarationError, tools_of
from .jupyter.kernelspecs import KERNEL_NAME, kernelspec_name
from .sandbox.limits import DEFAULT_GRACE
from .settings.profiles import DEFAULT_PROFILE, PROFILES

UPLOAD_CHUNK = 512 << 10  # raw bytes per upload cell (~0.7 MB of source)
DOWNLOAD_CHUNK = 1 << 20  # raw bytes per download request
DOWNLOAD_LIMIT = 256 << 20  # default largest file ``download`` accepts
START_TIMEOUT = 120.0  # seconds for a kernel to start (a first compile is reported, not awaited)
RESUMING = ("resume_from", "resume_wait")  # settings a restart leaves out: it starts fresh
PIP_TIMEOUT = 600.0  # seconds for an install (downloads, and the kernel's own pip limits)

S = TypeVar("S", bound=KernelConnection)
P = ParamSpec("P")
T = TypeVar("T")


def kernel_arguments(profile: str, settings: dict[str, Any]) -> list[str]:
    """``--WasmKernel.NAME=VALUE`` for each setting. Names are checked here (a misspelt limit
    would otherwise leave the profile's default in force unnoticed); values by the kernel."""
    from .settings.kernel_settings import setting_names

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


class _Session(KernelConnection):
    """One kernel and its client. Each operation is a coroutine written once, here or in
    ``KernelConnection``: ``AsyncSession`` awaits it and ``Session`` runs it to its end
    (``_blocking``), the way nbclient derives its blocking API."""

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
        self._tool_server = None
        self._unchecked = []
        self._launch = {"extra_arguments": kernel_arguments(profile, self.settings)}
        fresh = {name: value for name, value in self.settings.items() if name not in RESUMING}
        self._restart = {"extra_arguments": kernel_arguments(profile, fresh)}
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

    def _forked(self, image: str) -> Self:
        """A session like this one (same class, profile, settings), resuming from ``image``,
        which it waits for while this one writes it."""
        settings = {**self.settings, "resume_from": image, "resume_wait": FILE_OP_TIMEOUT}
        return type(self)(self.profile, **self._options, **settings)

    def _file_reply_limit(self, length: int) -> int:
        return 4 * length // 3 + 64

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
        await self._check_earlier()
        msg_id = self._execute(code)
        try:
            return await self._collect(msg_id, timeout, on_stdout, on_stderr, on_result)
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
            raise_for(reply, f"cannot write {guest_path}")

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
        """A fresh interpreter and an empty /tmp: the kernel is restarted with its settings,
        less the image it resumed (a fork's, or ``resume_from``)."""
        await self._check_earlier()
        self.client.stop_channels()
        await ensure_async(self.manager.restart_kernel(now=False, **self._restart))
        await self._connect()

    async def _snapshot(self, name: str) -> None:
        """Save this session's image as ``name`` (the kernel's ``%snapshot save``; the
        ``snapshots`` setting must allow it, and the strict profile has it off)."""
        raise_for(await self._request(client_code.snapshot_code("save", name)), "snapshot failed")

    async def _restore(self, name: str) -> None:
        """Bring this session back to the image saved as ``name``."""
        raise_for(await self._request(client_code.snapshot_code("restore", name)), "restore failed")

    async def _fork(self, name: str | None = None) -> Self:
        """A new, started session that resumes from an image of this one, saved as ``name``
        (kept), or under a name of its own that is deleted once the fork has started: a
        fork image, whose memory the new kernel maps from this one's, copy-on-write.

        The new kernel's process starts while this kernel writes the image, and its sandbox
        waits for the image (``resume_wait``); if the image fails, that kernel is killed. The
        deletion's reply is not waited for here (the fork is ready without it) but before
        this session's next request, which raises if it failed."""
        image, own = (name, False) if name is not None else (f"fork-{uuid.uuid4().hex[:16]}", True)
        await self._check_earlier()
        code = client_code.snapshot_code("fork" if own else "save", image)
        msg_id = self._execute(code, silent=True, store_history=False)
        forked = self._forked(image)
        try:
            await forked._start_process()
            raise_for(await self._silent_reply(msg_id), "fork failed" if own else "snapshot failed")
        except BaseException:
            if forked.started and forked.manager.has_kernel:  # it waits for an image in vain
                await ensure_async(forked.manager.shutdown_kernel(now=True))
            raise
        try:
            await forked._until_started()
        finally:
            if own:
                code = client_code.snapshot_code("delete", image)
                msg_id = self._execute(code, silent=True, store_history=False)
                self._unchecked.append((msg_id, "delete failed"))
        return forked

    async def _install(self, *requirements: str) -> None:
        """Install packages into this session (the kernel's ``%pip install``, from the
        index or wheelhouse its ``packages`` setting names; off in the strict profile)."""
        reply = await self._request(client_code.install_code(requirements), timeout=PIP_TIMEOUT)
        raise_for(reply, "install failed")


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
