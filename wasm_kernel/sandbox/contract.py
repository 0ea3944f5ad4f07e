"""The host's side of the guest<->host contract: checks derived from its declarations.

Every byte a message holds was written by code running in the sandbox, so nothing is
trusted: ``parse`` accepts a JSON object of a declared message whose declared fields have
their declared kinds and sizes, keeps only those fields (defaults filled in) and refuses
anything else before it can reach a Jupyter message. ``guest_turn`` (and, in the install
turn, ``guest_call``) is how the host writes a call into the guest. The declarations
themselves live in the guest's module ``_wasm_kernel_contract``, which both sides load.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..guest.modules import _wasm_kernel_contract as declared
from ..guest.modules._wasm_kernel_contract import Field, Message, Shape

PEEK_BYTES = 64
MESSAGE_COST = 512  # bytes an output message costs beyond its payload (its Jupyter header)
_OP_FIELD = re.compile(rb'\s*\{\s*"op"\s*:\s*"([a-z_]{1,16})"')
_LITERALS = (str, int, float, bool, type(None))


class ProtocolError(ValueError):
    """The guest sent something that is not a valid message."""


@dataclass
class Verdict:
    """What the host judged of a guest message: carried beside it, never written into it."""

    memory_limit: bool = False  # a MemoryError that the sandbox's memory limit caused
    shown: bool = True  # False: past the cell's output budget (an error is then told briefly)


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise ProtocolError(what)


def _is_str_dict(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(key, str) for key in value)


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "\n[... truncated]"


# -- one check per kind of field: (field, value) -> the value as the host keeps it --------------


def _text(field: Field, value: Any) -> str:
    _check(isinstance(value, str), f"{field.name} must be a string")
    _check(field.limit is None or len(value) <= field.limit, f"{field.name} is too long")
    return value


def _clipped(field: Field, value: Any) -> str:
    _check(isinstance(value, str), f"{field.name} must be a string")
    return _clip(value, field.limit)


def _lines(field: Field, value: Any) -> list[str]:
    _check(
        isinstance(value, list) and all(isinstance(line, str) for line in value),
        f"{field.name} must be a list of strings",
    )
    return _clip("\n".join(value), field.limit).split("\n") if value else []


def _flag(field: Field, value: Any) -> bool:
    _check(isinstance(value, bool), f"{field.name} must be a boolean")
    return value


def _integer(field: Field, value: Any) -> int:
    _check(_is_integer(value), f"{field.name} must be an integer")
    return value


def _seconds(field: Field, value: Any) -> float:
    number = float(value) if isinstance(value, float) else None
    if _is_integer(value):
        with contextlib.suppress(OverflowError):  # a JSON integer too large for a float
            number = float(value)
    _check(
        number is not None and math.isfinite(number) and number >= 0,
        f"{field.name} must be a finite, non-negative number",
    )
    return number  # type: ignore[return-value]  # checked above


def _object(field: Field, value: Any) -> dict:
    _check(_is_str_dict(value), f"{field.name} must be an object")
    for key, kind in field.keys.items():
        if key in value:
            _KINDS[kind](Field(f"{field.name}.{key}", kind), value[key])
    return value


def _bundle(field: Field, value: Any) -> dict:
    _check(
        _is_str_dict(value) and (field.empty or bool(value)),
        f"{field.name} must be a non-empty object keyed by mime type",
    )
    for mime, payload in value.items():
        _check("/" in mime and len(mime) < 256, f"bad mime type {mime[:64]!r}")
        # JSON mime types (application/json, application/vnd.x+json) may hold any JSON value
        _check(
            isinstance(payload, (str, dict, list)) or mime.endswith("json"),
            f"{mime} payload must be text or JSON",
        )
    return value


def _choice(field: Field, value: Any) -> str:
    _check(value in field.choices, f"{field.name} must be one of {', '.join(field.choices)}")
    return value


def _words(field: Field, value: Any) -> list[str]:
    _check(
        isinstance(value, list)
        and len(value) <= field.limit
        and all(isinstance(word, str) and len(word) <= declared.WORD_LIMIT for word in value),
        f"{field.name} must be a list of short strings",
    )
    return value


def _base64(field: Field, value: Any) -> bytes:
    _check(isinstance(value, str), f"{field.name} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise ProtocolError(f"{field.name} must be a base64 string") from None


def _addresses(field: Field, value: Any) -> bytes:
    raw = _base64(field, value)
    _check(len(raw) % 4 == 0, f"{field.name} must be 32-bit")
    return raw


def _bytes(field: Field, value: Any) -> bytes:
    _check(
        isinstance(value, str) and len(value) <= (field.limit + 2) // 3 * 4,
        f"{field.name} must be base64 of at most {field.limit:,} bytes",
    )
    return _base64(field, value)


def _headers(field: Field, value: Any) -> list[tuple[str, str]]:
    _check(
        isinstance(value, list)
        and len(value) <= field.limit
        and all(
            isinstance(pair, list)
            and len(pair) == 2
            and all(isinstance(part, str) and len(part) <= declared.HEADER_LIMIT for part in pair)
            for pair in value
        ),
        f"{field.name} must be a list of [name, value] string pairs",
    )
    return [(name, text) for name, text in value]


def _buffers(field: Field, value: Any) -> list[bytes]:
    _check(
        isinstance(value, list)
        and len(value) <= field.limit
        and all(isinstance(item, str) for item in value),
        f"{field.name} must be a list of at most {field.limit} base64 strings",
    )
    try:
        return [base64.b64decode(item, validate=True) for item in value]
    except ValueError:
        raise ProtocolError(f"{field.name} must hold base64 strings") from None


def _items(field: Field, value: Any) -> list[dict]:
    _check(isinstance(value, list) and len(value) <= field.limit, f"{field.name}: too many")
    shapes = {shape.tag: shape for shape in field.shapes}
    checked = []
    for item in value:
        _check(_is_str_dict(item), f"each of {field.name} must be an object")
        tag = item.get(Shape.tag_key)
        shape = shapes.get(tag) if isinstance(tag, str) else None
        _check(shape is not None, f"unknown {Shape.tag_key} {str(tag)[:64]!r}")
        checked.append(_fields(shape, item))  # type: ignore[arg-type]  # checked above
    return checked


def _json(_field: Field, value: Any) -> Any:
    return value  # parsed JSON already, bounded by the message's size


_KINDS: dict[str, Callable[[Field, Any], Any]] = {
    declared.TEXT: _text,
    declared.CLIPPED: _clipped,
    declared.LINES: _lines,
    declared.FLAG: _flag,
    declared.INTEGER: _integer,
    declared.SECONDS: _seconds,
    declared.OBJECT: _object,
    declared.BUNDLE: _bundle,
    declared.CHOICE: _choice,
    declared.WORDS: _words,
    declared.ADDRESSES: _addresses,
    declared.ITEMS: _items,
    declared.JSON: _json,
    declared.HEADERS: _headers,
    declared.BYTES: _bytes,
    declared.BUFFERS: _buffers,
}


def _fields(shape: Shape | Message, raw: dict) -> dict:
    """``raw``'s declared fields, each checked (defaults for those absent), with its tag."""
    checked: dict[str, Any] = {shape.tag_key: shape.tag}
    for field in shape.fields:
        if field.name in raw:
            checked[field.name] = _KINDS[field.kind](field, raw[field.name])
        else:
            _check(field.default is not declared.REQUIRED, f"{field.name} is missing")
            default = field.default
            checked[field.name] = dict(default) if isinstance(default, dict) else default
    for requirement, holds in shape.rules:
        _check(holds(checked), requirement)
    return checked


