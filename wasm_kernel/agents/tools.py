"""Host tools: functions that code in the sandbox calls and that run outside it.

A ``HostTool`` is what both sides need of one tool: its declaration (name, parameters with
their annotations and defaults as text, docstring), which the guest turns into a function of
``sandbox_tools`` with that signature, and ``invoke``, which runs it on the arguments the
guest sent. ``python_tool`` makes one of a Python callable (sync or async), checking its
arguments against its annotations with pydantic, as ``pydantic.validate_call`` does;
``mcp_upstream`` makes them of upstream MCP servers' tools. Values are JSON plus bytes, in
the codec the guest uses (``_wasm_kernel_tools.encode``/``decode``).

The client serves its tools over the stdin channel (``tool_server``); the operator's, named
by ``WasmKernel.tools``, run in the kernel process (``kernel_tools``).
"""

from __future__ import annotations

import importlib
import inspect
import keyword
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..guest.modules._wasm_kernel_tools import encode
from ..install_hints import pip_install

METADATA_KEY = "wasm_kernel"  # the execute_request's metadata key a client declares tools in
REQUEST, REPLY = "tool_request", "tool_reply"  # the stdin channel's messages for a call
MAX_TOOLS = 256
MAX_PARAMETERS = 64
NAME_LIMIT = 128
TEXT_LIMIT = 1000  # characters of an annotation or default as shown
DOC_LIMIT = 16_000  # characters of a docstring
KINDS = (  # inspect.Parameter's kinds, by name
    "POSITIONAL_ONLY",
    "POSITIONAL_OR_KEYWORD",
    "VAR_POSITIONAL",
    "KEYWORD_ONLY",
    "VAR_KEYWORD",
)
RESERVED = ("ToolError", "ToolUnavailable")  # names sandbox_tools has of its own
OPERATOR_TOOL = re.compile(r"^(?:([A-Za-z_]\w*)=)?([A-Za-z_][\w.]*):([A-Za-z_]\w*)$")


class ToolError(Exception):
    """A tool failed in a way of its own (an MCP tool's error result): the guest raises
    ``sandbox_tools.ToolError`` with the message."""


class ToolUnavailable(ToolError):
    """The cell called a tool it is not served: ``sandbox_tools.ToolUnavailable`` in the guest."""


class ToolDeclarationError(ValueError):
    """A tool cannot be offered as declared (a bad name, a signature Python refuses)."""


@dataclass(frozen=True)
class HostTool:
    """One tool: its declaration for the guest and how to run it on the host.
    ``invoke(arguments)`` takes the guest's arguments by parameter name, decoded, and returns
    the value or, for an ``is_async`` tool, an awaitable of it."""

    name: str
    declaration: dict[str, Any]
    invoke: Callable[[dict[str, Any]], Any]
    is_async: bool = False
    schema: dict[str, Any] = field(default_factory=dict)  # the JSON schema of its arguments


def check_name(name: Any) -> str:
    if (
        not isinstance(name, str)
        or not name.isidentifier()
        or keyword.iskeyword(name)
        or name.startswith("_")
        or name in RESERVED
        or len(name) > NAME_LIMIT
    ):
        raise ToolDeclarationError(
            f"a tool's name must be a Python identifier not starting with '_' (at most"
            f" {NAME_LIMIT} characters, not {', '.join(RESERVED)}): {str(name)[:NAME_LIMIT]!r}"
        )
    return name


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 3] + "..."


def python_tool(function: Callable[..., Any], name: str | None = None) -> HostTool:
    """A Python callable as a tool, named ``name`` or by its own name."""
    try:
        from pydantic import ConfigDict, TypeAdapter, ValidationError, validate_call
    except ImportError:
        raise ToolDeclarationError(
            "tools check their arguments with pydantic, which the agents extra installs:"
            f" {pip_install('[agents]')}"
        ) from None
    if not callable(function):
        raise ToolDeclarationError(f"a tool must be callable, not {type(function).__name__}")
    name = check_name(name if name is not None else getattr(function, "__name__", None))
    try:
        signature = inspect.signature(function, eval_str=True)
    except (NameError, SyntaxError, TypeError):
        signature = inspect.signature(function)  # annotations stay as written
    parameters = []
    for parameter in signature.parameters.values():
        item: dict[str, Any] = {"name": parameter.name, "kind": parameter.kind.name}
        if parameter.annotation is not inspect.Parameter.empty:
            item["annotation"] = _shown(inspect.formatannotation(parameter.annotation))
        if parameter.default is not inspect.Parameter.empty:
            item["default"] = _shown(parameter.default)
        parameters.append(item)
    declaration: dict[str, Any] = {"doc": (inspect.getdoc(function) or "")[:DOC_LIMIT]}
    declaration["parameters"] = parameters
    if signature.return_annotation is not inspect.Signature.empty:
        declaration["returns"] = _shown(inspect.formatannotation(signature.return_annotation))
    check_declaration(name, declaration)
    config = ConfigDict(arbitrary_types_allowed=True)
    try:
        checked = validate_call(config=config)(function)
    except Exception as exc:  # pydantic cannot build a check for an annotation
        raise ToolDeclarationError(
            f"tool {name}: its annotations cannot be checked: {exc}"
        ) from None
    is_async = inspect.iscoroutinefunction(inspect.unwrap(function))

    def bound(arguments: dict[str, Any]) -> inspect.BoundArguments:
        unknown = set(arguments) - set(signature.parameters)
        if unknown:
            raise TypeError(f"{name}() got unexpected arguments: {', '.join(sorted(unknown))}")
        return inspect.BoundArguments(signature, dict(arguments))

    names = list(signature.parameters)

    def explained(exc: ValidationError) -> TypeError:
        """pydantic's errors, each naming the parameter (it numbers positional ones: the
        first place of an error's location; later numbers are places in a list)."""
        problems = []
        for error in exc.errors():
            where = list(error["loc"])
            if where and isinstance(where[0], int) and where[0] < len(names):
                where[0] = names[where[0]]
            given = _shown(error.get("input"))[:80]
            problems.append(
                f"{'.'.join(map(str, where)) or 'arguments'}: {error['msg']}, got {given}"
            )
        return TypeError(f"{name}() arguments do not match its annotations: {'; '.join(problems)}")

    def invoke(arguments: dict[str, Any]) -> Any:
        call = bound(arguments)
        try:
            return checked(*call.args, **call.kwargs)
        except ValidationError as exc:
            raise explained(exc) from None

    async def invoke_async(arguments: dict[str, Any]) -> Any:
        """pydantic checks an async function's arguments when its coroutine is awaited."""
        call = bound(arguments)
        try:
            return await checked(*call.args, **call.kwargs)
        except ValidationError as exc:
            raise explained(exc) from None

    try:
        schema = TypeAdapter(function, config=config).json_schema()  # type: ignore[arg-type]
    except Exception:
        schema = {}
    return HostTool(name, declaration, invoke_async if is_async else invoke, is_async, schema)


