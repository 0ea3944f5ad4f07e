"""The pure-Python packages the guest runs IPython from: downloaded, verified, precompiled.

``runtimes/guest-packages.json`` pins each wheel by version and sha256. ``install`` and
``precompile`` fetch them through pip (``pip download``, binary only, hashes required, so
the user's index settings apply), check every digest again, unpack them into one folder of
the cache and compile their ``.pyc`` *inside the guest* (the runtime's Python 3.15 writes
bytecode the host's Python cannot), then rename the folder into place. A kernel preopens
that folder read-only; it never downloads anything: a missing or altered entry is an error
that says to run ``python -m wasm_kernel install``.

An entry records the size and mtime of every file; a kernel start compares them (a few
milliseconds for the ~2,000 files), so an entry changed after it was built is refused.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import wasmtime

from ..files.host_files import file_stamps
from ..files.mounts import Mount
from .cache import CompiledRuntime, cache_key, exported, writable
from .runtime import manifest_dir, sha256_file
from .runtime_files import pinned_download
from .shared_cache import UntrustedCache, check_entry, followed

MANIFEST = "guest-packages.json"
RECORD = "entry.json"
SITE = "site"
INSTALL_HINT = "run `python -m wasm_kernel install` (or `precompile`) to download and build it"
COMPILE_FUEL = 10**13  # the one-time compileall turn: ~20 s of guest work, far below this


class PackagesUnavailable(Exception):
    """The guest packages are not in the cache, or not as they were built."""


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    wheel: str
    sha256: str


@dataclass(frozen=True)
class GuestPackages:
    """The manifest: which wheels, and where the guest sees them."""

    name: str
    guest_path: str
    python_version: str
    wheels: tuple[Wheel, ...]
    digest: str  # of the manifest's bytes: part of the cache key

    def entry_dir(self, cache_dir: Path, compiled: CompiledRuntime) -> Path:
        """Keyed by the manifest and by the compiled runtime (whose Python writes the .pyc)."""
        key = hashlib.sha256(f"{self.digest}:{cache_key(compiled.runtime)}".encode())
        return cache_dir / f"guest-{self.name}-{key.hexdigest()[:24]}"


def load_manifest(directory: Path | None = None) -> GuestPackages:
    raw = ((directory or manifest_dir()) / MANIFEST).read_bytes()
    spec = json.loads(raw)
    return GuestPackages(
        name=spec["name"],
        guest_path=spec["guest_path"],
        python_version=spec["python_version"],
        wheels=tuple(
            Wheel(**{k: item[k] for k in ("name", "version", "wheel", "sha256")})
            for item in spec["packages"]
        ),
        digest=hashlib.sha256(raw).hexdigest(),
    )


# -- at kernel start ----------------------------------------------------------------------


def locate(packages: GuestPackages, cache_dir: Path, compiled: CompiledRuntime) -> Path:
    """The folder to preopen for the guest; raises PackagesUnavailable if it is not sound."""
    entry, record = _recorded(packages, cache_dir, compiled)
    _check_unchanged(entry, record)
    return entry / SITE


def _recorded(
    packages: GuestPackages, cache_dir: Path, compiled: CompiledRuntime
) -> tuple[Path, dict]:
    """The entry and its record; PackagesUnavailable if there is none."""
    entry = packages.entry_dir(cache_dir, compiled)
    try:
        status = os.stat(entry / RECORD)
        stamp = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)
        record = _record(str(entry / RECORD), stamp)
    except (OSError, ValueError):
        raise PackagesUnavailable(
            f"the guest's Python packages ({packages.name}) are not in the cache {cache_dir}:"
            f" {INSTALL_HINT}."
        ) from None
    try:  # the files' stamps are checked later; who may change them, now
        check_entry(followed(entry), SITE)
    except (UntrustedCache, OSError) as exc:
        raise PackagesUnavailable(
            f"the guest's Python packages are not safe to use: {exc}"
        ) from None
    return entry, record


@functools.lru_cache(maxsize=4)
def _record(path: str, stamp: tuple[int, int, int, int]) -> dict:
    """A packages record, parsed once per version of its file (``stamp``): a kernel forked by
    the kernel server finds the server's (see ``preload``). Read only."""
    return json.loads(Path(path).read_text())


def preload(compiled: CompiledRuntime) -> None:
    """Parse the packages' record in the kernel server, for the kernels it forks (~4 ms of a
    start); their files are still checked in every kernel."""
    with contextlib.suppress(PackagesUnavailable):
        _recorded(load_manifest(), _cache_dir(compiled), compiled)


def _cache_dir(compiled: CompiledRuntime) -> Path:
    return compiled.lib_dir.parent.parent  # <cache>/<runtime entry>/lib


def _check_unchanged(entry: Path, record: dict) -> None:
    """PackagesUnavailable unless every file is as the record says (size and mtime)."""
    try:
        changed = record.get("files") != file_stamps(entry / SITE)
    except OSError:
        changed = True
    if changed:
        raise PackagesUnavailable(
            f"the guest's Python packages in {entry} changed after they were built: delete"
            f" that folder and {INSTALL_HINT} again."
        )


