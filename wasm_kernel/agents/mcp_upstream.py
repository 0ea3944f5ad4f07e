"""Upstream MCP servers whose tools code in the sandbox calls (code mode).

``python -m wasm_kernel mcp --upstream FILE`` reads FILE in the format MCP clients use,
``{"mcpServers": {NAME: {"command": ..., "args": [...], "env": {...}, "cwd": ...}}}`` (or
``{"url": ...}`` for a streamable HTTP server), connects to each server with the official SDK's
client while the MCP server runs, and turns each of their tools into a ``HostTool``: inside the
sandbox it is a function of ``sandbox_tools`` whose signature comes from the tool's input
schema (required properties first, the others keyword-only) and whose docstring is its
description. A model can then write code that calls them in loops, and only what the code
prints comes back into its context. The tools run in this process (the MCP server), which
the operator trusts; the kernels only ever see their arguments and results.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from ..files.host_files import open_regular
from .tools import HostTool, ToolError, check_declaration, check_name, tools_of

CONFIG_LIMIT = 1 << 20  # bytes of the configuration file
SCHEMA_DEPTH = 4  # nesting of a schema written out as an annotation
_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "null": "None",
    "object": "dict",
    "array": "list",
}


class UpstreamError(ValueError):
    """The upstream configuration cannot be used: the reason names the file or server."""


def read_config(path: str) -> dict[str, dict[str, Any]]:
    """The ``mcpServers`` of a configuration file, each checked."""
    try:
        fd = open_regular(Path(path).expanduser())  # not a link, FIFO or device
    except OSError as exc:
        raise UpstreamError(f"cannot read {path}: {exc}") from None
    with os.fdopen(fd, "rb") as file:
        raw = file.read(CONFIG_LIMIT + 1)
    if len(raw) > CONFIG_LIMIT:
        raise UpstreamError(f"{path} is larger than {CONFIG_LIMIT:,} bytes")
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise UpstreamError(f"{path} is not JSON: {exc}") from None
    servers = config.get("mcpServers") if isinstance(config, dict) else None
    if not isinstance(servers, dict) or not servers:
        raise UpstreamError(f'{path} must hold {{"mcpServers": {{NAME: {{...}}, ...}}}}')
    for name, spec in servers.items():
        if not isinstance(spec, dict) or not (
            isinstance(spec.get("command"), str) or isinstance(spec.get("url"), str)
        ):
            raise UpstreamError(f"server {name!r} in {path} needs a 'command' or a 'url'")
        if not isinstance(spec.get("args", []), list) or not isinstance(spec.get("env", {}), dict):
            raise UpstreamError(f"server {name!r} in {path}: 'args' is a list, 'env' an object")
    return servers


async def connect(stack: contextlib.AsyncExitStack, name: str, spec: dict[str, Any]) -> Any:
    """An initialized SDK client session to one upstream server, closed with ``stack``."""
    from mcp.client.session import ClientSession

    if "command" in spec:
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(
            command=spec["command"],
            args=[str(arg) for arg in spec.get("args", [])],
            env={str(k): str(v) for k, v in spec.get("env", {}).items()} or None,
            cwd=spec.get("cwd"),
        )
        read, write = await stack.enter_async_context(stdio_client(params))
    else:
        from mcp.client.streamable_http import streamable_http_client

        read, write = (await stack.enter_async_context(streamable_http_client(spec["url"])))[:2]
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session


async def upstream_tools(stack: contextlib.AsyncExitStack, path: str) -> dict[str, HostTool]:
    """Every tool of every server ``path`` names, connected for as long as ``stack`` is open.
    Two servers offering the same name is an error: a model must know which it calls."""
    tools: dict[str, HostTool] = {}
    for server, spec in read_config(path).items():
        try:
            session = await connect(stack, server, spec)
            listed = (await session.list_tools()).tools
        except Exception as exc:
            raise UpstreamError(f"upstream server {server!r}: {exc}") from exc
        for tool in listed:
            made = schema_tool(session, tool, server)
            if made.name in tools:
                raise UpstreamError(f"two upstream servers offer a tool named {made.name!r}")
            tools[made.name] = made
    return tools_of(tools)


def annotation(schema: Any, depth: int = 0) -> str:
    """A JSON schema as the Python annotation a reader expects (``list[str]``, ``int | None``)."""
    if not isinstance(schema, dict) or depth > SCHEMA_DEPTH:
        return "Any"
    if "enum" in schema and isinstance(schema["enum"], list):
        return f"Literal[{', '.join(json.dumps(value) for value in schema['enum'][:20])}]"
    for union in ("anyOf", "oneOf"):
        if isinstance(schema.get(union), list):
            return " | ".join(dict.fromkeys(annotation(item, depth + 1) for item in schema[union]))
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_TYPES.get(item, "Any") for item in kind if isinstance(item, str))
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"list[{annotation(schema['items'], depth + 1)}]"
    return _TYPES.get(kind, "Any") if isinstance(kind, str) else "Any"


def schema_tool(session: Any, tool: Any, server: str) -> HostTool:
    """One upstream tool as a HostTool that calls it through ``session``."""
    name = check_name(tool.name.replace("-", "_").replace(".", "_"))
    schema: dict[str, Any] = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    given = schema.get("properties")
    properties: dict[str, Any] = given if isinstance(given, dict) else {}
    required = [key for key in schema.get("required", []) if key in properties]
    parameters = [
        {"name": key, "kind": "POSITIONAL_OR_KEYWORD", "annotation": annotation(properties[key])}
        for key in required
    ]
    for key, item in properties.items():
        if key not in required:
            default = (
                repr(item["default"]) if isinstance(item, dict) and "default" in item else "..."
            )
            parameters.append(
                {
                    "name": key,
                    "kind": "KEYWORD_ONLY",
                    "annotation": annotation(item),
                    "default": default,
                }
            )
    described = [
        f"    {key}: {item['description']}"
        for key, item in properties.items()
        if isinstance(item, dict) and isinstance(item.get("description"), str)
    ]
    doc = (tool.description or "").strip()
    if described:
        doc += "\n\nArguments:\n" + "\n".join(described)
    doc += f"\n\n(The tool {tool.name!r} of the MCP server {server!r}.)"
    declaration: dict[str, Any] = {"doc": doc.strip(), "parameters": parameters}
    if isinstance(tool.output_schema, dict):
        declaration["returns"] = _returns(tool.output_schema)
    declaration = check_declaration(name, declaration)
    wrapped = _wraps_result(tool.output_schema)

    async def invoke(arguments: dict[str, Any]) -> Any:
        result = await session.call_tool(tool.name, _jsonable(arguments))
        return value_of(result, wrapped)

    return HostTool(name, declaration, invoke, is_async=True, schema=schema)


def _returns(output_schema: dict[str, Any]) -> str:
    if _wraps_result(output_schema):
        return annotation(output_schema["properties"]["result"])
    return annotation(output_schema)


def _wraps_result(output_schema: Any) -> bool:
    """The SDK's servers wrap a result that is not an object as ``{"result": VALUE}``."""
    if not isinstance(output_schema, dict):
        return False
    properties = output_schema.get("properties")
    return isinstance(properties, dict) and list(properties) == ["result"]


