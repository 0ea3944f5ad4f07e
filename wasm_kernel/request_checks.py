"""Checks of what clients send, and of what the guest answers their introspection requests.

ipykernel's handlers drop requests whose content lacks what they read (no reply at all, so
the client waits forever), and introspection and history parameters arrive as any JSON. These
checks answer such requests with an error, or clamp what can be clamped; the guest's answers
to completion and is_complete requests are shaped back into what the protocol allows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COMPLETION_TYPES = "_jupyter_types_experimental"  # ipykernel's key for typed completions


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
