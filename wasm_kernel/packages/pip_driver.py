"""The host's pip, run in its own process to resolve and fetch wheels for the guest.

pip resolves for the guest (its Python version, its environment markers, wheels only) and
sees as installed only the metadata stubs we write; it runs with nothing on its import path
but the standard library, pip itself and those stubs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name
from packaging.version import Version

from .wheels import Distribution, PackageError

if TYPE_CHECKING:
    from packaging.requirements import Requirement

# What pip may pick (with --python-version): wheels for any Python 3 that need no particular
# interpreter, ABI or platform (py3-none-any, py2.py3-none-any, py315-none-any ...), or pure
# ones built for WASI.
TARGET_OPTIONS = [
    "--only-binary=:all:",
    "--implementation=py",
    "--abi=none",
    "--platform=any",
    "--platform=wasi_0_0_0_wasm32",
]
MAX_REQUESTS = 100  # requirement strings per %pip command
MAX_REQUEST_TEXT = 200  # characters per requirement string
# pip's first lines. pip evaluates dependencies' environment markers for the interpreter it
# runs on; it must evaluate them for the guest (sys_platform "wasi", its Python version), so
# they replace the one function its vendored packaging asks. Before that, pip asks Linux to
# kill it when the kernel dies (PR_SET_PDEATHSIG): a kernel killed with SIGKILL runs no
# cleanup, and pip, in a session of its own, would wait on a stalled index for minutes. If
# the kernel died before that took hold, pip has another parent already, and stops.
PIP_BOOT = """\
import ctypes, json, os, signal, sys
kernel, paths, markers = int(sys.argv[1]), sys.argv[2:4], json.loads(sys.argv[4])
if sys.platform == "linux":
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
if os.getppid() != kernel:
    sys.exit(1)
