"""IPython's InteractiveShell, wired to the host the way ipykernel wires its ZMQ shell.

Results go out through the display hook (execute_result), display() and friends through the
display publisher (display_data, update_display_data, clear_output), errors through
``_showtraceback``, and pages, set_next_input and exit through execute_reply payloads. What
the sandbox cannot do (processes, GUIs, threads) is refused with one clear line.

The class is named ``ZMQInteractiveShell`` because that is what pandas, plotly and others
look for to tell a notebook front end from a terminal, and it has a ``kernel`` as ipykernel's
shell has (pandas decides from it, when it is imported, whether to fit wide frames to a
terminal or show every column). IPython's module for WebAssembly builds without processes
is imported, as under JupyterLite: tqdm.auto looks for it (or ipykernel's) to choose its
widget bars (comms: see ``_wasm_kernel_comms``).
"""

import base64
import contextlib
import itertools
import json
import os
import sys

import _wasm_kernel_contract as contract
import _wasm_kernel_debugging
import _wasm_kernel_sandbox
from IPython.core import formatters
from IPython.core.autocall import ZMQExitAutocall
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.lib import pretty
from traitlets import Instance, Type, default
from traitlets.config import Config

NO_PROCESSES = (
    "this kernel runs Python in a WebAssembly sandbox, which cannot start processes or shell"
    " commands. Use Python instead (os, pathlib, shutil work on the sandbox's own files)."
)
NO_GUI = "there is no GUI in this sandbox: figures are shown inline, as images"
INLINE = "module://matplotlib_inline.backend_inline"
NOTEBOOK_BACKENDS = ("notebook", "nbagg", "widget", "ipympl")
REFUSED_HINTS = (
    # (exception class, start of its message, the hint shown under the traceback)
    (
        PermissionError,
        "[Errno 63] ",  # EPERM: what WASI answers outside the grants, or for read-only paths
        (
            "(The sandbox refused this path: only its mounted folders are reachable, and only /tmp"
            " and read-write mounts can be changed. %sandbox lists them.)"
        ),
    ),
    (
        OSError,
        "[Errno 19] ",  # EDQUOT: the private /tmp is over its size limit
        (
            "(The private /tmp is over its size limit, so nothing there can grow: delete files in"
            " it to write again. Files that were open for writing there have become read-only.)"
        ),
    ),
    (
        OSError,
        "[Errno 33] ",  # EMFILE: the sandbox's cap on open descriptors
        (
            "(The sandbox limits how many files a kernel may hold open at once: close the ones you"
            " no longer need, for example by opening them in a `with` block.)"
        ),
    ),
)
NETWORK_HINT = (
    "(The sandbox has no network. To use data, put the files in the notebook's folder (the"
    " notebook profile mounts it read-only at /notebook) or in a folder the operator mounts,"
    " or upload them there with Jupyter, then read them by path. %sandbox lists the folders.)"
)
NETWORK_MODULES = {"ssl", "_ssl", "requests", "httpx", "aiohttp", "urllib3"}
#: Exact types of the commonest cell results. Their classes are immutable, so no ``_repr_*_``
#: method can be added to them: only a registered printer can make a formatter other than
#: text/plain answer for their values.
PLAIN_RESULT_TYPES = frozenset(
    {int, float, complex, bool, str, bytes, type(None), list, tuple, dict, set, frozenset}
)
#: How a printer registered by name (``for_type_by_name``) names each class they are made of.
DEFERRED_NAMES = {
    cls: tuple((base.__module__, base.__name__) for base in cls.__mro__)
    for cls in PLAIN_RESULT_TYPES
}
#: Exact types whose pretty text is their repr while pretty's stock printer prints them.
REPR_TYPES = frozenset({int, str, bool, type(None)})
#: IPython's own formatters, whose answer for a value comes only from a registered printer or
#: the value's ``print_method`` (a subclass or any other formatter may do anything).
STOCK_FORMATTERS = frozenset(
    {
        formatters.HTMLFormatter,
        formatters.MarkdownFormatter,
        formatters.SVGFormatter,
        formatters.PNGFormatter,
        formatters.PDFFormatter,
        formatters.JPEGFormatter,
        formatters.LatexFormatter,
        formatters.JSONFormatter,
        formatters.JavascriptFormatter,
        formatters.IPythonDisplayFormatter,
        formatters.MimeBundleFormatter,
    }
)


