"""An MCP server that gives a model a sandboxed Python: ``python -m wasm_kernel mcp``.

Built on the official ``mcp`` SDK (``MCPServer``). Each MCP session gets its own kernel
(an ``AsyncSession``): over stdio the session is the server process, so the kernel lives and
dies with it; over streamable HTTP kernels are kept per ``Mcp-Session-Id`` and shut down
when their session has been idle for ``--idle-timeout`` seconds, and all of them when the
server stops; every HTTP request must carry the operator's bearer token (``--token-file`` or
``WASM_KERNEL_MCP_TOKEN``), which is required unless the server listens on loopback only.
The profile, limits and mounts come from the server's command line: no tool
takes a setting, so the model cannot raise a limit. The ``snapshot``, ``restore`` and
``install_packages`` tools exist only where those settings allow what they do.
"""

import argparse
import asyncio
import base64
import binascii
import contextlib
import hmac
import ipaddress
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from .client import AsyncSession, Execution, SessionError, kernel_arguments
from .profiles import PROFILES
from .settings import TRUE_WORDS

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
MAX_TEXT = 100_000  # characters of one run's text returned to the model; the rest is cut
IDLE_TIMEOUT = 1800.0  # seconds an HTTP session's kernel is kept without requests
SWEEP = 30.0  # seconds between idle checks
MAX_SESSIONS = 8  # HTTP sessions at once: each runs a kernel process (~150 MB)
TOKEN_ENV = "WASM_KERNEL_MCP_TOKEN"
MIN_TOKEN = 16  # characters: shorter tokens can be guessed
UNAUTHORIZED = b'{"error": "unauthorized: this server needs its bearer token"}'
INSTRUCTIONS = (
    "run_python runs code in a persistent, sandboxed CPython 3.15 (WebAssembly): names stay"
    " between calls, numpy, pandas and matplotlib are there, figures come back as images. There"
    " is no network, no processes and no host file beyond what the operator mounted; /tmp is"
    " private and writable. Each call has fuel, time, memory and output limits set by the"
    " operator; a call that hits one ends with an error naming it."
)


@dataclass
class Kernels:
    """The kernels of this server, one per MCP session (key None: the stdio session)."""

    profile: str
    settings: dict[str, Any]
    cwd: str | None = None
    sessions: dict[str | None, AsyncSession] = field(default_factory=dict)
    used: dict[str | None, float] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def get(self, key: str | None) -> AsyncSession:
        async with self._lock:
            self.used[key] = time.monotonic()
            session = self.sessions.get(key)
            if session is None:
                session = self.sessions[key] = await self.start()
            return session

    async def start(self) -> AsyncSession:
        session = AsyncSession(
            self.profile, cwd=self.cwd, kernel_stdout=subprocess.DEVNULL, **self.settings
        )
        await session.start()
        return session

    async def close_idle(self, seconds: float) -> None:
        now = time.monotonic()
        for key in [key for key, when in self.used.items() if now - when > seconds]:
            await self.close(key)

    async def close(self, key: str | None) -> None:
        session = self.sessions.pop(key, None)
        self.used.pop(key, None)
        if session is not None:
            await session.close()

    async def close_all(self) -> None:
        for key in list(self.sessions):
            await self.close(key)

    def allows(self, setting: str) -> bool:
        """Does the kernels' ``snapshots`` or ``packages`` setting allow its tools? From
        ``--set``, else the server's environment, else the profile, as the kernel reads it;
        a value the kernel would refuse allows nothing."""
        value = self.settings.get(setting, os.environ.get(f"WASM_KERNEL_{setting.upper()}"))
        if value is None:
            value = getattr(PROFILES[self.profile], setting)
        if setting == "packages":
            return str(value).strip() not in ("", "off")
        return str(value).strip().lower() in TRUE_WORDS


