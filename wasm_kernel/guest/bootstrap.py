"""Guest side of wasm-kernel: this file runs inside the sandboxed CPython, never on the host.

The host loads it once per interpreter as the module ``_wasm_kernel`` and then drives every
cell and request through its functions. Everything that must reach the kernel as a Jupyter
message (results, display data, errors, input requests, replies) goes through ``_host.call``
as one JSON object; plain stdout and stderr stay ordinary file writes that the host streams.

Modules needed only on some paths (traceback, codeop, pprint, base64) are imported where
they are used: importing them at boot would add tens of milliseconds to every kernel start.
"""

import _socket
import _thread
import ast
import builtins
import errno
import functools
import getpass
import io
import json
import keyword
import linecache
import os
import re
import sys
import time
import types
import weakref

import _host

CELL_PREFIX = "Cell In["
ERROR_TEXT_LIMIT = 256 * 1024  # characters of an error's value and traceback sent to the host
DAMAGED = 86  # exit status of a turn after which the host must roll the interpreter back

MIME_METHODS = {
    "text/html": "_repr_html_",
    "text/markdown": "_repr_markdown_",
    "text/latex": "_repr_latex_",
    "image/svg+xml": "_repr_svg_",
    "image/png": "_repr_png_",
    "image/jpeg": "_repr_jpeg_",
    "application/json": "_repr_json_",
    "application/javascript": "_repr_javascript_",
    "application/pdf": "_repr_pdf_",
}


class StdinNotImplementedError(NotImplementedError):
    """Raised by input() when the Jupyter client does not accept input requests."""


StdinNotImplementedError.__module__ = "builtins"  # shown by its bare name, as in IPython


#: Open ``capture_output`` blocks (IPython.utils.capture): rich output goes to the innermost.
capture_stack = []

CAPTURABLE = ("display", "clear", "result")


def flush_streams():
    """Flush the user's stdout and stderr, if the cell left any: print() to a None
    sys.stdout does nothing, as under the native kernel, and so does this."""
    for name in ("stdout", "stderr"):
        try:
            getattr(sys, name).flush()
        except Exception:
            pass


def call_host(op, **fields):
    """Send one structured message to the kernel and return its JSON reply."""
    if capture_stack and op in CAPTURABLE:
        capture_stack[-1].append({"op": op, **fields})
        return {}
    flush_streams()
    reply = _host.call(json.dumps({"op": op, **fields}).encode())
    return json.loads(reply) if reply else {}


# -- rich representations -------------------------------------------------------------------


def _encode(value):
    if isinstance(value, bytes):
        import base64

        return base64.b64encode(value).decode("ascii")
    return value


def mime_bundle(obj, include=None, exclude=None):
    """Return (data, metadata) the way IPython's formatter would for ``obj``."""
    data, metadata = {}, {}
    is_instance = not isinstance(obj, type)
    bundle_method = getattr(obj, "_repr_mimebundle_", None) if is_instance else None
    if callable(bundle_method):
        try:
            result = bundle_method(include=include, exclude=exclude)
        except Exception as exc:
            _formatter_failed(obj, "_repr_mimebundle_", exc)
            result = None
        if isinstance(result, tuple) and len(result) == 2:
            result, extra = result
            metadata.update(extra or {})
        if isinstance(result, dict):
            data.update({mime: _encode(value) for mime, value in result.items()})
    for mime, method_name in MIME_METHODS.items():
        method = getattr(obj, method_name, None) if is_instance else None
        if mime in data or not callable(method):
            continue
        try:
            value = method()
        except Exception as exc:
            _formatter_failed(obj, method_name, exc)
            continue
        if isinstance(value, tuple) and len(value) == 2:
            value, extra = value
            if extra:
                metadata[mime] = extra
        if value is not None:
            data[mime] = _encode(value)
    if "text/plain" not in data:
        data["text/plain"] = plain_text(obj)
    if include:
        data = {mime: value for mime, value in data.items() if mime in include}
    if exclude:
        data = {mime: value for mime, value in data.items() if mime not in exclude}
    return data, metadata


