"""Code mode through MCP: ``python -m wasm_kernel mcp --upstream FILE``, driven by the SDK.

The upstream server is written here with the SDK's own ``MCPServer`` and started by the
wasm-kernel server from a configuration file in the format MCP clients use. What the model
sees is checked against the upstream server itself, asked directly with the SDK's client.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

mcp = pytest.importorskip("mcp")
from mcp.client.session import ClientSession  # noqa: E402 (after the skip)
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

UPSTREAM = '''
from mcp.server.mcpserver import MCPServer

server = MCPServer("catalogue")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def lookup(key: str, default: str = "none") -> dict[str, str]:
    """The catalogue's record for ``key``."""
    return {"key": key, "value": key.upper() if key.startswith("k") else default}


@server.tool()
def fail(message: str) -> str:
    """Always fails."""
    raise ValueError(message)


server.run("stdio")
'''
CODE = (
    "from sandbox_tools import add, lookup\n"
    "total = 0\n"
    "for i in range(25):\n"
    "    total = add(total, i)\n"
    "records = [lookup(k) for k in ('k1', 'x', 'k22')]\n"
    "print(json.dumps([total, records]))"
)


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def connected(params: StdioServerParameters, check: Any) -> Any:
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await check(session)


@pytest.mark.slow
def test_code_in_the_sandbox_calls_an_upstream_servers_tools(tmp_path: Path) -> None:
    script = tmp_path / "catalogue.py"
    script.write_text(UPSTREAM)
    upstream = StdioServerParameters(command=sys.executable, args=[str(script)])
    config = tmp_path / "servers.json"
    servers = {"catalogue": {"command": upstream.command, "args": upstream.args}}
    config.write_text(json.dumps({"mcpServers": servers}))
    wasm = StdioServerParameters(
        command=sys.executable, args=["-m", "wasm_kernel", "mcp", "--upstream", str(config)]
    )

    async def direct(session: ClientSession) -> tuple[dict, list]:
        """What the upstream itself says: its schemas, and the loop's result."""
        schemas = {tool.name: tool.input_schema for tool in (await session.list_tools()).tools}
        total = 0
        for i in range(25):
            total = (await session.call_tool("add", {"a": total, "b": i})).structured_content[
                "result"
            ]
        records = [
            (await session.call_tool("lookup", {"key": key})).structured_content
            for key in ("k1", "x", "k22")
        ]
        return schemas, [total, records]

    async def through_the_sandbox(session: ClientSession) -> tuple[dict, Any, Any, Any]:
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"run_python", "list_sandbox_tools"} <= names
        listed = await session.call_tool("list_sandbox_tools", {})
        assert not listed.is_error, text_of(listed)
        tools = {tool["name"]: tool for tool in listed.structured_content["result"]}
        await session.call_tool("run_python", {"code": "import json"})
        ran = await session.call_tool("run_python", {"code": CODE})
        failed = await session.call_tool(
            "run_python", {"code": "from sandbox_tools import fail\nfail('boom')"}
        )
        helped = await session.call_tool("run_python", {"code": "help(add)"})
        return tools, ran, failed, helped

    schemas, expected = asyncio.run(connected(upstream, direct))
    tools, ran, failed, helped = asyncio.run(connected(wasm, through_the_sandbox))
    assert set(tools) == set(schemas)
    for name, tool in tools.items():
        assert tool["input_schema"] == schemas[name]  # the model sees the upstream's schema
    assert tools["add"]["signature"] == "add(a: int, b: int) -> int"
    # optional arguments are keyword-only, with the schema's default
    assert tools["lookup"]["signature"].startswith("lookup(key: str, *, default: str = 'none')")
    assert not ran.is_error, text_of(ran)
    assert json.loads(text_of(ran)) == expected
    assert failed.is_error and "ToolError" in text_of(failed) and "boom" in text_of(failed)
    assert tools["add"]["description"].startswith("Add two integers.")
    assert "add(a: int, b: int) -> int" in text_of(helped)


@pytest.mark.nokernel
def test_a_configuration_without_servers_is_refused(tmp_path: Path) -> None:
    import subprocess

    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"servers": {}}))
    done = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "mcp", "--upstream", str(config)],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2 and "mcpServers" in done.stderr
