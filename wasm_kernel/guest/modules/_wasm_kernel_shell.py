"""IPython's InteractiveShell, wired to the host the way ipykernel wires its ZMQ shell.

Results and display() go out through ``_wasm_kernel_display``, errors through
``_showtraceback`` (as ``_wasm_kernel_tracebacks`` shows them), and pages, set_next_input and
exit through execute_reply payloads. What the sandbox cannot do (processes, GUIs, threads) is
refused with one clear line, here and in ``_wasm_kernel_magics``.

The class is named ``ZMQInteractiveShell`` because that is what pandas, plotly and others
look for to tell a notebook front end from a terminal, and it has a ``kernel`` as ipykernel's
shell has (pandas decides from it, when it is imported, whether to fit wide frames to a
terminal or show every column). IPython's module for WebAssembly builds without processes
is imported, as under JupyterLite: tqdm.auto looks for it (or ipykernel's) to choose its
widget bars (comms: see ``_wasm_kernel_comms``).
"""

import contextlib
import os
import re
import sys

import _wasm_kernel_contract as contract
import _wasm_kernel_debugging
import _wasm_kernel_magics
import _wasm_kernel_visual_debugger
from _wasm_kernel_cell_files import cell_file
from _wasm_kernel_display import (
    HostDisplayFormatter,
    HostDisplayHook,
    HostDisplayPublisher,
    jsonable,
)
from _wasm_kernel_magics import NO_GUI, NO_PROCESSES
from _wasm_kernel_tracebacks import exception_tree, sandbox_hint, without_kernel_frames
from IPython.core.autocall import ZMQExitAutocall
from IPython.core.compilerop import CachingCompiler
from IPython.core.error import UsageError
from IPython.core.history import HistoryManager
from IPython.core.inputtransformer2 import (
    ESCAPE_SINGLES,
    EscapedCommand,
    HelpEnd,
    MagicAssign,
    SystemAssign,
    TransformerManager,
)
from IPython.core.interactiveshell import InteractiveShell
from traitlets import Instance, Type, default
from traitlets.config import Config

INLINE = "module://matplotlib_inline.backend_inline"
NOTEBOOK_BACKENDS = ("notebook", "nbagg", "widget", "ipympl")


def _kernel():
    """The kernel's guest module as it is now (the host may have reinstalled it)."""
    return sys.modules["_wasm_kernel"]


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


class CellFileCompiler(CachingCompiler):
    """Names a cell's code as ipykernel does, by a path in a folder of the temporary
    directory (``/tmp/ipykernel_<pid>/<murmur2 of the code>.py``, see
    ``_wasm_kernel_cell_files``) where IPython's terminal has ``<ipython-input-N-...>``: the
    debuggers, warnings and ``inspect`` show what they show natively. Every code object
    compiled is told to the visual debugger, whose breakpoints may come later."""

    def get_code_name(self, raw_code, transformed_code, number):
        return cell_file(raw_code)

    def __call__(self, *args, **kwargs):
        code = super().__call__(*args, **kwargs)
        _wasm_kernel_visual_debugger.compiled(code)
        return code


#: IPython's own token transformers, each of which acts only on a token that is one of these
#: characters (a magic, a shell escape, a help request, an autocall escape).
STOCK_TOKEN_TRANSFORMERS = [MagicAssign, SystemAssign, EscapedCommand, HelpEnd]
TOKEN_MARKS = re.compile("[" + re.escape("".join(sorted(ESCAPE_SINGLES))) + "]")


class CellTransformerManager(TransformerManager):
    """IPython's, less tokenizing a cell that none of its token transformers can change (one
    with none of their characters): the tokenizing was a tenth of a bare cell's cost. A
    transformer the user adds is run as natively."""

    def do_token_transforms(self, lines):
        stock = self.token_transformers == STOCK_TOKEN_TRANSFORMERS
        if stock and TOKEN_MARKS.search("".join(lines)) is None:
            return lines
        return super().do_token_transforms(lines)


class CellHistory(HistoryManager):
    """IPython's, with the last inputs it hands to ``_i``, ``_ii``, ``_iii`` kept as plain
    attributes rather than traits: setting the four traits at every cell, each validated and
    announced to no observer, cost as much as the rest of storing the cell."""

    _i00 = _i = _ii = _iii = ""


class ZMQInteractiveShell(InteractiveShell):
    """The shell behind ``get_ipython()`` in the sandbox (named as ipykernel's: see above)."""

    @default("input_transformer_manager")
    def _default_input_transformer_manager(self):
        return CellTransformerManager()

    compiler_class = Type(CellFileCompiler)
    displayhook_class = Type(HostDisplayHook)
    display_pub_class = Type(HostDisplayPublisher)
    kernel = Instance(GuestKernel, ())  # as ipykernel's shell.kernel: see the module's doc
    # Plain attributes, not InteractiveShell's traits (none configurable, announced to no
    # observer): a cell with a result read and set them ~10 times through traitlets, 7% of a
    # bare ``x + 1`` cell's cost.
    execution_count = 1
    last_execution_succeeded = True
    last_execution_result = None

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

    def init_history(self):
        self.history_manager = CellHistory(shell=self, parent=self)
        self.configurables.append(self.history_manager)

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
        for exc in exception_tree(value):
            exc.__traceback__ = without_kernel_frames(exc.__traceback__)
        return etype, value, without_kernel_frames(tb)

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

    _wasm_kernel_magics.install(shell)
    _wasm_kernel_debugging.install(shell)
    return shell