def _jsonable(value: Any) -> Any:
    """Arguments for an MCP server: bytes as base64 text (MCP arguments are plain JSON)."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    return value


def value_of(result: Any, wrapped: bool) -> Any:
    """An MCP tool result as a Python value: its structured content if any (unwrapped), else
    its text (one block: the text; several: a list), images and blobs as bytes. A result
    marked as an error raises ToolError with its text."""
    blocks = []
    for block in result.content:
        if block.type == "text":
            blocks.append(block.text)
        elif block.type in ("image", "audio"):
            blocks.append(base64.b64decode(block.data))
        elif block.type == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            blocks.append(text if text is not None else base64.b64decode(resource.blob))
        else:
            blocks.append(str(getattr(block, "uri", block.type)))
    if result.is_error:
        raise ToolError(" ".join(str(block) for block in blocks) or "the tool failed")
    structured = result.structured_content
    if structured is not None:
        return structured["result"] if wrapped and "result" in structured else structured
    return blocks[0] if len(blocks) == 1 else blocks


def describe(tools: dict[str, HostTool]) -> list[dict[str, Any]]:
    """The sandbox's tools as a model reads them: Python signature, description, schema."""
    from ..guest.modules._wasm_kernel_tools import _signature

    return [
        {
            "name": name,
            "signature": f"{name}{_signature(tool.declaration)}",
            "description": tool.declaration.get("doc", ""),
            "input_schema": tool.schema,
        }
        for name, tool in tools.items()
    ]
