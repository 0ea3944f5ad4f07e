"""IPython.lib for wasm-kernel's sandbox: only the display module."""
