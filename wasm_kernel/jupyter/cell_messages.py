"""One execute_request's Jupyter messages, built from what the guest sends during its turn.

Each message the contract declares for the client has one handler here, named after it
(``on_result``, ``on_display`` ...), as ipykernel's kernel dispatches requests by name. The
builder runs on the guest thread (and, for output, wasmtime's threads): the request's parent
header and stdin identity are captured up front by the kernel, whose context variables are
not visible there. What it needs of the kernel is the narrow ``KernelDoors``, not the kernel.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..guest.modules import _wasm_kernel_contract as declared
from ..output.active_output import ActiveOutput
from ..sandbox.contract import Verdict
from ..sandbox.stops import memory_limit_text
from .execute_request import Request

if TYPE_CHECKING:
    from ..network.network import CellNetwork
    from ..sandbox.interrupts import Interrupts
    from .audit import AuditLog
    from .debug_session import DebugSession
    from .kernel_tools import KernelTools

INPUT_POLL = 0.05  # seconds between checks for an input_reply or an interrupt
BRIEF_ERROR = 1024  # characters of an error's value shown when the output budget is spent
MISSING_PATH_ERRORS = ("FileNotFoundError", "PermissionError", "NotADirectoryError")
NOTHING_MOUNTED = (
    " (no host folder is mounted in this kernel: it sees only its private /tmp and the Python"
    " runtime. Files come in through the operator: a mount, or a client's upload.)"
)
ONLY_MOUNTED = (
    " (this kernel sees only the host folders mounted at {folders}, its private /tmp and the"
    " Python runtime; other host files are not there. The operator grants more folders"
    " with WasmKernel.mounts.)"
)
_QUOTED_PATH = re.compile(r": '(/[^']*)'")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelDoors:
    """What a cell's messages need of the kernel, and nothing more."""

    # (msg_type, content, parent) on IOPub; False: left out, too much waits for slow clients
    publish: Callable[[str, dict, dict], bool]
    stdin: Callable[[], tuple[Any, Any]]  # the stdin channel's (session, socket)
    output_sent: Callable[[], None]  # waits until earlier output is on its way to IOPub
    describe: Callable[[], str]  # %sandbox
    pip: Callable[[dict, Interrupts], dict]  # %pip: (message, interrupts) -> reply
    snapshot: Callable[[CellMessages, str, str], dict]  # %snapshot: (cell, action, name)
    comm: Callable[[CellMessages, dict, Verdict], dict]  # a comm message from the guest
    active_output: str  # the active-output policy's mode
    memory_limit: int  # bytes, for MemoryLimitExceeded
    # where the guest sees its host folders (None: they could not be mounted, no hint)
    host_folders: tuple[str, ...] | None
    own_folders: tuple[str, ...]  # the guest's other folders (scratch, runtime, packages)
    tools: KernelTools  # sandbox_tools: the operator's and the cell's client's tools
    network: Callable[[], CellNetwork]  # a cell's HTTP requests, within its budget
    audit: Callable[[], AuditLog | None]  # the operator's audit log, if any
    debugger: DebugSession  # the visual debugger's session: a stopped cell waits on it


