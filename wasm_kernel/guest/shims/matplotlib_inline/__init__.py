"""Inline matplotlib figures for wasm-kernel (our own stand-in for the matplotlib-inline package)."""