def _kernel():
    """The kernel's guest module as it is now (the host may have reinstalled it)."""
    return sys.modules["_wasm_kernel"]


def jsonable(data):
    """A mime bundle the host can read: bytes base64-encoded (as ipykernel's json_clean),
    anything JSON cannot hold shown by its str."""
    encoded = {}
    for key, value in (data or {}).items():
        if isinstance(value, (bytes, bytearray)):
            value = base64.b64encode(value).decode("ascii")
        encoded[str(key)] = json.loads(json.dumps(value, default=str))
    return encoded


class FormatterView:
    """What a formatter answers from, as plain attributes kept current by trait observers:
    reading the traits themselves on every result cost more than the formatting saved. The
    printer registries are the formatter's own dicts, so ``for_type`` and friends, which
    change them in place, are seen at once."""

    TRAITS = ("enabled", "print_method", "singleton_printers", "type_printers", "deferred_printers")

    def __init__(self, formatter):
        self.formatter = formatter
        self.refresh()
        formatter.observe(self.refresh, names=list(self.TRAITS))

    def refresh(self, change=None):
        formatter = self.formatter
        self.enabled = formatter.enabled
        self.print_method = formatter.print_method
        self.singletons = formatter.singleton_printers
        self.types = formatter.type_printers
        self.deferred = formatter.deferred_printers
        self._has_method = {}  # type: whether it has print_method (builtin types are fixed)

    def may_answer(self, obj):
        """Whether the formatter could give something for ``obj`` (an instance of a
        PLAIN_RESULT_TYPE, which has no ``__getattr__``): it is enabled and a printer is
        registered for the value or its type, or the type has the formatter's method."""
        if not self.enabled:
            return False
        cls = type(obj)
        if id(obj) in self.singletons:
            return True
        has_method = self._has_method.get(cls)
        if has_method is None:
            has_method = self._has_method[cls] = hasattr(cls, self.print_method)
        return (
            has_method
            or not self.types.keys().isdisjoint(cls.__mro__)
            or not self.deferred.keys().isdisjoint(DEFERRED_NAMES[cls])
        )


