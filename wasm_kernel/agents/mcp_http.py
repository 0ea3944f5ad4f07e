"""The MCP server's HTTP side: the operator's bearer token, the URL it serves, and the
kernels of a session stopped as soon as its client ends the session.

The token file is the operator's, yet it is opened like any file from outside: without
following a link, only if it is a regular file, and read no further than a token can be
long (``/dev/zero`` or a FIFO would otherwise hang the start or fill the memory).
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import os
from typing import TYPE_CHECKING, Any

from ..files import host_files

if TYPE_CHECKING:
    from .mcp_kernels import Kernels

TOKEN_ENV = "WASM_KERNEL_MCP_TOKEN"
MIN_TOKEN = 16  # characters: shorter tokens can be guessed
MAX_TOKEN_FILE = 4096  # bytes: a token file is one line; anything longer is not one
PATH = "/mcp"  # where the SDK's streamable HTTP app answers
UNAUTHORIZED = b'{"error": "unauthorized: this server needs its bearer token"}'


def url(host: str, port: int) -> str:
    """The address clients connect to (an IPv6 address in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{PATH}"


def bearer_token(token_file: str | None, host: str) -> bytes | None:
    """The operator's token, from ``token_file`` or the environment; None only on loopback.
    Raises ValueError with the reason when it is missing where it is needed, or weak."""
    token = read_token_file(token_file) if token_file is not None else None
    if token is None:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        if token_file is not None:
            raise ValueError(f"the token file {token_file} is empty")
        if not _is_loopback(host):
            raise ValueError(
                f"--host {host} is reachable from other machines: give a bearer token"
                f" (--token-file FILE or {TOKEN_ENV}) or listen on 127.0.0.1"
            )
        return None
    if len(token) < MIN_TOKEN or any(char.isspace() for char in token):
        raise ValueError(f"the bearer token must be at least {MIN_TOKEN} characters, no spaces")
    return token.encode()


def read_token_file(path: str) -> str:
    """The token in ``path``: a regular file (not a link, device or FIFO) of at most
    MAX_TOKEN_FILE bytes of UTF-8. Raises ValueError saying what is wrong."""
    try:
        fd = host_files.open_regular(path)
    except host_files.NotAFile as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(
                f"the token file {path} is a symbolic link: give the file itself"
            ) from None
        raise ValueError(f"the token file {path} is not a regular file") from None
    except OSError as exc:
        raise ValueError(f"cannot read the token file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if info.st_size > MAX_TOKEN_FILE:
            raise ValueError(
                f"the token file {path} has {info.st_size:,} bytes: a token file holds one"
                f" line of at most {MAX_TOKEN_FILE:,}"
            )
        data = os.read(fd, MAX_TOKEN_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_TOKEN_FILE:  # it grew after the fstat
        raise ValueError(f"the token file {path} holds more than {MAX_TOKEN_FILE:,} bytes")
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError(f"the token file {path} is not UTF-8 text") from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def requiring_token(app: Any, token: bytes) -> Any:
    """The HTTP app, refusing with 401 every request without ``Authorization: Bearer
    <token>``. The SDK's auth (AuthSettings, TokenVerifier) is OAuth's, with an issuer and
    resource metadata; an operator's static token needs only this constant-time check."""
    expected = b"bearer " + token

    async def checked(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
        # the scheme is case-insensitive (RFC 9110); the token itself is compared exactly
        given = given[:7].lower() + given[7:]
        if hmac.compare_digest(given, expected):
            await app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": UNAUTHORIZED})

    return checked


def closing_kernels(app: Any, kernels: Kernels) -> Any:
    """The HTTP app, with a session's kernel stopped as soon as its client ends the session
    (DELETE with its Mcp-Session-Id) rather than when it has been idle long enough."""

    async def wrapped(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "DELETE":
            await app(scope, receive, send)
            return
        statuses = []

        async def noting_status(message: dict) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])
            await send(message)

        await app(scope, receive, noting_status)
        key = dict(scope["headers"]).get(b"mcp-session-id")
        if key is not None and statuses == [200]:  # the session manager ended that session
            await kernels.close(key.decode("latin-1"))

    return wrapped
