"""A small stand-in for IPython inside the sandbox (there is no real IPython in the runtime).

Notebook code imports ``IPython.display`` and calls ``get_ipython()``; this package gives
both, written for wasm-kernel, so that such code runs unchanged.
"""

version_info = (9, 0, 0, "wasm-kernel")
__version__ = "9.0.0"


def get_ipython():
    """The running shell, for code that checks whether it runs in a notebook."""
    import _wasm_kernel

    return _wasm_kernel.shell
