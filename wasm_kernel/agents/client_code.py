"""The code a client session sends into the guest, and the checks of what comes back.

File operations are expressions only (evaluated as ``user_expressions``, so no name lands in
the user's namespace); ``%snapshot`` and ``%pip`` lines are built from checked names. What the
kernel answers is the guest's: read as data (``ast.literal_eval`` of strings only, sizes
checked), never trusted.
"""

from __future__ import annotations

import ast
import base64
import json
import shlex
from typing import Any

from ..images.names import ImageError, check_name


class SessionError(Exception):
    """The session cannot do what was asked: the kernel refused its settings, died, or a file
    operation failed inside the sandbox."""


def write_code(guest_path: str, chunk: bytes, append: bool) -> str:
    encoded = base64.b64encode(chunk).decode("ascii")
    mode = "ab" if append else "wb"
    return (
        f"(lambda f: (f.write(__import__('base64').b64decode({encoded!r})), f.close()))"
        f"(__import__('io').open({guest_path!r}, {mode!r}));"
    )


def size_expression(guest_path: str) -> str:
    return f"__import__('os').stat({guest_path!r}).st_size"


def read_expression(guest_path: str, offset: int, length: int) -> str:
    return (
        f"(lambda f: (f.seek({offset}), __import__('base64').b64encode(f.read({length})).decode(),"
        f" f.close())[1])(__import__('io').open({guest_path!r}, 'rb'))"
    )


def list_expression(guest_path: str) -> str:
    return (
        "__import__('json').dumps([[e.name, e.is_dir(), 0 if e.is_dir() else e.stat().st_size]"
        f" for e in sorted(__import__('os').scandir({guest_path!r}), key=lambda e: e.name)])"
    )


def check_path(guest_path: Any) -> str:
    if not isinstance(guest_path, str) or not guest_path or "\0" in guest_path:
        raise SessionError(f"a guest path must be a non-empty string, not {guest_path!r}")
    return guest_path


def literal_string(reply: dict, name: str, limit: int) -> str:
    """The string a user expression evaluated to, read from its text/plain (guest data)."""
    content = reply.get("content") or {}
    if content.get("status") != "ok":
        raise SessionError(f"{content.get('ename', 'Error')}: {content.get('evalue', '')}")
    result = (content.get("user_expressions") or {}).get(name)
    if not isinstance(result, dict):
        raise SessionError("the kernel did not answer the file request")
    if result.get("status") != "ok":
        raise SessionError(f"{result.get('ename', 'Error')}: {result.get('evalue', '')}")
    text = (result.get("data") or {}).get("text/plain")
    if not isinstance(text, str) or len(text) > limit:
        raise SessionError("the kernel's answer to the file request is not what was asked for")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise SessionError("the kernel's answer to the file request is malformed") from exc
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise SessionError("the kernel's answer to the file request is not what was asked for")
    return str(value)


def entries(text: str) -> list[dict[str, Any]]:
    try:
        rows = json.loads(text)
        return [
            {"name": str(name), "is_dir": bool(is_dir), "size": int(size)}
            for name, is_dir, size in rows
        ]
    except (ValueError, TypeError) as exc:
        raise SessionError("the kernel's folder listing is malformed") from exc


def decoded(text: str, limit: int) -> bytes:
    try:
        data = base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise SessionError("the kernel's file data is not base64") from exc
    if len(data) > limit:
        raise SessionError("the kernel sent more file data than was asked for")
    return data


def snapshot_code(action: str, name: str) -> str:
    """``%snapshot ACTION NAME``, the name checked first: it goes into a line of code."""
    try:
        return f"%snapshot {action} {check_name(name)}"
    except (ImageError, TypeError) as exc:
        raise SessionError(str(exc)) from None


def install_code(requirements: tuple[str, ...]) -> str:
    """``%pip install`` with each requirement quoted, so none can add a line or an option
    the magic would read as something else."""
    if not requirements:
        raise SessionError("install needs at least one requirement")
    for requirement in requirements:
        if not isinstance(requirement, str) or not requirement.strip():
            raise SessionError(f"a requirement must be a non-empty string, not {requirement!r}")
        if any(char in requirement for char in "\0\r\n"):
            raise SessionError(f"a requirement must be one line: {requirement!r}")
    return "%pip install " + " ".join(shlex.quote(item) for item in requirements)
