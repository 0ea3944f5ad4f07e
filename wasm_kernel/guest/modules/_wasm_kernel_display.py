"""Where a cell's output goes: its value through the display hook (execute_result),
display() and friends through the display publisher (display_data, update_display_data,
clear_output), both as messages to the host; and the formatter that spares plain values the
dozen formatters they cannot answer to.
"""

import base64
import json
import sys

import _wasm_kernel_contract as contract
from IPython.core import formatters
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.lib import pretty
from traitlets.config import Configurable

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
#: IPython's ``ast_node_interactivity`` values under which only a cell's last statement (an
#: expression, or an assignment) shows its value, once.
LAST_STATEMENT_ONLY = frozenset({"last_expr", "last_expr_or_assign"})
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
        if type(value) is str:  # as it would come back (the commonest: text/plain)
            encoded[str(key)] = value
            continue
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
        self.has_method = {}  # type: whether it has print_method (builtin types are fixed)


class HostDisplayFormatter(formatters.DisplayFormatter):
    """IPython's, less the work of asking every formatter about a value that only text/plain
    can answer for: calling each of the dozen formatters was a third of a bare ``x + 1``
    cell's cost. The proof is made on every call from the formatters as they are then, so a
    printer the user registers, a formatter they enable or add, wins as it does natively."""

    WIRING = ("formatters", "ipython_display_formatter", "mimebundle_formatter")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._views = {}  # formatter: its FormatterView
        self._rewired()
        self.observe(self._rewired, names=list(self.WIRING))

    def _rewired(self, change=None):
        """The formatters as the traits hold them now (traits cost too much to read on every
        result); the dict of formatters by mime type is read afresh at each result, since it
        changes in place (``register_formatter``)."""
        self._by_mime = self.formatters
        self._fixed = (self.ipython_display_formatter, self.mimebundle_formatter)

    def _view(self, formatter):
        view = self._views.get(formatter)
        if view is None:
            view = self._views[formatter] = FormatterView(formatter)
        return view

    def format(self, obj, include=None, exclude=None):
        plain = self._by_mime.get("text/plain")
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
        cls = type(obj)
        if cls not in PLAIN_RESULT_TYPES:
            return False
        for formatter in self._fixed:
            if self._may_answer(formatter, obj, cls):
                return False
        for mime, formatter in self._by_mime.items():
            if mime != "text/plain" and self._may_answer(formatter, obj, cls):
                return False
        return True

    def _may_answer(self, formatter, obj, cls):
        """Whether ``formatter`` could give something for ``obj`` (an instance of ``cls``, a
        PLAIN_RESULT_TYPE, which has no ``__getattr__``): any but IPython's own might; one of
        those, if enabled, when a printer is registered for the value or its type, or the type
        has the formatter's method."""
        if type(formatter) not in STOCK_FORMATTERS:
            return True
        view = self._views.get(formatter)
        if view is None:
            view = self._view(formatter)
        if not view.enabled:
            return False
        if id(obj) in view.singletons:
            return True
        has_method = view.has_method.get(cls)
        if has_method is None:
            has_method = view.has_method[cls] = hasattr(cls, view.print_method)
        return (
            has_method
            or not view.types.keys().isdisjoint(cls.__mro__)
            or not view.deferred.keys().isdisjoint(DEFERRED_NAMES[cls])
        )


class _ShellAsArgument(Configurable):
    """Takes the ``shell`` argument DisplayHook passes on to Configurable, where ``shell`` is
    not a trait (HostDisplayHook's is a plain attribute, which DisplayHook then sets)."""

    def __init__(self, shell=None, **kwargs):
        super().__init__(**kwargs)


class HostDisplayHook(DisplayHook, _ShellAsArgument):
    """A cell's value becomes its execute_result.

    ``shell`` and ``exec_result`` are plain attributes here, not DisplayHook's traits: a cell
    with a result read them ~25 times and set ``exec_result`` twice, each time through
    traitlets (validated, announced to no observer), 6% of a bare ``x + 1`` cell's cost."""

    shell = None
    exec_result = None

    @staticmethod
    def semicolon_at_end_of_expression(expression):
        """IPython's answer (is the cell's last token a ';', which silences its result?),
        without tokenizing the cell when it has no ';' at all: a tenth of a bare cell's cost."""
        if ";" not in expression:
            return False
        return DisplayHook.semicolon_at_end_of_expression(expression)

    def start_displayhook(self):
        self.bundle = {"data": {}, "metadata": {}}

    def write_output_prompt(self):
        pass

    def write_format_data(self, format_dict, md_dict=None):
        self.bundle = {"data": jsonable(format_dict), "metadata": jsonable(md_dict)}

    def finish_displayhook(self):
        bundle, self.bundle = self.bundle, None
        if bundle and bundle["data"]:
            # where only a cell's last statement shows its value; other modes show values as
            # statements run, and each must reach the front end as it comes
            last = self.shell.ast_node_interactivity in LAST_STATEMENT_ONLY
            _kernel().call_host(contract.RESULT, last=last, **bundle)


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
