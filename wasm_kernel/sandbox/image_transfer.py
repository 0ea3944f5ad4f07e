"""Images in and out of an interpreter: an image's memory and globals put into a fresh
instance, and an instance's taken out as an image file (see ``images`` for the format,
``image_writer`` for how it is written).

The guest's own part of a resume (its folders, seeds, stale files) is a turn the sandbox
runs afterwards (``settle``); this module touches only memory and globals.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import wasmtime

from ..images import image_writer, images
from ..images.image_fields import PAGE, HostState
from ..memory import live_memory
from ..memory.checkpoints import memory_address
from ..memory.cow import map_copy_on_write
from ..memory.live_memory import LiveMemory
from ..runtime.cache import CompiledRuntime, exported
from ..runtime.rewrite import BRK_EXPORT, RESET_PREOPENS_EXPORT
from .interpreter import Interpreter
from .stops import memory_limit_text


def load(interpreter: Interpreter, image: images.Image, memory_limit: int) -> None:
    """Put an image's memory and globals into a fresh instance and point wasi-libc at this
    kernel's folders (its table of preopens is in the image's memory)."""
    store, memory = interpreter.store, interpreter.memory
    reset_preopens = interpreter.named.get(RESET_PREOPENS_EXPORT)
    targets = interpreter.mutable_globals()
    if reset_preopens is None or not targets:
        raise images.ImageError("this runtime build cannot resume images")
    if set(image.globals) != set(targets):
        raise images.ImageError("the image's globals do not match this runtime's")
    current = interpreter.size
    if image.memory_size < current:
        raise images.ImageError("the image's memory is smaller than a fresh interpreter's")
    try:
        memory.grow(store, (image.memory_size - current) // PAGE)
    except wasmtime.WasmtimeError:
        raise images.ImageError(memory_limit_text(memory_limit)) from None
    if image.memory_file is not None:
        _map_memory_file(interpreter, image.memory_file, image.memory_size)
        interpreter.memory_base = (image.memory_file, image.memory_digest)
    base = memory_address(memory, store)
    if image.live is not None:
        _map_live_memory(base, image.live, image.boot_file)
    try:
        image.pages.map_into(base)
    except OSError as exc:
        raise images.ImageError(f"cannot map the image's pages: {exc}") from None
    finally:
        image.pages.close()  # the mappings keep what they map
    try:
        for name, value in image.globals.items():
            targets[name].set_value(store, value)
    except (ValueError, TypeError, OverflowError, wasmtime.WasmtimeError) as exc:
        raise images.ImageError(f"the image's globals do not fit this runtime: {exc}") from None
    try:  # runs wasi-libc's code on the image's memory: it may trap like any guest code
        reset_preopens(store)
    except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
        raise images.ImageError(f"the resumed interpreter trapped: {exc}") from None


def _map_memory_file(interpreter: Interpreter, path: Path, size: int) -> None:
    """Guest memory up to ``size`` (or the file's end: an image that builds on it may be
    larger) as a copy-on-write view of a boot image's raw memory file: the guest reads only
    the pages it touches, shared with every kernel mapping the file, and its writes stay
    private. Where the file cannot be mapped, the kernel boots instead."""
    try:
        size = min(size, path.stat().st_size)
        map_copy_on_write(interpreter.memory, interpreter.store, path, 0, size)
    except (OSError, ValueError) as exc:
        raise images.ImageError(f"cannot map {path.name}: {exc}") from None


def _map_live_memory(base: int, live: LiveMemory, boot_file: Path | None) -> None:
    """Guest memory as a copy-on-write view of the forking kernel's frozen checkpoint and
    the boot memory file (see ``live_memory``)."""
    try:
        files = live_memory.open_files(live)
        try:
            live_memory.map_parts(base, live, files, boot_file)
        finally:
            for fd in files:
                os.close(fd)
    except (OSError, ValueError) as exc:
        raise images.ImageError(f"cannot map the forked session's memory: {exc}") from None


def capture(
    interpreter: Interpreter,
    out: BinaryIO,
    host: HostState,
    mounts: list[str],
    scratch: image_writer.ScratchArchive,
    memory_file: Path | None = None,
    live: LiveMemory | None = None,
    on_boot_image: bool = False,
) -> None:
    """The interpreter as an image file written into ``out``, between turns (its memory as a
    raw file at ``memory_file`` instead, for a boot image; or only where ``live`` says it is,
    for a fork). Memory equal to a fresh instance's is left out; with ``on_boot_image``,
    memory still equal to the boot memory file it was mapped from (where that file's sha256
    is known) instead, the image naming the file by its sha256: such an image resumes only
    where that very file is (boot images differ from one build to the next), so only
    hibernation, short-lived and on this machine, writes it (an idle session: ~9 MiB on
    disk instead of ~45)."""
    store = interpreter.store
    globals_ = interpreter.mutable_globals()
    if globals_[BRK_EXPORT].value(store) == 0:
        globals_[BRK_EXPORT].set_value(store, interpreter.size)  # as GuestState.take does
    compiled = interpreter.compiled
    base_file, base_digest = interpreter.memory_base or (None, "")
    if not on_boot_image:
        base_digest = ""
    source: contextlib.AbstractContextManager[bytes | mmap.mmap]
    if memory_file is not None or live is not None:
        source, base_digest = contextlib.nullcontext(b""), ""
    elif base_file is not None and base_digest:
        source = _mapped_whole(base_file)
    else:
        source, base_digest = contextlib.nullcontext(fresh_memory(compiled)), ""
    with source as base:
        image_writer.write_image(
            out,
            needs=images.identity(compiled.runtime.module.sha256),
            mounts=mounts,
            memory=interpreter.view(),
            base=base,
            globals_={name: value.value(store) for name, value in globals_.items()},
            host=host,
            scratch=scratch,
            taken=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            memory_file=memory_file,
            live=live,
            base_digest=base_digest,
        )


@contextlib.contextmanager
def _mapped_whole(path: Path) -> Iterator[mmap.mmap]:
    """A boot memory file (the kernel's own cache's), mapped read-only while a save compares
    guest memory with it."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        view = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    with view:
        yield view


def fresh_memory(compiled: CompiledRuntime) -> bytes:
    """Linear memory of a just-instantiated module: what an image leaves out."""
    store = wasmtime.Store(compiled.engine)
    try:
        store.set_wasi(wasmtime.WasiConfig())
        linker = wasmtime.Linker(compiled.engine)
        linker.define_wasi()
        i32 = wasmtime.ValType.i32()
        linker.define_func("host", "call", wasmtime.FuncType([i32] * 4, [i32]), lambda *_: -1)
        exports = linker.instantiate(store, compiled.module).exports(store)
        memory = exported(exports, "memory", wasmtime.Memory)
        return ctypes.string_at(memory_address(memory, store), memory.data_len(store))
    finally:
        store.close()
