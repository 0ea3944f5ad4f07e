"""The WebAssembly Python the guest runs: its pinned manifest and files, the compiled-runtime
cache, the binary rewrite that makes it restorable, the WASI adapter, and the guest's IPython
packages.

May import: files.
"""
