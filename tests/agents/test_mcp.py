"""``python -m wasm_kernel mcp`` driven by the MCP SDK's own client over stdio.

The server is started as an agent host would start it (a subprocess speaking JSON-RPC on
its stdin and stdout), with its limits on the command line; the checks are what the model
gets back: text, images, files, errors, and that it cannot change a limit.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psutil
import pytest
from wheelmaker import make_wheel

mcp = pytest.importorskip("mcp")
from mcp.client.session import ClientSession  # noqa: E402 (after the skip)
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

PNG = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"  # an inline figure


def serve(
    arguments: list[str], check: Callable[[ClientSession], Awaitable[None]], errlog: Any = None
) -> None:
    """Start the server with ``arguments``, connect the SDK's client, run ``check``; the
    server's stderr goes to ``errlog`` (the client shows it to its user: default stderr)."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "wasm_kernel", "mcp", *arguments]
    )

    async def main() -> None:
        async with (
            stdio_client(params, errlog=errlog or sys.stderr) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await check(session)

    asyncio.run(main())


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


def test_tools_are_listed_without_any_setting_a_model_could_change() -> None:
    async def check(session: ClientSession) -> None:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == {"run_python", "list_files", "upload_file", "download_file", "reset"}
        parameters = {
            name for tool in tools.values() for name in tool.input_schema.get("properties", {})
        }
        assert parameters <= {"code", "path", "content", "encoding", "sandbox"}

    serve([], check)


def test_the_server_writes_only_warnings_to_the_client_s_terminal() -> None:
    """MCP clients show a stdio server's stderr to their user: a session that lists the
    tools and runs a cell writes nothing there; ``--log-level DEBUG`` shows what it does."""

    async def check(session: ClientSession) -> None:
        await session.list_tools()
        assert text_of(await session.call_tool("run_python", {"code": "6 * 7"})) == "42"

    shown = []
    for arguments in ([], ["--log-level", "DEBUG"]):
        with tempfile.TemporaryFile("w+") as errlog:
            serve(arguments, check, errlog)
            errlog.seek(0)
            shown.append(errlog.read())
    quiet, detailed = shown
    assert quiet == "", quiet
    assert "DEBUG" in detailed, detailed


@pytest.mark.slow
def test_run_python_keeps_state_and_returns_text_and_images() -> None:
    async def check(session: ClientSession) -> None:
        first = await session.call_tool("run_python", {"code": "x = 20\nprint('hi')\nx * 2"})
        assert not first.is_error
        assert text_of(first) == "hi\n\n40"
        figure = await session.call_tool("run_python", {"code": PNG})
        images = [block for block in figure.content if block.type == "image"]
        assert len(images) == 1 and images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG")
        table = await session.call_tool(
            "run_python",
            {"code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"},
        )
        assert text_of(table).split() == ["a", "b", "0", "1", "x", "1", "2", "y"]
        error = await session.call_tool("run_python", {"code": "1 / 0"})
        assert "ZeroDivisionError" in text_of(error) and "\x1b[" not in text_of(error)
        assert text_of(await session.call_tool("run_python", {"code": "x"})) == "20"

    serve([], check)


@pytest.mark.slow
def test_limits_come_from_the_command_line() -> None:
    async def check(session: ClientSession) -> None:
        result = await session.call_tool("run_python", {"code": "while True: pass"})
        assert "TimeLimitExceeded" in text_of(result)
        after = await session.call_tool("run_python", {"code": "'still here'"})
        assert text_of(after) == "'still here'"
        banner = await session.call_tool("run_python", {"code": "%sandbox"})
        assert "time 1.5 s" in text_of(banner) and "Profile: strict" in text_of(banner)

    serve(["--set", "time_limit=1.5", "--set", "interrupt_grace=0.5"], check)


@pytest.mark.slow
def test_files_go_in_and_out() -> None:
    async def check(session: ClientSession) -> None:
        wrote = await session.call_tool(
            "upload_file", {"path": "/tmp/notes.txt", "content": "héllo\n"}
        )
        assert not wrote.is_error, text_of(wrote)
        binary = bytes(range(256))
        await session.call_tool(
            "upload_file",
            {
                "path": "/tmp/b.bin",
                "content": base64.b64encode(binary).decode(),
                "encoding": "base64",
            },
        )
        read = await session.call_tool("run_python", {"code": "open('/tmp/notes.txt').read()"})
        assert text_of(read) == "'héllo\\n'"
        listing = (await session.call_tool("list_files", {"path": "/tmp"})).structured_content
        entries = {entry["name"]: entry["size"] for entry in listing["result"]}
        assert entries == {"notes.txt": len("héllo\n".encode()), "b.bin": 256}
        text = await session.call_tool("download_file", {"path": "/tmp/notes.txt"})
        assert text.structured_content == {
            "path": "/tmp/notes.txt",
            "encoding": "utf-8",
            "content": "héllo\n",
        }
        raw = (await session.call_tool("download_file", {"path": "/tmp/b.bin"})).structured_content
        assert raw["encoding"] == "base64" and base64.b64decode(raw["content"]) == binary
        outside = await session.call_tool("download_file", {"path": "/etc/passwd"})
        assert outside.is_error and "FileNotFoundError" in text_of(outside)
        readonly = await session.call_tool(
            "upload_file", {"path": "/usr/local/lib/x.py", "content": ""}
        )
        assert readonly.is_error
        await session.call_tool("run_python", {"code": "kept = 1"})
        await session.call_tool("reset", {})
        gone = await session.call_tool("run_python", {"code": "kept"})
        assert "NameError" in text_of(gone)
        assert (await session.call_tool("list_files", {})).structured_content == {"result": []}

    serve([], check)


def kernels_under(pid: int) -> list[psutil.Process]:
    """Live kernel processes below `pid`; one that has exited (a zombie not yet reaped) is gone."""
    kernels = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            command = child.cmdline()
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
        if "wasm_kernel" in " ".join(command) and "-f" in command:
            kernels.append(child)
    return kernels


@pytest.mark.slow
def test_the_kernel_ends_with_the_session() -> None:
    """The server's kernel is its child; when the client closes stdio, both are gone."""
    kernels: list[psutil.Process] = []

    async def check(session: ClientSession) -> None:
        await session.call_tool("run_python", {"code": "1"})
        kernels.extend(kernels_under(os.getpid()))
        assert len(kernels) == 1

    serve([], check)
    _, alive = psutil.wait_procs(kernels, timeout=20)
    assert not alive, "the kernel outlived its MCP session"


def test_an_unknown_setting_stops_the_server_with_a_reason() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "mcp", "--set", "fule=1"],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert "unknown setting 'fule'" in result.stderr


