"""An MCP server that gives a model a sandboxed Python: ``python -m wasm_kernel mcp``.

Built on the official ``mcp`` SDK (``MCPServer``). Each MCP session gets its own kernel
(an ``AsyncSession``, see mcp_kernels.py): over stdio the session is the server process, so
the kernel lives and dies with it; over streamable HTTP kernels are kept per
``Mcp-Session-Id`` and shut down when their session has been idle (no call in progress) for
``--idle-timeout`` seconds, and all of them when the server stops; every HTTP request must
carry the operator's bearer token (``--token-file`` or ``WASM_KERNEL_MCP_TOKEN``, see
mcp_http.py), which is required unless the server listens on loopback only.
The profile, limits and mounts come from the server's command line: no tool
takes a setting, so the model cannot raise a limit. The ``snapshot``, ``restore``,
``fork_sandbox`` (with ``close_sandbox`` and ``list_sandboxes``) and ``install_packages``
tools exist only where those settings allow what they do; every tool acting in a sandbox
takes the name of one (``sandbox``, default ``main``). With
``--upstream FILE`` the tools of other MCP servers become functions inside the sandbox
(``sandbox_tools``, see mcp_upstream.py) and ``list_sandbox_tools`` shows them to the model.
"""

import argparse
import asyncio
import base64
import binascii
import contextlib
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

from .. import __version__
from ..client import AsyncSession, Execution, SessionError, kernel_arguments
from ..install_hints import pip_install
from ..sandbox.metrics import METADATA_KEY
from ..settings.profiles import PROFILES
from .mcp_http import PATH, TOKEN_ENV, bearer_token, closing_kernels, requiring_token, url
from .mcp_kernels import MAIN, MAX_SESSIONS, Kernels
from .mcp_upstream import UpstreamError, describe, read_config, upstream_tools

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
MAX_TEXT = 100_000  # characters of one run's text returned to the model; the rest is cut
IDLE_TIMEOUT = 1800.0  # seconds an HTTP session's kernel is kept without requests
SWEEP = 30.0  # seconds between idle checks at most; a shorter --idle-timeout checks oftener
HOST, PORT = "127.0.0.1", 8000  # where the streamable HTTP server listens by default
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LOG_LEVELS: tuple[LogLevel, ...] = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_LEVEL: LogLevel = "WARNING"  # a stdio server's stderr reaches the client's user
INSTRUCTIONS = (
    "run_python runs code in a persistent, sandboxed CPython 3.15 (WebAssembly): names stay"
    " between calls, numpy, pandas and matplotlib are there, figures come back as images. There"
    " is no network, no processes and no host file beyond what the operator mounted; /tmp is"
    " private and writable. Each call has fuel, time, memory and output limits set by the"
    " operator; a call that hits one ends with an error naming it."
)


def content_of(execution: Execution) -> Any:
    """An Execution as an MCP tool result: text for streams, results and errors, images as
    images; a cell that raised is an error result (``isError``) with its traceback. What the
    cell cost goes in the result's ``_meta`` under ``wasm_kernel``, as in the execute_reply:
    for the agent's host to read, not in the text the model reads."""
    from mcp_types import CallToolResult, ImageContent, TextContent

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
        texts.append(execution.error.traceback or str(execution.error))
    text = "\n".join(texts)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + f"\n[... {len(text) - MAX_TEXT:,} more characters cut]"
    if not text and not images:
        text = "[no output]"
    blocks = [TextContent(type="text", text=text)] if text else []
    meta = None
    if execution.metrics is not None:
        meta = {METADATA_KEY: execution.metrics.as_metadata()}
    return CallToolResult(
        content=[*blocks, *images], is_error=execution.error is not None, _meta=meta
    )


