"""Host tools inside the guest: the module ``sandbox_tools``, and the values tools exchange.

A tool is a function that runs outside the sandbox (in the client that runs the cell, or in
the kernel process for the operator's tools). The kernel builds ``sandbox_tools`` when a cell
first imports it, from the tools the running cell's client and the operator serve: each is
an ordinary function with the tool's signature and docstring (``help()`` and completion work)
that sends one ``tool`` message and waits for its reply. Before each later cell the module is
brought up to date, so it always holds the tools of the cell that runs.

Values travel as JSON; bytes as ``{"$bytes": BASE64}``. ``encode`` and ``decode`` are the one
codec both sides use: the host imports this module as ``wasm_kernel.guest.modules.
_wasm_kernel_tools`` (nothing here runs on import but definitions).
"""

import base64
import builtins
import math
import sys
import types

MODULE_NAME = "sandbox_tools"
BYTES_TAG = "$bytes"
MAX_DEPTH = 100  # nesting of a value, as JSON parsers bound it


class ToolError(Exception):
    """A tool failed, or could not be called: its message says why. A tool's own exception
    arrives as a subclass of both this and the builtin of the same name (ValueError...)."""


ToolError.__module__ = MODULE_NAME


# -- the values tools exchange ---------------------------------------------------------------


def too_deep():
    return ValueError(
        f"a tool's value is nested more than {MAX_DEPTH} deep (lists and dicts within each"
        " other): that is the bound on the values tools take and return"
    )


def encode(value, depth=0):
    """``value`` as JSON data: None, booleans, numbers, strings, lists (tuples), dicts with
    string keys, and bytes; anything else raises TypeError naming what cannot go."""
    if depth > MAX_DEPTH:
        raise too_deep()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a tool's value cannot be {value!r} (JSON has no such number)")
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {BYTES_TAG: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [encode(item, depth + 1) for item in value]
    if isinstance(value, dict):
        if len(value) == 1 and BYTES_TAG in value:
            raise ValueError(f"a dict whose only key is {BYTES_TAG!r} cannot be sent (bytes)")
        encoded = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"a tool's dict keys must be strings, not {type(key).__name__}")
            encoded[key] = encode(item, depth + 1)
        return encoded
    raise TypeError(f"a tool takes and returns JSON values and bytes, not {type(value).__name__}")


def decode(value, depth=0):
    """The value ``encode`` made: bytes back from their tag."""
    if depth > MAX_DEPTH:
        raise too_deep()
    if isinstance(value, list):
        return [decode(item, depth + 1) for item in value]
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get(BYTES_TAG), str):
            return base64.b64decode(value[BYTES_TAG], validate=True)
        return {key: decode(item, depth + 1) for key, item in value.items()}
    return value


# -- the module ----------------------------------------------------------------------------

DOC = (
    "Tools served by the host: functions that run outside the sandbox, called like any other."
    " Their errors raise ToolError (and the builtin of the same name, e.g. ValueError)."
)
_module = None  # sandbox_tools, once a cell imported it
_digest = ""  # which catalogue it holds, as the host names it
_failures: dict[str, type] = {}  # ename -> the exception class a tool's failure of that name raises


class _Shown:
    """An annotation or default as the host wrote it, shown as written (``limit: int = 10``)."""

    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def _signature(declaration):
    import inspect

    parameters = []
    for item in declaration.get("parameters", ()):
        options = {}
        if "annotation" in item:
            options["annotation"] = _Shown(item["annotation"])
        if "default" in item:
            options["default"] = _Shown(item["default"])
        kind = getattr(inspect.Parameter, item.get("kind", "POSITIONAL_OR_KEYWORD"))
        parameters.append(inspect.Parameter(item["name"], kind, **options))
    returns = declaration.get("returns")
    empty = inspect.Signature.empty
    return inspect.Signature(parameters, return_annotation=_Shown(returns) if returns else empty)


def _tool(name, declaration):
    """The guest's function for one tool: binds its arguments as Python would, then calls."""
    signature = _signature(declaration)

    def tool(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)  # a TypeError, as for any function
        return call(name, dict(bound.arguments))

    tool.__name__ = tool.__qualname__ = name
    tool.__module__ = MODULE_NAME
    tool.__doc__ = declaration.get("doc") or None
    tool.__signature__ = signature
    return tool