def site_mount(compiled: CompiledRuntime) -> tuple[Mount, Future[None]]:
    """The packages as the guest sees them (read-only, from the cache holding ``compiled``;
    PackagesUnavailable if they were never built), and the check that their files are as
    built, which runs beside the sandbox's start (1,800 stats, ~17 ms where stat is slow):
    its result must be had before the guest runs."""
    packages = load_manifest()
    entry, record = _recorded(packages, _cache_dir(compiled), compiled)
    pool = ThreadPoolExecutor(1, thread_name_prefix="wasm-kernel-packages-check")
    checked = pool.submit(_check_unchanged, entry, record)
    pool.shutdown(wait=False)  # its one job still runs; the pool takes no other
    return Mount(entry / SITE, packages.guest_path, writable=False), checked


# -- at install -----------------------------------------------------------------------------


def prepare(packages: GuestPackages, cache_dir: Path, compiled: CompiledRuntime) -> Path:
    """The folder of the entry, built first if it is missing or damaged."""
    with contextlib.suppress(PackagesUnavailable):
        return locate(packages, cache_dir, compiled)
    entry = packages.entry_dir(cache_dir, compiled)
    if not writable(cache_dir):
        raise PackagesUnavailable(f"the cache {cache_dir} is read-only and lacks {entry.name}")
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=cache_dir))
    try:
        staging.chmod(0o755)
        wheels = staging / "wheels"
        download(packages, wheels)
        site = staging / SITE
        for wheel in packages.wheels:
            unpack(wheels / wheel.wheel, site)
        shutil.rmtree(wheels)
        precompile_in_guest(compiled, site, packages.guest_path)
        record = {"packages": packages.name, "files": file_stamps(site)}
        (staging / RECORD).write_text(json.dumps(record))
        shutil.rmtree(entry, ignore_errors=True)
        os.rename(staging, entry)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for stale in cache_dir.glob(f"guest-{packages.name}-*"):
        if stale != entry and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    return locate(packages, cache_dir, compiled)


def download(packages: GuestPackages, target: Path) -> None:
    """Fetch the pinned wheels with pip (pure-Python wheels only, each hash required)."""
    target.mkdir()
    complaint = pinned_download(
        [(w.name, w.version, w.sha256) for w in packages.wheels],
        target,
        *("--implementation", "py", "--abi", "none", "--platform", "any"),
        *("--python-version", packages.python_version),
    )
    if complaint:
        raise PackagesUnavailable(f"pip could not download the guest's packages:\n{complaint}")
    for wheel in packages.wheels:  # pip checked them; so do we, for what we unpack
        path = target / wheel.wheel
        if not path.exists() or sha256_file(path) != wheel.sha256:
            raise PackagesUnavailable(f"{wheel.wheel} is missing or not the pinned file")


def unpack(wheel: Path, site: Path) -> None:
    """Unpack a pure-Python wheel: its packages and .dist-info (``.data`` scripts, headers
    and manuals are left out; ``purelib`` goes with the rest)."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            parts = PurePosixPath(member.filename).parts
            if not parts or member.is_dir():
                continue
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] != "purelib":
                    continue
                parts = parts[2:]
            if any(part in ("", ".", "..") for part in parts) or member.filename.startswith("/"):
                raise PackagesUnavailable(f"{wheel.name}: unsafe member {member.filename!r}")
            destination = site.joinpath(*parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as source, open(destination, "wb") as out:
                shutil.copyfileobj(source, out)


def precompile_in_guest(compiled: CompiledRuntime, site: Path, guest_path: str) -> None:
    """Write the .pyc with the guest's own Python, in one turn of a throwaway interpreter
    that sees only the runtime's folder and ``site`` (writable, for this once)."""
    engine = compiled.engine
    store = wasmtime.Store(engine)
    wasi = wasmtime.WasiConfig()
    wasi.argv = ["python.wasm"]
    wasi.env = [("HOME", "/"), ("PYTHONTZPATH", "")]
    wasi.preopen_dir(str(compiled.lib_dir), compiled.runtime.lib_guest_dir, False)
    wasi.preopen_dir(str(site), guest_path, True)
    wasi.inherit_stderr()
    store.set_wasi(wasi)
    store.set_fuel(COMPILE_FUEL)
    store.set_epoch_deadline(1 << 62)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    i32 = wasmtime.ValType.i32()
    linker.define_func("host", "call", wasmtime.FuncType([i32] * 4, [i32]), lambda *_: -1)
    try:
        exports = linker.instantiate(store, compiled.module).exports(store)
        if not compiled.runtime.preinitialized:
            exported(exports, "_initialize", wasmtime.Func)(store)
        source = (
            "import compileall, py_compile, sys, warnings\n"
            # the packages' own style (ipywidgets' "\\." escapes) is their authors' concern:
            # what the compile finds in their code is not news for the user who installs
            "warnings.simplefilter('ignore', SyntaxWarning)\n"
            f"ok = compileall.compile_dir({guest_path!r}, quiet=1, workers=1,"
            " invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
            "sys.exit(0 if ok else 1)\n"
        ).encode()
        pointer = exported(exports, "host_alloc", wasmtime.Func)(store, len(source))
        exported(exports, "memory", wasmtime.Memory).write(store, source, pointer)
        status = exported(exports, "turn", wasmtime.Func)(store, pointer, len(source))
    finally:
        store.close()
    if status != 0:
        raise PackagesUnavailable(f"compiling the guest's packages failed (status {status})")
