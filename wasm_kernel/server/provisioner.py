"""The kernel provisioner that obtains ready kernels from the kernel server.

Registered under ``jupyter_client.kernel_provisioners`` as ``wasm-kernel`` and named in the
kernelspecs ``install`` writes, so JupyterLab, nbclient, papermill and nbgrader get kernels
forked by the per-user server (``kernel_server``) with no change on their side. Everything but
the launch is jupyter_client's local provisioner: ports, connection file, CurveZMQ keys,
signals to the kernel's process group, restart, shutdown and kill.

The server is started on first use, in the background: that first kernel is launched the
ordinary way while the server loads, and later ones are forked by it. Any failure to reach the
server (none yet, a refusal, a dead one, ``WASM_KERNEL_SERVER=off``) falls back to the
ordinary launch with one log line, never to a failed start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.provisioning import LocalProvisioner

from . import kernel_server

SERVER_SWITCH = "WASM_KERNEL_SERVER"  # "off": every kernel is launched the ordinary way
CONNECT_SECONDS = 2.0
ANSWER_LIMIT = 4096
STARTED_SECONDS = 10.0  # at most this long for a served kernel to say it has started
ENDING_WATCH = 0.1  # seconds a poll during a requested shutdown waits for the kernel's end
TOLD_SECONDS = 1.0  # how long a gone kernel's status may take to arrive from the server
UNKNOWN_STATUS = -1  # a kernel gone while no server was left to say how it ended


class ServedKernel:
    """A forked kernel as jupyter_client's local provisioner handles its Popen: the server
    tells its exit status on ``connection``; ``lifeline`` ends it if this process dies."""

    def __init__(self, pid: int, connection: socket.socket, lifeline: socket.socket):
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        self._connection = connection
        self._lifeline = lifeline
        self._process = psutil.Process(pid)  # its start time guards against pid reuse
        self.started = False  # whether the kernel said it has started

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._told_exit(0)
            if self.returncode is None and not self._running():
                # gone: the server tells the status once it has reaped it; a dead server
                # (the connection at its end) cannot, and then the status is unknown
                self.returncode = self._told_exit(TOLD_SECONDS)
                if self.returncode is None:
                    self.returncode = UNKNOWN_STATUS
            if self.returncode is not None:
                self._close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (status := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["wasm-kernel"], timeout or 0)
            select.select([self._connection], [], [], 0.05)
        return status

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    async def until_started(self) -> None:
        """Return once the kernel says it has started (or has ended, or after
        STARTED_SECONDS; see ``lifeline.tell_started``): its clients' first connection
        then succeeds, instead of waiting out ZMQ's reconnect interval."""
        self._lifeline.setblocking(False)
        with contextlib.suppress(OSError, TimeoutError):
            told = asyncio.get_running_loop().sock_recv(self._lifeline, 1)
            self.started = await asyncio.wait_for(told, STARTED_SECONDS) == b"\n"

    async def ended(self, seconds: float) -> None:
        """Return once the server has said something of this kernel (its exit is all it
        says), or after ``seconds``."""
        loop = asyncio.get_running_loop()
        told = loop.create_future()

        def readable() -> None:
            if not told.done():
                told.set_result(None)

        loop.add_reader(self._connection, readable)
        try:
            await asyncio.wait_for(told, seconds)
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(self._connection)

    def _told_exit(self, seconds: float) -> int | None:
        """The exit status the server sent, waiting up to ``seconds`` for it."""
        if not select.select([self._connection], [], [], seconds)[0]:
            return None
        try:
            answer = self._connection.recv(ANSWER_LIMIT)
        except OSError:
            return None
        for line in answer.splitlines():
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                told = json.loads(line).get("exit")
                if isinstance(told, int):
                    return told
        return None

    def _running(self) -> bool:
        try:
            return self._process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def _close(self) -> None:
        self._connection.close()
        self._lifeline.close()