class HostDisplayFormatter(formatters.DisplayFormatter):
    """IPython's, less the work of asking every formatter about a value that only text/plain
    can answer for: calling each of the dozen formatters was a third of a bare ``x + 1``
    cell's cost. The proof is made on every call from the formatters as they are then, so a
    printer the user registers, a formatter they enable or add, wins as it does natively."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._views = {}  # formatter: its FormatterView

    def _view(self, formatter):
        view = self._views.get(formatter)
        if view is None:
            view = self._views[formatter] = FormatterView(formatter)
        return view

    def format(self, obj, include=None, exclude=None):
        plain = self.formatters.get("text/plain")
        if include or exclude or plain is None or not self._only_plain_text_answers(obj):
            return super().format(obj, include=include, exclude=exclude)
        data, metadata = self._plain_text(plain, obj), None  # as super().format calls it
        if isinstance(data, tuple) and len(data) == 2:
            data, metadata = data
        return (
            {} if data is None else {"text/plain": data},
            {} if metadata is None else {"text/plain": metadata},
        )

    def _plain_text(self, plain, obj):
        """What ``plain(obj)`` gives; for the REPR_TYPES still printed by pretty's stock
        ``_repr_pprint``, that is their one-line repr, got without building a pretty printer."""
        cls = type(obj)
        if type(plain) is formatters.PlainTextFormatter and cls in REPR_TYPES:
            view = self._view(plain)
            if id(obj) in view.singletons:
                printer = view.singletons[id(obj)]
            else:
                printer = view.types.get(cls)
            if printer is pretty._repr_pprint:
                try:
                    text = repr(obj)
                except Exception:  # an int too long to print: IPython's own error handling
                    return plain(obj)
                if len(text.splitlines()) == 1:
                    return text
        return plain(obj)

    def _only_plain_text_answers(self, obj):
        if type(obj) not in PLAIN_RESULT_TYPES:
            return False
        others = [self.ipython_display_formatter, self.mimebundle_formatter]
        others += [f for mime, f in self.formatters.items() if mime != "text/plain"]
        for formatter in others:
            if type(formatter) not in STOCK_FORMATTERS or self._view(formatter).may_answer(obj):
                return False
        return True


class HostDisplayHook(DisplayHook):
    """A cell's value becomes its execute_result."""

    def start_displayhook(self):
        self.bundle = {"data": {}, "metadata": {}}

    def write_output_prompt(self):
        pass

    def write_format_data(self, format_dict, md_dict=None):
        self.bundle = {"data": jsonable(format_dict), "metadata": jsonable(md_dict)}

    def finish_displayhook(self):
        bundle, self.bundle = self.bundle, None
        if bundle and bundle["data"]:
            _kernel().call_host(contract.RESULT, **bundle)


class HostDisplayPublisher(DisplayPublisher):
    """display(), update_display() and clear_output() become Jupyter messages."""

    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **_):
        if not isinstance(data, dict):  # as ipykernel's publisher says
            raise TypeError(f"data must be a dict, got: {data!r}")
        for mime, value in data.items():
            if not (isinstance(value, (str, bytes, bytearray, dict, list)) or "json" in mime):
                raise TypeError(
                    f"display data for {mime} must be text, bytes or JSON, not"
                    f" {type(value).__name__}: the notebook format cannot hold it"
                )
        _kernel().call_host(
            contract.DISPLAY,
            data=jsonable(data),
            metadata=jsonable(metadata),
            transient=jsonable(transient),
            update=bool(update),
        )

    def clear_output(self, wait=False):
        _kernel().call_host(contract.CLEAR, wait=bool(wait))


class GuestKernel:
    """What ``get_ipython().kernel`` is in the sandbox. Under ipykernel it is the kernel object;
    libraries ask whether there is one to tell a kernel from a terminal (pandas at import), so
    its presence is what matters. It says which kernel it is, and nothing of ipykernel's."""

    implementation = "wasm-kernel"

    def get_parent(self, channel="shell"):
        """The request being answered, as ipykernel's kernel keeps it: ipywidgets' Output
        widget captures the output of the request whose id it finds here."""
        return {"header": _kernel().call_host(contract.PARENT).get("header", {})}

    def __repr__(self):
        return "<wasm-kernel's guest side>"


