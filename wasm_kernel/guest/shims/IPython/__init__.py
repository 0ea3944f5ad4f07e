"""A small stand-in for IPython inside the sandbox (there is no real IPython in the runtime).

Notebook code imports ``IPython.display`` and calls ``get_ipython()``; this package gives
both, written for wasm-kernel, so that such code runs unchanged.
"""

from _wasm_kernel import get_ipython  # noqa: F401 - the public name

version_info = (9, 0, 0, "wasm-kernel")
__version__ = "9.0.0"