@pytest.mark.slow
def test_a_refused_value_is_the_tool_s_error() -> None:
    async def check(session: ClientSession) -> None:
        result = await session.call_tool("run_python", {"code": "1"})
        assert result.is_error
        assert "InvalidSetting" in text_of(result) and "memory_limit" in text_of(result)

    serve(["--set", "memory_limit=1"], check)


@pytest.mark.slow
def test_list_files_result_is_json_serialisable() -> None:
    """Structured content is what a host forwards to the model as JSON."""

    async def check(session: ClientSession) -> None:
        await session.call_tool("run_python", {"code": "import os; os.mkdir('/tmp/d')"})
        listing = await session.call_tool("list_files", {})
        json.dumps(listing.structured_content)
        assert listing.structured_content == {"result": [{"name": "d", "is_dir": True, "size": 0}]}

    serve([], check)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "the HTTP server did not start"
            time.sleep(0.2)


@pytest.mark.slow
def test_streamable_http_gives_each_session_its_own_kernel() -> None:
    from mcp.client.streamable_http import streamable_http_client

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "wasm_kernel", "mcp", "--transport", "streamable-http"]
        + ["--port", str(port)],
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"

    async def main() -> None:
        async with streamable_http_client(url) as (r1, w1), ClientSession(r1, w1) as one:
            await one.initialize()
            assert text_of(await one.call_tool("run_python", {"code": "x = 1\nx"})) == "1"
            async with streamable_http_client(url) as (r2, w2), ClientSession(r2, w2) as two:
                await two.initialize()
                assert "NameError" in text_of(await two.call_tool("run_python", {"code": "x"}))
                assert len(kernels_under(server.pid)) == 2
            # the second client ended its session: its kernel is gone, the first one's stays
            deadline = time.monotonic() + 20
            while len(kernels_under(server.pid)) != 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert len(kernels_under(server.pid)) == 1
            assert text_of(await one.call_tool("run_python", {"code": "x + 1"})) == "2"

    try:
        wait_for_port(port)
        asyncio.run(main())
    finally:
        kernels = kernels_under(server.pid)
        server.terminate()
        server.wait(timeout=30)
        _, alive = psutil.wait_procs(kernels, timeout=20)
        assert not alive, "kernels outlived the server"