del sys.argv[1:5]
sys.path += paths
import pip._vendor.packaging.markers as m
m.default_environment = lambda: dict(markers)
from pip._internal.cli.main import main
sys.exit(main())
"""


class Cancelled(Exception):
    """The user interrupted the cell while pip ran."""


# -- requests from the guest ------------------------------------------------------------------


def parse_requests(texts: Iterable[object]) -> list[Requirement]:
    """The guest's requirement strings as requirements: a name, extras and version specifiers
    only. URLs, paths, markers and options are refused (each would reach the host's pip)."""
    # imported on first use, as everywhere in this module: packaging's requirement parser
    # (with its markers) took ~11 ms of every kernel start, which needs none of it
    from packaging.requirements import InvalidRequirement, Requirement

    texts = list(texts)
    if not texts:
        raise PackageError("You must give at least one requirement to install")
    if len(texts) > MAX_REQUESTS:
        raise PackageError(f"at most {MAX_REQUESTS} requirements per command")
    requirements = []
    for text in texts:
        if not isinstance(text, str) or len(text) > MAX_REQUEST_TEXT or not text.isprintable():
            raise PackageError(f"not a requirement: {str(text)[:MAX_REQUEST_TEXT]!r}")
        if text.strip().startswith("-"):
            raise PackageError(
                f"{text.strip()}: pip options are not available here; give package names"
                " and versions only (NAME, NAME==VERSION, NAME>=VERSION)"
            )
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise PackageError(
                f"{text!r} is not a package name with an optional version ({exc})."
                " Only names and versions can be installed: no paths, URLs or files."
            ) from None
        if requirement.url or requirement.marker:
            raise PackageError(
                f"{text!r}: only a package name and version specifiers are accepted here"
                " (no URLs, paths or environment markers)"
            )
        requirements.append(requirement)
    return requirements


def requirement_text(requirement: Requirement) -> str:
    """The requirement rebuilt from its parsed parts: nothing else of the guest's text passes."""
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    return f"{canonicalize_name(requirement.name)}{extras}{requirement.specifier}"


# -- pip, in its own process ------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where packages come from: the index pip is configured for, or a wheelhouse folder."""

    wheelhouse: Path | None = None

    @property
    def pip_options(self) -> list[str]:
        if self.wheelhouse is None:
            return []
        # --isolated: no pip configuration (its indexes included) reaches this choice
        return ["--isolated", "--no-index", f"--find-links={self.wheelhouse}"]

    def __str__(self) -> str:
        if self.wheelhouse is None:
            return "the package index pip is configured for on the host"
        return f"the wheelhouse {self.wheelhouse}"


class Pip:
    """Runs the host's pip with an import path of the standard library, pip and our stubs.

    ``-I -S``: no site-packages, no PYTHON* variables, no working folder on the path, so pip
    imports nothing but itself; it finds installed distributions only in the stub folder.
    """

    def __init__(
        self,
        source: Source,
        work: Path,
        markers: dict[str, str],
        cancelled: Callable[[float], bool],
    ):
        self.source = source
        self.work = work
        self.markers = markers
        self.python_option = f"--python-version={markers['python_version']}"
        self.cancelled = cancelled  # waits up to N seconds; True if the user interrupted
        self.stubs = work / "installed"
        pip_spec = importlib.util.find_spec("pip")
        if pip_spec is None or pip_spec.origin is None:
            raise PackageError("pip is not installed on the host, so packages cannot be fetched")
        self.pip_home = work / "pip"
        self.pip_home.mkdir()
        (self.pip_home / "pip").symlink_to(Path(pip_spec.origin).parent, target_is_directory=True)

    def write_stubs(self, distributions: Iterable[Distribution]) -> None:
        """What pip must take as installed: a METADATA of name and version per distribution."""
        shutil.rmtree(self.stubs, ignore_errors=True)
        for dist in distributions:
            folder = self.stubs / f"{dist.key.replace('-', '_')}-{Version(dist.version)}.dist-info"
            folder.mkdir(parents=True)
            text = f"Metadata-Version: 2.1\nName: {dist.key}\nVersion: {Version(dist.version)}\n"
            (folder / "METADATA").write_text(text)

    def run(self, arguments: list[str]) -> tuple[int, str]:
        """pip's exit status and its error output; an interrupt kills it (and raises)."""
        command = [
            sys.executable,
            "-I",
            "-S",
            "-c",
            PIP_BOOT,
            str(os.getpid()),
            str(self.stubs),
            str(self.pip_home),
            json.dumps(self.markers),
            *arguments,
        ]
        environment = dict(os.environ, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        with tempfile.TemporaryFile() as errors:
            process = subprocess.Popen(
                command,
                cwd=self.work,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                env=environment,
                # an interrupt ends pip and anything it started; pip's death signal fires
                # when the thread that started it ends (the guest thread, which lives as long
                # as the kernel and waits here meanwhile)
                start_new_session=True,
            )
            try:
                while process.poll() is None:
                    if self.cancelled(0.1):
                        raise Cancelled()
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            errors.seek(0)
            text = errors.read(1 << 20).decode("utf-8", "replace")
        return process.returncode, text

    def resolve(self, requirements: list[str], upgrade: bool, report: Path) -> tuple[int, str]:
        options = ["install", "--dry-run", "--quiet", f"--report={report}", self.python_option]
        options += TARGET_OPTIONS
        if upgrade:
            options.append("--upgrade")
        return self.run([*options, *self.source.pip_options, "--", *requirements])

    def resolve_for_host_platform(self, requirement: str, report: Path) -> int:
        """Whether ``requirement`` has wheels for the guest's CPython version on this
        machine's platform: to tell a compiled-only package from a missing one."""
        options = ["install", "--dry-run", "--quiet", "--ignore-installed", "--no-deps"]
        options += [f"--report={report}", "--only-binary=:all:"]
        options.append(self.python_option)
        return self.run([*options, *self.source.pip_options, "--", requirement])[0]

    def download(self, pins: list[str], folder: Path) -> tuple[int, str]:
        options = ["download", "--quiet", "--no-deps", f"--dest={folder}", self.python_option]
        options += TARGET_OPTIONS
        return self.run([*options, *self.source.pip_options, "--", *pins])