class ZMQInteractiveShell(InteractiveShell):
    """The shell behind ``get_ipython()`` in the sandbox (named as ipykernel's: see above)."""

    displayhook_class = Type(HostDisplayHook)
    display_pub_class = Type(HostDisplayPublisher)
    kernel = Instance(GuestKernel, ())  # as ipykernel's shell.kernel: see the module's doc

    def _tee(self, channel):
        """IPython copies everything a cell prints into its output history: in the sandbox
        that is guest memory the output limit does not bound (the printing goes on after the
        notebook stops showing it), and it breaks every later cell once a cell sets
        sys.stdout to None. The kernel keeps no output history, so nothing is copied."""
        return contextlib.nullcontext()

    async def run_code(self, code_obj, result=None, *, async_=False):
        try:
            return await super().run_code(code_obj, result, async_=async_)
        finally:
            for name in ("stdout", "stderr"):
                if not hasattr(sys, name):  # deleted by the cell: IPython needs them next
                    setattr(sys, name, getattr(sys, f"__{name}__"))

    def init_display_formatter(self):
        self.display_formatter = HostDisplayFormatter(parent=self)
        self.configurables.append(self.display_formatter)

    def init_virtualenv(self):
        pass  # the guest has no virtualenv, and IPython's check would look for a host path

    def init_hooks(self):
        super().init_hooks()
        self.set_hook("show_in_pager", self._page, 99)

    def _page(self, _shell, text, start=0, screen_lines=0, pager_cmd=None):
        """'?' and %pinfo: the page goes to the front end as a payload, as under ipykernel."""
        data = jsonable(text if isinstance(text, dict) else {"text/plain": text})
        self.payload_manager.write_payload(
            {"source": "page", "data": data, "start": max(0, int(start))}
        )

    def set_next_input(self, text, replace=False):
        self.payload_manager.write_payload(
            {"source": "set_next_input", "text": text, "replace": bool(replace)}
        )

    keepkernel_on_exit = False  # exit(keep_kernel=True) sets it, as under ipykernel

    @default("exiter")
    def _default_exiter(self):
        return ZMQExitAutocall(self)  # exit, exit(), exit(keep_kernel=True): ipykernel's

    def ask_exit(self):
        """The host ends the kernel when the reply is out, unless keepkernel."""
        keep = bool(self.keepkernel_on_exit)
        self.payload_manager.write_payload({"source": "ask_exit", "keepkernel": keep})

    def _get_exc_info(self, exc_tuple=None):
        etype, value, tb = super()._get_exc_info(exc_tuple)
        for exc in _exception_tree(value):
            exc.__traceback__ = _without_kernel_frames(exc.__traceback__)
        return etype, value, _without_kernel_frames(tb)

    def showtraceback(self, exc_tuple=None, *args, **kwargs):
        """Out of memory, the guest's reserve is given back first: formatting the error needs
        room, and so does the next cell."""
        if isinstance((exc_tuple or sys.exc_info())[1], MemoryError):
            _kernel().release_reserve()
        super().showtraceback(exc_tuple, *args, **kwargs)

    def _showtraceback(self, etype, evalue, stb):
        hint = sandbox_hint(evalue)
        lines = list(stb) + ([hint] if hint else [])
        name = "SyntaxError" if etype.__name__ == "_IncompleteInputError" else etype.__name__
        _kernel().report(name, str(evalue), lines)
        self._last_traceback = stb

    def system(self, cmd):
        raise UsageError(f"!{cmd}: {NO_PROCESSES}")

    system_piped = system_raw = system

    def getoutput(self, cmd, split=True, depth=0):
        raise UsageError(f"!{cmd}: {NO_PROCESSES}")

    def enable_gui(self, gui=None):
        if gui not in (None, "inline"):
            raise UsageError(f"%gui {gui}: {NO_GUI}.")

    def enable_matplotlib(self, gui=None):
        if gui in NOTEBOOK_BACKENDS:
            print(
                f"%matplotlib {gui}: interactive figures need a live connection to the"
                " front end, which the sandbox does not have; figures are shown inline.",
                file=sys.stderr,
            )
            gui = "inline"
        elif gui not in (None, "inline", "agg"):
            raise UsageError(f"%matplotlib {gui}: {NO_GUI}.")
        return super().enable_matplotlib(gui)


def _exception_tree(exc, seen=None):
    """``exc`` and every exception chained to it or grouped in it."""
    seen = set() if seen is None else seen
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        for member in getattr(exc, "exceptions", None) or ():
            if isinstance(member, BaseException):
                yield from _exception_tree(member, seen)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)