@pytest.mark.slow
def test_snapshot_restore_and_install_where_the_operator_allows_them(tmp_path) -> None:
    house = tmp_path / "wheelhouse"
    house.mkdir()
    make_wheel(house, "wkm-tool", files={"wkm_tool.py": "WORD = 'installed'\n"})

    async def check(session: ClientSession) -> None:
        tools = {tool.name for tool in (await session.list_tools()).tools}
        assert {"snapshot", "restore", "install_packages"} <= tools
        installed = await session.call_tool("install_packages", {"requirements": ["wkm-tool"]})
        assert not installed.is_error, text_of(installed)
        await session.call_tool("run_python", {"code": "import wkm_tool; n = 1"})
        saved = await session.call_tool("snapshot", {"name": "one"})
        assert not saved.is_error, text_of(saved)
        await session.call_tool("run_python", {"code": "n = 2"})
        assert not (await session.call_tool("restore", {"name": "one"})).is_error
        after = await session.call_tool("run_python", {"code": "wkm_tool.WORD, n"})
        assert text_of(after) == "('installed', 1)"
        missing = await session.call_tool("restore", {"name": "absent"})
        assert missing.is_error and "there is no snapshot named 'absent'" in text_of(missing)
        refused = await session.call_tool("install_packages", {"requirements": ["wkm-absent"]})
        assert refused.is_error and "wkm-absent" in text_of(refused)

    serve(
        ["--set", "snapshots=yes", "--set", f"snapshot_dir={tmp_path / 'images'}"]
        + ["--set", f"packages={house}"],
        check,
    )