def _formatter_failed(obj, method_name, exc):
    """Say on stderr that a rich representation failed (IPython prints the traceback)."""
    sys.stderr.write(
        f"{type(obj).__name__}.{method_name}() raised {type(exc).__name__}: {exc};"
        " that representation is left out\n"
    )


def plain_text(obj):
    if isinstance(obj, (dict, list, tuple, set, frozenset)):
        import pprint

        return pprint.pformat(obj, sort_dicts=False)
    return repr(obj)


def display(*objs, **kwargs):
    """builtins.display: IPython.display.display, imported on first use."""
    from IPython.display import display as ipython_display

    return ipython_display(*objs, **kwargs)


def displayhook(value):
    """sys.displayhook: the value of a cell's last expression becomes its execute_result."""
    if value is None:
        return
    builtins._ = value
    custom = getattr(value, "_ipython_display_", None)
    if callable(custom) and not isinstance(value, type):
        custom()  # the object displays itself, as IPython lets it
        return
    data, metadata = mime_bundle(value)
    call_host("result", data=data, metadata=metadata)


# -- running cells --------------------------------------------------------------------------


def _ends_with_semicolon(source, node):
    """True when ';' follows the cell's last expression (IPython's output suppression)."""
    lines = source.splitlines(True)
    tail = lines[node.end_lineno - 1].encode()[node.end_col_offset :].decode(errors="replace")
    rest = "".join([tail, *lines[node.end_lineno :]]).lstrip()
    return rest.startswith(";")


def _clip(text):
    if len(text) <= ERROR_TEXT_LIMIT:
        return text
    return text[:ERROR_TEXT_LIMIT] + f"\n[... {len(text) - ERROR_TEXT_LIMIT:,} more characters]"


def report_error(exc):
    """Send an uncaught exception to the kernel, with an IPython-style traceback, clipped so
    that even a huge message reaches the host as an error."""
    import _wasm_kernel_traceback

    traceback = _clip("\n".join(_wasm_kernel_traceback.format_exception(exc)))
    call_host(
        "error", ename=type(exc).__name__, evalue=_clip(str(exc)), traceback=traceback.split("\n")
    )


def _report(exc):
    """report_error that a late KeyboardInterrupt cannot escape; if formatting fails, the
    error still goes out bare (and if even that fails, the host rolls the cell back)."""
    for _ in range(3):
        try:
            report_error(exc)
            return
        except KeyboardInterrupt:
            continue
        except Exception:
            break
    try:
        evalue = _clip(str(exc))
    except Exception:
        evalue = ""
    call_host("error", ename=type(exc).__name__, evalue=evalue, traceback=[])


# indent, optional "target =" (as in ``result = %timeit -o ...``), then %magic, %%magic or !cmd
_MAGIC_LINE = re.compile(
    r"^([ \t]*)((?:[A-Za-z_][\w.]*\s*,\s*)*[A-Za-z_][\w.]*\s*=\s*)?"
    r"(?:(%{1,2})([A-Za-z_]\w*)|(!{1,2}))(.*)$"
)


def transform_ipython_syntax(source):
    """Rewrite IPython's magic and shell syntax into calls on the shell object.

    Only used when the cell is not valid Python as it stands, so ordinary code is never
    touched. ``%%name`` on the first line makes the whole cell a cell magic. Returns None
    when there is nothing to rewrite.
    """
    first, _, body = source.partition("\n")
    match = _MAGIC_LINE.match(first)
    if match and match.group(3) == "%%" and not match.group(2):
        name, line = match.group(4), match.group(6).strip()
        return f"get_ipython().run_cell_magic({name!r}, {line!r}, {body!r})\n"
    lines = []
    rewritten = False
    for text in source.splitlines():
        match = _MAGIC_LINE.match(text)
        if match is None or match.group(3) == "%%":
            lines.append(text)
            continue
        rewritten = True
        indent, target, _, name, bang, rest = match.groups()
        if bang:
            call = f"get_ipython().system({rest.strip()!r})"
        else:
            call = f"get_ipython().run_line_magic({name!r}, {rest.strip()!r})"
        lines.append(indent + (target or "") + call)
    return "\n".join(lines) + "\n" if rewritten else None


