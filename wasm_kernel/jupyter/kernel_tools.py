"""The kernel's side of host tools: which tools a cell has, and carrying its calls.

A cell's tools are the operator's (``WasmKernel.tools``, run here, in the kernel process) and
those its client declares in the execute_request's metadata, ``{"wasm_kernel": {"tools":
{NAME: DECLARATION}}}``. A client's tool is called the way ``input()`` asks: a
``tool_request`` on the stdin channel to that client, answered by a ``tool_reply`` carrying
the same ``call_id``. Every wait ends when the cell is interrupted or reaches its time limit:
it costs the guest no fuel (it runs nothing) and counts against the time limit. A client
that declared no tools (JupyterLab, nbclient) is never asked: the guest gets a clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..agents.tools import (
    MAX_TOOLS,
    METADATA_KEY,
    OPERATOR_TOOL,
    REPLY,
    REQUEST,
    HostTool,
    ToolDeclarationError,
    ToolUnavailable,
    catalogue,
    check_declaration,
    check_name,
    failure,
    reply_of,
)
from ..guest.modules import _wasm_kernel_contract as declared
from ..guest.modules._wasm_kernel_tools import MAX_DEPTH, decode, too_deep
from .execute_request import Request

if TYPE_CHECKING:
    from ..sandbox.interrupts import Interrupts

POLL = 0.02  # seconds between checks for an interrupt while a tool runs
RESULT_LIMIT = declared.TOOL_RESULT_LIMIT  # bytes of JSON of a tool's result
INTERRUPTED = {"interrupted": True}
log = logging.getLogger(__name__)


def not_served(name: str, error: str | None) -> dict[str, Any]:
    why = (
        f"the client's tool declarations were refused: {error}"
        if error
        else "its client serves no tools (wasm_kernel.client's Session(tools=...) and the MCP"
        " server's upstream tools do; JupyterLab and nbclient do not) and the operator's"
        " WasmKernel.tools has none of that name"
    )
    return failure(ToolUnavailable(f"{name}() is not available to this cell: {why}"))


@dataclass(frozen=True)
class CellTools:
    """The tools one execute_request has: name -> declaration, who serves each."""

    declarations: dict[str, dict[str, Any]]
    from_client: frozenset[str]
    digest: str
    error: str | None = None  # why the client's declarations were refused


class KernelTools:
    """The kernel's door for ``tools`` and ``tool`` messages (one per kernel)."""

    def __init__(self, operator: dict[str, HostTool]):
        self.operator = operator
        self._cell: tuple[str, CellTools] | None = None  # the last request's, by msg_id
        self._threads: ThreadPoolExecutor | None = None  # the operator's tools run there

    def of(self, request: Request) -> CellTools:
        msg_id = request.parent.get("header", {}).get("msg_id", "")
        if self._cell is None or self._cell[0] != msg_id:
            self._cell = (msg_id, self._declared(request.parent))
        return self._cell[1]

    def _declared(self, parent: dict) -> CellTools:
        declarations = catalogue(self.operator)
        error = None
        metadata = parent.get("metadata")
        given = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
        offered = given.get("tools") if isinstance(given, dict) else None
        client: dict[str, dict[str, Any]] = {}
        try:
            if offered is not None:
                if not isinstance(offered, dict) or len(offered) > MAX_TOOLS:
                    raise ToolDeclarationError(f"tools must be an object of at most {MAX_TOOLS}")
                for name, declaration in offered.items():
                    if check_name(name) in self.operator:
                        raise ToolDeclarationError(f"{name!r} is already an operator's tool")
                    client[name] = check_declaration(name, declaration)
        except ToolDeclarationError as exc:
            error, client = str(exc), {}
        declarations.update(client)
        text = json.dumps(declarations, sort_keys=True).encode()
        digest = hashlib.sha256(text).hexdigest()[:32]
        return CellTools(declarations, frozenset(client), digest, error)

    def catalogue(self, request: Request, digest: str) -> dict[str, Any]:
        """The ``tools`` message: the cell's declarations, unless the guest has them."""
        tools = self.of(request)
        if digest == tools.digest:
            return {"digest": tools.digest}
        return {"digest": tools.digest, "tools": tools.declarations}

    def call(
        self,
        request: Request,
        message: dict,
        interrupts: Interrupts,
        stdin: Callable[[], tuple[Any, Any]],
    ) -> dict[str, Any]:
        """The ``tool`` message: run it here or ask the client; the reply the guest reads."""
        tools, name = self.of(request), message["name"]
        if name in tools.from_client:
            return self._ask_client(request, name, message["arguments"], interrupts, stdin)
        if name in self.operator:
            return self._run_here(self.operator[name], message["arguments"], interrupts)
        return not_served(name, tools.error)

    # -- the operator's tools, in this process --------------------------------------------

    def _run_here(self, tool: HostTool, wire: dict, interrupts: Interrupts) -> dict[str, Any]:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(4, thread_name_prefix="wasm-kernel-tool")
        future: Future = self._threads.submit(_run, tool, wire)
        while not wait_for([future], timeout=POLL).done:
            if interrupts.take():
                future.cancel()  # a sync tool already running goes on; its result is dropped
                return INTERRUPTED
        try:
            return _bounded(reply_of(future.result()))
        except Exception as exc:
            return failure(exc)

    # -- a client's tools, over the stdin channel ------------------------------------------

    def _ask_client(
        self,
        request: Request,
        name: str,
        wire: dict,
        interrupts: Interrupts,
        stdin: Callable[[], tuple[Any, Any]],
    ) -> dict[str, Any]:
        session, socket = stdin()
        call_id = uuid.uuid4().hex
        content = {"call_id": call_id, "name": name, "arguments": wire}
        session.send(socket, REQUEST, content, request.parent, ident=request.stdin_ident)
        while True:
            if interrupts.take():
                return INTERRUPTED
            if not socket.poll(int(POLL * 1000)):
                continue
            try:  # the content is read here, bounded (see _answer)
                idents, reply = session.recv(socket, content=False)
            except Exception as exc:  # a bad signature, a header nested past json's bound
                log.warning("dropped an unreadable message on the stdin channel: %s", exc)
                continue
            if reply is None or reply.get("msg_type") != REPLY or idents != request.stdin_ident:
                continue  # another client's, or a reply to a call that was given up
            raw = bytes(reply["content"])
            if call_id.encode() in raw:  # the id is not guessable: only this call's reply has it
                answer = _answer(raw, call_id)
                if answer is not None:
                    return answer