def _without_kernel_frames(tb):
    """The traceback less the frames of the kernel's own guest code."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(contract.KERNEL_FILES):
            kept.append(tb)
        tb = tb.tb_next
    for earlier, later in itertools.pairwise(kept):
        earlier.tb_next = later
    if kept:
        kept[-1].tb_next = None
    return kept[0] if kept else None


def sandbox_hint(exc):
    """One line saying how the sandbox caused this error, or None."""
    text = str(exc)
    if any(_wasm_kernel_sandbox.NO_NETWORK in str(e) for e in _exception_tree(exc)):
        return NETWORK_HINT
    if isinstance(exc, ModuleNotFoundError):
        return _missing_module_hint(exc.name or "")
    for kind, start, hint in REFUSED_HINTS:
        if isinstance(exc, kind) and text.startswith(start):
            return hint
    return None


def _missing_module_hint(name):
    """Whether the runtime ships the module, and how to see what it ships."""
    top = name.partition(".")[0]
    listing = "help('modules') lists the modules it ships."
    if top in NETWORK_MODULES:
        return (
            f"(The sandbox's runtime does not ship {top}: the sandbox has no network for it"
            f" to use. {listing})"
        )
    if top != name and _ships(top):
        return f"(The sandbox's runtime ships {top}, but not {name}. {listing})"
    if top in sys.stdlib_module_names:
        return (
            "(The sandbox's runtime, a WASI build of CPython, leaves out this part of the"
            f" standard library. {listing})"
        )
    return (
        f"(The sandbox's runtime does not ship {name or 'this module'}. `%pip install NAME`"
        f" adds pure-Python packages where the kernel allows it. {listing})"
    )


def _ships(name):
    try:
        import importlib.util

        return importlib.util.find_spec(name) is not None
    except Exception:
        return False


@magics_class
class SandboxMagics(Magics):
    """%sandbox, and one clear line for the magics that need processes or a GUI."""

    @line_magic
    def sandbox(self, line):
        """Show what the sandbox grants: profile, host folders, limits, runtime."""
        print(_kernel().call_host(contract.DESCRIBE).get("text", "(not available here)"))

    @line_magic
    def pip(self, line):
        """%pip install|uninstall|list|show: the host's pip does the work, where the kernel
        allows it; the sandbox sends package names only (and reads ``-r`` files itself)."""
        import importlib
        import shlex

        words, names, upgrade = shlex.split(line), [], False
        command = words.pop(0) if words else ""
        if command not in contract.PIP_COMMANDS:
            raise UsageError(
                f"%pip {command}: the commands here are install, uninstall, list, show"
            )
        while words:
            word = words.pop(0)
            if word in ("-r", "--requirement") and words:
                with open(words.pop(0)) as requirements:
                    names += [row.split("#")[0].strip() for row in requirements]
            elif word in ("-U", "--upgrade"):
                upgrade = True
            elif word not in ("-y", "--yes", "-q", "--quiet"):
                names.append(word)
        names = [name for name in names if name]
        reply = _kernel().call_host(contract.PIP, command=command, args=names, upgrade=upgrade)
        importlib.invalidate_caches()
        if reply.get("error") == contract.INTERRUPTED:
            raise KeyboardInterrupt
        if reply.get("text"):
            print(reply["text"])
        if reply.get("error"):
            raise UsageError(reply["error"])

    @line_magic
    def conda(self, line):
        """conda needs processes; %pip installs pure-Python packages where allowed."""
        raise UsageError(
            "%conda: conda cannot run in this sandbox (no processes); %pip install takes"
            " pure-Python packages where the kernel allows it. `%pip list` shows what the runtime"
            " ships."
        )

    @line_magic
    def snapshot(self, line):
        """%snapshot save|restore|list|delete NAME: images of this session, kept by the kernel
        (save and restore happen when the cell ends). %snapshot forget: this notebook's session
        is not kept (hibernated) when it is closed; it opens with a fresh interpreter."""
        action, _, name = line.strip().partition(" ")
        reply = _kernel().call_host(contract.SNAPSHOT, action=action, name=name.strip())
        if "error" in reply:
            raise UsageError(reply["error"])
        if reply.get("text"):
            print(reply["text"])

    @line_magic
    def gui(self, line):
        """There is no GUI event loop in the sandbox; only ``inline`` (a no-op) is taken."""
        name = line.strip()
        if name not in ("", "inline"):
            raise UsageError(f"%gui {name}: {NO_GUI}.")

    @line_cell_magic
    def script(self, line, cell=None):
        """Scripts run in processes, which the sandbox has none of."""
        raise UsageError(f"%%script {line}".rstrip() + f": {NO_PROCESSES}")


PROCESS_MAGICS = ("bash", "sh", "system", "sx", "perl", "ruby", "python2", "python3", "pypy")


def _no_process_magic(name):
    def refuse(line, cell=None):
        raise UsageError(f"%{name}: {NO_PROCESSES}")

    refuse.__doc__ = "Not in the sandbox: it cannot start processes."
    return refuse


def _module_names_in(path, list_folder):
    """IPython's module_list, for zips too: it reads a private attribute of zipimport that
    Python 3.15 no longer has, so ``import `` could not complete the zipped stdlib."""
    if path and os.path.isdir(path):
        return list_folder(path)
    import pkgutil

    return [info.name for info in pkgutil.iter_modules([path])]


def _root_modules(get_root_modules):
    """The runtime builds extension modules in (``matplotlib._path``): complete their top
    level, as a folder of packages would."""
    return sorted({name.partition(".")[0] for name in get_root_modules()})


def _fix_module_completion():
    from IPython.core import completerlib

    list_folder, root_modules = completerlib.module_list, completerlib.get_root_modules
    completerlib.module_list = lambda path: _module_names_in(path, list_folder)
    completerlib.get_root_modules = lambda: _root_modules(root_modules)


def _refuse_jpeg_without_encoder():
    """The runtime's Pillow has no JPEG encoder: choosing JPEG figures fails here, clearly,
    instead of at the end of every later cell."""
    from IPython.core import pylabtools

    select = pylabtools.select_figure_formats

    def select_figure_formats(shell, formats, **kwargs):
        wanted = {formats} if isinstance(formats, str) else set(formats)
        if wanted & {"jpg", "jpeg"}:
            from PIL import features

            if not features.check("jpg"):
                raise ValueError(
                    "JPEG figures are not available: this runtime's Pillow has no JPEG"
                    " encoder. Use 'png', 'retina' or 'svg'."
                )
        return select(shell, formats, **kwargs)

    pylabtools.select_figure_formats = select_figure_formats


def create_shell(user_module, plain_tracebacks=False):
    """The one shell of this interpreter, as ipykernel configures its own."""
    config = Config()
    config.HistoryManager.hist_file = ":memory:"  # no file, and no saving thread
    config.IPCompleter.use_jedi = False  # seconds per completion in the guest
    config.InteractiveShell.colors = "nocolor" if plain_tracebacks else "neutral"
    os.environ.setdefault("MPLBACKEND", INLINE)
    ipython_dir = os.path.expanduser("~/.ipython")  # HOME is the private /tmp
    made = not os.path.exists(ipython_dir)
    shell = ZMQInteractiveShell.instance(config=config, user_module=user_module)
    if made:  # the profile folder IPython makes at start holds nothing this kernel uses (no
        # history file, no config): a fresh /tmp stays empty; IPython makes it again if needed
        import shutil

        shutil.rmtree(ipython_dir, ignore_errors=True)
    _fix_module_completion()
    _refuse_jpeg_without_encoder()
    import IPython.utils._process_emscripten  # noqa: F401 (true here too; see the module's doc)

    shell.magics_manager.register(SandboxMagics)
    _wasm_kernel_debugging.install(shell)
    for name in PROCESS_MAGICS:
        shell.register_magic_function(_no_process_magic(name), "line_cell", name)
    return shell
