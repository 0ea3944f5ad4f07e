"""The on-disk cache of compiled runtimes.

Compiling the fuel-metered CPython module (after ``rewrite.make_restorable``) takes a minute
or more; loading the serialized native code takes tens of milliseconds. An entry holds the
serialized module plus the files the guest needs next to it (the stdlib zip under its guest
name and matplotlib's data extracted), and is keyed by everything that makes serialized code
reusable: the runtime's sha256 digests, the wasmtime version and the engine settings.

Entries are built in a temporary folder and renamed into place, so a reader never sees half
an entry. Each entry records the size and mtime of its big files; when they no longer match,
the files are hashed again before use (and, where the folder is writable, the record is
restamped so the next start skips the hashing), and an entry that fails that check, or that
wasmtime refuses to load, is deleted and rebuilt.

A cache folder may be read-only: baked into an image with ``python -m wasm_kernel precompile
--cache-dir DIR`` and shared by every user. Loading a sound entry from it writes nothing (no
lock file, no stamps). A folder counts as read-only when the OS refuses writes or when nobody
has write permission on it (``chmod a-w``), which also keeps a kernel running as root from
writing into a sealed cache. A missing or damaged entry in a read-only folder is an error
naming the folder and the command that builds the entry; nothing is deleted there.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TypeVar

import wasmtime

from . import rewrite
from .runtime import CACHE_DIR_ENV, Runtime, default_cache_dir, sha256_file, verify
from .shared_cache import check_cache
from .wasi_adapter import adapter_digest, adapter_wat

log = logging.getLogger(__name__)

KEY_CHARS = 24  # hex digits of the cache key in an entry's folder name
# The entry the kernel server loaded before forking, by folder and record: a kernel it forks
# finds its compiled runtime here instead of deserializing it again. Only the server keeps
# one (``preload``): a module kept loaded holds a mapping of its file.
_PRELOADED: dict[tuple[str, str], CompiledRuntime] = {}

#: Engine settings the compiled code depends on. Changing any of them changes the cache key.
ENGINE_SETTINGS: dict[str, object] = {
    "wasm_exceptions": True,  # the runtime uses the exception-handling proposal
    "consume_fuel": True,  # per-cell fuel limits
    "epoch_interruption": True,  # wall-clock deadlines and hard interrupts
    "max_wasm_stack": 2 << 20,  # larger values abort the process in wasmtime-py 49
}

Progress = Callable[[str], AbstractContextManager[object]]
T = TypeVar("T")


def _no_progress(_: str) -> AbstractContextManager[object]:
    return contextlib.nullcontext()


def make_engine() -> wasmtime.Engine:
    config = wasmtime.Config()
    for name, value in ENGINE_SETTINGS.items():
        setattr(config, name, value)
    return wasmtime.Engine(config)


def exported(exports: Mapping[str, object], name: str, kind: type[T]) -> T:
    """The export ``name`` of a wasm instance, checked to be a ``kind`` (a ``wasmtime.Func``,
    ``wasmtime.Memory``...); a missing name raises KeyError, as indexing the exports does."""
    value = exports[name]
    if not isinstance(value, kind):
        raise TypeError(f"export {name!r} is a {type(value).__name__}, not a {kind.__name__}")
    return value


@functools.cache
def wasmtime_version() -> str:
    """Read once: each look-up in the installed distributions' metadata costs ~2 ms."""
    return metadata.version("wasmtime")


