"""Comms between the front end and the guest, handled as ipykernel's comm manager handles them.

ipykernel answers ``comm_open``, ``comm_msg`` and ``comm_close`` on the shell channel with no
reply: what the handlers publish goes out on IOPub under the comm message. Here they wait
their turn behind the running request, as under ipykernel 6 (``shell_main``). Each one
is a guest turn (``COMM_RECEIVED``), bounded and rolled back as a cell is; the guest's comms
(``_wasm_kernel_comms``) send theirs through the contract's ``comm`` message, which counts
against the turn's output budget and passes the active-output policy (``active_widgets``).
``comm_info_request`` asks the guest for its open comms.

Clients are untrusted too: a comm message larger than the contract's ``COMM_RECEIVED_LIMIT``
(its JSON text and buffers together) is refused with an error under it and a line in the
kernel's log, and one that has waited ``QUEUED`` seconds behind other comm messages is
dropped unhandled (``Backlog``), so that a flood holds cells back by seconds at most.
Front ends send a widget's changes one at a time, each once the last is handled, so theirs
never wait that long.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from ipykernel.kernelbase import Kernel

from ..guest.modules import _wasm_kernel_contract as declared
from ..output.active_widgets import WidgetPolicy
from ..sandbox.contract import Verdict
from ..sandbox.guest_thread import GuestThread
from ..sandbox.sandbox import Sandbox
from ..sandbox.stops import CellStopped
from .cell_messages import CellMessages, KernelDoors
from .execute_request import Request
from .iopub import GuestPublisher

LIMIT = declared.COMM_RECEIVED_LIMIT  # bytes of one comm message from the front end
QUEUED = 5.0  # seconds a comm message may wait behind others before it is dropped
TELL_EVERY = 10.0  # seconds between notices that comm messages are dropped
OVER_BUDGET = (
    "the comm message was not sent: this cell's (or comm handler's) output went past its"
    " output limit (WasmKernel.output_limit)"
)
DROPPED = (
    f"comm messages arrived faster than they could be handled: those that waited over {QUEUED:g}"
    " s behind others were dropped unhandled"
)
BACKLOG = "the comm message was not sent: too much output waits for clients that do not read it"


class Backlog:
    """How long a comm message has waited behind other comm messages: since it arrived, or
    since the present run of comm messages began, whichever is later (one that waited
    behind a cell is handled after it, as under ipykernel). Arrival is judged from the
    header's date against the least delay seen from the same session, so the client's clock
    need not agree with ours."""

    SESSIONS = 1000  # sessions whose least delay is kept

    def __init__(self) -> None:
        self._least: dict[str, float] = {}
        self.run_began: float | None = None  # when the present run of comm messages began
        self._told = -math.inf

    def waited(self, header: dict) -> float:
        now = time.time()
        date, session = header.get("date"), header.get("session")
        if not isinstance(date, datetime) or not isinstance(session, str):
            return 0.0
        if date.tzinfo is None:
            date = date.replace(tzinfo=UTC)
        delay = now - date.timestamp()
        least = min(self._least.get(session, delay), delay)
        if session in self._least or len(self._least) < self.SESSIONS:
            self._least[session] = least
        arrived = now - (delay - least)
        return now - max(arrived, self.run_began or arrived)

    def tell(self) -> bool:
        """Whether to say that messages are dropped (once every TELL_EVERY seconds)."""
        now = time.monotonic()
        if now - self._told < TELL_EVERY:
            return False
        self._told = now
        return True


def checked(parent: dict) -> tuple[str, str]:
    """A front end's comm message as the JSON text the guest's entry point takes, or ("",
    why it is refused)."""
    header = parent.get("header", {})
    content = parent.get("content")
    if not isinstance(content, dict):
        return "", "the comm message's content is not an object"
    comm_id = content.get("comm_id")
    limit = declared.COMM_ID_LIMIT
    if not isinstance(comm_id, str) or not 0 < len(comm_id) <= limit:
        return "", f"the comm message needs a comm_id of at most {limit} characters"
    msg_type = header.get("msg_type")
    if msg_type == "comm_open" and not isinstance(content.get("target_name"), str):
        return "", "comm_open needs a target_name"
    buffers = parent.get("buffers") or []
    metadata = parent.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    size = sum(len(memoryview(buffer).cast("B")) for buffer in buffers)
    if size <= LIMIT:  # else too large already: the JSON text need not be measured
        size += sum(len(json.dumps(part, default=str)) for part in (content, metadata))
    if size > LIMIT:
        return "", (
            f"the comm message ({size:,} bytes of JSON text and buffers, or more) is over the"
            f" kernel's bound of {LIMIT:,} bytes on a comm message from the front end"
        )
    text = json.dumps(
        {
            "msg_type": msg_type,
            "header": {
                key: header[key] for key in ("msg_id", "msg_type", "session") if key in header
            },
            "content": content,
            "metadata": metadata,
            "buffers": [base64.b64encode(buffer).decode("ascii") for buffer in buffers],
        },
        default=str,
    )
    return text, ""


class HostComms(Kernel):
    """ipykernel's comm handlers, answered by the guest."""

    _worker: GuestThread
    _sandbox: Callable[[Any], Awaitable[Sandbox]]
    _answer: Callable[..., Awaitable[dict]]
    _doors: KernelDoors
    guest_output: GuestPublisher

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.widget_policy = WidgetPolicy()
        self._backlog = Backlog()
        for msg_type in declared.COMM_MESSAGE_TYPES:
            self.shell_handlers[msg_type] = self.comm_received

    async def shell_main(self, subshell_id: str | None, msg: Any) -> None:
        """Every shell message, comm messages too, waits for the one before it on its shell.

        ipykernel 7 dispatches a comm message at once while a cell runs (an async cell may
        await a widget) and afterwards puts back the shell parent it saw before. Here the
        handler's guest turn can only follow the cell's, so the put-back came once the next
        cell had begun, and that cell's idle status went out under the previous cell:
        JupyterLab, waiting for it, kept the prompt at ``[*]``."""
        if subshell_id is None:
            lock = self._main_asyncio_lock
        else:
            lock = self.shell_channel_thread.manager.get_subshell_asyncio_lock(subshell_id)
        async with lock:
            await self.dispatch_shell(msg, subshell_id=subshell_id)

    async def comm_received(self, stream: Any, ident: Any, parent: dict) -> None:
        """One comm message from the front end: a guest turn, as a cell's, with no reply."""
        cell = CellMessages(
            self._doors,
            Request(
                parent=parent,
                stdin_ident=None,
                silent=False,
                allow_stdin=False,
                execution_count=self.execution_count,
            ),
        )
        if self._backlog.waited(parent["header"]) > QUEUED:
            if self._backlog.tell():
                self.log.warning("comm messages arrive faster than they are handled: dropping")
                cell.stream("stderr", f"wasm-kernel: {DROPPED}\n")
            return
        text, refusal = checked(parent)
        if refusal:
            self.log.warning("refused a %s: %s", parent["header"].get("msg_type"), refusal)
            cell.fail("CommRefused", refusal)
            return
        msg_type = parent["header"]["msg_type"]
        if msg_type == "comm_open":
            self.widget_policy.opened_by_client(parent["content"]["comm_id"])
        elif msg_type == "comm_close":
            self.widget_policy.closed(parent["content"]["comm_id"])
        try:
            sandbox = await self._sandbox(lambda note: cell.stream("stderr", note))
        except Exception as exc:
            self.log.warning("a comm message found no sandbox: %s", exc)
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._worker, sandbox.comm_received, text, cell)
        except CellStopped as stop:
            if stop.recovered:
                self._worker.defer_checkpoint(sandbox)
            cell.fail(stop.ename, stop.evalue)
            return
        cell.reply()  # the policy's notice; an error past the output budget, in brief
        self._worker.defer_checkpoint(sandbox)

    def set_parent(self, ident: Any, parent: dict, channel: str = "shell") -> None:
        """A run of comm messages begins, or ends with another request (see Backlog)."""
        super().set_parent(ident, parent, channel)
        if channel == "shell":
            if parent.get("header", {}).get("msg_type") not in declared.COMM_MESSAGE_TYPES:
                self._backlog.run_began = None
            elif self._backlog.run_began is None:
                self._backlog.run_began = time.time()

    def comm_outgoing(self, cell: CellMessages, message: dict, verdict: Verdict) -> dict:
        """A comm message from the guest (the contract's ``comm``), published on IOPub under
        the request the turn answers; the reply's error is raised in the guest."""
        if not verdict.shown:
            return {"error": OVER_BUDGET}
        msg_type, content = message["msg_type"], message["content"]
        refusal = self.widget_policy.outgoing(msg_type, content, cell.active_output)
        if refusal:
            return {"error": refusal}
        topic = f"comm-{content['comm_id']}".encode()
        parent = cell.request.parent
        published = self.guest_output.publish(
            msg_type, content, parent, topic, message["buffers"], message["metadata"]
        )
        if not published:
            return {"error": BACKLOG}
        return {}

    async def comm_info_request(self, stream: Any, ident: Any, parent: dict) -> None:
        """The guest's open comms, as ipykernel lists its comm manager's."""
        content = parent.get("content")
        target = content.get("target_name") if isinstance(content, dict) else None
        answer = await self._answer(declared.COMM_INFO, target if isinstance(target, str) else None)
        listed = answer.get("comms")
        comms = {
            str(comm_id): {"target_name": str(info.get("target_name"))}
            for comm_id, info in (listed.items() if isinstance(listed, dict) else ())
            if isinstance(info, dict)
        }
        if self.session is not None:
            self.session.send(
                stream, "comm_info_reply", {"comms": comms, "status": "ok"}, parent, ident
            )