def _is_base64(data: str) -> bool:
    try:
        base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def build_server(
    kernels: Kernels, idle_timeout: float | None = None, log_level: LogLevel = LOG_LEVEL
) -> Any:
    """The MCP server with its tools; ``kernels`` supplies one kernel per session, and with
    an ``idle_timeout`` (HTTP) a sweep stops the kernels of sessions idle that long. Its log
    goes to stderr, which MCP clients show to their user: ``log_level`` and up only."""
    from mcp.server.mcpserver import Context, MCPServer
    from mcp_types import CallToolResult

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[Kernels]:
        sweeper = None
        if idle_timeout is not None:
            sweeper = asyncio.create_task(_sweep(kernels, idle_timeout))
        async with contextlib.AsyncExitStack() as upstream:
            try:
                if kernels.upstream is not None:
                    kernels.tools = await upstream_tools(upstream, kernels.upstream)
                yield kernels
            finally:
                if sweeper is not None:
                    sweeper.cancel()
                await kernels.close_all()

    server = MCPServer(
        "wasm-kernel",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        log_level=log_level,
    )

    timeout = idle_timeout or IDLE_TIMEOUT

    def session_key(ctx: Context) -> str | None:
        request = ctx.request_context.request
        return request.headers.get("mcp-session-id") if request is not None else None

    @contextlib.asynccontextmanager
    async def kernel(ctx: Context, sandbox: str) -> AsyncIterator[AsyncSession]:
        """The caller's sandbox, in use for the whole call; failures reported to the model."""
        with reported():
            async with kernels.use(session_key(ctx), timeout, sandbox) as session:
                yield session

    @server.tool()
    async def run_python(code: str, ctx: Context, sandbox: str = MAIN) -> CallToolResult:
        """Run Python code in the sandbox, like a notebook cell: names persist between calls,
        the value of the last line is returned, figures come back as images."""
        async with kernel(ctx, sandbox) as session:
            return content_of(await session.run(code))

    @server.tool()
    async def list_files(
        ctx: Context, path: str = "/tmp", sandbox: str = MAIN
    ) -> list[dict[str, Any]]:
        """List a folder in the sandbox: each entry's name, whether it is a folder, its size."""
        async with kernel(ctx, sandbox) as session:
            return await session.files(path)

    @server.tool()
    async def upload_file(
        path: str,
        content: str,
        ctx: Context,
        encoding: Literal["utf-8", "base64"] = "utf-8",
        sandbox: str = MAIN,
    ) -> str:
        """Write a file in the sandbox (under /tmp, or a folder the operator made writable).
        ``encoding`` is 'utf-8' for text or 'base64' for binary content."""
        async with kernel(ctx, sandbox) as session:
            if encoding == "base64":
                try:
                    data = base64.b64decode(content, validate=True)
                except binascii.Error as exc:
                    raise ValueError(f"content is not valid base64 ({exc})") from None
            else:
                data = content.encode()
            await session.upload(path, data)
        return f"wrote {len(data):,} bytes to {path}"

    @server.tool()
    async def download_file(path: str, ctx: Context, sandbox: str = MAIN) -> dict[str, Any]:
        """Read a file from the sandbox: text as UTF-8, anything else as base64."""
        async with kernel(ctx, sandbox) as session:
            data = await session.download(path)
        try:
            return {"path": path, "encoding": "utf-8", "content": data.decode("utf-8")}
        except UnicodeDecodeError:
            return {"path": path, "encoding": "base64", "content": base64.b64encode(data).decode()}

    @server.tool()
    async def reset(ctx: Context, sandbox: str = MAIN) -> str:
        """Start over: a fresh interpreter and an empty /tmp."""
        async with kernel(ctx, sandbox) as session:
            await session.reset()
        return "the sandbox was reset: no names, an empty /tmp"

    if kernels.upstream is not None:

        @server.tool()
        async def list_sandbox_tools() -> list[dict[str, Any]]:
            """The functions code in run_python can call (`from sandbox_tools import NAME`):
            each one's Python signature, description and JSON input schema. They are other
            MCP servers' tools: call them from code, in loops and branches, and print only
            what you need to see."""
            return describe(kernels.tools)

    if kernels.allows("snapshots"):

        @server.tool()
        async def snapshot(name: str, ctx: Context, sandbox: str = MAIN) -> str:
            """Save the sandbox's state (names, /tmp, installed packages) as ``name``, to go
            back to later with restore."""
            async with kernel(ctx, sandbox) as session:
                await session.snapshot(name)
            return f"saved snapshot {name!r}"

        @server.tool()
        async def restore(name: str, ctx: Context, sandbox: str = MAIN) -> str:
            """Bring the sandbox back to the state saved as ``name``."""
            async with kernel(ctx, sandbox) as session:
                await session.restore(name)
            return f"restored snapshot {name!r}"

        @server.tool()
        async def fork_sandbox(name: str, ctx: Context, sandbox: str = MAIN) -> str:
            """Start a second sandbox, ``name``, as a copy of ``sandbox`` as it is now (names,
            /tmp, installed packages); from then on each goes its own way, to try two
            approaches from the same state. Pass ``sandbox=name`` to the other tools to use
            it; close_sandbox ends it."""
            with reported():
                await kernels.fork(session_key(ctx), timeout, sandbox, name)
            return f"sandbox {name!r} is a fork of {sandbox!r}"

        @server.tool()
        async def close_sandbox(name: str, ctx: Context) -> str:
            """End a forked sandbox (the main one ends with the session)."""
            with reported():
                await kernels.close_sandbox(session_key(ctx), name)
            return f"sandbox {name!r} is closed"

        @server.tool()
        async def list_sandboxes(ctx: Context) -> list[str]:
            """This session's sandboxes: 'main' and its forks."""
            return kernels.names(session_key(ctx))

    if kernels.allows("packages"):

        @server.tool()
        async def install_packages(
            requirements: list[str], ctx: Context, sandbox: str = MAIN
        ) -> str:
            """Install pure-Python packages into the sandbox (pip requirements such as
            'tabulate' or 'attrs>=23'), from the package source the operator allows."""
            async with kernel(ctx, sandbox) as session:
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
    except (SessionError, ValueError) as exc:
        raise ToolError(str(exc)) from exc