def parse(raw: bytes) -> dict:
    """Decode and check one guest message; raise ProtocolError if it is not acceptable."""
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    _check(_is_str_dict(message), "message must be a JSON object")
    op = message.get("op")
    declaration = declared.MESSAGES.get(op) if isinstance(op, str) else None
    if declaration is None:
        raise ProtocolError(f"unknown operation {str(op)[:64]!r}")
    return _fields(declaration, message)


def declaration(message: dict) -> Message:
    """The declaration of a message ``parse`` accepted."""
    return declared.MESSAGES[message["op"]]


def peek_op(head: bytes) -> Message | None:
    """The declared message whose op a message starts by naming (the guest's json.dumps puts
    it first), read without parsing the rest: for messages too large to parse. Only ever used
    to decide between leaving output out and failing the cell, which the guest controls."""
    match = _OP_FIELD.match(head)
    return declared.MESSAGES.get(match.group(1).decode()) if match else None


def too_large(kind: Message, size: int) -> dict | None:
    """The reply to a message over its declared bound (its ``limit``), if its reply can carry
    an error (None: the message is left out, unread)."""
    text = (
        f"the {kind.op} message ({size:,} bytes as sent) is over the bound of {kind.limit:,}"
        f" bytes on one {kind.op} message"
    )
    error = next((field for field in kind.reply if field.name == "error"), None)
    if error is not None and error.kind == declared.OBJECT:
        return {"error": {"ename": "ValueError", "evalue": text}}
    if error is not None and error.kind == declared.TEXT:
        return {"error": text}
    return None