def _compile_cell(source, filename):
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        tree = compile(source, filename, "exec", ast.PyCF_ONLY_AST | flags)
    except SyntaxError as original:
        rewritten = transform_ipython_syntax(source)
        if rewritten is None:
            raise
        try:
            tree = compile(rewritten, filename, "exec", ast.PyCF_ONLY_AST | flags)
        except SyntaxError:
            raise original from None
        source = rewritten
    body = tree.body
    show_last = (
        bool(body) and isinstance(body[-1], ast.Expr) and not _ends_with_semicolon(source, body[-1])
    )
    units = []
    if show_last:
        head = ast.Module(body=body[:-1], type_ignores=[])
        units.append(compile(head, filename, "exec", flags))
        units.append(compile(ast.Interactive(body=[body[-1]]), filename, "single", flags))
    else:
        units.append(compile(tree, filename, "exec", flags))
    return units


def _run_code(code, namespace):
    result = eval(code, namespace)
    if code.co_flags & 0x80:  # CO_COROUTINE: the cell used top-level await
        import asyncio

        asyncio.run(result)


def run_cell(source, execution_count):
    """Run one notebook cell in ``__main__``; report its outcome through the host.

    Ends the turn with status DAMAGED when the cell broke what the host relies on in here,
    so that the host rolls the cell back instead of keeping a kernel that cannot run cells.
    """
    try:
        filename = f"{CELL_PREFIX}{execution_count}]"
        lines = source.splitlines(True)
        linecache.cache[filename] = (len(source), None, lines, filename)
        namespace = sys.modules["__main__"].__dict__
        shell.execution_count = execution_count
        shell.events.trigger("pre_execute")
        shell.events.trigger("pre_run_cell")
        for code in _compile_cell(source, filename):
            _run_code(code, namespace)
    except BaseException as exc:
        _report(exc)
    for event in ("post_execute", "post_run_cell"):
        try:
            shell.events.trigger(event)
        except BaseException as exc:
            _report(exc)
    try:
        flush_streams()
        _note_new_files()
    except BaseException:
        pass
    for name in ("stdout", "stderr"):
        if not hasattr(sys, name):  # deleted: the interpreter's end of turn cannot do without
            setattr(sys, name, getattr(sys, f"__{name}__"))
    if not _intact():
        raise SystemExit(DAMAGED)


# -- the shell object behind get_ipython() ---------------------------------------------------


class EventManager:
    """IPython-style event callbacks (matplotlib registers post_execute, for one)."""

    def __init__(self):
        self.callbacks = {
            name: [] for name in ("pre_execute", "pre_run_cell", "post_execute", "post_run_cell")
        }

    def register(self, event, function):
        if event not in self.callbacks:
            raise KeyError(f"unknown event {event!r}")
        if function not in self.callbacks[event]:
            self.callbacks[event].append(function)

    def unregister(self, event, function):
        self.callbacks[event].remove(function)

    def trigger(self, event, *args, **kwargs):
        for function in list(self.callbacks[event]):
            function(*args, **kwargs)


class Shell:
    """What ``get_ipython()`` returns in the sandbox: namespace, events and magics."""

    def __init__(self):
        self.events = EventManager()
        self.execution_count = 0
        self.config = {}
        self.initial_names = set()

    @property
    def user_ns(self):
        return sys.modules["__main__"].__dict__

    def run_line_magic(self, name, line):
        import _wasm_kernel_magics

        return _wasm_kernel_magics.run_line_magic(self, name, line)

    def run_cell_magic(self, name, line, cell):
        import _wasm_kernel_magics

        return _wasm_kernel_magics.run_cell_magic(self, name, line, cell)

    def system(self, command):
        import _wasm_kernel_magics

        return _wasm_kernel_magics.no_processes(f"!{command}")

    def run_cell(self, source, store_history=False):
        """Run more code as if it were a cell of its own (used by some magics)."""
        for code in _compile_cell(source, f"{CELL_PREFIX}{self.execution_count}]"):
            _run_code(code, self.user_ns)


