"""Checks of what clients send, and of what the guest answers their introspection requests.

ipykernel's handlers drop requests whose content lacks what they read (no reply at all, so
the client waits forever), and introspection and history parameters arrive as any JSON. These
checks answer such requests with an error, or clamp what can be clamped; the guest's answers
to completion and is_complete requests are shaped back into what the protocol allows.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping
from typing import Any

from ipykernel.kernelbase import Kernel
from jupyter_client.session import Session

STALE_WINDOW = 5.0  # seconds after its start in which a kernel checks requests' dates
COMPLETION_TYPES = "_jupyter_types_experimental"  # ipykernel's key for typed completions
# requests whose content ipykernel reads without checking: the fields each must hold
CHECKED_REQUESTS: dict[str, tuple[str, dict[str, type]]] = {
    "execute_request": ("execute_reply", {"code": str}),
    "complete_request": ("complete_reply", {"code": str, "cursor_pos": int}),
    "inspect_request": ("inspect_reply", {"code": str, "cursor_pos": int}),
    "is_complete_request": ("is_complete_reply", {"code": str}),
    "comm_info_request": ("comm_info_reply", {}),
    "history_request": ("history_reply", {"hist_access_type": str}),
}


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clean_request(code: Any, cursor_pos: Any) -> tuple[str, int]:
    """Malformed introspection requests get a harmless, empty answer rather than an error."""
    code = code if isinstance(code, str) else ""
    valid = isinstance(cursor_pos, int) and not isinstance(cursor_pos, bool)
    cursor = cursor_pos if valid else len(code)
    return code, min(max(cursor, 0), len(code))


def completion_types(types: Any, length: int) -> list[dict]:
    """ipykernel's typed completions (JupyterLab shows their kind), checked field by field."""
    if not isinstance(types, list):
        return []
    checked = []
    for item in types:
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            continue
        checked.append(
            {
                "start": clamp(item.get("start"), 0, length),
                "end": clamp(item.get("end"), 0, length),
                "text": item["text"],
                "type": str(item.get("type") or ""),
                "signature": str(item.get("signature") or ""),
            }
        )
    return checked


def clamp(value: Any, fallback: int, upper: int) -> int:
    valid = isinstance(value, int) and not isinstance(value, bool)
    return min(max(value, 0), upper) if valid else fallback


def malformed(parent: dict, fields: Mapping[str, type]) -> str | None:
    """What is wrong with a request's content (None: nothing), checked field by field."""
    content = parent.get("content")
    if not isinstance(content, dict):
        return "the request's content must be an object"
    for name, kind in fields.items():
        value = content.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"{name!r} must be {kind.__name__}"
        if isinstance(value, str) and not encodable(value):
            return f"{name!r} contains unpaired surrogates (not valid Unicode)"
    if not isinstance(parent.get("metadata", {}), dict):
        return "the request's metadata must be an object"
    return None


def complete_reply(reply: dict, code: str, cursor: int) -> dict:
    """A complete_reply from the guest's answer, every field checked."""
    types = (reply.get("metadata") or {}).get(COMPLETION_TYPES)
    return {
        "status": "ok",
        "matches": [m for m in reply.get("matches", []) if isinstance(m, str)],
        "cursor_start": clamp(reply.get("cursor_start"), cursor, len(code)),
        "cursor_end": clamp(reply.get("cursor_end"), cursor, len(code)),
        "metadata": {COMPLETION_TYPES: completion_types(types, len(code))},
    }


def is_complete_reply(reply: dict) -> dict:
    """An is_complete_reply from the guest's answer: a status the protocol knows, or unknown."""
    status = reply.get("status")
    if status not in ("complete", "incomplete", "invalid"):
        return {"status": "unknown"}
    result = {"status": status}
    if status == "incomplete":
        result["indent"] = str(reply.get("indent", ""))
    return result


def note_start() -> None:
    """When this kernel began: before its sockets were bound, so before any client could send
    it a request (the kernel application calls it first thing)."""
    global _started
    _started = time.time()


_started: float | None = None


def addressed_to_a_predecessor(parent: dict) -> bool:
    """A request sent before this kernel began, received in its first seconds: meant for the
    kernel it replaces. jupyter_client asks a dead kernel to shut down before a restart, and
    closing its control socket keeps that request queued for the next kernel on the same
    port, which a fast-starting kernel binds in time to receive it."""
    sent = parent.get("header", {}).get("date")
    if _started is None or not isinstance(sent, datetime.datetime) or sent.tzinfo is None:
        return False
    return time.time() - _started < STALE_WINDOW and sent.timestamp() < _started


class CheckedRequests(Kernel):
    """ipykernel's request handlers, each answering a request whose content is not what the
    protocol says with an error reply (execute_request's check is the kernel's own: it also
    waits for a resumed session)."""

    @property
    def live_session(self) -> Session:
        """ipykernel's ``session``: declared optional, but the kernel app always gives one."""
        session = self.session
        assert session is not None, "the kernel was started without a Jupyter session"
        return session

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

    async def shutdown_request(self, stream: Any, ident: Any, parent: dict) -> None:
        if addressed_to_a_predecessor(parent):
            self.log.warning("ignored a shutdown_request sent to the kernel this one replaces")
            return
        await super().shutdown_request(stream, ident, parent)

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