def cache_key(runtime: Runtime) -> str:
    identity = {
        "runtime": runtime.key,
        "wasmtime": wasmtime_version(),
        "machine": platform.machine(),
        "engine": ENGINE_SETTINGS,
        "adapter": adapter_digest(),
        "rewrite": rewrite.VERSION if runtime.restorable else None,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class CompiledRuntime:
    """A loaded cache entry: native code plus the folders the guest sees read-only."""

    runtime: Runtime
    engine: wasmtime.Engine
    module: wasmtime.Module
    adapter: wasmtime.Module  # the WASI adapter of the file guards (see wasi_adapter.py)
    lib_dir: Path  # holds the stdlib zip under its guest file name
    mpl_data_dir: Path
    interrupt_cells: rewrite.InterruptCells | None  # None: interrupts end in a hard stop

    def close(self) -> None:
        """Free the native code now rather than in a finalizer during interpreter exit."""
        self.module.close()
        self.adapter.close()
        self.engine.close()


def _entry_name_pattern(runtime: Runtime) -> re.Pattern[str]:
    """Folder names of this runtime's entries under any key (not e.g. '<name>-debug-...')."""
    return re.compile(re.escape(runtime.name) + f"-[0-9a-f]{{{KEY_CHARS}}}")


class CorruptEntry(Exception):
    pass


class ReadOnlyCache(Exception):
    """The entry must be (re)built, but the cache folder is read-only."""


def writable(path: Path) -> bool:
    """Whether this process may write in ``path``, the nearest existing folder on the way to it.

    Besides what the OS allows, a folder without any write permission bit (``chmod a-w``) is
    taken as sealed, even for root, whom permissions do not stop.
    """
    for folder in (path, *path.parents):
        try:
            mode = folder.stat().st_mode
        except FileNotFoundError:
            continue
        except OSError:
            return False
        return bool(mode & 0o222) and os.access(folder, os.W_OK, effective_ids=True)
    return False


def _memo(entry: Path, record: dict) -> tuple[str, str]:
    return str(entry), json.dumps(record, sort_keys=True)


class RuntimeCache:
    MODULE = "module.cwasm"
    ADAPTER = "adapter.cwasm"
    RECORD = "entry.json"
    LIB = "lib"
    MPL_DATA = "mpl-data"

    def __init__(self, directory: Path | None = None, engine: wasmtime.Engine | None = None):
        self.directory = Path(directory) if directory else default_cache_dir()
        self.engine = engine or make_engine()

    def entry_dir(self, runtime: Runtime) -> Path:
        return self.directory / f"{runtime.name}-{cache_key(runtime)[:KEY_CHARS]}"

    def _stdlib_name(self, runtime: Runtime) -> str:
        return runtime.stdlib_guest_path.rsplit("/", 1)[1]

    def _stamped_files(self, runtime: Runtime) -> list[str]:
        """The entry's big files, whose size, mtime and digest the record keeps."""
        return [self.MODULE, self.ADAPTER, f"{self.LIB}/{self._stdlib_name(runtime)}"]

    # -- reading ---------------------------------------------------------------------------

    def lookup(self, runtime: Runtime) -> CompiledRuntime | None:
        """Load the entry for ``runtime`` if present and sound; drop it if it is damaged."""
        return self._lookup(runtime)[0]

    def _lookup(self, runtime: Runtime) -> tuple[CompiledRuntime | None, str | None]:
        """The loaded entry, or None and why it was unusable (None: there is no entry).

        A damaged entry is deleted, except in a read-only folder, where it is left alone.
        """
        entry = self.entry_dir(runtime)
        try:
            if not (entry / self.RECORD).exists():
                return None, None
            check_cache(self.directory, entry, self.LIB, runtime.module.path.parent)
            record = self._check(entry, runtime)
            if (preloaded := _PRELOADED.get(_memo(entry, record))) is not None:
                return preloaded, None
            cells = record.get("interrupt_cells")
            interrupt_cells = rewrite.InterruptCells(**cells) if cells else None
            module = wasmtime.Module.deserialize_file(self.engine, str(entry / self.MODULE))
            adapter = wasmtime.Module.deserialize_file(self.engine, str(entry / self.ADAPTER))
        except (
            CorruptEntry,
            OSError,
            ValueError,
            TypeError,
            KeyError,
            wasmtime.WasmtimeError,
        ) as exc:
            if writable(self.directory):
                self._discard(entry)
            return None, f"{type(exc).__name__}: {exc}"
        compiled = CompiledRuntime(
            runtime,
            self.engine,
            module,
            adapter,
            entry / self.LIB,
            entry / self.MPL_DATA,
            interrupt_cells,
        )
        return compiled, None

    def preload(self, runtime: Runtime) -> CompiledRuntime | None:
        """Keep ``runtime``'s entry loaded for the processes this one forks (the server)."""
        compiled = self.lookup(runtime)
        if compiled is not None:
            entry = self.entry_dir(runtime)
            _PRELOADED[_memo(entry, self._check(entry, runtime))] = compiled
        return compiled

    def _check(self, entry: Path, runtime: Runtime) -> dict:
        record = json.loads((entry / self.RECORD).read_text())
        if record.get("key") != cache_key(runtime):
            raise CorruptEntry("entry was written for another runtime or engine")
        restamped = False
        for rel, stamp in record["files"].items():
            stat = (entry / rel).stat()
            if [stat.st_size, stat.st_mtime_ns] == stamp[:2]:
                continue
            # Touched since it was written (copied into an image, restored from backup...):
            # trust it only if its content is still what was recorded.
            if stat.st_size != stamp[0] or sha256_file(entry / rel) != stamp[2]:
                raise CorruptEntry(f"{rel} changed since it was cached")
            stamp[1] = stat.st_mtime_ns
            restamped = True
        if restamped:
            self._restamp(entry, record)
        return record

    def _restamp(self, entry: Path, record: dict) -> None:
        """Record the new mtimes of rehashed files, so later starts skip the hashing.

        Only where the entry may be written; the record is replaced atomically, and a failure
        costs nothing but another hashing next time.
        """
        if not writable(entry):
            log.info(
                "%s: files were touched since they were cached; rehashing them on every"
                " start (the folder is read-only)",
                entry,
            )
            return
        staging = None
        try:
            fd, staging = tempfile.mkstemp(dir=entry, prefix=f".{self.RECORD}-")
            with os.fdopen(fd, "w") as file:
                json.dump(record, file, indent=1)
            os.chmod(staging, 0o644)
            os.replace(staging, entry / self.RECORD)
        except OSError as exc:
            log.info("could not restamp %s: %s", entry, exc)
            if staging:
                with contextlib.suppress(OSError):
                    os.unlink(staging)

    def _discard(self, entry: Path) -> None:
        with contextlib.suppress(OSError):
            shutil.rmtree(entry)

    # -- building --------------------------------------------------------------------------

    def load(self, runtime: Runtime, progress: Progress = _no_progress) -> CompiledRuntime:
        """Return the compiled runtime, building the entry first if needed.

        Raises ReadOnlyCache when the entry is missing or damaged and the folder is read-only.
        """
        found, problem = self._lookup(runtime)
        if found:
            return found
        if not writable(self.directory):
            raise ReadOnlyCache(self._read_only_message(runtime, problem))
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReadOnlyCache(self._read_only_message(runtime, problem, exc)) from exc
        with self._build_lock(runtime):
            # Another process may have finished the same build while we waited.
            found = self.lookup(runtime)
            if found:
                return found
            self._build(runtime, progress)
        self._prune_stale(runtime)
        found = self.lookup(runtime)
        if found is None:
            raise CorruptEntry(
                f"the cache entry just built in {self.entry_dir(runtime)} is unreadable"
            )
        return found

    def _read_only_message(
        self, runtime: Runtime, problem: str | None, error: OSError | None = None
    ) -> str:
        entry = self.entry_dir(runtime)
        if problem:
            state = f"its compiled runtime {entry.name} is unusable ({problem})"
        else:
            state = f"it holds no compiled runtime {entry.name}"
            others = self._other_entries(runtime)
            if others:
                state += (
                    f" (only {', '.join(others)}, built for another wasmtime version or"
                    f" engine settings; this is wasmtime {wasmtime_version()})"
                )
        reason = f": {error}" if error else ""
        return (
            f"the compiled-runtime cache {self.directory} is read-only{reason}, and {state}."
            f" Build the entry there with `python -m wasm_kernel precompile --cache-dir"
            f" {self.directory}` (as a user who may write there, e.g. when building the image),"
            f" or set {CACHE_DIR_ENV} to a writable folder."
        )

    def _other_entries(self, runtime: Runtime) -> list[str]:
        """This runtime's entries for other keys (other wasmtime, engine settings), each
        with the wasmtime version its record names, so an upgrade's leftovers say what
        they are."""
        own_entry = _entry_name_pattern(runtime)
        try:
            names = sorted(p.name for p in self.directory.iterdir() if own_entry.fullmatch(p.name))
        except OSError:
            return []
        return [f"{name} (wasmtime {self._recorded_wasmtime(name)})" for name in names]

    def _recorded_wasmtime(self, name: str) -> str:
        try:
            with open(self.directory / name / self.RECORD, "rb") as file:
                record = json.loads(file.read(1 << 16))
            return str(record["wasmtime"])[:40]
        except (OSError, ValueError, TypeError, KeyError):
            return "unknown"

    @contextlib.contextmanager
    def _build_lock(self, runtime: Runtime) -> Iterator[None]:
        # Opened for reading: a lock file another user created (a shared cache) still locks.
        fd = os.open(self.directory / f"{runtime.name}.lock", os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _build(self, runtime: Runtime, progress: Progress) -> None:
        final = self.entry_dir(runtime)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=self.directory))
        try:
            # mkdtemp's folder is private; an entry must be readable by every user of a
            # shared or pre-baked cache.
            staging.chmod(0o755)
            with progress("verifying runtime files"):
                verify(runtime.module)
                verify(runtime.stdlib)
            with progress("compiling the Python runtime to native code (one time)"):
                wasm = runtime.module.path.read_bytes()
                interrupt_cells = None
                if runtime.restorable:
                    interrupt_cells = self._interrupt_cells(wasm)
                    wasm = rewrite.make_restorable(wasm)
                module = wasmtime.Module(self.engine, wasm)
                del wasm
            with progress("writing the compiled runtime"):
                (staging / self.MODULE).write_bytes(module.serialize())
                del module
                adapter = wasmtime.Module(self.engine, adapter_wat())
                (staging / self.ADAPTER).write_bytes(adapter.serialize())
                lib = staging / self.LIB
                lib.mkdir()
                shutil.copyfile(runtime.stdlib.path, lib / self._stdlib_name(runtime))
                self._extract_mpl_data(runtime, staging / self.MPL_DATA)
                files = {}
                for rel in self._stamped_files(runtime):
                    stat = (staging / rel).stat()
                    files[rel] = [stat.st_size, stat.st_mtime_ns, sha256_file(staging / rel)]
                record = {
                    "key": cache_key(runtime),
                    "runtime": runtime.name,
                    "wasmtime": wasmtime_version(),
                    "files": files,
                    "interrupt_cells": interrupt_cells.as_dict() if interrupt_cells else None,
                }
                (staging / self.RECORD).write_text(json.dumps(record, indent=1))
            self._discard(final)
            os.rename(staging, final)
        except BaseException:
            self._discard(staging)
            raise

    @staticmethod
    def _interrupt_cells(wasm: bytes) -> rewrite.InterruptCells | None:
        """Where to write a soft interrupt; None (hard stops only) for an unknown build."""
        try:
            return rewrite.find_interrupt_cells(wasm)
        except rewrite.UnsupportedModule as exc:
            log.warning("soft interrupts unavailable for this runtime: %s", exc)
            return None

    def _extract_mpl_data(self, runtime: Runtime, target: Path) -> None:
        """matplotlib's data ships as a zip inside the stdlib zip; the guest needs it unpacked."""
        target.mkdir()
        with (
            zipfile.ZipFile(runtime.stdlib.path) as outer,
            outer.open(runtime.mpl_data_member) as inner_file,
            zipfile.ZipFile(inner_file) as inner,
        ):
            for member in inner.infolist():
                dest = (target / member.filename).resolve()
                if not dest.is_relative_to(target.resolve()):
                    raise CorruptEntry(f"unsafe member {member.filename!r} in mpl-data")
                inner.extract(member, target)

    def _prune_stale(self, runtime: Runtime) -> None:
        """Remove entries of this runtime built for another wasmtime or engine setting."""
        keep = self.entry_dir(runtime).name
        own_entry = _entry_name_pattern(runtime)
        for path in self.directory.iterdir():
            if path.is_dir() and path.name != keep and own_entry.fullmatch(path.name):
                self._discard(path)
