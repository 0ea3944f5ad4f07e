"""A session's kernel and the messages it exchanges with it: start, connect, requests and
their replies, a cell's IOPub messages gathered into an ``Execution``, shutdown.

``client`` builds the session's operations (files, images, packages) on this. Each method is
a coroutine; manager and client calls go through ``ensure_async``, as nbclient's do, so that
the blocking manager and client a ``Session`` keeps serve too.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Callable
from typing import Any

from jupyter_client.manager import AsyncKernelManager, KernelManager
from jupyter_core.utils import ensure_async

from ..images.names import NOT_RESUMED, RUNNING_FROM
from .client_code import SessionError
from .execution import Callback, Collector, Execution, ExecutionError
from .tool_server import ToolServer
from .tools import HostTool

STOP_MARGIN = 10.0  # seconds past interrupt_grace that an interrupted cell may take to end
POLL = 1.0  # seconds between liveness checks while waiting for a cell
READY_POLL = 0.02  # seconds to wait for IOPub after each kernel_info_reply while connecting
FILE_OP_TIMEOUT = 60.0  # seconds for one chunk of a file transfer

log = logging.getLogger(__name__)


class KernelConnection:
    """One kernel and its client; what a session holds is set by the session (``client``)."""

    manager_class: type[KernelManager] = AsyncKernelManager
    manager: KernelManager
    client: Any  # the manager's client (blocking or asynchronous, as the manager)
    kernel_name: str
    settings: dict[str, Any]
    tools: dict[str, HostTool]  # name -> the function cells may call
    startup_timeout: float
    grace: float  # seconds an interrupted cell has to end (the kernel's interrupt_grace)
    _launch: dict[str, Any]  # start_kernel's arguments
    _restart: dict[str, Any]  # restart_kernel's: a fresh interpreter, resuming no image
    _tool_server: ToolServer | None
    # requests whose replies nothing has waited for yet (a fork image's deletion), each
    # with what its failure is called: checked before this session's next request
    _unchecked: list[tuple[str, str]]

    @property
    def started(self) -> bool:
        return getattr(self, "manager", None) is not None

    async def _start(self) -> None:
        """Start the kernel and wait for its sandbox."""
        await self._start_process()
        await self._until_started()

    async def _start_process(self) -> None:
        """Start the kernel's process, not waiting for its sandbox."""
        self.manager = self.manager_class(kernel_name=self.kernel_name)
        await ensure_async(self.manager.start_kernel(**self._launch))

    async def _until_started(self) -> None:
        """Connect to the started process and wait for its sandbox; a session asked to resume
        an image fails if its kernel could not, and started afresh."""
        ready = await self._connect()
        if self.settings.get("resume_from"):
            try:
                await self._check_resumed(ready)
            except BaseException:
                await self._close()
                raise

    async def _connect(self) -> dict:
        """Open the channels and wait until the interpreter runs: its banner says so, or else
        a silent empty cell waits for it and fails on refused settings or a failed start;
        returns the kernel_info_reply that found the kernel ready."""
        self.client = self.manager.client()
        self.client.start_channels(stdin=not self.tools)  # with tools, the server's
        self._serve_tools()
        try:
            ready = await self._until_connected()
            if not _running(ready):
                reply = await self._request("", timeout=self.startup_timeout)
                content = reply.get("content") or {}
                if content.get("status") != "ok":
                    raise SessionError(f"{content.get('ename')}: {content.get('evalue')}")
        except BaseException:
            await self._close()
            raise
        return ready

    async def _until_connected(self) -> dict:
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
            return reply

    async def _check_resumed(self, ready: dict) -> None:
        """Raise if the kernel says, in its banner, that it could not resume the image it was
        asked to. The banner of ``ready`` (the kernel_info_reply that found the kernel ready,
        which waits seconds for the interpreter) is final if it says the interpreter runs;
        if not, the kernel is asked again, now that a cell has waited for it."""
        if not _running(ready):
            ready = await self._kernel_info(time.monotonic() + self.startup_timeout)
        for line in _banner_lines(ready):
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

    async def _check_earlier(self) -> None:
        """Wait for the replies of requests sent without waiting, raising for a failed one."""
        while self._unchecked:
            msg_id, what = self._unchecked.pop(0)
            try:
                raise_for(await self._reply(msg_id, FILE_OP_TIMEOUT), what)
            finally:
                self._executed(msg_id)

    async def _close(self) -> None:
        """Shut the kernel down (once the requests it was sent are done, if it still runs)."""
        manager = getattr(self, "manager", None)
        if self._unchecked and manager is not None and await ensure_async(manager.is_alive()):
            try:
                await self._check_earlier()
            except SessionError as exc:  # the kernel goes, but the user should know
                log.warning("closing a session: %s", exc)
        self._unchecked = []
        if self._tool_server is not None:
            self._tool_server.close()
            self._tool_server = None
        client = getattr(self, "client", None)
        if client is not None:
            client.stop_channels()
        if manager is not None and manager.has_kernel:
            await ensure_async(manager.shutdown_kernel(now=False))

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
        await ensure_async(self.manager.restart_kernel(now=True, **self._restart))
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
        await self._check_earlier()
        msg_id = self._execute(
            code, silent=True, store_history=False, user_expressions=user_expressions or {}
        )
        return await self._silent_reply(msg_id, timeout)

    async def _silent_reply(self, msg_id: str, timeout: float = FILE_OP_TIMEOUT) -> dict:
        """The shell reply of the silent request ``msg_id``, once its IOPub messages are in."""
        try:
            collector = Collector(msg_id, None, None, None)
            end = time.monotonic() + timeout
            while not collector.feed(await _within(self.client.get_iopub_msg, end)):
                pass
            return await self._reply(msg_id, _left(end))
        finally:
            self._executed(msg_id)


def _banner_lines(kernel_info_reply: dict) -> list[str]:
    return str(kernel_info_reply["content"].get("banner", "")).splitlines()


def _running(kernel_info_reply: dict) -> bool:
    """Whether the banner says the interpreter runs (see ``describe``)."""
    return any(line.startswith(RUNNING_FROM) for line in _banner_lines(kernel_info_reply))


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


def raise_for(reply: dict, what: str) -> None:
    content = reply.get("content") or {}
    if content.get("status") != "ok":
        raise SessionError(f"{what}: {content.get('ename')}: {content.get('evalue')}")