shell = Shell()


# -- input, getpass and sleep that talk to the kernel ---------------------------------------


def _read_line(prompt, password):
    reply = call_host("input", prompt=str(prompt), password=password)
    failure = reply.get("error")
    if failure == "no-stdin":
        raise StdinNotImplementedError(
            "input() was called, but this frontend does not support input requests."
        )
    if failure == "eof":
        raise EOFError("EOF when reading a line")
    if failure == "interrupted":
        raise KeyboardInterrupt("Interrupted by user")
    return reply.get("value", "")


def input(prompt=""):
    return _read_line(prompt, password=False)


def getpass_(prompt="Password: ", stream=None):
    return _read_line(prompt, password=True)


def sleep(seconds):
    """time.sleep that the kernel can cut short with an interrupt."""
    seconds = float(seconds)
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    if call_host("sleep", seconds=seconds).get("interrupted"):
        raise KeyboardInterrupt


def serve(name, *args):
    """Run the service function ``name`` for the host (completion, inspection...). These run
    the user's code too (properties, ``__dir__``, reprs): if that raises, the reply is empty;
    if it broke the kernel's code, the turn ends DAMAGED, as a cell's would."""
    try:
        globals()[name](*args)
    except BaseException:
        call_host("reply", content={})
    if not _intact():
        raise SystemExit(DAMAGED)


def evaluate_expressions(expressions):
    """user_expressions of an execute_request: each evaluated in the user's namespace."""
    results = {}
    for name, source in expressions.items():
        try:
            data, metadata = mime_bundle(eval(source, _namespace()))
            results[name] = {"status": "ok", "data": data, "metadata": metadata}
        except Exception as exc:
            results[name] = {
                "status": "error",
                "ename": type(exc).__name__,
                "evalue": str(exc),
                "traceback": [],
            }
    call_host("reply", content=results)


# -- completion, inspection, completeness -----------------------------------------------------


def _namespace():
    return sys.modules["__main__"].__dict__


def _resolve(dotted):
    """Follow a dotted name through the user's namespace without calling anything."""
    head, *rest = dotted.split(".")
    namespace = _namespace()
    if head in namespace:
        obj = namespace[head]
    elif hasattr(builtins, head):
        obj = getattr(builtins, head)
    else:
        raise LookupError(head)
    for part in rest:
        obj = getattr(obj, part)
    return obj


def _token_bounds(code, cursor, allow_after):
    start = cursor
    while start > 0 and (
        code[start - 1].isidentifier() or code[start - 1].isdigit() or code[start - 1] in "._"
    ):
        start -= 1
    end = cursor
    if allow_after:
        while end < len(code) and (code[end].isalnum() or code[end] == "_"):
            end += 1
    return start, end


_IMPORT_MODULE = re.compile(r"\s*(?:import|from)\s+([\w.]*)$")
_FROM_IMPORT = re.compile(r"\s*from\s+([\w.]+)\s+import\s+(?:[\w\s,]*,\s*)?(\w*)$")


def _submodules(package_name):
    """Names of the modules inside a package (or top-level modules for ``""``)."""
    import importlib
    import pkgutil

    if not package_name:
        names = {info.name for info in pkgutil.iter_modules()}
        return names | {name.partition(".")[0] for name in sys.builtin_module_names}
    package = importlib.import_module(package_name)
    names = {info.name for info in pkgutil.iter_modules(getattr(package, "__path__", []))}
    prefix = package_name + "."
    names |= {
        name[len(prefix) :].partition(".")[0]
        for name in sys.builtin_module_names
        if name.startswith(prefix)
    }
    return names


