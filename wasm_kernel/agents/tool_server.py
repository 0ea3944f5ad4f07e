"""The client's side of host tools: serving a session's tools while its cells run.

The session declares its tools in each execute_request's metadata (``declaration``); the
kernel then sends each call as a ``tool_request`` on the stdin channel, the way ``input()``
asks, and waits for the ``tool_reply``. A thread of its own owns the stdin socket (so calls
are answered whatever the session's event loop is doing), starts each call, and sends each
reply when it is ready: sync tools on worker threads, async ones on the session's event
loop (``AsyncSession``) or on a loop of this server's (``Session``). Calls of a cell that has
ended are cancelled (an async tool) or their results dropped (a sync one cannot be stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import zmq
from jupyter_client.session import Session

from ..guest.modules._wasm_kernel_tools import decode
from .tools import METADATA_KEY, REPLY, REQUEST, HostTool, catalogue, failure, reply_of

WORKERS = 8  # sync tools running at once
log = logging.getLogger(__name__)


class ToolServer:
    """Answers one session's tool calls on its own stdin connection to the kernel."""

    def __init__(self, client: Any, tools: dict[str, HostTool], loop: Any = None):
        self.tools = tools
        shared = client.session  # a copy for this thread: same key and identity
        self._session = Session(
            key=shared.key,
            signature_scheme=shared.signature_scheme,
            session=shared.session,
            username=shared.username,
        )
        if client.transport == "tcp":
            self._url = f"tcp://{client.ip}:{client.stdin_port}"
        else:
            self._url = f"{client.transport}://{client.ip}-{client.stdin_port}"
        self._loop: asyncio.AbstractEventLoop | None = loop
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="wasm-kernel-tool")
        self._running: set[str] = set()  # msg_ids of the cells being run
        self._calls: dict[str, tuple[str, Future]] = {}  # call_id -> (msg_id, its future)
        self._lock = threading.Lock()
        self._replies: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="wasm-kernel-tools", daemon=True)
        self._thread.start()

    def metadata(self) -> dict[str, Any]:
        """What each execute_request carries: the tools this client serves."""
        return {METADATA_KEY: {"tools": catalogue(self.tools)}}

    def begin(self, msg_id: str) -> None:
        with self._lock:
            self._running.add(msg_id)

    def end(self, msg_id: str) -> None:
        """The cell is over: its calls still running are cancelled (or left to finish
        unheard, a sync tool)."""
        with self._lock:
            self._running.discard(msg_id)
            ended = [call for call, (owner, _) in self._calls.items() if owner == msg_id]
            futures = [self._calls.pop(call)[1] for call in ended]
        for future in futures:
            future.cancel()

    def close(self) -> None:
        self._closed = True
        self._wake()
        self._thread.join(timeout=5)
        self._workers.shutdown(wait=False, cancel_futures=True)
        if self._own_loop is not None:
            self._own_loop.call_soon_threadsafe(self._own_loop.stop)
        for descriptor in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(descriptor)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"!")

    # -- the serving thread --------------------------------------------------------------

    def _serve(self) -> None:
        context = zmq.Context()
        socket = context.socket(zmq.DEALER)
        socket.linger = 0
        socket.setsockopt(zmq.IDENTITY, self._session.bsession)
        socket.connect(self._url)
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        try:
            while not self._closed:
                events = dict(poller.poll())
                if self._wake_read in events:
                    os.read(self._wake_read, 4096)
                while not self._replies.empty():
                    parent, content = self._replies.get()
                    self._session.send(socket, REPLY, content, parent)
                if socket in events:
                    while self._take(socket):
                        pass
        except Exception:
            log.exception("the tool server stopped")
        finally:
            socket.close()
            context.term()

    def _take(self, socket: zmq.Socket) -> bool:
        """Start the call one waiting message asks for; False when none waits. A message
        that cannot be read (arguments are the guest's: anything) is dropped, with a log."""
        try:
            _, message = self._session.recv(socket, mode=zmq.NOBLOCK)
            if message is None:
                return False
            self._start(message)
        except Exception:
            log.exception("dropped a tool request that could not be read")
        return True

    def _start(self, message: dict) -> None:
        """One tool_request: start the call, whose reply is sent when it is done."""
        content = message.get("content") or {}
        parent = message.get("parent_header") or {}
        call_id = content.get("call_id")
        if message.get("msg_type") != REQUEST or not isinstance(call_id, str):
            return
        owner = parent.get("msg_id")
        with self._lock:
            if owner not in self._running:
                return  # a cell that has ended
        tool = self.tools.get(content.get("name"))  # type: ignore[arg-type]
        future: Future
        if tool is None:
            future = Future()
            future.set_exception(LookupError(f"this client serves no tool {content.get('name')!r}"))
        else:
            future = self._submit(tool, content.get("arguments") or {})
        with self._lock:
            self._calls[call_id] = (owner, future)
        future.add_done_callback(lambda done: self._finished(parent, call_id, done))

    def _submit(self, tool: HostTool, wire: dict) -> Future:
        if not tool.is_async:
            return self._workers.submit(lambda: tool.invoke(decode(wire)))

        async def run() -> Any:
            return await tool.invoke(decode(wire))

        return asyncio.run_coroutine_threadsafe(run(), self._event_loop())

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is not None:
            return self._loop
        if self._own_loop is None:
            self._own_loop = asyncio.new_event_loop()
            threading.Thread(
                target=self._own_loop.run_forever, name="wasm-kernel-async-tools", daemon=True
            ).start()
        return self._own_loop

    def _finished(self, parent: dict, call_id: str, future: Future) -> None:
        with self._lock:
            if self._calls.pop(call_id, None) is None or future.cancelled():
                return  # the cell ended first
        exc = future.exception()
        reply = failure(exc) if exc is not None else reply_of(future.result())
        if "error" in reply:
            content = {"call_id": call_id, "status": "error", **reply["error"]}
        else:
            content = {"call_id": call_id, "status": "ok", "value": reply["value"]}
        self._replies.put((parent, content))
        self._wake()
