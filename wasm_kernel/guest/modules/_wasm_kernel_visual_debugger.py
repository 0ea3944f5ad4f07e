"""JupyterLab's visual debugger, the guest's side: breakpoints, stops, stepping, variables.

The host keeps the debug session (breakpoints, dumped cells) and hands the breakpoints to each
cell. They cost nothing where they are not: ``sys.monitoring`` watches lines only in the code
objects compiled from a cell file that has a breakpoint, so a cell without one (and what it
calls) runs untraced. At a breakpoint the cell stops inside a host call (``debug_stop``) that
waits for the person at the panel; while it waits, each reply is a Debug Adapter Protocol
request to answer (stack, scopes, variables, evaluate ...) or how to go on. Stepping uses
``bdb`` from the stopped frame until the next ``continue``, only for the user's frames.
"""

import bdb
import linecache
import reprlib
import sys
import types
import weakref
from collections.abc import Mapping

import _wasm_kernel_contract as contract

TOOL = sys.monitoring.DEBUGGER_ID
TOOL_NAME = "wasm-kernel visual debugger"
LINE = sys.monitoring.events.LINE
THREAD = 1  # the one thread the panel shows
VALUE_LIMIT = 1000  # characters of a value as the panel shows it
PAGE_LIMIT = 1000  # variables in one answer
SOURCE_LIMIT = 1 << 20  # characters of a file's text the panel is sent
KEPT_FILES = 1000  # cell files past which those whose code is gone are forgotten
NOT_USER = ("<", "/usr/local/lib/")  # the kernel's guest code and the runtime's libraries
HIDDEN_NAMES = {"__builtins__", "__builtin__", "__loader__", "__spec__", "__package__"}
HIDDEN_NAMES |= {"__name__", "__doc__", "__annotations__", "__display__", "get_ipython"}
HIDDEN_NAMES |= {"exit", "quit", "In", "Out", "_oh", "_dh", "_", "__", "___"}

_breakpoints = {}  # cell file -> the lines with a breakpoint
_codes = {}  # cell file -> the code objects compiled from it (for breakpoints set later)
_idle_references = {}  # what the variables pane shows while no cell runs (see Idle)
_short = reprlib.Repr(maxstring=VALUE_LIMIT, maxother=VALUE_LIMIT, maxlist=100, maxdict=100)
_short.maxlevel = 3


def _kernel():
    """The kernel's guest module as it is now (the host may have reinstalled it)."""
    return sys.modules["_wasm_kernel"]


def _is_user(frame):
    """A frame of the user's code: a cell's, or a module of the user's own."""
    return not frame.f_code.co_filename.startswith(NOT_USER)


# -- breakpoints ------------------------------------------------------------------------------


def compiled(code):
    """Every code object compiled from a cell (the shell's compiler tells each), kept weakly:
    a breakpoint set later must reach the functions a cell defined."""
    if len(_codes) > KEPT_FILES:
        for path in [path for path, codes in _codes.items() if not codes]:
            del _codes[path]  # cells whose code is gone
    codes = _codes.get(code.co_filename)
    if codes is None:  # made only when missing: IPython compiles a cell statement by statement
        codes = _codes[code.co_filename] = weakref.WeakSet()
    pending = [code]
    while pending:
        each = pending.pop()
        codes.add(each)
        if each.co_filename in _breakpoints:
            sys.monitoring.set_local_events(TOOL, each, LINE)
        pending += [item for item in each.co_consts if isinstance(item, types.CodeType)]


def set_breakpoints(breakpoints):
    """The session's breakpoints ({cell file: [lines]}), from the host at each cell and each
    step; lines are watched only in the code of those files."""
    wanted = {str(path): {int(line) for line in lines} for path, lines in breakpoints.items()}
    if wanted == _breakpoints or not _own_tool():
        return
    for path in set(_breakpoints) | set(wanted):
        for code in list(_codes.get(path, ())):
            sys.monitoring.set_local_events(TOOL, code, LINE if path in wanted else 0)
    _breakpoints.clear()
    _breakpoints.update(wanted)
    sys.monitoring.restart_events()  # lines passed over before are watched again