def oversized_error(size: int) -> dict:
    """What an error report too large to read becomes: still an error."""
    text = f"the cell raised an error whose report ({size:,} bytes) was too large to show."
    return {
        "op": declared.ERROR.op,
        "ename": "ErrorTooLarge",
        "evalue": text,
        "traceback": [text],
        "publish": True,
    }


def guest_call(entry: declared.EntryPoint, *arguments: Any) -> str:
    """The source of one call of a declared entry point of the guest's kernel module, as a
    statement (its value, None, shown by no one), for the install turn, which runs before the
    module can take turns (``guest_turn``). Arguments are plain data, written as literals, so
    nothing but that entry point runs."""
    listed = _arguments(entry, arguments)
    return f"__import__({declared.GUEST_MODULE!r}).{entry.name}({', '.join(map(repr, listed))})"


def guest_turn(entry: declared.EntryPoint, *arguments: Any) -> str:
    """The source of a turn that calls one of the guest's TURN_ENTRY_POINTS: one string
    literal, the JSON list of the entry point's name and its arguments, which the guest's
    display hook (its ``take_turn``) decodes and calls. The guest compiles one token where
    a call's text cost ~40,000 fuel a token. Arguments are plain data JSON holds as they are
    (no tuples, only string keys), so nothing but that entry point runs, given exactly them."""
    if entry.name not in declared.TURN_ENTRY_POINTS:
        raise TypeError(f"{entry.name} is not called in a turn of its own")
    listed = _arguments(entry, arguments)
    for argument in listed:
        _check_json(argument)
    # ASCII-safe: repr escapes what the source cannot hold as it is (lone surrogates)
    return repr(json.dumps([entry.name, *listed], ensure_ascii=False, allow_nan=False))


def _arguments(entry: declared.EntryPoint, arguments: tuple[Any, ...]) -> list[Any]:
    """The arguments as a call passes them: checked against the declaration, plain data,
    trailing ones at their defaults left out."""
    variadic = entry.parameters[-1:] != () and entry.parameters[-1].startswith("*")
    fixed = len(entry.parameters) - variadic
    if len(arguments) < fixed or (len(arguments) > fixed and not variadic):
        raise TypeError(f"{entry.name} takes {entry.parameters}, got {len(arguments)} arguments")
    for argument in arguments:
        _check_literal(argument)
    listed = list(arguments)
    while listed and _is_default(entry, len(listed) - 1, listed[-1]):
        listed.pop()
    return listed


def _is_default(entry: declared.EntryPoint, position: int, value: Any) -> bool:
    """Whether the argument at ``position`` is the entry point's default there (a literal of
    the same type and value), so that the call can leave it out."""
    name = entry.parameters[position] if position < len(entry.parameters) else ""
    if name not in entry.defaults:
        return False
    default = entry.defaults[name]
    return type(value) is type(default) and value == default


def _check_json(value: Any) -> None:
    """Only plain data JSON gives back as it was sent: lists, and objects with string keys."""
    if isinstance(value, tuple):
        raise TypeError("a tuple would arrive as a list: send a list")
    if isinstance(value, list):
        for item in value:
            _check_json(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"JSON keys are strings, not {type(key).__name__}")
            _check_json(item)


def _check_literal(value: Any) -> None:
    """Only data whose repr is a literal that evaluates back to it."""
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_literal(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_literal(key)
            _check_literal(item)
    elif type(value) not in _LITERALS or (isinstance(value, float) and not math.isfinite(value)):
        raise TypeError(f"not plain data: {type(value).__name__}")