def content_of(execution: Execution) -> list[Any]:
    """An Execution as MCP content: text for streams, results and errors; images as images."""
    from mcp_types import ImageContent, TextContent

    texts: list[str] = []
    images: list[ImageContent] = []
    if execution.stdout:
        texts.append(execution.stdout)
    if execution.stderr:
        texts.append(f"[stderr]\n{execution.stderr}")
    for bundle in execution.results:
        image = next((mime for mime in IMAGE_TYPES if isinstance(bundle.get(mime), str)), None)
        if image is not None and _is_base64(bundle[image]):
            images.append(ImageContent(type="image", data=bundle[image].strip(), mime_type=image))
        elif isinstance(bundle.get("text/plain"), str):
            texts.append(bundle["text/plain"])
    if execution.error is not None:
        if execution.timed_out:
            texts.append("[the call ran past its time and was interrupted]")
        texts.append(f"[error]\n{execution.error.traceback or execution.error}")
    text = "\n".join(texts) or "[no output]"
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + f"\n[... {len(text) - MAX_TEXT:,} more characters cut]"
    return [TextContent(type="text", text=text), *images]


def _is_base64(data: str) -> bool:
    try:
        base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def build_server(kernels: Kernels, idle_timeout: float = IDLE_TIMEOUT) -> Any:
    """The MCP server with its tools; ``kernels`` supplies one kernel per session."""
    from mcp.server.mcpserver import Context, MCPServer

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[Kernels]:
        sweeper = asyncio.create_task(_sweep(kernels, idle_timeout))
        try:
            yield kernels
        finally:
            sweeper.cancel()
            await kernels.close_all()

    server = MCPServer("wasm-kernel", instructions=INSTRUCTIONS, lifespan=lifespan)

    async def kernel(ctx: Context) -> AsyncSession:
        request = ctx.request_context.request
        key = request.headers.get("mcp-session-id") if request is not None else None
        with reported():
            return await kernels.get(key)

    @server.tool()
    async def run_python(code: str, ctx: Context) -> list[Any]:
        """Run Python code in the sandbox, like a notebook cell: names persist between calls,
        the value of the last line is returned, figures come back as images."""
        session = await kernel(ctx)
        with reported():
            return content_of(await session.run(code))

    @server.tool()
    async def list_files(ctx: Context, path: str = "/tmp") -> list[dict[str, Any]]:
        """List a folder in the sandbox: each entry's name, whether it is a folder, its size."""
        session = await kernel(ctx)
        with reported():
            return await session.files(path)

    @server.tool()
    async def upload_file(
        path: str, content: str, ctx: Context, encoding: Literal["utf-8", "base64"] = "utf-8"
    ) -> str:
        """Write a file in the sandbox (under /tmp, or a folder the operator made writable).
        ``encoding`` is 'utf-8' for text or 'base64' for binary content."""
        data = (
            base64.b64decode(content, validate=True) if encoding == "base64" else content.encode()
        )
        await (await kernel(ctx)).upload(path, data)
        return f"wrote {len(data):,} bytes to {path}"

    @server.tool()
    async def download_file(path: str, ctx: Context) -> dict[str, Any]:
        """Read a file from the sandbox: text as UTF-8, anything else as base64."""
        session = await kernel(ctx)
        with reported():
            data = await session.download(path)
        try:
            return {"path": path, "encoding": "utf-8", "content": data.decode("utf-8")}
        except UnicodeDecodeError:
            return {"path": path, "encoding": "base64", "content": base64.b64encode(data).decode()}

    @server.tool()
    async def reset(ctx: Context) -> str:
        """Start over: a fresh interpreter and an empty /tmp."""
        session = await kernel(ctx)
        with reported():
            await session.reset()
        return "the sandbox was reset: no names, an empty /tmp"

    if kernels.allows("snapshots"):

        @server.tool()
        async def snapshot(name: str, ctx: Context) -> str:
            """Save the sandbox's state (names, /tmp, installed packages) as ``name``, to go
            back to later with restore."""
            session = await kernel(ctx)
            with reported():
                await session.snapshot(name)
            return f"saved snapshot {name!r}"

        @server.tool()
        async def restore(name: str, ctx: Context) -> str:
            """Bring the sandbox back to the state saved as ``name``."""
            session = await kernel(ctx)
            with reported():
                await session.restore(name)
            return f"restored snapshot {name!r}"

    if kernels.allows("packages"):

        @server.tool()
        async def install_packages(requirements: list[str], ctx: Context) -> str:
            """Install pure-Python packages into the sandbox (pip requirements such as
            'tabulate' or 'attrs>=23'), from the package source the operator allows."""
            session = await kernel(ctx)
            with reported():
                await session.install(*requirements)
            return f"installed {', '.join(requirements)}"

    return server


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """Failures the model should read (a missing file, a refused setting) as tool errors;
    the SDK would hide any other exception behind "Error executing tool"."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        yield
    except (SessionError, binascii.Error, ValueError) as exc:
        raise ToolError(str(exc)) from exc


async def _sweep(kernels: Kernels, idle_timeout: float) -> None:
    while True:
        await asyncio.sleep(SWEEP)
        await kernels.close_idle(idle_timeout)


def settings_from(pairs: list[str]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--set takes NAME=VALUE, not {pair!r}")
        settings[name.strip()] = value
    return settings


def add_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--sandbox-profile",
        choices=sorted(PROFILES),
        default="strict",
        metavar="PROFILE",
        help="the kernels' profile (default: strict, which grants no host folder)",
    )
    command.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a kernel setting, repeatable: --set time_limit=30 --set memory_limit=268435456",
    )
    command.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="HOST:GUEST[:ro|rw]",
        help="a host folder for the kernels (notebook profile only), repeatable",
    )
    command.add_argument("--cwd", help="folder the kernels start in (default: this one)")
    command.add_argument(
        "--transport", choices=["stdio", "streamable-http"], default="stdio", help="default: stdio"
    )
    command.add_argument("--host", default="127.0.0.1", help="streamable HTTP address")
    command.add_argument("--port", type=int, default=8000, help="streamable HTTP port")
    command.add_argument(
        "--token-file",
        help=f"streamable HTTP: a file holding the bearer token every request must carry"
        f" (or set {TOKEN_ENV}); required unless --host is a loopback address",
    )
    command.add_argument(
        "--idle-timeout",
        type=float,
        default=IDLE_TIMEOUT,
        help=f"streamable HTTP: seconds before an idle session and its kernel end"
        f" (default {IDLE_TIMEOUT:g})",
    )
    command.add_argument(
        "--max-sessions",
        type=int,
        default=MAX_SESSIONS,
        help=f"streamable HTTP: sessions (so kernels) at once (default {MAX_SESSIONS})",
    )


def serve(args: argparse.Namespace) -> int:
    settings = settings_from(args.set)
    if args.mount:
        settings["mounts"] = args.mount
    kernels = Kernels(args.sandbox_profile, settings, cwd=args.cwd)
    try:  # unknown names are refused now; values by each kernel as it starts
        kernel_arguments(args.sandbox_profile, settings)
    except SessionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        server = build_server(kernels, args.idle_timeout)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "mcp":
            raise
        print(
            "error: the MCP server needs the mcp package: pip install 'wasm-kernel[agents]'",
            file=sys.stderr,
        )
        return 2
    if args.transport == "stdio":
        server.run("stdio")
        return 0
    try:
        token = bearer_token(args.token_file, args.host)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    app = server.streamable_http_app(
        host=args.host, session_idle_timeout=args.idle_timeout, max_sessions=args.max_sessions
    )
    app = closing_kernels(app, kernels)
    if token is not None:
        app = requiring_token(app, token)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def bearer_token(token_file: str | None, host: str) -> bytes | None:
    """The operator's token, from ``token_file`` or the environment; None only on loopback.
    Raises ValueError with the reason when it is missing where it is needed, or weak."""
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as file:
                token = file.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the token file: {exc}") from None
    else:
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
