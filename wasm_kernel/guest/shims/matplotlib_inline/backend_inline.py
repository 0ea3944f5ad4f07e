"""Inline figures: matplotlib figures sent to the notebook as image outputs.

``matplotlib_inline.sandbox_backend`` is the backend matplotlib loads (the sandbox's
``MPLBACKEND``); this module holds its behaviour and public settings. Figures drawn in a cell are shown when
the cell ends, or at ``plt.show()``, and then closed, as with IPython's inline backend. The
formats and savefig options are set with ``%config InlineBackend.figure_format = 'svg'`` or
``set_matplotlib_formats('retina')``.
"""

import base64
import io

import _wasm_kernel
from matplotlib._pylab_helpers import Gcf
from matplotlib.backend_bases import FigureManagerBase

FORMATS = {"png", "retina", "jpeg", "svg", "pdf"}

settings = {
    "figure_formats": {"png"},
    "print_figure_kwargs": {"bbox_inches": "tight"},
    "close_figures": True,
}


def configure(
    figure_format=None, figure_formats=None, print_figure_kwargs=None, close_figures=None
):
    """The InlineBackend settings ``%config`` can change."""
    if figure_format is not None:
        figure_formats = {figure_format}
    if figure_formats is not None:
        formats = {"jpeg" if name == "jpg" else name for name in figure_formats}
        unknown = formats - FORMATS
        if unknown:
            raise ValueError(f"unknown figure format(s) {sorted(unknown)}; use {sorted(FORMATS)}")
        if "jpeg" in formats and not _jpeg_available():
            raise ValueError(
                "JPEG figures are not available: this runtime's Pillow has no JPEG"
                " encoder. Use 'png', 'retina' or 'svg'."
            )
        settings["figure_formats"] = formats
    if print_figure_kwargs is not None:
        settings["print_figure_kwargs"] = dict(print_figure_kwargs)
    if close_figures is not None:
        settings["close_figures"] = bool(close_figures)


def _jpeg_available():
    from PIL import features

    return bool(features.check("jpg"))


def set_matplotlib_formats(*formats, **kwargs):
    """Choose the image formats of inline figures, e.g. ``('svg',)`` or ``('png', 'retina')``."""
    configure(figure_formats=set(formats), print_figure_kwargs={"bbox_inches": "tight", **kwargs})


def _render(figure, fmt):
    buffer = io.BytesIO()
    options = dict(settings["print_figure_kwargs"])
    if fmt == "retina":
        options["dpi"] = 2 * figure.dpi
    figure.canvas.print_figure(buffer, format="png" if fmt == "retina" else fmt, **options)
    return buffer.getvalue()


def figure_bundle(figure):
    """(data, metadata) of one figure in the configured formats."""
    data = {"text/plain": repr(figure)}
    metadata = {}
    for fmt in sorted(settings["figure_formats"]):
        raw = _render(figure, fmt)
        if fmt == "svg":
            data["image/svg+xml"] = raw.decode("utf-8")
        elif fmt == "pdf":
            data["application/pdf"] = base64.b64encode(raw).decode("ascii")
        else:
            mime = "image/jpeg" if fmt == "jpeg" else "image/png"
            data[mime] = base64.b64encode(raw).decode("ascii")
            if fmt == "retina":
                width, height = _png_size(raw)
                metadata[mime] = {"width": width // 2, "height": height // 2}
    return data, metadata


def _png_size(raw):
    return int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")


def display_figure(figure):
    data, metadata = figure_bundle(figure)
    _wasm_kernel.call_host("display", data=data, metadata=metadata, transient={}, update=False)


def show(close=None, block=None):
    """Send every open figure to the notebook; close them unless told otherwise."""
    managers = Gcf.get_all_fig_managers()
    try:
        for manager in managers:
            display_figure(manager.canvas.figure)
    finally:
        if settings["close_figures"] if close is None else close:
            for manager in managers:
                Gcf.destroy(manager)


def flush_figures():
    """At the end of a cell: show what the cell drew and did not show yet."""
    if Gcf.get_all_fig_managers():
        show(close=settings["close_figures"])


class FigureManagerInline(FigureManagerBase):
    def show(self):
        display_figure(self.canvas.figure)


_wasm_kernel.shell.events.register("post_execute", flush_figures)