def sweep_interval(idle_timeout: float) -> float:
    """Seconds between idle checks: a kernel outlives its timeout by at most half of it
    (30 s at most between checks, so the default 30 minutes is not checked needlessly)."""
    return min(SWEEP, idle_timeout / 2)


async def _sweep(kernels: Kernels, idle_timeout: float) -> None:
    while True:
        await asyncio.sleep(sweep_interval(idle_timeout))
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
        "--upstream",
        metavar="FILE",
        help="MCP servers whose tools code in the sandbox may call, as functions of the module"
        ' sandbox_tools: a JSON file in the format MCP clients use, {"mcpServers": {NAME:'
        ' {"command": ..., "args": [...]} or {"url": ...}}}; they run here, outside the sandbox',
    )
    command.add_argument(
        "--transport", choices=["stdio", "streamable-http"], default="stdio", help="default: stdio"
    )
    command.add_argument(
        "--host", default=HOST, help=f"streamable HTTP: the address to listen on (default {HOST})"
    )
    command.add_argument(
        "--port",
        type=int,
        default=PORT,
        help=f"streamable HTTP: the port (default {PORT}); clients connect to"
        f" http://HOST:PORT{PATH}",
    )
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
        help=f"kernels at once: sessions and their forked sandboxes (default {MAX_SESSIONS})",
    )
    command.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=LOG_LEVEL,
        help=f"the server's log on stderr, which MCP clients show their user: this level and"
        f" up (default {LOG_LEVEL}; INFO adds a line per request)",
    )


def serve(args: argparse.Namespace) -> int:
    settings = settings_from(args.set)
    if args.mount:
        settings["mounts"] = args.mount
    kernels = Kernels(
        args.sandbox_profile,
        settings,
        cwd=args.cwd,
        max_sessions=args.max_sessions,
        upstream=args.upstream,
    )
    try:  # unknown names are refused now; values by each kernel as it starts
        kernel_arguments(args.sandbox_profile, settings)
        if args.upstream is not None:
            read_config(args.upstream)  # the file now; its servers once the server runs
    except (SessionError, UpstreamError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        http = args.transport != "stdio"
        server = build_server(kernels, args.idle_timeout if http else None, args.log_level)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "mcp":
            raise
        print(
            f"error: the MCP server needs the mcp package, which the agents extra installs:"
            f" {pip_install('[agents]')}",
            file=sys.stderr,
        )
        return 2
    if not http:
        server.run("stdio")
        return 0
    try:
        token = bearer_token(args.token_file, args.host)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    app = server.streamable_http_app(
        streamable_http_path=PATH,
        host=args.host,
        session_idle_timeout=args.idle_timeout,
        max_sessions=args.max_sessions,
    )
    app = closing_kernels(app, kernels)
    if token is not None:
        app = requiring_token(app, token)
    print(f"wasm-kernel MCP server on {url(args.host, args.port)}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower())
    return 0
