"""Validation of the structured messages the guest sends through ``host.call``.

Every byte here is written by code running in the sandbox, so nothing is trusted: the
payload must be a JSON object of a known operation whose fields have the expected types
and sizes. Anything else is refused before it can reach Jupyter messages.
"""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

from .guest.modules import _wasm_kernel_messages as ops

MAX_ERROR_TEXT = 256 * 1024  # characters kept of an error's value and traceback
# messages that count against the cell's output budget (everything that reaches the client)
OUTPUT_OPS = frozenset({ops.DISPLAY, ops.RESULT, ops.CLEAR, ops.ERROR, ops.PAYLOAD})
DROPPABLE_OPS = OUTPUT_OPS - {ops.ERROR}  # left out when over budget; an error must still count
PEEK_BYTES = 64
MESSAGE_COST = 512  # bytes an output message costs beyond its payload (its Jupyter header)
_OP_FIELD = re.compile(rb'\s*\{\s*"op"\s*:\s*"([a-z]{1,16})"')


class ProtocolError(ValueError):
    """The guest sent something that is not a valid message."""


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise ProtocolError(what)


def _is_str_dict(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(key, str) for key in value)


def _mime_data(value: Any, empty: bool = False) -> dict:
    """A mime bundle; ``empty``: may hold nothing (ipykernel sends display_data with no data
    for ``display(display_id=...)``)."""
    _check(
        _is_str_dict(value) and (empty or bool(value)),
        "data must be a non-empty object keyed by mime type",
    )
    for mime, payload in value.items():
        _check("/" in mime and len(mime) < 256, f"bad mime type {mime[:64]!r}")
        # JSON mime types (application/json, application/vnd.x+json) may hold any JSON value
        _check(
            isinstance(payload, (str, dict, list)) or mime.endswith("json"),
            f"{mime} payload must be text or JSON",
        )
    return value


def _clip(text: str) -> str:
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "\n[... truncated]"


def parse(raw: bytes) -> dict:
    """Decode and validate one guest message; raise ProtocolError if it is not acceptable."""
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    _check(_is_str_dict(message), "message must be a JSON object")
    op = message.get("op")
    validator = _VALIDATORS.get(op) if isinstance(op, str) else None
    if validator is None:
        raise ProtocolError(f"unknown operation {str(op)[:64]!r}")
    return validator(message)


def peek_op(head: bytes) -> str | None:
    """The operation a message starts by naming (the guest's json.dumps puts it first), read
    without parsing the rest: for messages too large to parse. Only ever used to decide
    between leaving output out and failing the cell, which the guest controls anyway."""
    match = _OP_FIELD.match(head)
    return match.group(1).decode() if match else None


def oversized_error(size: int) -> dict:
    """What an error report too large to read becomes: still an error."""
    text = f"the cell raised an error whose report ({size:,} bytes) was too large to show."
    return {"op": "error", "ename": "ErrorTooLarge", "evalue": text, "traceback": [text]}


def _display(message: dict) -> dict:
    metadata = message.get("metadata", {})
    transient = message.get("transient", {})
    _check(_is_str_dict(metadata), "metadata must be an object")
    _check(_is_str_dict(transient), "transient must be an object")
    display_id = transient.get("display_id")
    _check(display_id is None or isinstance(display_id, str), "display_id must be a string")
    update = message.get("update", False)
    _check(isinstance(update, bool), "update must be a boolean")
    _check(not update or display_id is not None, "an update needs a display_id")
    return {
        "op": message["op"],
        "data": _mime_data(message.get("data"), empty=message["op"] == ops.DISPLAY),
        "metadata": metadata,
        "transient": transient,
        "update": update,
    }


def _clear(message: dict) -> dict:
    wait = message.get("wait", False)
    _check(isinstance(wait, bool), "wait must be a boolean")
    return {"op": ops.CLEAR, "wait": wait}


def _error(message: dict) -> dict:
    ename, evalue, tb = message.get("ename"), message.get("evalue"), message.get("traceback")
    _check(isinstance(ename, str) and len(ename) < 1024, "ename must be a short string")
    if not isinstance(evalue, str):
        raise ProtocolError("evalue must be a string")
    if not (isinstance(tb, list) and all(isinstance(line, str) for line in tb)):
        raise ProtocolError("bad traceback")
    publish = message.get("publish", True)
    _check(isinstance(publish, bool), "publish must be a boolean")
    return {
        "op": ops.ERROR,
        "ename": ename,
        "evalue": _clip(evalue),
        "traceback": _clip("\n".join(tb)).split("\n") if tb else [],
        "publish": publish,
    }


