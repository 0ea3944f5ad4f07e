"""IPython.core for wasm-kernel's sandbox: only the display modules (older import paths)."""