def _own_tool():
    """Whether sys.monitoring's debugger slot is ours (a cell's own debugger may hold it:
    then the panel's breakpoints do not stop)."""
    if sys.monitoring.get_tool(TOOL) is None:
        sys.monitoring.use_tool_id(TOOL, TOOL_NAME)
        sys.monitoring.register_callback(TOOL, LINE, _on_line)
    return sys.monitoring.get_tool(TOOL) == TOOL_NAME


def _on_line(code, line):
    if line not in _breakpoints.get(code.co_filename, ()):
        return sys.monitoring.DISABLE  # this line no more, until the breakpoints change
    if not _stepper.active:  # while stepping, bdb stops there itself
        _stepper.stop(sys._getframe(1), "breakpoint")
    return None


def pause(frame):
    """The panel's pause, from the interrupt handler: stop at the next line of the user's
    code (``frame`` is where the cell was: perhaps in a library it called)."""
    _stepper.reason = "pause"
    if not _stepper.active:
        _stepper.set_trace(frame)
        _stepper.active = True
    else:
        _stepper.set_step()


def cell_ended():
    """Whatever a stop left tracing ends with the cell, and the pane's earlier variables
    are let go (it asks again)."""
    _stepper.finish()
    _stepper.reason = None  # a pause that never reached the user's code
    _idle_references.clear()


# -- a stop -------------------------------------------------------------------------------------


class Stepper(bdb.Bdb):
    """bdb, from a stop until ``continue``: only the user's frames stop, the breakpoints
    are the session's, and each stop waits on the host."""

    def __init__(self):
        super().__init__()
        self.active = False
        self.reason = None  # why the next stop stops, if not a breakpoint or a step ("pause")

    def stop_here(self, frame):
        return _is_user(frame) and super().stop_here(frame)

    def break_here(self, frame):
        return frame.f_lineno in _breakpoints.get(frame.f_code.co_filename, ())

    def break_anywhere(self, frame):
        return frame.f_code.co_filename in _breakpoints

    def user_call(self, frame, argument_list):
        pass  # stepping in stops at the callee's first line

    def user_return(self, frame, return_value):
        """A step out of a function stops where it returns to, as debugpy's does."""
        caller = frame.f_back
        if frame is self.returnframe and caller is not None and _is_user(caller):
            self.stop(caller, "step")

    def user_exception(self, frame, exc_info):
        pass

    def user_line(self, frame):
        reason, self.reason = self.reason, None
        self.stop(frame, reason or ("breakpoint" if self.break_here(frame) else "step"))

    def stop(self, frame, reason):
        """Wait on the host, answering its requests, until it says how to go on."""
        try:
            resume = Stopped(frame).wait(reason)
        except BaseException:  # an interrupt, or the shutdown: the cell ends here
            self.finish()
            raise
        if resume == contract.INTERRUPTED:
            self.finish()
            raise KeyboardInterrupt("Interrupted by user")
        if resume == "continue":
            self.finish()
            return
        if not self.active:
            self.set_trace(frame)  # every frame up the stack, and the calls to come
            self.active = True
        if resume == "next":
            self.set_next(frame)
        elif resume == "stepOut":
            self.set_return(frame)
        else:
            self.set_step()

    def finish(self):
        if self.active:
            self.active = False
            self.set_continue()  # no bdb breakpoints: tracing stops


_stepper = Stepper()