class WasmKernelProvisioner(LocalProvisioner):
    """jupyter_client's local provisioner, launching through the kernel server."""

    _ending = False  # a shutdown was requested of the present kernel

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        self._ending = False
        served = None
        if os.environ.get(SERVER_SWITCH, "").lower() != "off":
            try:
                served = self._from_server(cmd, kwargs)
            except (OSError, kernel_server.Refused, ValueError, psutil.Error) as exc:
                # the kernel starts as well either way: for operators (--debug), not users
                self.log.debug("wasm-kernel: launching without the kernel server (%s)", exc)
        if served is None:
            return await super().launch_kernel(cmd, **kwargs)
        self.process = served  # type: ignore[assignment]  # Popen's interface, see ServedKernel
        self.pid = self.pgid = served.pid  # the kernel leads its own session and group
        self.cwd = kwargs.get("cwd") or os.getcwd()
        await served.until_started()
        return self.connection_info

    async def shutdown_requested(self, restart: bool = False) -> None:
        await super().shutdown_requested(restart)
        self._ending = True

    async def poll(self) -> int | None:
        """Also waits a moment for a served kernel that was asked to shut down: jupyter_client
        polls such a kernel every 100 ms, so one that ends 30 ms after the request was seen
        ended 100 ms after it; the server tells a served kernel's end as it happens."""
        status = await super().poll()
        if status is None and self._ending and isinstance(self.process, ServedKernel):
            await self.process.ended(ENDING_WATCH)
            status = await super().poll()
        return status

    def _from_server(self, cmd: list[str], kwargs: dict[str, Any]) -> ServedKernel | None:
        kernel_server.kernel_arguments(cmd)  # another command (a wrapper): launched as it is
        fingerprint = kernel_server.code_fingerprint(cmd[0])
        folder = kernel_server.private_folder(kernel_server.runtime_folder(fingerprint))
        path = kernel_server.socket_path(folder)
        connection = _connect(path)
        if connection is None:
            _start_server(cmd[0], folder, path)
            raise kernel_server.Refused("the kernel server is starting")
        ours, theirs = socket.socketpair()
        with connection, theirs, open(os.devnull, "rb") as nothing:
            # Popen's defaults: no stdin (ours: nothing), this process's stdout and stderr
            defaults = {"stdin": nothing.fileno(), "stdout": 1, "stderr": 2}
            streams = [_descriptor(kwargs.get(name), fd) for name, fd in defaults.items()]
            request = {
                "argv": list(cmd),
                "env": dict(kwargs.get("env") or os.environ),
                "cwd": str(kwargs.get("cwd") or os.getcwd()),
            }
            socket.send_fds(connection, [json.dumps(request).encode()], [*streams, theirs.fileno()])
            connection.settimeout(30)
            answer = json.loads(connection.makefile("rb").readline(ANSWER_LIMIT) or b"{}")
            if "pid" not in answer:
                ours.close()
                raise kernel_server.Refused(answer.get("refused", "no answer"))
            return ServedKernel(int(answer["pid"]), connection.dup(), ours)


def _descriptor(stream: Any, default: int) -> int:
    """The descriptor to give the kernel for one of Popen's stream arguments; a pipe the
    caller wants to read cannot cross, so that launch goes the ordinary way."""
    if stream is None:
        return default
    if isinstance(stream, int) and stream >= 0:
        return stream
    if hasattr(stream, "fileno"):
        return int(stream.fileno())
    raise kernel_server.Refused("the caller reads the kernel's streams through a pipe")


def _connect(path: Path) -> socket.socket | None:
    """A connection to a live server at ``path``, or None when none answers there."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(CONNECT_SECONDS)
    try:
        connection.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        connection.close()
        return None
    if kernel_server.peer_uid(connection) != os.getuid():
        connection.close()
        raise kernel_server.Refused("the kernel server's socket belongs to another user")
    return connection


def _start_server(python: str, folder: Path, path: Path) -> None:
    """Start the server in the background, in its own session, logging to its folder."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
    log = os.open(folder / kernel_server.LOG_NAME, flags, 0o600)
    try:
        subprocess.Popen(
            [python, "-P", "-m", "wasm_kernel.server.kernel_server", str(folder), str(path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(log)
