"""IPython.display for wasm-kernel's sandbox: rich output through the kernel's host channel.

The same names as IPython's module: display functions from IPython.core.display_functions,
display objects and display_* helpers from IPython.core.display, and IFrame, FileLink and
Code from IPython.lib.display. The display objects are imported on first use: compiling
their modules takes longer than a plain ``display(x)`` needs.
"""

from IPython.core.display_functions import *  # noqa: F403
from IPython.core.display_functions import __all__ as _function_names

_LAZY = {
    "IPython.core.display": (
        "display_pretty",
        "display_html",
        "display_markdown",
        "display_svg",
        "display_png",
        "display_jpeg",
        "display_webp",
        "display_latex",
        "display_json",
        "display_javascript",
        "display_pdf",
        "DisplayObject",
        "TextDisplayObject",
        "Pretty",
        "HTML",
        "Markdown",
        "Math",
        "Latex",
        "SVG",
        "JSON",
        "Javascript",
        "Image",
    ),
    "IPython.lib.display": ("IFrame", "FileLink", "Code"),
}
_HOME = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [*_function_names, *_HOME]


def __getattr__(name):
    module_name = _HOME.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