def for_kernel(kernel: Any) -> KernelTools:
    """The kernel's door, with the operator's tools imported now; a name that cannot be
    imported is a refused setting (every cell says so), not a dead kernel."""
    from ..agents.tools import operator_tools

    try:
        return KernelTools(operator_tools(kernel.tools))
    except ToolDeclarationError as exc:
        why = f"{exc}{_working_folder_hint(kernel.tools)}"
        kernel.refuse_setting("tools", list(kernel.tools), "the configuration", why)
        return KernelTools({})


def _working_folder_hint(specs: list[str]) -> str:
    """Why a tools module beside the notebook is not found: the working folder is the
    notebook's, which the sandbox may write to, so the kernel never imports from it."""
    missing = []
    for spec in specs:
        match = OPERATOR_TOOL.match(spec.strip())
        top = match.group(2).partition(".")[0] if match else ""
        with contextlib.suppress(ImportError, ValueError):
            if top and importlib.util.find_spec(top) is None:
                missing.append(top)
    if not missing:
        return ""
    return (
        ". WasmKernel.tools are imported from the kernel's installed packages and PYTHONPATH,"
        f" never from its working folder ({os.getcwd()}): that is the notebook's folder, which"
        " the sandbox may write to, so it is kept off sys.path on purpose. Install"
        f" {', '.join(missing)}, or put its folder on the kernel's PYTHONPATH"
    )


def _run(tool: HostTool, wire: dict) -> Any:
    """One call of an operator's tool, on a worker thread (an async one on a loop of its own)."""
    result = tool.invoke(decode(wire))
    if tool.is_async:
        return asyncio.run(result)
    return result


def _answer(raw: bytes, call_id: str) -> dict[str, Any] | None:
    """A client's tool_reply to call ``call_id``, checked: a value, or an error with text
    (None: it answers another call). Its value is nested at most MAX_DEPTH deep, the bound
    of the values tools exchange: deeper than json can parse is refused too."""
    try:
        content = json.loads(raw)
    except RecursionError:
        return failure(too_deep())
    except ValueError:
        return failure(ValueError("the client's tool_reply is not JSON"))
    if not isinstance(content, dict) or content.get("call_id") != call_id:
        return None
    if content.get("status") == "ok" and "value" in content:
        if _nested_deeper(content["value"], MAX_DEPTH):
            return failure(too_deep())
        return _bounded({"value": content["value"]})
    ename, evalue = content.get("ename"), content.get("evalue")
    if not (isinstance(ename, str) and ename.isidentifier() and len(ename) < 256):
        ename = "ToolError"
    if isinstance(evalue, (dict, list)):  # text is asked for; str() of it could recurse deep
        evalue = "(not text)"
    return {"error": {"ename": ename, "evalue": str(evalue)[:16_000]}}


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` holds anything more than ``limit`` lists or objects deep, as
    ``decode`` counts (found without recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return False


def _bounded(reply: dict[str, Any]) -> dict[str, Any]:
    if "value" in reply:
        size = len(json.dumps(reply["value"]))
        if size > RESULT_LIMIT:
            return failure(
                ValueError(
                    f"the tool's result is too big: {size:,} bytes as JSON, over the bound of"
                    f" {RESULT_LIMIT:,} bytes ({RESULT_LIMIT >> 20} MiB) on a tool's result"
                )
            )
    return reply