class CellMessages:
    """Turns what the guest produces during one execute_request into Jupyter messages."""

    def __init__(self, doors: KernelDoors, request: Request):
        self.doors = doors
        self.request = request
        self.execution_count = request.execution_count
        self.error: dict | None = None
        self.snapshot: tuple[str, str] | None = None  # %snapshot save/restore, for the turn's end
        self.payload: list[dict] = []
        self._error_published = True
        self._told_backlog = False
        # A result from the cell's last statement waits for the next message or the turn's end:
        # sent at once, it woke the IOPub thread while the guest still ran, which then waited
        # for it (on two cores). Results shown as statements run (interactivity 'all') go out.
        self._held: tuple[str, dict] | None = None
        self._order = threading.Lock()  # the guest thread's messages and the output thread's
        self.network = doors.network()
        # active-output policy: passive bundles; one notice on stderr when the cell ends
        self.active_output = ActiveOutput(
            doors.active_output, lambda text: self.stream("stderr", text)
        )

    def _publish(self, msg_type: str, content: dict, hold: bool = False) -> None:
        """Send a message after any held one; ``hold``: keep it back (see ``release``)."""
        with self._order:
            held, self._held = self._held, None
            if held is not None:
                self._send(*held)
            if hold:
                self._held = (msg_type, content)
            else:
                self._send(msg_type, content)

    def release(self) -> None:
        """Send the held message, if any: the turn has ended."""
        with self._order:
            held, self._held = self._held, None
            if held is not None:
                self._send(*held)

    def _send(self, msg_type: str, content: dict) -> None:
        published = self.doors.publish(msg_type, content, self.request.parent)
        if not published and not self._told_backlog:
            self._told_backlog = True
            log.warning(
                "leaving out cell output: too much of it waits for clients that do not read IOPub"
            )

    def stream(self, name: str, text: str) -> None:
        if not self.request.silent:
            self._publish("stream", {"name": name, "text": text})

    def message(self, message: dict, verdict: Verdict, interrupts: Interrupts) -> dict:
        """One checked guest message; returns the reply the guest gets."""
        if message["op"] != declared.RESULT.op:
            self.release()  # what the guest asks next may wait on output sent (an input prompt)
        handler = getattr(self, f"on_{message['op']}")
        return handler(message, verdict, interrupts) or {}

    # -- one handler per message the contract sends to the kernel ------------------------------

    def on_result(self, message: dict, _verdict: Verdict, _interrupts: Interrupts) -> None:
        data = self.active_output.bundle(message["data"])  # active-output policy
        if not self.request.silent:
            content = {"execution_count": self.execution_count, "data": data}
            content["metadata"] = message["metadata"]
            self._publish("execute_result", content, hold=message["last"])

    def on_display(self, message: dict, _verdict: Verdict, _interrupts: Interrupts) -> None:
        content = {
            "data": self.active_output.bundle(message["data"]),  # active-output policy
            "metadata": message["metadata"],
            "transient": message["transient"],
        }
        self._publish("update_display_data" if message["update"] else "display_data", content)

    def on_clear(self, message: dict, _verdict: Verdict, _interrupts: Interrupts) -> None:
        self._publish("clear_output", {"wait": message["wait"]})

    def on_error(self, message: dict, verdict: Verdict, _interrupts: Interrupts) -> None:
        ename, evalue, traceback = message["ename"], message["evalue"], message["traceback"]
        # an allocation the limit refused (failed growth, or a bare MemoryError from the
        # allocator), not e.g. the parser's "too complex" MemoryError
        if ename == "MemoryError" and (verdict.memory_limit or not evalue):
            ename, evalue = "MemoryLimitExceeded", memory_limit_text(self.doors.memory_limit)
        elif ename in MISSING_PATH_ERRORS and (hint := self._outside_the_sandbox(evalue)):
            evalue += hint
            traceback = [*traceback, hint.strip()]
        if message["publish"]:
            self._record_error(ename, evalue, traceback, shown=verdict.shown)
        else:  # IPython printed it already (a UsageError): for the reply only
            self.error = {"ename": ename, "evalue": evalue, "traceback": []}

    def on_payload(self, message: dict, _verdict: Verdict, _interrupts: Interrupts) -> None:
        payload = message["payload"]
        for item in payload:
            if item["source"] == declared.PAGE.tag:  # active-output policy
                item["data"] = self.active_output.bundle(item["data"])
        self.payload = payload

    def on_input(self, message: dict, _verdict: Verdict, interrupts: Interrupts) -> dict:
        return self._input(message["prompt"], message["password"], interrupts)

    def on_describe(self, _message: dict, _verdict: Verdict, _interrupts: Interrupts) -> dict:
        return {"text": self.doors.describe()}

    def on_pip(self, message: dict, _verdict: Verdict, interrupts: Interrupts) -> dict:
        return self.doors.pip(message, interrupts)

    def on_snapshot(self, message: dict, _verdict: Verdict, _interrupts: Interrupts) -> dict:
        return self.doors.snapshot(self, message["action"], message["name"])

    def on_tools(self, message: dict, _verdict: Verdict, _interrupts: Interrupts) -> dict:
        return self.doors.tools.catalogue(self.request, message["digest"])

    def on_tool(self, message: dict, _verdict: Verdict, interrupts: Interrupts) -> dict:
        started = time.monotonic()
        reply = self.doors.tools.call(self.request, message, interrupts, self.doors.stdin)
        if (audit := self.doors.audit()) is not None:
            error = reply.get("error")
            audit.tool_call(
                message["name"],
                "ok" if "value" in reply else "error",
                seconds=time.monotonic() - started,
                error="interrupted" if reply.get("interrupted") else error and error["ename"],
                sent_bytes=len(json.dumps(message["arguments"])),
                received_bytes=len(json.dumps(reply.get("value"))) if "value" in reply else None,
            )
        return reply

    def on_http(self, message: dict, _verdict: Verdict, interrupts: Interrupts) -> dict:
        started = time.monotonic()
        reply = self.network.fetch(message, interrupts)
        if (audit := self.doors.audit()) is not None:
            audit.network_request(
                message["method"],
                message["url"],
                "refused" if "error" in reply else "allowed",
                reason=reply.get("detail"),
                status=reply.get("status"),
                seconds=time.monotonic() - started,
                sent_bytes=len(message["body"]),
                received_bytes=_decoded_size(reply.get("body", "")),
            )
        return reply

    def on_comm(self, message: dict, verdict: Verdict, _interrupts: Interrupts) -> dict:
        return self.doors.comm(self, message, verdict)

    def on_debug_stop(self, message: dict, _verdict: Verdict, interrupts: Interrupts) -> dict:
        return self.doors.debugger.stop(message["reason"], self.request.parent, interrupts)

    def on_debug_answer(self, message: dict, _verdict: Verdict, interrupts: Interrupts) -> dict:
        return self.doors.debugger.answered(message, interrupts)

    def on_parent(self, _message: dict, _verdict: Verdict, _interrupts: Interrupts) -> dict:
        header = self.request.parent.get("header", {})
        kept = ("msg_id", "msg_type", "session")
        return {"header": {key: header[key] for key in kept if isinstance(header.get(key), str)}}

    # -- the cell's end ------------------------------------------------------------------------

    def asks_exit(self) -> bool:
        """exit() or quit() in the cell, without keep_kernel."""
        return any(
            item["source"] == declared.ASK_EXIT.tag and not item["keepkernel"]
            for item in self.payload
        )

    def fail(self, ename: str, evalue: str) -> dict:
        """End the cell with an error raised by the kernel rather than by the user's code."""
        self._record_error(ename, evalue, [f"{ename}: {evalue}"])
        return self.reply()

    def reply(self, user_expressions: dict | None = None) -> dict:
        self.release()
        self.active_output.finish()  # active-output policy: one notice for the cell, if any
        if self.error:
            if not self._error_published:
                self._publish_brief_error()
            return {"status": "error", "execution_count": self.execution_count, **self.error}
        return {
            "status": "ok",
            "execution_count": self.execution_count,
            "payload": self.payload,
            "user_expressions": user_expressions or {},
        }

    def _outside_the_sandbox(self, evalue: str) -> str:
        """If the error is about a path only the host could have, a hint saying what the
        kernel sees instead (empty otherwise)."""
        mounted = self.doors.host_folders
        quoted = _QUOTED_PATH.search(evalue) if mounted is not None else None
        if mounted is None or quoted is None:
            return ""
        path = quoted.group(1)
        for top in (*mounted, *self.doors.own_folders):
            if path == top or path.startswith(top.rstrip("/") + "/"):
                return ""
        return ONLY_MOUNTED.format(folders=", ".join(mounted)) if mounted else NOTHING_MOUNTED

    def _record_error(
        self, ename: str, evalue: str, traceback: list[str], shown: bool = True
    ) -> None:
        """The cell's error, for its reply; published now, or (past the output budget) in
        brief when the cell ends, so that an error never passes unseen."""
        self.error = {"ename": ename, "evalue": evalue, "traceback": traceback}
        self._error_published = shown
        if shown:
            self._publish("error", self.error)

    def _publish_brief_error(self) -> None:
        assert self.error is not None
        evalue = self.error["evalue"]
        if len(evalue) > BRIEF_ERROR:
            evalue = evalue[:BRIEF_ERROR] + " [...]"
        self.error = {
            "ename": self.error["ename"],
            "evalue": evalue,
            "traceback": [
                f"{self.error['ename']}: {evalue}",
                "(the traceback is not shown: the cell's output went past its output limit)",
            ],
        }
        self._publish("error", self.error)

    def _input(self, prompt: str, password: bool, interrupts: Interrupts) -> dict:
        """input_request over stdin; the wait ends early on interrupt."""
        if not self.request.allow_stdin:
            return {"error": declared.NO_STDIN}
        self.doors.output_sent()  # the prompt comes after what was printed before it
        session, socket = self.doors.stdin()
        while session.recv(socket)[1] is not None:  # drop stale replies
            pass
        session.send(
            socket,
            "input_request",
            {"prompt": prompt, "password": password},
            self.request.parent,
            ident=self.request.stdin_ident,
        )
        while True:
            if interrupts.take():
                return {"error": declared.INTERRUPTED}
            if socket.poll(int(INPUT_POLL * 1000)):
                _, reply = session.recv(socket)
                if reply is None or reply.get("msg_type") != "input_reply":
                    continue
                value = reply.get("content", {}).get("value", "")
                if not isinstance(value, str):
                    value = ""
                return {"error": declared.EOF} if value == "\x04" else {"value": value}


def _decoded_size(text: str) -> int:
    """Bytes a base64 text holds, without decoding it."""
    return len(text) // 4 * 3 - text[-2:].count("=")