def _import_candidates(line):
    """Completions after ``import`` / ``from``: module names, or a module's names."""
    if match := _FROM_IMPORT.match(line):
        module, prefix = match.groups()
        try:
            import importlib

            names = set(dir(importlib.import_module(module))) | _submodules(module)
        except Exception:
            names = set()
        return prefix, names
    if match := _IMPORT_MODULE.match(line):
        parent, _, prefix = match.group(1).rpartition(".")
        try:
            return prefix, _submodules(parent)
        except Exception:
            return prefix, set()
    return None


def complete(code, cursor):
    start, _ = _token_bounds(code, cursor, allow_after=False)
    token = code[start:cursor]
    line = code[:cursor].rpartition("\n")[2]
    if (imports := _import_candidates(line)) is not None:
        prefix, candidates = imports
        start = cursor - len(prefix)
    elif "." in token:
        base, _, prefix = token.rpartition(".")
        try:
            candidates = dir(_resolve(base))
        except Exception:
            candidates = []
        start = cursor - len(prefix)
    else:
        prefix = token
        candidates = list(_namespace()) + dir(builtins) + keyword.kwlist
    show_private = prefix.startswith("_")
    matches = sorted(
        {
            name
            for name in candidates
            if name.startswith(prefix) and (show_private or not name.startswith("_"))
        }
    )
    call_host("reply", content={"matches": matches, "cursor_start": start, "cursor_end": cursor})


def _call_context(code, cursor):
    """The name being called at the cursor, as in ``f(a, |``, for inspection."""
    depth = 0
    for index in range(cursor - 1, -1, -1):
        char = code[index]
        if char == ")":
            depth += 1
        elif char == "(":
            if depth == 0:
                return _token_bounds(code, index, allow_after=False)
            depth -= 1
    return None


def inspect_object(code, cursor, detail_level):
    import inspect

    start, end = _token_bounds(code, cursor, allow_after=True)
    name = code[start:end].strip(".")
    if not name and (context := _call_context(code, cursor)):
        name = code[context[0] : context[1]].strip(".")
    try:
        obj = _resolve(name)
    except Exception:
        call_host("reply", content={"found": False, "data": {}})
        return
    fields = [("Type", type(obj).__name__)]
    try:
        fields.append(("Signature", name + str(inspect.signature(obj))))
    except (TypeError, ValueError):
        if not callable(obj):
            fields.append(("String form", _shorten(repr(obj))))
    doc = inspect.getdoc(obj)
    if doc:
        fields.append(("Docstring", doc))
    if detail_level:
        try:
            fields.append(("Source", inspect.getsource(obj)))
        except (OSError, TypeError):
            pass
        source_file = getattr(inspect.getmodule(obj), "__file__", None)
        if source_file:
            fields.append(("File", source_file))
    text = "\n".join(
        f"{label}: {value}" if "\n" not in value else f"{label}:\n{value}"
        for label, value in fields
    )
    call_host("reply", content={"found": True, "data": {"text/plain": text}})


def _shorten(text, limit=200):
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_complete(code):
    import codeop

    try:
        compiled = codeop.compile_command(code, "<input>", "exec")
    except (SyntaxError, OverflowError, ValueError):
        call_host("reply", content={"status": "invalid"})
        return
    if compiled is not None and not code.rstrip("\n").endswith("\\"):
        call_host("reply", content={"status": "complete"})
        return
    last = code.rstrip("\n").splitlines()[-1] if code.strip() else ""
    indent = last[: len(last) - len(last.lstrip())]
    if last.rstrip().endswith(":"):
        indent += "    "
    call_host("reply", content={"status": "incomplete", "indent": indent})


# -- guest-only modules (IPython.display and friends) ------------------------------------------


class ShippedModules:
    """Import finder for modules the host ships as source, such as our own IPython.display."""

    def __init__(self, sources):
        self.sources = sources  # dotted name -> (source, is_package)

    def find_spec(self, name, path=None, target=None):
        if name not in self.sources:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, self, is_package=self.sources[name][1])

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        source, _ = self.sources[module.__name__]
        exec(compile(source, f"<wasm-kernel:{module.__name__}>", "exec"), module.__dict__)


