"""The WASI functions the kernel shadows (see descriptors.py), and the adapter module through
which the shadows reach wasmtime's real ones.

wasmtime's WASI functions read the *calling instance's* ``memory`` export, and a host
function has no instance; the adapter imports the guest's memory, re-exports it, and forwards
each call. It is compiled once, with the runtime, into the cache entry (``cache.py``), whose
key holds the adapter's digest: compiling it at every kernel start cost ~4 ms.
"""

from __future__ import annotations

import functools
import hashlib

WASI = "wasi_snapshot_preview1"
I32, I64 = "i32", "i64"
# name -> parameter types of the WASI functions shadowed (each returns an errno, i32)
SIGNATURES = {
    "fd_close": (I32,),
    "fd_renumber": (I32, I32),
    "path_open": (I32, I32, I32, I32, I32, I64, I64, I32, I32),
    "path_create_directory": (I32, I32, I32),
    "path_rename": (I32, I32, I32, I32, I32, I32),
    "path_link": (I32, I32, I32, I32, I32, I32, I32),
    "path_unlink_file": (I32, I32, I32),
    "path_remove_directory": (I32, I32, I32),
    "path_filestat_get": (I32, I32, I32, I32, I32),
}


def adapter_wat() -> str:
    """The adapter's source: each shadowed function forwarded to the real one."""
    imports, functions = [], []
    for name, params in SIGNATURES.items():
        types = " ".join(params)
        imports.append(f'  (import "{WASI}" "{name}" (func ${name} (param {types}) (result i32)))')
        forward = " ".join(f"local.get {index}" for index in range(len(params)))
        functions.append(
            f'  (func (export "{name}") (param {types}) (result i32) {forward} call ${name})'
        )
    return "\n".join(
        [
            "(module",
            '  (import "guest" "memory" (memory 0))',
            *imports,
            '  (export "memory" (memory 0))',
            *functions,
            ")",
        ]
    )


@functools.cache
def adapter_digest() -> str:
    """Part of the cache key: a changed adapter is compiled again with the runtime."""
    return hashlib.sha256(adapter_wat().encode()).hexdigest()