@pytest.mark.slow
def test_a_forked_sandbox_goes_its_own_way(tmp_path) -> None:
    """fork_sandbox starts a second kernel from the first one's state; each tool takes the
    sandbox to act in; forks count against --max-sessions and end with the session."""
    kernels: list[psutil.Process] = []
    same = "state.tolist(), open('/tmp/note.txt').read()"

    async def check(session: ClientSession) -> None:
        tools = {tool.name for tool in (await session.list_tools()).tools}
        assert {"fork_sandbox", "close_sandbox", "list_sandboxes"} <= tools
        setup = "import numpy as np\nstate = np.arange(5)\nopen('/tmp/note.txt', 'w').write('a')"
        assert not (await session.call_tool("run_python", {"code": setup})).is_error
        forked = await session.call_tool("fork_sandbox", {"name": "try-b"})
        assert not forked.is_error, text_of(forked)
        kernels.extend(kernels_under(os.getpid()))
        assert len(kernels) == 2
        change = {"code": "state[0] = 9", "sandbox": "try-b"}
        assert not (await session.call_tool("run_python", change)).is_error
        wrote = {"path": "/tmp/note.txt", "content": "b", "sandbox": "try-b"}
        assert not (await session.call_tool("upload_file", wrote)).is_error
        main = await session.call_tool("run_python", {"code": same})
        assert text_of(main) == "([0, 1, 2, 3, 4], 'a')"
        fork = await session.call_tool("run_python", {"code": same, "sandbox": "try-b"})
        assert text_of(fork) == "([9, 1, 2, 3, 4], 'b')"
        listed = await session.call_tool("list_sandboxes", {})
        assert listed.structured_content == {"result": ["main", "try-b"]}

        async def refused(tool: str, arguments: dict, reason: str) -> None:
            result = await session.call_tool(tool, arguments)
            assert result.is_error and reason in text_of(result), text_of(result)

        await refused("fork_sandbox", {"name": "try-b"}, "there is a sandbox 'try-b' already")
        await refused("fork_sandbox", {"name": "../up"}, "a sandbox name is 1 to 64 letters")
        await refused("fork_sandbox", {"name": "try-c"}, "already runs its 2 kernels")
        await refused("run_python", {"code": "1", "sandbox": "nope"}, "there is no sandbox 'nope'")
        await refused("close_sandbox", {"name": "main"}, "'main' ends with the session")
        closed = await session.call_tool("close_sandbox", {"name": "try-b"})
        assert not closed.is_error, text_of(closed)
        await refused("run_python", {"code": "1", "sandbox": "try-b"}, "there is no sandbox")
        assert text_of(await session.call_tool("run_python", {"code": "int(state[0])"})) == "0"

    images = f"snapshot_dir={tmp_path / 'images'}"
    serve(["--set", "snapshots=yes", "--set", images, "--max-sessions", "2"], check)
    _, alive = psutil.wait_procs(kernels, timeout=20)
    assert not alive, "a sandbox outlived its MCP session"


TOKEN = "a-test-token-0123456789"