class Shown:
    """The variables the panel was shown, by the numbers it expands them by."""

    def __init__(self, references):
        self.references = references  # variablesReference -> what it expands

    def reference(self, value):
        """A number that expands ``value`` (0: nothing to expand)."""
        if not _expandable(value):
            return 0
        number = len(self.references) + 1
        self.references[number] = value
        return number

    def variables(self, arguments):
        value = self.references.get(arguments.get("variablesReference"))
        if value is None:
            raise LookupError("no such variablesReference (the variables shown have changed)")
        start = max(0, int(arguments.get("start") or 0))
        count = min(PAGE_LIMIT, int(arguments.get("count") or 0) or PAGE_LIMIT)
        return {"variables": described(_children(value), start, count, self.reference)}

    def inspectVariables(self, _arguments):
        names = _kernel().shell.user_ns
        shown = [(name, value) for name, value in names.items() if _visible(name)]
        return {"variables": described(shown, 0, PAGE_LIMIT, self.reference)}

    def source(self, arguments):
        """A file's text (a module beside the notebook a frame is in)."""
        source = arguments.get("path")
        lines = linecache.getlines(source) if isinstance(source, str) else []
        if not lines:
            raise LookupError("source unavailable")
        return {"content": _clip("".join(lines), SOURCE_LIMIT)}


class Stopped(Shown):
    """One stop: its frames, and the variables shown."""

    def __init__(self, frame):
        super().__init__({})
        self.frames = []
        while frame is not None:
            if _is_user(frame):
                self.frames.append(frame)
            frame = frame.f_back

    def wait(self, reason):
        reply = _kernel().call_host(contract.DEBUG_STOP, reason=reason)
        while True:
            set_breakpoints(reply.get("breakpoints", _breakpoints))
            request = reply.get("request")
            if request is None:
                return reply.get("resume", "continue")
            reply = _answer(answer(request, self))

    def frame(self, arguments):
        number = arguments.get("frameId")
        if not isinstance(number, int) or not 0 < number <= len(self.frames):
            raise LookupError(f"no frame {number!r} in this stop")
        return self.frames[number - 1]

    # -- the requests a stop answers ------------------------------------------------------

    def stackTrace(self, arguments):
        start = max(0, int(arguments.get("startFrame") or 0))
        levels = int(arguments.get("levels") or 0) or len(self.frames)
        frames = [
            {
                "id": number,
                "name": frame.f_code.co_name,
                "line": frame.f_lineno,
                "column": 1,
                "source": {"path": frame.f_code.co_filename, "sourceReference": 0},
            }
            for number, frame in enumerate(self.frames, 1)
        ]
        return {"stackFrames": frames[start : start + levels], "totalFrames": len(frames)}

    def scopes(self, arguments):
        frame = self.frame(arguments)
        local = {
            "name": "Locals",
            "variablesReference": self.reference(frame.f_locals),
            "expensive": False,
            "presentationHint": "locals",
            "source": {},
        }
        shared = {
            "name": "Globals",
            "variablesReference": self.reference(frame.f_globals),
            "expensive": False,
            "source": {},
        }
        return {"scopes": [local, shared]}

    def evaluate(self, arguments):
        """An expression's value in a frame; from the debugger's console (context "repl") a
        statement runs there too."""
        frame = self.frame(arguments)
        text = str(arguments.get("expression", ""))
        try:
            code = compile(text, "<debugger>", "eval")
        except SyntaxError:
            if arguments.get("context") != "repl":
                raise
            exec(compile(text, "<debugger>", "exec"), frame.f_globals, frame.f_locals)
            return {"result": "", "variablesReference": 0}
        value = eval(code, frame.f_globals, frame.f_locals)
        return {
            "result": _shown(value),
            "type": type(value).__name__,
            "variablesReference": self.reference(value),
            "presentationHint": {},
        }

    def richInspectVariables(self, arguments):
        frame = self.frame(arguments)
        name = str(arguments.get("variableName", ""))
        scope = {**frame.f_globals, **frame.f_locals}
        return rich(scope, name)

    def copyToGlobals(self, arguments):
        frame = self.frame({"frameId": arguments.get("srcFrameId")})
        source, target = arguments.get("srcVariableName"), arguments.get("dstVariableName")
        if not (isinstance(target, str) and target.isidentifier()):
            raise ValueError("dstVariableName and srcVariableName must be valid identifiers")
        _kernel().shell.user_ns[target] = frame.f_locals[source]
        return {}


