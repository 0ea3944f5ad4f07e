"""JupyterLab's visual debugger: the Debug Adapter Protocol as JupyterLab speaks it, over
``debug_request``/``debug_reply`` on the control channel (events: ``debug_event`` on IOPub).

The session's state is the host's (``DebugSession``): a rolled-back cell cannot lose it.
Requests about a stopped cell go to the guest, which waits inside its host call; those the
panel sends while no cell runs (the variables pane) run as a service turn. Cells are named as
ipykernel names them (``_wasm_kernel_cell_files``), so that JupyterLab's gutter breakpoints
land on the code that runs. ``%debug``, ``%pdb`` and ``pdb.set_trace()`` work besides, through
the stdin channel (see the guest's debugging module).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ipykernel.kernelbase import Kernel

from ..guest.modules import _wasm_kernel_cell_files as cell_files
from ..guest.modules import _wasm_kernel_contract as declared
from ..output.active_output import ActiveOutput
from .debug_session import DebugSession, NotStopped

if TYPE_CHECKING:
    from ..sandbox.sandbox import Sandbox

NOT_OFFERED = (
    "the visual debugger is turned off in this kernel (WasmKernel.debugger). Use %debug after"
    " an error, %pdb on, or pdb.set_trace() in a cell: the debugger then asks for its commands"
    " below the cell."
)
NOT_STOPPED = "no cell is stopped at a breakpoint"
BUSY = "a cell is running: ask again when it stops or ends"
TEXT_LIMIT = 64 * 1024  # characters of a text argument handed to the guest
SOURCE_LIMIT = 4 << 20  # characters of a dumped cell
KEPT_CELLS = 1000  # dumped cells kept, and files with breakpoints
LINES_LIMIT = 1000  # breakpoints in one file
RESUMES = ("continue", "next", "stepIn", "stepOut")
GUEST_STOPPED = ("stackTrace", "scopes", "evaluate", "copyToGlobals")
GUEST_ANY = ("variables", "inspectVariables", "richInspectVariables", "modules", "source")
CAPABILITIES = {
    "supportsConfigurationDoneRequest": True,
    "supportsDelayedStackTraceLoading": True,
    "supportsEvaluateForHovers": True,
    "supportsModulesRequest": True,
    "supportsClipboardContext": True,
    "exceptionBreakpointFilters": [],
}


def _response(request: dict, success: bool, body: dict | None = None, message: str = "") -> dict:
    seq = request.get("seq")
    command = request.get("command")
    reply: dict[str, Any] = {
        "type": "response",
        "request_seq": seq if isinstance(seq, int) and not isinstance(seq, bool) else 0,
        "success": success,
        "command": command if isinstance(command, str) else "",
    }
    if body is not None:
        reply["body"] = body
    if message:
        reply["message"] = message
    return reply


def refusal(request: dict, message: str) -> dict:
    return _response(request, False, message=message)


def _plain(arguments: dict) -> dict:
    """The scalar arguments of a request, bounded: all the guest reads."""
    kept: dict[str, Any] = {}
    for key, value in arguments.items():
        if len(key) > 64:
            continue
        if isinstance(value, bool):
            kept[key] = value
        elif isinstance(value, int):
            kept[key] = max(min(value, 2**31), -(2**31))
        elif isinstance(value, str) and len(value) <= TEXT_LIMIT:
            kept[key] = value
    return kept


def _path(arguments: dict) -> str | None:
    source = arguments.get("source")
    path = source.get("path") if isinstance(source, dict) else None
    return path if isinstance(path, str) and len(path) <= 4096 else None


class DebugRequests(Kernel):
    """``do_debug_request``: host state, or the guest's answer."""

    debugger: bool
    active_output: str
    debug_session: DebugSession
    _service: Callable[..., Awaitable[dict]]
    _running_sandbox: Callable[[], Sandbox | None]
    _breakpoint_ids = itertools.count(1)

    async def do_debug_request(self, msg: Any) -> dict:
        reply = await self._debug_reply(msg if isinstance(msg, dict) else {})
        return {"seq": self.debug_session.next_seq(), **reply}

    async def _debug_reply(self, request: dict) -> dict:
        if not self.debugger:
            return refusal(request, NOT_OFFERED)
        command = request.get("command")
        arguments = request.get("arguments")
        arguments = arguments if isinstance(arguments, dict) else {}
        session = self.debug_session
        own = getattr(self, f"_dap_{command}", None) if isinstance(command, str) else None
        if own is not None:
            answered = own(request, arguments)
            return await answered if inspect.isawaitable(answered) else answered
        if command in RESUMES:
            if not session.stopped:
                return refusal(request, NOT_STOPPED)
            session.resume(command)
            body = {"allThreadsContinued": True} if command == "continue" else None
            return _response(request, True, body)
        if command in GUEST_STOPPED or command in GUEST_ANY:
            return await self._guest_answer(request, command, arguments)
        return refusal(request, f"{str(command)[:64]!r} is not supported by this kernel")

    async def _guest_answer(self, request: dict, command: str, arguments: dict) -> dict:
        session = self.debug_session
        question = {"command": command, "arguments": _plain(arguments)}
        try:
            if session.stopped:
                answer = await session.ask(question)
            elif command in GUEST_STOPPED:
                return refusal(request, NOT_STOPPED)
            elif session.cell_running:
                return refusal(request, BUSY)
            else:
                answer = await self._service(declared.DEBUG, question)
        except (NotStopped, TimeoutError) as exc:
            return refusal(request, str(exc) or "the stopped cell did not answer in time")
        except Exception as exc:  # a limit stopped the service, or no sandbox
            return refusal(request, f"{type(exc).__name__}: {exc}")
        given = answer.get("body")
        body: dict = given if isinstance(given, dict) else {}
        if command == "richInspectVariables" and isinstance(body.get("data"), dict):
            body["data"] = ActiveOutput(self.active_output).inspect(body["data"])
        message = answer.get("failure")
        success = answer.get("success") is True
        return _response(request, success, body, message if isinstance(message, str) else "")

    # -- the host's own answers: one method per command --------------------------------------

    def _dap_debugInfo(self, request: dict, _arguments: dict) -> dict:
        session = self.debug_session
        listed = [
            {"source": path, "breakpoints": [{"line": line} for line in lines]}
            for path, lines in session.breakpoints.items()
        ]
        body = {
            "isStarted": session.started,
            "hashMethod": cell_files.HASH_METHOD,
            "hashSeed": cell_files.HASH_SEED,
            "tmpFilePrefix": cell_files.CELL_FOLDER,
            "tmpFileSuffix": cell_files.CELL_SUFFIX,
            "breakpoints": listed,
            "stoppedThreads": [1] if session.stopped else [],
            "richRendering": True,
            "exceptionPaths": [],
            "copyToGlobals": True,
        }
        return _response(request, True, body)

    def _dap_initialize(self, request: dict, _arguments: dict) -> dict:
        self.debug_session.started = True
        return _response(request, True, dict(CAPABILITIES))

    def _dap_attach(self, request: dict, _arguments: dict) -> dict:
        # as debugpy: JupyterLab opens its debugger sidebar on this event
        self.debug_session.event("initialized")
        return _response(request, True)

    def _dap_setExceptionBreakpoints(self, request: dict, _arguments: dict) -> dict:
        # no exception filters are offered (CAPABILITIES), so the only list is the empty one
        return _response(request, True)

    def _dap_configurationDone(self, request: dict, _arguments: dict) -> dict:
        return _response(request, True)

    def _dap_disconnect(self, request: dict, _arguments: dict) -> dict:
        self.debug_session.end()
        return _response(request, True)

    def _dap_threads(self, request: dict, _arguments: dict) -> dict:
        return _response(request, True, {"threads": [{"id": 1, "name": "MainThread"}]})

    def _dap_dumpCell(self, request: dict, arguments: dict) -> dict:
        code = arguments.get("code")
        if not isinstance(code, str) or len(code) > SOURCE_LIMIT:
            return refusal(request, f"code must be a string of at most {SOURCE_LIMIT:,} characters")
        path = cell_files.cell_file(code)
        sources = self.debug_session.sources
        sources.pop(path, None)
        sources[path] = code
        while len(sources) > KEPT_CELLS:
            del sources[next(iter(sources))]
        return _response(request, True, {"sourcePath": path})

    def _dap_setBreakpoints(self, request: dict, arguments: dict) -> dict:
        path = _path(arguments)
        wanted = arguments.get("breakpoints")
        if path is None or not isinstance(wanted, list) or len(wanted) > LINES_LIMIT:
            return refusal(request, "setBreakpoints needs source.path and a list of breakpoints")
        lines = sorted(
            {
                each["line"]
                for each in wanted
                if isinstance(each, dict)
                and isinstance(each.get("line"), int)
                and 0 < each["line"] < 2**31
            }
        )
        breakpoints = self.debug_session.breakpoints
        breakpoints.pop(path, None)
        if lines and len(breakpoints) < KEPT_CELLS:
            breakpoints[path] = lines
        verified = [
            {
                "verified": True,
                "id": next(self._breakpoint_ids),
                "source": {"path": path},
                "line": n,
            }
            for n in lines
        ]
        return _response(request, True, {"breakpoints": verified})

    def _dap_pause(self, request: dict, _arguments: dict) -> dict:
        """Stop the running cell at its next line of the user's code."""
        session = self.debug_session
        if not session.stopped:
            sandbox = self._running_sandbox() if session.cell_running else None
            if sandbox is None:
                return refusal(request, "no cell is running")
            sandbox.interrupt(pause=True)
        return _response(request, True)

    async def _dap_source(self, request: dict, arguments: dict) -> dict:
        """A dumped cell's code, or a file the guest reads (a module beside the notebook)."""
        path = _path(arguments)
        code = self.debug_session.sources.get(path or "")
        if code is not None:
            return _response(request, True, {"content": code})
        if path is None:
            return _response(request, False, {}, "source unavailable")
        return await self._guest_answer(request, "source", {"path": path})