def check_declaration(name: str, declaration: Any) -> dict[str, Any]:
    """A declaration as the guest needs it (sent by a client: anything), else the reason."""
    from ..guest.modules._wasm_kernel_tools import _signature

    if not isinstance(declaration, dict):
        raise ToolDeclarationError(f"tool {name}: its declaration must be an object")
    doc = declaration.get("doc", "")
    parameters = declaration.get("parameters", [])
    returns = declaration.get("returns")
    if not isinstance(doc, str) or len(doc) > DOC_LIMIT:
        raise ToolDeclarationError(f"tool {name}: doc must be text of at most {DOC_LIMIT:,}")
    if returns is not None and (not isinstance(returns, str) or len(returns) > TEXT_LIMIT):
        raise ToolDeclarationError(f"tool {name}: returns must be short text")
    if not isinstance(parameters, list) or len(parameters) > MAX_PARAMETERS:
        raise ToolDeclarationError(f"tool {name}: at most {MAX_PARAMETERS} parameters")
    kept = []
    for item in parameters:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ToolDeclarationError(f"tool {name}: each parameter must be an object")
        if not item["name"].isidentifier() or keyword.iskeyword(item["name"]):
            raise ToolDeclarationError(f"tool {name}: bad parameter name {item['name'][:64]!r}")
        if item.get("kind", KINDS[1]) not in KINDS:
            raise ToolDeclarationError(f"tool {name}: a parameter's kind must be one of {KINDS}")
        for key in ("annotation", "default"):
            if key in item and (not isinstance(item[key], str) or len(item[key]) > TEXT_LIMIT):
                raise ToolDeclarationError(f"tool {name}: a parameter's {key} must be short text")
        kept.append(
            {key: item[key] for key in ("name", "kind", "annotation", "default") if key in item}
        )
    checked: dict[str, Any] = {"doc": doc, "parameters": kept}
    if returns is not None:
        checked["returns"] = returns
    try:
        _signature(checked)
    except (ValueError, TypeError) as exc:
        raise ToolDeclarationError(f"tool {name}: {exc}") from None
    return checked


def catalogue(tools: Mapping[str, HostTool]) -> dict[str, dict[str, Any]]:
    return {name: tool.declaration for name, tool in tools.items()}


def tools_of(given: Any) -> dict[str, HostTool]:
    """What ``Session(tools=...)`` takes: callables, HostTools, or a mapping name -> either."""
    if given is None:
        return {}
    if isinstance(given, HostTool) or callable(given):
        given = [given]
    items: Iterable[tuple[str | None, Any]]
    items = given.items() if isinstance(given, Mapping) else ((None, item) for item in given)
    tools: dict[str, HostTool] = {}
    for name, item in items:
        tool = item if isinstance(item, HostTool) else python_tool(item, name)
        if name is not None and tool.name != name:
            tool = HostTool(name, tool.declaration, tool.invoke, tool.is_async, tool.schema)
        if tool.name in tools:
            raise ToolDeclarationError(f"two tools are named {tool.name!r}")
        tools[check_name(tool.name)] = tool
    if len(tools) > MAX_TOOLS:
        raise ToolDeclarationError(f"at most {MAX_TOOLS} tools")
    return tools


def operator_tools(specs: Iterable[str]) -> dict[str, HostTool]:
    """``WasmKernel.tools``: ``[NAME=]module:function`` each, imported now (in the kernel
    process, which the operator trusts); raises ToolDeclarationError saying which failed."""
    found: dict[str, Any] = {}
    for spec in specs:
        match = OPERATOR_TOOL.match(spec.strip())
        if match is None:
            raise ToolDeclarationError(f"{spec!r} is not [NAME=]module:function")
        name, module_name, attribute = match.groups()
        try:
            function = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise ToolDeclarationError(f"{spec!r} cannot be imported: {exc}") from None
        found[name or attribute] = function
    return tools_of(found)


def reply_of(value: Any) -> dict[str, Any]:
    """A tool's value as the reply the guest reads: encoded, or why it cannot be."""
    try:
        return {"value": encode(value)}
    except (TypeError, ValueError) as exc:
        return failure(TypeError(f"the tool's result cannot be sent: {exc}"))


def failure(exc: BaseException) -> dict[str, Any]:
    """A tool's exception as the guest raises it: its type's name and its message."""
    return {"error": {"ename": type(exc).__name__, "evalue": str(exc)[:DOC_LIMIT]}}