def _answer(answered):
    """Send an answer; one over the message's bound is a failure that says so."""
    kernel = _kernel()
    try:
        return kernel.call_host(contract.DEBUG_ANSWER, **answered)
    except kernel.MessageTooLarge as exc:
        return kernel.call_host(contract.DEBUG_ANSWER, success=False, failure=str(exc))


# -- requests answered with or without a stop ---------------------------------------------


class Idle(Shown):
    """No cell is stopped: the requests the panel sends then run as a service turn; what the
    variables pane shows expands until its next inspectVariables, or the next cell."""

    def __init__(self):
        super().__init__(_idle_references)

    def inspectVariables(self, arguments):
        self.references.clear()
        return super().inspectVariables(arguments)


def modules(_stop, arguments):
    loaded = list(sys.modules.values())
    start = max(0, int(arguments.get("startModule") or 0))
    count = int(arguments.get("moduleCount") or 0) or len(loaded)
    found = []
    for number, module in enumerate(loaded[start : start + min(count, PAGE_LIMIT)], start):
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if isinstance(origin, str) and origin.endswith(".py"):
            found.append({"id": number, "name": module.__name__, "path": origin})
    return {"modules": found, "totalModules": len(loaded)}


def answer(request, stop):
    """A DAP request's answer: success, body, and why not."""
    command = str(request.get("command", ""))
    arguments = request.get("arguments") or {}
    if command == "modules":
        handler = modules
    elif command == "richInspectVariables" and isinstance(stop, Idle):
        name = str(arguments.get("variableName", ""))
        return {"success": True, "body": rich(_kernel().shell.user_ns, name)}
    else:
        method = getattr(type(stop), command, None) if command.isidentifier() else None
        if method is None:
            return {"success": False, "failure": f"{command}: only while a cell is stopped"}
        handler = method
    try:
        return {"success": True, "body": handler(stop, arguments)}
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return {"success": False, "failure": f"{type(exc).__name__}: {_clip(str(exc))}"}


def serve(request):
    """A request while no cell runs (the ``debug`` service)."""
    return answer(request, Idle())


# -- values as the panel shows them ---------------------------------------------------------


def _visible(name):
    return (
        name not in HIDDEN_NAMES
        and not name.startswith("_i")
        and not (name.startswith("_") and name[1:2].isdigit())
    )


def _clip(text, limit=VALUE_LIMIT):
    return text if len(text) <= limit else text[:limit] + "..."


def _shown(value):
    try:
        return _clip(_short.repr(value))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return f"<repr failed: {type(exc).__name__}>"


def _expandable(value):
    return isinstance(value, (Mapping, list, tuple, set, frozenset)) or (
        hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType))
    )


def _children(value):
    """(name, value) pairs a variable expands to."""
    if isinstance(value, Mapping):  # a dict, or a function's locals
        names = [(str(key), item) for key, item in value.items()]
        is_scope = all(isinstance(key, str) for key in value)
        return [(name, item) for name, item in names if not is_scope or _visible(name)]
    if isinstance(value, (list, tuple)):
        return [(str(index), item) for index, item in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return [(str(index), item) for index, item in enumerate(value)]
    return [(str(name), item) for name, item in vars(value).items()]


def described(pairs, start, count, reference):
    return [
        {
            "name": name,
            "value": _shown(value),
            "type": type(value).__name__,
            "evaluateName": name,
            "variablesReference": reference(value),
        }
        for name, value in pairs[start : start + count]
    ]


def rich(scope, name):
    """A variable's mime bundle, as the notebook would show it (the host applies the
    active-output policy)."""
    from _wasm_kernel_display import jsonable

    if not name.isidentifier() or name not in scope:
        return {"data": {}, "metadata": {}}
    data, metadata = _kernel().shell.display_formatter.format(scope[name])
    data, metadata = jsonable(data), jsonable(metadata)
    return {"data": data, "metadata": {key: metadata[key] for key in metadata if key in data}}