def _payload(message: dict) -> dict:
    """execute_reply payloads, as ipykernel's shell writes them; each checked by source."""
    payloads = message.get("payload")
    if not (isinstance(payloads, list) and len(payloads) <= 16):
        raise ProtocolError("payload must be a short list")
    checked = []
    for item in payloads:
        _check(_is_str_dict(item), "each payload must be an object")
        source = item.get("source")
        _check(source in ops.PAYLOAD_SOURCES, f"unknown payload source {str(source)[:64]!r}")
        if source == "page":
            start = item.get("start", 0)
            _check(isinstance(start, int) and not isinstance(start, bool), "bad page start")
            checked.append({"source": source, "data": _mime_data(item.get("data")), "start": start})
        elif source == "set_next_input":
            text, replace = item.get("text"), item.get("replace", False)
            _check(isinstance(text, str) and isinstance(replace, bool), "bad set_next_input")
            checked.append({"source": source, "text": text, "replace": replace})
        else:
            keep = item.get("keepkernel", False)
            _check(isinstance(keep, bool), "keepkernel must be a boolean")
            checked.append({"source": source, "keepkernel": keep})
    return {"op": ops.PAYLOAD, "payload": checked}


def _input(message: dict) -> dict:
    prompt, password = message.get("prompt", ""), message.get("password", False)
    _check(isinstance(prompt, str) and len(prompt) <= MAX_ERROR_TEXT, "prompt must be a string")
    _check(isinstance(password, bool), "password must be a boolean")
    return {"op": ops.INPUT, "prompt": prompt, "password": password}


def _sleep(message: dict) -> dict:
    seconds = message.get("seconds")
    if not (
        isinstance(seconds, (int, float))
        and not isinstance(seconds, bool)
        and math.isfinite(seconds)
        and seconds >= 0
    ):
        raise ProtocolError("seconds must be a finite, non-negative number")
    return {"op": ops.SLEEP, "seconds": float(seconds)}


def _reply(message: dict) -> dict:
    content = message.get("content")
    _check(_is_str_dict(content), "content must be an object")
    return {"op": ops.REPLY, "content": content}


def _describe(_message: dict) -> dict:
    return {"op": ops.DESCRIBE}


def _interruption(_message: dict) -> dict:
    return {"op": ops.INTERRUPTION}


def _immortalize(message: dict) -> dict:
    addresses = message.get("addresses")
    if not isinstance(addresses, str):
        raise ProtocolError("addresses must be a base64 string")
    try:
        raw = base64.b64decode(addresses, validate=True)
    except ValueError:
        raise ProtocolError("addresses must be a base64 string") from None
    _check(len(raw) % 4 == 0, "addresses must be 32-bit")
    return {"op": ops.IMMORTALIZE, "addresses": raw}


PIP_COMMANDS = ("install", "uninstall", "list", "show")
MAX_PIP_ARGS = 1000


def _pip(message: dict) -> dict:
    """A %pip command: the host checks each argument again (packages.parse_requests)."""
    command, args, upgrade = message.get("command"), message.get("args"), message.get("upgrade")
    _check(command in PIP_COMMANDS, "command must be install, uninstall, list or show")
    _check(
        isinstance(args, list)
        and len(args) <= MAX_PIP_ARGS
        and all(isinstance(arg, str) and len(arg) <= 1000 for arg in args),
        "args must be a list of short strings",
    )
    _check(isinstance(upgrade, bool), "upgrade must be a boolean")
    return {"op": "pip", "command": command, "args": args, "upgrade": upgrade}


def _snapshot(message: dict) -> dict:
    action, name = message.get("action"), message.get("name", "")
    _check(isinstance(action, str) and len(action) <= 64, "action must be a short string")
    _check(isinstance(name, str) and len(name) <= 1024, "name must be a short string")
    return {"op": "snapshot", "action": action, "name": name}


_VALIDATORS = {
    ops.DISPLAY: _display,
    ops.RESULT: _display,
    ops.CLEAR: _clear,
    ops.ERROR: _error,
    ops.PAYLOAD: _payload,
    ops.INPUT: _input,
    ops.SLEEP: _sleep,
    ops.REPLY: _reply,
    ops.DESCRIBE: _describe,
    ops.INTERRUPTION: _interruption,
    ops.PIP: _pip,
    ops.SNAPSHOT: _snapshot,
    ops.IMMORTALIZE: _immortalize,
}