# -- what the sandbox lacks, said plainly: network and threads ---------------------------------
# The runtime's _socket has no resolver and its sockets cannot be created, and threads cannot
# start; left alone, users meet "unknown url type: https", an AttributeError about
# _socket.getaddrinfo or "can't start new thread". Each of these now ends in one clear error.

NO_NETWORK = "there is no network in this sandbox"  # the traceback shim keys its hint on it
NO_THREADS = (
    "can't start new thread: threads are not available in this sandbox (its"
    " interpreter runs on a single thread); call the function directly instead"
)


class NetworkUnavailable(_socket.gaierror, ConnectionError):
    """Raised by every attempt to use the network. A gaierror and a ConnectionError (so an
    OSError), so code written for an offline machine handles it as it would there."""


NetworkUnavailable.__module__ = "socket"


def _no_network(host=None, port=None):
    message = f"Network is unreachable: {NO_NETWORK}"
    if isinstance(host, str) and host:
        message += f" (connecting to {host!r}" + (f", port {port})" if port is not None else ")")
    return NetworkUnavailable(errno.ENETUNREACH, message)


def _refuse_lookup(host=None, port=None, *args, **kwargs):
    """_socket's resolver functions (getaddrinfo, gethostbyname...), which the runtime lacks."""
    raise _no_network(host, port)


class _NoSocket(_socket.socket):
    """_socket.socket as the socket module sees it: creating a socket says why it cannot."""

    __slots__ = ()

    def __init__(self, *args, **kwargs):
        raise _no_network()


def _no_threads(*args, **kwargs):
    """_thread's thread starters: the same RuntimeError as before, with the reason."""
    raise RuntimeError(NO_THREADS)


def _https_open(handler, request):
    """urllib.request without ssl has no https handler ("unknown url type: https"): say that
    there is no network, wrapped in URLError as urllib wraps a failed connection."""
    import urllib.error

    raise urllib.error.URLError(_no_network(request.host))


def _fix_urllib_request(module):
    if not hasattr(module, "HTTPSHandler"):
        module.UnknownHandler.https_open = _https_open


def _fix_tqdm(module):
    """tqdm's monitor thread cannot start: without this every bar warns TqdmMonitorWarning."""
    module.tqdm.monitor_interval = 0


def _no_self_pipe(loop):
    """Stands for both making and closing the self-pipe: there is none."""
    loop._ssock = loop._csock = None


def _fix_asyncio(module):
    """asyncio's event loop wakes itself through a socket pair, which the sandbox cannot
    make; one thread never needs that wake-up, so loops (top-level await) do without it."""
    module.BaseSelectorEventLoop._make_self_pipe = _no_self_pipe
    module.BaseSelectorEventLoop._close_self_pipe = _no_self_pipe


IMPORT_FIXUPS = {
    "urllib.request": _fix_urllib_request,
    "tqdm.std": _fix_tqdm,
    "asyncio.selector_events": _fix_asyncio,
}


class ImportFixups:
    """Import finder that adjusts a few runtime modules right after they are imported, so
    nothing is imported at boot that a cell may never use."""

    def find_spec(self, name, path=None, target=None):
        if name not in IMPORT_FIXUPS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _FixingLoader(spec.loader, IMPORT_FIXUPS[name])
                return spec
        return None


class _FixingLoader:
    """Runs the real loader, then the fixup; the module keeps the real loader."""

    def __init__(self, loader, fixup):
        self.loader, self.fixup = loader, fixup

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            self.fixup(module)
        except Exception:
            pass

    def __getattr__(self, name):
        return getattr(self.loader, name)


def _without_network_and_threads():
    """Put the refusals in the builtin modules everything else reaches the network and
    threads through, before socket or threading is imported."""
    for name in (
        "getaddrinfo",
        "getnameinfo",
        "gethostbyname",
        "gethostbyname_ex",
        "gethostbyaddr",
    ):
        if not hasattr(_socket, name):
            setattr(_socket, name, _refuse_lookup)
    _socket.socket = _NoSocket
    _socket.NetworkUnavailable = NetworkUnavailable  # socket's `from _socket import *` shows it
    for name in ("start_new_thread", "start_new", "start_joinable_thread"):
        setattr(_thread, name, _no_threads)
    threading = sys.modules.get("threading")
    if threading is not None and hasattr(threading, "_start_joinable_thread"):
        threading._start_joinable_thread = _no_threads
    sys.meta_path.insert(0, ImportFixups())


