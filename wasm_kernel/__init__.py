"""wasm-kernel: a Jupyter kernel whose Python cells run in a WebAssembly sandbox."""

__version__ = "0.1.0"