def _kernel():
    return sys.modules["_wasm_kernel"]


def call(name, arguments):
    """Call tool ``name`` with its arguments by parameter name; its value, or its error."""
    kernel = _kernel()
    contract = kernel.contract
    try:
        encoded = encode(arguments)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}(): {exc}") from None
    try:
        reply = kernel.call_host(contract.TOOL, name=name, arguments=encoded)
    except kernel.MessageTooLarge as exc:
        raise failure("ValueError")(f"{name}(): its arguments are too big: {exc}") from None
    if reply.get("interrupted"):
        raise kernel.interruption()
    error = reply.get("error")
    if isinstance(error, dict):
        raise failure(str(error.get("ename", "ToolError")))(str(error.get("evalue", "")))
    if "value" not in reply:
        raise ToolError(f"{name}(): tools can only be called while a cell runs")
    return decode(reply["value"])


def failure(ename):
    """The exception class a tool failure named ``ename`` raises: ToolError, and the builtin
    exception of that name if there is one, so ``except ValueError`` works as on the host."""
    if ename in ("ToolError", "ToolUnavailable"):
        return ToolUnavailable if ename == "ToolUnavailable" else ToolError
    known = _failures.get(ename)
    if known is None:
        builtin = getattr(builtins, ename, None)
        if isinstance(builtin, type) and issubclass(builtin, Exception):
            try:
                known = type(ename, (ToolError, builtin), {"__module__": MODULE_NAME})
            except TypeError:  # a layout that cannot be mixed in
                known = ToolError
        else:
            known = type(ename, (ToolError,), {"__module__": MODULE_NAME})
        _failures[ename] = known
    return known


class ToolUnavailable(ToolError, ImportError):
    """``from sandbox_tools import NAME`` for a tool this cell is not served (an ImportError
    of its own, so the reason reaches the user; Python would replace an AttributeError's)."""


ToolUnavailable.__module__ = MODULE_NAME


def _missing(name):
    """A tool this cell is not served: ToolUnavailable, saying which tools it has."""
    if name.startswith("_"):  # dunders pydoc and importlib look for
        raise AttributeError(f"module {MODULE_NAME!r} has no attribute {name!r}")
    raise ToolUnavailable(
        f"sandbox_tools has no tool {name!r}: the tools here are those the client running this"
        " cell serves (wasm_kernel.client's Session(tools=...), the MCP server's upstream"
        " servers) and the operator's (WasmKernel.tools); this cell has "
        + (", ".join(sorted(_module.__all__)) or "none")
    )


def refresh():
    """Bring ``sandbox_tools`` up to the running cell's tools (only once a cell imported it)."""
    global _digest
    if _module is None:
        return
    kernel = _kernel()
    reply = kernel.call_host(kernel.contract.TOOLS, digest=_digest)
    catalogue = reply.get("tools")
    if not isinstance(catalogue, dict):
        return  # the same as before, or a service turn: keep what is there
    for name in list(_module.__all__):
        _module.__dict__.pop(name, None)
    for name, declaration in catalogue.items():
        setattr(_module, name, _tool(name, declaration))
    _module.__all__ = sorted(catalogue)
    _digest = str(reply.get("digest", ""))


class ToolsFinder:
    """Import finder for ``sandbox_tools``: one module object, filled by ``refresh``."""

    def find_spec(self, name, path=None, target=None):
        if name != MODULE_NAME:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        global _module
        if _module is None:
            _module = types.ModuleType(MODULE_NAME, DOC)
            _module.ToolError, _module.ToolUnavailable = ToolError, ToolUnavailable
            _module.__all__ = []
            _module.__getattr__ = _missing
            _missing.__name__ = _missing.__qualname__ = "__getattr__"
        return _module

    def exec_module(self, module):
        refresh()


def install():
    """At boot: ``import sandbox_tools`` builds the module."""
    sys.meta_path.append(ToolsFinder())
