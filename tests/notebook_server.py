"""A client of a running Jupyter Server (or of one behind JupyterHub's proxy), as JupyterLab
uses it: sessions over REST, cells over the kernel's websocket (the JSON protocol), with a
token in the Authorization header, at any base URL (a hub's proxy serves a user's server under
``/user/NAME/``). Used by the tests that stop servers the ways operators and hubs do
(``test_server_stops``, ``test_jupyterhub``) and by ``lab_server``'s ``execute``."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any

import psutil
import websocket

REQUEST_SECONDS = 30.0


class RefusedRequest(Exception):
    """An HTTP answer other than 2xx, with its status."""

    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


@dataclass
class Cell:
    reply: dict
    outputs: list[dict] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.reply["content"]["status"])

    def text(self) -> str:
        """What the cell showed, in order: streams, results' and displays' text/plain, the
        error's name and value."""
        parts = []
        for message in self.outputs:
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                parts.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                parts.append(content["data"].get("text/plain", ""))
            elif kind == "error":
                parts.append(f"{content['ename']}: {content['evalue']}")
        return "".join(parts)


class NotebookServer:
    """REST and websockets of one server at ``url`` (ending in its base URL's slash)."""

    def __init__(self, url: str, token: str):
        self.url = url
        self.token = token

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"token {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_SECONDS) as answer:
                text = answer.read().decode()
        except urllib.error.HTTPError as exc:
            raise RefusedRequest(exc.code, exc.read().decode(errors="replace")) from None
        return json.loads(text) if text else None

    def wait_ready(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                self.request("GET", "api/status")
                return
            except (OSError, RefusedRequest):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def open_notebook(self, path: str, kernel_name: str = "wasm-python") -> str:
        """Open (or reopen) the notebook's session as JupyterLab does; returns its kernel id."""
        session = self.request(
            "POST",
            "api/sessions",
            {"path": path, "name": path, "type": "notebook", "kernel": {"name": kernel_name}},
        )
        return str(session["kernel"]["id"])

    def _channels(self, kernel_id: str, session: str, seconds: float) -> websocket.WebSocket:
        url = self.url.replace("http", "ws", 1) + f"api/kernels/{kernel_id}/channels"
        return websocket.create_connection(
            f"{url}?session_id={session}",
            header=[f"Authorization: token {self.token}"],
            timeout=seconds,
        )

    def debug(self, kernel_id: str, commands: list[str], seconds: float = 60.0) -> list[dict]:
        """Debug Adapter Protocol requests (no arguments) on the control channel, as
        JupyterLab's debugger panel sends them over the websocket; their replies' contents."""
        session = uuid.uuid4().hex
        socket = self._channels(kernel_id, session, seconds)
        replies = []
        try:
            for seq, command in enumerate(commands, 1):
                msg_id = uuid.uuid4().hex
                content = {"type": "request", "seq": seq, "command": command, "arguments": {}}
                socket.send(
                    json.dumps(_message("debug_request", "control", msg_id, session, content))
                )
                while True:
                    message = json.loads(socket.recv())
                    parent = message.get("parent_header", {}).get("msg_id")
                    if parent == msg_id and message["msg_type"] == "debug_reply":
                        replies.append(message["content"])
                        break
        finally:
            socket.close()
        return replies

    def execute(self, kernel_id: str, code: str, seconds: float = 120.0) -> Cell:
        """Run one cell over the kernel's websocket; the reply and the outputs it produced."""
        session = uuid.uuid4().hex
        socket = self._channels(kernel_id, session, seconds)
        try:
            msg_id = uuid.uuid4().hex
            content = {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
            }
            socket.send(json.dumps(_message("execute_request", "shell", msg_id, session, content)))
            deadline = time.monotonic() + seconds
            cell: Cell | None = None
            outputs: list[dict] = []
            idle = False
            while cell is None or not idle:
                socket.settimeout(max(0.1, deadline - time.monotonic()))
                message = json.loads(socket.recv())
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = message["msg_type"]
                if kind == "execute_reply":
                    cell = Cell(message)
                elif kind == "status" and message["content"]["execution_state"] == "idle":
                    idle = True
                elif kind in ("stream", "execute_result", "error", "display_data"):
                    outputs.append(message)
            cell.outputs = outputs
            return cell
        finally:
            socket.close()


def _message(msg_type: str, channel: str, msg_id: str, session: str, content: dict) -> dict:
    return {
        "header": {
            "msg_id": msg_id,
            "msg_type": msg_type,
            "session": session,
            "username": "test",
            "version": "5.3",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "parent_header": {},
        "metadata": {},
        "content": content,
        "channel": channel,
        "buffers": [],
    }


def kernel_processes(kernel_id: str) -> list[psutil.Process]:
    """The live processes of a kernel, found by its connection file's name on their command
    line (served kernels show theirs too)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(f"kernel-{kernel_id}.json" in word for word in cmdline):
            found.append(process)
    return found


def wait_gone(processes: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """The processes still alive after up to ``seconds``."""
    _, alive = psutil.wait_procs(processes, timeout=seconds)
    return alive