@pytest.mark.slow
def test_streamable_http_requires_the_operator_s_token(tmp_path) -> None:
    """Every request needs the bearer token: none or a wrong one is refused (401), before
    any kernel starts; the right one works."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "wasm_kernel", "mcp", "--transport", "streamable-http"]
        + ["--port", str(port), "--token-file", str(token_file)],
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"

    async def connect(headers: dict[str, str]) -> str:
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return text_of(await session.call_tool("run_python", {"code": "6 * 7"}))

    async def main() -> None:
        for headers in ({}, {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": TOKEN}):
            with pytest.raises(Exception) as refused:
                await asyncio.wait_for(connect(headers), 60)
            assert refused.group_contains(MCPError, match="error response", depth=None)
            async with httpx2.AsyncClient(headers=headers) as http:
                response = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert response.status_code == 401
        assert kernels_under(server.pid) == []
        assert await connect({"Authorization": f"Bearer {TOKEN}"}) == "42"

    try:
        wait_for_port(port)
        asyncio.run(main())
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize(
    "arguments, env, reason",
    [
        (["--host", "0.0.0.0"], {}, "reachable from other machines"),
        (["--host", "127.0.0.1"], {"WASM_KERNEL_MCP_TOKEN": "short"}, "at least 16"),
    ],
)
def test_an_exposed_or_weakly_guarded_http_server_does_not_start(
    arguments: list[str], env: dict[str, str], reason: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "mcp", "--transport", "streamable-http"]
        + ["--port", str(free_port()), *arguments],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "WASM_KERNEL_MCP_TOKEN": "", **env},
    )
    assert result.returncode == 2, result.stderr
    assert reason in result.stderr


# -- what the model reads back ----------------------------------------------------------------


@pytest.mark.slow
def test_results_say_what_failed_and_nothing_more() -> None:
    """An upload's failure carries its reason; a cell that raised is an error result with its
    traceback; a figure alone comes without "[no output]"; the server names its version."""
    from wasm_kernel import __version__

    async def check(session: ClientSession) -> None:
        assert session.server_info is not None
        assert session.server_info.version == __version__
        readonly = await session.call_tool(
            "upload_file", {"path": "/usr/local/lib/x.py", "content": "x"}
        )
        assert readonly.is_error
        assert "cannot write /usr/local/lib/x.py" in text_of(readonly), text_of(readonly)
        garbled = await session.call_tool(
            "upload_file", {"path": "/tmp/x", "content": "not base64!", "encoding": "base64"}
        )
        assert garbled.is_error and "content is not valid base64" in text_of(garbled)
        raised = await session.call_tool("run_python", {"code": "print('before')\n1 / 0"})
        assert raised.is_error
        assert text_of(raised).startswith("before\n")
        assert "Traceback" in text_of(raised) and "ZeroDivisionError" in text_of(raised)
        assert "[error]" not in text_of(raised)
        figure = await session.call_tool("run_python", {"code": PNG})
        assert not figure.is_error
        assert [block.type for block in figure.content] == ["image"], text_of(figure)
        empty = await session.call_tool("run_python", {"code": "x = 1"})
        assert not empty.is_error and text_of(empty) == "[no output]"

    serve([], check)


# -- the HTTP server's sessions -----------------------------------------------------------------


def start_http(*arguments: str) -> tuple[subprocess.Popen[str], str, str]:
    """The HTTP server on a free port, its URL, and the first line it printed (its stderr
    goes to a file, which nothing has to keep draining)."""
    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "wasm_kernel", "mcp", "--transport", "streamable-http"]
            + ["--port", str(port), *arguments],
            stdin=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )
        wait_for_port(port)
        log.seek(0)
        line = log.readline()
    return server, f"http://127.0.0.1:{port}/mcp", line


def stop_http(server: subprocess.Popen[str]) -> None:
    kernels = kernels_under(server.pid)
    server.terminate()
    server.wait(timeout=30)
    _, alive = psutil.wait_procs(kernels, timeout=20)
    assert not alive, "kernels outlived the server"


def test_the_http_server_says_where_it_listens_and_help_gives_the_defaults() -> None:
    from mcp.client.streamable_http import streamable_http_client

    server, expected, line = start_http()
    try:
        url = line.split()[-1]
        assert url == expected, line

        async def main() -> None:
            async with (
                streamable_http_client(url) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                assert "run_python" in {tool.name for tool in (await session.list_tools()).tools}

        asyncio.run(main())
    finally:
        stop_http(server)
    shown = " ".join(
        subprocess.run(
            [sys.executable, "-m", "wasm_kernel", "mcp", "--help"],
            capture_output=True,
            check=True,
            text=True,
        ).stdout.split()
    )
    assert "(default 127.0.0.1)" in shown and "(default 8000)" in shown
    assert "http://HOST:PORT/mcp" in shown


@pytest.mark.slow
def test_a_call_in_progress_keeps_its_kernel_past_the_idle_timeout() -> None:
    """A call longer than --idle-timeout (and than the sweep's interval, 30 s before) is a
    session in use: it returns, and the kernel keeps its names. Once idle, the kernel ends."""
    from mcp.client.streamable_http import streamable_http_client

    server, url, _ = start_http("--idle-timeout", "2", "--set", "time_limit=120")

    async def main() -> None:
        async with (
            streamable_http_client(url) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await session.call_tool("run_python", {"code": "kept = 'names'"})
            started = time.monotonic()
            long = await session.call_tool(
                "run_python", {"code": "import time\ntime.sleep(35)\n'slept'"}
            )
            print(f"the long call took {time.monotonic() - started:.1f} s")
            assert not long.is_error and text_of(long) == "'slept'", text_of(long)
            assert text_of(await session.call_tool("run_python", {"code": "kept"})) == "'names'"
            assert len(kernels_under(server.pid)) == 1
            idle_since = time.monotonic()
            while kernels_under(server.pid) and time.monotonic() - idle_since < 30:
                await asyncio.sleep(0.2)
            print(f"the idle kernel ended after {time.monotonic() - idle_since:.1f} s")
            assert kernels_under(server.pid) == []

    try:
        asyncio.run(main())
    finally:
        stop_http(server)


@pytest.mark.slow
def test_expired_sessions_hold_their_place_until_their_kernel_is_gone() -> None:
    """Clients that leave without ending their session (no DELETE) one after another, each
    after its session expired: never more kernels than --max-sessions at once."""
    from mcp.client.streamable_http import streamable_http_client

    server, url, _ = start_http("--idle-timeout", "2", "--max-sessions", "2")
    most = 0

    async def one_client(number: int) -> None:
        nonlocal most
        async with (
            streamable_http_client(url, terminate_on_close=False) as (
                read,
                write,
            ),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool("run_python", {"code": f"{number} * 2"})
            assert text_of(result) == str(number * 2), text_of(result)
            most = max(most, len(kernels_under(server.pid)))

    async def main() -> None:
        nonlocal most
        for number in range(5):
            await one_client(number)
            await asyncio.sleep(2.5)  # past the idle timeout: the SDK ends the session
            most = max(most, len(kernels_under(server.pid)))

    try:
        asyncio.run(main())
    finally:
        stop_http(server)
    print(f"at most {most} kernels at once")
    assert most <= 2


# -- the token file ------------------------------------------------------------------------------


def token_files(tmp_path) -> dict[str, str]:
    good = tmp_path / "token"
    good.write_text(TOKEN + "\n")
    link = tmp_path / "link"
    link.symlink_to(good)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_text("x" * (1 << 20))
    return {
        "link": str(link),
        "fifo": str(fifo),
        "big": str(big),
        "device": "/dev/zero",
        "folder": str(tmp_path),
    }


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("link", "is a symbolic link"),
        ("fifo", "is not a regular file"),
        ("big", "holds one line of at most"),
        ("device", "is not a regular file"),
        ("folder", "is not a regular file"),
    ],
)
def test_a_token_file_that_is_not_a_small_regular_file_is_refused(
    tmp_path, kind: str, reason: str
) -> None:
    """--token-file /dev/zero read without bound, a FIFO blocked the start, a link was
    followed: each is refused at once with the reason."""
    path = token_files(tmp_path)[kind]
    result = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "mcp", "--transport", "streamable-http"]
        + ["--port", str(free_port()), "--token-file", path],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2, result.stderr
    assert reason in result.stderr and path in result.stderr


@pytest.mark.slow
def test_concurrent_forks_never_pass_max_sessions_and_end_with_the_server(tmp_path) -> None:
    """Six fork_sandbox calls at once on one session under --max-sessions 3: two places are
    left, so two forks start and four calls are refused, each before any fork has started;
    never more than three kernels run; none outlives the server."""
    seen: dict[int, psutil.Process] = {}
    most = 0

    async def watch() -> None:
        nonlocal most
        while True:
            alive = kernels_under(os.getpid())
            seen.update((kernel.pid, kernel) for kernel in alive)
            most = max(most, len(alive))
            await asyncio.sleep(0.05)

    async def check(session: ClientSession) -> None:
        assert not (await session.call_tool("run_python", {"code": "x = 1"})).is_error
        watching = asyncio.create_task(watch())
        answered: list[tuple[str, bool, str]] = []

        async def fork(name: str) -> None:
            result = await session.call_tool("fork_sandbox", {"name": name})
            answered.append((name, result.is_error, text_of(result)))

        await asyncio.wait_for(asyncio.gather(*(fork(f"f{n}") for n in range(6))), 150)
        watching.cancel()
        refused = [text for _, error, text in answered if error]
        assert len(refused) == 4, answered
        assert all("already runs its 3 kernels" in text for text in refused), refused
        assert [error for _, error, _ in answered] == [True] * 4 + [False] * 2, answered
        listed = await session.call_tool("list_sandboxes", {})
        assert len(listed.structured_content["result"]) == 3

    images = f"snapshot_dir={tmp_path / 'images'}"
    serve(["--set", "snapshots=yes", "--set", images, "--max-sessions", "3"], check)
    assert most <= 3, f"{most} kernels ran at once"
    # serve() returns once the server process has ended: its kernels have ended with it
    _, alive = psutil.wait_procs(list(seen.values()), timeout=5)
    assert not alive, "a kernel outlived the MCP server"