# -- files across a rollback -------------------------------------------------------------------
# A rollback puts back the guest's memory, but the host's table of open descriptors stays as
# the trapped cell left it. A file object from before that cell may then hold a descriptor the
# cell closed, and that number may now belong to a file the cell opened. So files opened
# through open() are remembered, and at the end of each cell (before the checkpoint) each new
# one gets the identity (device, inode) of what it opened. After a rollback the host calls
# close_stale_files(): a file whose descriptor now leads elsewhere is closed, a clear "I/O
# operation on closed file" instead of writes into another file.

_file_identities = weakref.WeakKeyDictionary()  # io.FileIO -> (st_dev, st_ino), or None: new


def _identity(raw):
    try:
        status = os.fstat(raw.fileno())
    except (OSError, ValueError):
        return None
    return (status.st_dev, status.st_ino)


class _RememberingOpen:
    """open() that remembers the files it opens. A callable object rather than a function
    so that, like the builtin, it does not turn into a method as a class attribute."""

    def __init__(self, real_open):
        self._real_open = real_open
        functools.update_wrapper(self, real_open)

    def __call__(self, *args, **kwargs):
        file = self._real_open(*args, **kwargs)
        raw = getattr(getattr(file, "buffer", file), "raw", file)
        if isinstance(raw, io.FileIO):
            _file_identities[raw] = None  # fstat waits for the cell's end: opens stay cheap
        return file

    def __repr__(self):
        return repr(self._real_open)


def _note_new_files():
    for raw, identity in list(_file_identities.items()):
        if identity is None and not raw.closed:
            _file_identities[raw] = _identity(raw)


def close_stale_files():
    for raw, identity in list(_file_identities.items()):
        if identity is not None and not raw.closed and _identity(raw) != identity:
            try:
                raw.close()  # marks it closed even when the descriptor is already gone
            except OSError:
                pass


def get_ipython():
    return shell


def install_modules(sources):
    """Called by the host once this module is registered: ship the guest-only modules and
    remember the pieces the host drives, for ``_intact``."""
    global _self, _originals
    sys.meta_path.insert(0, ShippedModules(sources))
    _self = sys.modules[__name__]
    _originals = {
        name: value
        for name, value in globals().items()
        if isinstance(value, (type, types.FunctionType, Shell))
    }


def _intact():
    """Whether the host can still drive this module: a cell may have removed it from
    sys.modules, replaced its functions or broken the import system."""
    try:
        module = builtins.__import__(__name__)
    except BaseException:
        return False
    return module is _self and all(
        module.__dict__.get(name) is value for name, value in _originals.items()
    )


# -- boot -------------------------------------------------------------------------------------


def boot():
    # Line-buffered, write-through streams: output reaches the kernel as it is printed.
    for stream in (sys.__stdout__, sys.__stderr__):
        stream.reconfigure(line_buffering=True, write_through=True)
    sys.displayhook = displayhook
    builtins.display = display
    builtins.input = input
    builtins.open = io.open = _RememberingOpen(io.open)
    getpass.getpass = getpass_
    time.sleep = sleep
    # The signal module gives SIGINT its default handler, so a KeyboardInterrupt is raised when
    # the host trips CPython's signal flags (see the host's snapshot.SignalFlags).
    import signal  # noqa: F401

    _without_network_and_threads()

    # Start where the host says (the notebook's mounted folder, or the private /tmp), so
    # relative paths just work.
    os.chdir(os.environ.get("PWD", "/tmp"))
    namespace = sys.modules["__main__"].__dict__
    namespace.setdefault("__builtins__", builtins)
    namespace["get_ipython"] = get_ipython
    shell.initial_names = set(namespace)


boot()
