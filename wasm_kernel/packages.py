"""Packages for the guest: pure-Python wheels, chosen by the host's pip, unpacked by the kernel.

The guest asks for packages by name (``%pip install``). The host's pip resolves and fetches
them, **wheels only** (``--only-binary=:all:``: no sdist is ever built, no hook run), for a
CPython 3.15 that takes only platform-independent wheels, with the runtime's own packages
(and those this kernel installed) in pip's view as already installed, so they satisfy
dependencies and are never replaced. pip runs in its own process with nothing on its import
path but the standard library, pip itself and metadata stubs we write.

Every wheel is then treated as hostile input: its name, tags, members, METADATA, WHEEL and
RECORD are checked, and it is unpacked into a fresh staging folder (regular files only, sizes
and compression ratios bounded, every hash checked against RECORD) before its files move into
the kernel's package folder, which the guest sees read-only at ``GUEST_FOLDER`` on its
``sys.path``. Wheels are cached per user by sha256 and shared between kernels.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import InvalidVersion, Version

from . import kernel_folders
from .mounts import Mount

if TYPE_CHECKING:
    from packaging.requirements import Requirement
from .wheels import (
    Distribution,
    PackageError,
    Wheel,
    WheelFolder,
    guest_markers,
    parse_metadata,
)

GUEST_FOLDER = "/usr/local/packages"  # where the guest sees this kernel's packages
OFF, INDEX = "off", "index"
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
MAX_REPORT = 64 << 20  # bytes of pip's resolution report read
MAX_PIP_ERRORS = 4000  # characters of pip's error lines passed on
# pip evaluates dependencies' environment markers for the interpreter it runs on; it must
# evaluate them for the guest (sys_platform "wasi", its Python version), so the boot code
# replaces the one function its vendored packaging asks.
PIP_BOOT = (
    "import json, sys; sys.path += sys.argv[1:3]; markers = json.loads(sys.argv[3]);"
    " del sys.argv[1:4]; import pip._vendor.packaging.markers as m;"
    " m.default_environment = lambda: dict(markers);"
    " from pip._internal.cli.main import main; sys.exit(main())"
)
NOT_FOUND = re.compile(
    r"Could not find a version that satisfies the requirement (\S+)(?: \(from ([^)]*)\))?"
    r" \(from versions: ([^)]*)\)"
)


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


# -- distributions: shipped with the runtime, or installed in this kernel ---------------------


def shipped_distributions(stdlib_zip: Path, location: str) -> dict[str, Distribution]:
    """The runtime's own packages, read from the dist-info folders in its (sha256-pinned)
    standard library zip: the guest's word is not needed, nor trusted."""
    found: dict[str, Distribution] = {}
    with zipfile.ZipFile(stdlib_zip) as archive:
        for name in archive.namelist():
            parts = name.split("/")
            if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "METADATA":
                metadata = parse_metadata(archive.read(name), name)
                if metadata["Name"] and metadata["Version"]:
                    dist = Distribution(metadata["Name"], metadata["Version"], metadata, location)
                    found[dist.key] = dist
    return found


def folder_distributions(folder: Path, location: str) -> dict[str, Distribution]:
    """Distributions unpacked in a folder (the guest's own IPython packages), by their
    ``.dist-info/METADATA``."""
    found: dict[str, Distribution] = {}
    for path in sorted(folder.glob("*.dist-info/METADATA")):
        metadata = parse_metadata(path.read_bytes(), str(path.relative_to(folder)))
        if metadata["Name"] and metadata["Version"]:
            dist = Distribution(metadata["Name"], metadata["Version"], metadata, location)
            found[dist.key] = dist
    return found


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
                start_new_session=True,  # an interrupt ends pip and anything it started
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


# -- the wheel cache --------------------------------------------------------------------------


class WheelCache:
    """Downloaded wheels, per user, by sha256: shared between kernels, checked on every use,
    and trimmed least recently used first to what the user's quota leaves."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _place(self, sha256: str, filename: str) -> Path:
        return self.folder / sha256[:2] / sha256 / filename

    def get(self, sha256: str | None, filename: str) -> Path | None:
        if not sha256 or not re.fullmatch(r"[0-9a-f]{64}", sha256) or not _plain_name(filename):
            return None
        path = self._place(sha256, filename)
        if path.is_file() and not path.is_symlink() and file_sha256(path) == sha256:
            with contextlib.suppress(OSError):  # its time of last use, for trimming
                os.utime(path)
            return path
        return None

    def trim(self, limit: int) -> None:
        """Remove the least recently used wheels until the cache holds at most ``limit``
        bytes (another kernel reading one keeps its open file)."""
        wheels = []
        for path in self.folder.glob("??/*/*.whl"):
            with contextlib.suppress(OSError):
                status = path.stat()
                wheels.append((status.st_mtime, status.st_size, path))
        total = sum(size for _, size, _ in wheels)
        for _, size, path in sorted(wheels):
            if total <= limit:
                break
            try:
                path.unlink()
            except OSError:
                continue
            total -= size
            with contextlib.suppress(OSError):
                path.parent.rmdir()

    def put(self, path: Path, sha256: str) -> Path:
        """Copy a downloaded wheel in (atomically: another kernel may be reading)."""
        place = self._place(sha256, path.name)
        place.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=place.parent, prefix=".incoming-")
        with os.fdopen(handle, "wb") as out, open(path, "rb") as source:
            shutil.copyfileobj(source, out)
        os.replace(temporary, place)
        return place


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# -- the service: %pip commands ----------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """A wheel pip chose: what the guest will get, as pip's report names it."""

    name: NormalizedName
    version: Version
    filename: str
    sha256: str | None
    url: str


class Packages:
    """One kernel's packages: where they come from, what the runtime ships, what is installed.

    ``source`` None means installing is off; listing and showing still work.
    """

    def __init__(
        self,
        source: Source | None,
        quota: int,
        user_quota: int,
        stdlib_zip: Path,
        shipped_location: str,
        cache: WheelCache,
        python_version: str,
    ):
        self.source = source
        self.markers = guest_markers(python_version)
        self.cache = cache
        self._stdlib_zip, self._shipped_location = stdlib_zip, shipped_location
        self._shipped: dict[str, Distribution] | None = None
        self._shipped_folders: list[Mount] = []
        self.root = kernel_folders.create(kernel_folders.PACKAGES_PREFIX)
        self.folder = WheelFolder(self.root, quota, GUEST_FOLDER, user_quota)

    @property
    def mount(self) -> Mount:
        return Mount(self.folder.site, GUEST_FOLDER, writable=False)

    @property
    def shipped(self) -> dict[str, Distribution]:
        if self._shipped is None:  # read on first use: kernel start does not pay for it
            self._shipped = shipped_distributions(self._stdlib_zip, self._shipped_location)
            for folder in self._shipped_folders:
                self._shipped.update(folder_distributions(folder.host, folder.guest))
        return self._shipped

    def ships_folder(self, folder: Mount) -> None:
        """The distributions in ``folder`` come with the guest too: never installed over."""
        self._shipped_folders.append(folder)
        self._shipped = None

    def close(self) -> None:
        kernel_folders.remove(self.root)

    def describe(self) -> str:
        if self.source is None:
            return "off (WasmKernel.packages)"
        return (
            f"%pip install from {self.source} into {GUEST_FOLDER} (read-only),"
            f" up to {self.folder.quota >> 20} MiB (all your kernels:"
            f" {self.folder.user_quota >> 20} MiB)"
        )

    def run(
        self, command: str, args: list[str], upgrade: bool, cancelled: Callable[[float], bool]
    ) -> str:
        """One %pip command; returns pip-like text, raises PackageError or Cancelled."""
        if command == "install":
            return self.install(args, upgrade, cancelled)
        if command == "uninstall":
            return self.uninstall(args)
        if command == "list":
            return self.listing()
        if command == "show":
            return self.show(args)
        raise PackageError(
            f"%pip {command}: only install, uninstall, list and show are available here"
            if command
            else "%pip needs a command: install, uninstall, list or show"
        )

    def _all(self) -> dict[str, Distribution]:
        return {**self.shipped, **self.folder.installed}

    def listing(self) -> str:
        rows = sorted(((d.name, d.version) for d in self._all().values()), key=_lower_first)
        width = max([len("Package")] + [len(name) for name, _ in rows])
        version_width = max([len("Version")] + [len(version) for _, version in rows])
        lines = [f"{'Package':<{width}} Version", f"{'-' * width} {'-' * version_width}"]
        lines += [f"{name:<{width}} {version}" for name, version in rows]
        return "\n".join(lines)

    def show(self, args: list[str]) -> str:
        if not args:
            raise PackageError("Please provide a package name or names.")
        everything = self._all()
        found, missing = [], []
        for text in args:
            dist = everything.get(canonicalize_name(text))
            if dist is None:
                missing.append(text)
            else:
                found.append(self._shown(dist, everything))
        if missing:
            raise PackageError(
                "\n---\n".join(found + [f"Package(s) not found: {', '.join(missing)}"])
            )
        return "\n---\n".join(found)

    def _shown(self, dist: Distribution, everything: dict[str, Distribution]) -> str:
        """One distribution as ``pip show`` prints it."""
        meta = dist.metadata
        homepage = meta.get("Home-page", "")
        for url in meta.get_all("Project-URL") or []:
            label, _, address = url.partition(",")
            if not homepage and re.sub(r"[^a-z]", "", label.lower()) == "homepage":
                homepage = address.strip()
        license_line = f"License: {meta.get('License', '')}"
        if _metadata_version(meta) >= (2, 4) and meta.get("License-Expression"):
            license_line = f"License-Expression: {meta['License-Expression']}"
        required_by = sorted(
            (
                other.name
                for other in everything.values()
                if dist.key in {canonicalize_name(name) for name in other.requires(self.markers)}
            ),
            key=str.lower,
        )
        return "\n".join(
            [
                f"Name: {dist.name}",
                f"Version: {dist.version}",
                f"Summary: {meta.get('Summary', '')}",
                f"Home-page: {homepage}",
                f"Author: {meta.get('Author', '')}",
                f"Author-email: {meta.get('Author-email', '')}",
                license_line,
                f"Location: {dist.location}",
                f"Requires: {', '.join(dist.requires(self.markers))}",
                f"Required-by: {', '.join(required_by)}",
            ]
        )

    def uninstall(self, args: list[str]) -> str:
        if not args:
            raise PackageError("You must give at least one requirement to uninstall")
        lines = []
        for text in args:
            key = canonicalize_name(text)
            shipped = self.shipped.get(key)
            if shipped is not None:
                raise PackageError(
                    f"Cannot uninstall {shipped.name} {shipped.version}: it ships with the"
                    " runtime (only packages installed with %pip can be uninstalled)"
                )
            dist = self.folder.installed.get(key)
            if dist is None:
                lines.append(f"WARNING: Skipping {text} as it is not installed.")
                continue
            self.folder.remove(dist)
            lines += [
                f"Found existing installation: {dist.name} {dist.version}",
                f"Uninstalling {dist.name}-{dist.version}:",
                f"  Successfully uninstalled {dist.name}-{dist.version}",
            ]
        return "\n".join(lines)

    def install(self, args: list[str], upgrade: bool, cancelled: Callable[[float], bool]) -> str:
        return self._install(parse_requests(args), upgrade, cancelled)

    def pins(self) -> list[str]:
        """What %pip installed, as exact pins: what an image of this kernel carries."""
        return sorted(f"{dist.name}=={dist.version}" for dist in self.folder.installed.values())

    def match(self, pins: list[str], cancelled: Callable[[float], bool]) -> list[str]:
        """Make the installed packages those an image names (after a resume or a restore):
        others are removed, missing ones installed again from this kernel's own source (an
        image grants nothing). Returns lines for the user; raises PackageError."""
        wanted: dict[str, Requirement] = {}
        for pin in pins:
            (requirement,) = parse_requests([pin])
            exact = [spec for spec in requirement.specifier if spec.operator == "=="]
            if len(exact) != 1 or len(requirement.specifier) != 1:
                raise PackageError(f"the image names {pin!r}, which is not an exact version")
            wanted[canonicalize_name(requirement.name)] = requirement
        told = []
        for key, dist in list(self.folder.installed.items()):
            kept = wanted.get(key)
            if kept is None or not kept.specifier.contains(dist.version, prereleases=True):
                self.folder.remove(dist)
                told.append(f"Removed {dist.name} {dist.version}: the image does not have it.")
        missing = [r for key, r in wanted.items() if key not in self.folder.installed]
        if missing and self.source is None:
            names = ", ".join(requirement_text(r) for r in missing)
            raise PackageError(
                f"the image's packages {names} are not installed: installing packages is off"
                " in this kernel (WasmKernel.packages)"
            )
        if missing:
            done = self._install(missing, False, cancelled)
            told.append(f"The image's packages, installed again: {done.splitlines()[-1]}")
        return told

    def _install(
        self, requirements: list[Requirement], upgrade: bool, cancelled: Callable[[float], bool]
    ) -> str:
        if self.source is None:
            raise PackageError(
                "installing packages is off in this kernel (WasmKernel.packages = 'off', the"
                " strict profile's default). The operator can allow it with"
                " --WasmKernel.packages=index or the path of a wheelhouse folder."
                " `%pip list` shows what the runtime ships."
            )
        lines, wanted = [], []
        for requirement in requirements:
            key = canonicalize_name(requirement.name)
            present = self.shipped.get(key) or self.folder.installed.get(key)
            if present is None or (upgrade and key not in self.shipped):
                wanted.append(requirement_text(requirement))
            elif requirement.specifier.contains(present.version, prereleases=True):
                where = "shipped with the runtime" if key in self.shipped else "installed"
                lines.append(
                    f"Requirement already satisfied: {requirement.name} in {present.location}"
                    f" ({present.version}, {where})"
                )
            elif key in self.shipped:
                raise PackageError(
                    f"{present.name} {present.version} ships with the runtime and cannot be"
                    f" replaced; {requirement_text(requirement)} asks for another version."
                )
            else:
                wanted.append(requirement_text(requirement))
        if wanted:
            with tempfile.TemporaryDirectory(prefix="pip-", dir=self.root) as work:
                pip = Pip(self.source, Path(work), self.markers, cancelled)
                pip.write_stubs(self._all().values())
                plan = self._resolve(pip, wanted, upgrade)
                wheels = self._fetch(pip, plan)
                others = self._others_held()
                done = self.folder.install(
                    wheels, self.folder.user_quota - others - self.folder.used
                )
                for wheel in wheels:
                    if wheel.path.is_relative_to(pip.work):  # downloaded, and it installed
                        self.cache.put(wheel.path, wheel.sha256)
                self.cache.trim(self.folder.user_quota - others - self.folder.used)
            if done:
                names = " ".join(f"{dist.name}-{dist.version}" for dist in done)
                lines.append(f"Successfully installed {names}")
        return "\n".join(lines)

    def _others_held(self) -> int:
        """Bytes in the package folders of this user's other running kernels."""
        held = 0
        for root in kernel_folders.running(kernel_folders.PACKAGES_PREFIX):
            if root != self.root:
                for folder, _, files in os.walk(root):
                    for name in files:
                        with contextlib.suppress(OSError):
                            held += os.lstat(os.path.join(folder, name)).st_size
        return held

    def _resolve(self, pip: Pip, wanted: list[str], upgrade: bool) -> list[Planned]:
        report = pip.work / "report.json"
        status, errors = pip.resolve(wanted, upgrade, report)
        if status != 0:
            raise PackageError(self._explain(pip, errors, wanted))
        try:
            with open(report, "rb") as source:
                items = json.loads(source.read(MAX_REPORT))["install"]
            plan = [self._planned(item) for item in items]
        except (OSError, ValueError, KeyError, TypeError, InvalidVersion) as exc:
            raise PackageError(f"pip's answer could not be read ({exc})") from None
        for item in plan:
            shipped = self.shipped.get(item.name)
            if shipped is not None:
                raise PackageError(
                    f"the packages asked for need {item.name} {item.version} in place of"
                    f" {shipped.name} {shipped.version}, which ships with the runtime and cannot"
                    " be replaced. Nothing was installed."
                )
        return plan

    def _in_wheelhouse(self, item: Planned) -> Path | None:
        """The wheelhouse's own file for ``item`` (no download needed), if pip chose one."""
        wheelhouse = self.source.wheelhouse if self.source else None
        address = urlsplit(item.url)
        if wheelhouse is None or address.scheme != "file" or address.netloc:
            return None
        path = Path(unquote(address.path))
        return path if path.parent == wheelhouse and path.name == item.filename else None

    def _accept(self, item: Planned, path: Path) -> tuple[Path, str]:
        """A fetched file, checked against what pip announced."""
        if not path.is_file() or path.is_symlink() or Path(item.filename).name != item.filename:
            raise PackageError(
                f"asked for {item.name} {item.version}, the package source did not answer with"
                f" {item.filename}"
            )
        sha256 = file_sha256(path)
        if item.sha256 is not None and sha256 != item.sha256:
            raise PackageError(
                f"{item.filename}: the package source answered with a file whose sha256 is not"
                " the one it announced"
            )
        return path, sha256

    @staticmethod
    def _planned(item: dict) -> Planned:
        metadata, download = item["metadata"], item["download_info"]
        hashes = download.get("archive_info", {}).get("hashes", {})
        filename = unquote(urlsplit(str(download["url"])).path.rsplit("/", 1)[-1])
        if not _plain_name(filename) or not filename.endswith(".whl"):
            raise PackageError(f"the package source named a file {filename!r}, not a wheel")
        sha256 = hashes.get("sha256")
        return Planned(
            canonicalize_name(str(metadata["name"])),
            Version(str(metadata["version"])),
            filename,
            sha256 if isinstance(sha256, str) else None,
            str(download["url"]),
        )

    def _explain(self, pip: Pip, errors: str, wanted: list[str]) -> str:
        """pip's refusal, said for this sandbox: a shipped package that would have to be
        replaced, a compiled-only package, wheels refused, or pip's own last word."""
        from packaging.requirements import InvalidRequirement, Requirement

        match = NOT_FOUND.search(errors)
        requirement = None
        if match:
            try:
                requirement = Requirement(match.group(1))
            except InvalidRequirement:
                pass
        if requirement is not None:
            key = canonicalize_name(requirement.name)
            shipped = self.shipped.get(key)
            if shipped is not None:
                needed_by = match.group(2) if match and match.group(2) else "the packages asked for"
                return (
                    f"{needed_by} needs {requirement}, but the runtime ships"
                    f" {shipped.name} {shipped.version}, which cannot be replaced."
                    " Nothing was installed."
                )
            report = pip.work / "compiled.json"
            if pip.resolve_for_host_platform(requirement_text(requirement), report) == 0:
                return self._compiled_only(requirement, report)
            if match and match.group(3).strip() != "none":
                return (
                    f"{requirement.name} {match.group(3)} is in {self.source}, but pip could use"
                    " none of its wheels (their metadata does not match their name, or they"
                    " need another Python). Nothing was installed."
                )
            return (
                f"no wheel of {requirement} that runs in the sandbox was found in"
                f" {self.source}. Only pure-Python wheels (py3-none-any) can be installed;"
                " packages published only as source are never built here."
            )
        if "DO NOT MATCH THE HASHES" in errors:
            return (
                f"the package source answered {', '.join(wanted)} with a file whose sha256 is not"
                " the one it announced, so pip refused it. Nothing was installed."
            )
        kept = [line for line in errors.splitlines() if line.startswith("ERROR:")]
        last = next((line for line in reversed(errors.splitlines()) if line.strip()), "")
        if kept == ["ERROR: Exception:"] or not kept:  # pip crashed: its last line says on what
            reason = re.sub(r"<[^>]*>", "", last.split(": ", 1)[-1]).replace("  ", " ")
            kept = [f"pip failed on {', '.join(wanted)} from {self.source}: {reason.strip()}"]
        return "\n".join(kept).replace(str(pip.work), "")[:MAX_PIP_ERRORS]

    def _compiled_only(self, requirement: Requirement, report: Path) -> str:
        try:
            item = json.loads(report.read_bytes()[:MAX_REPORT])["install"][0]
            filename = self._planned(item).filename
        except (OSError, ValueError, KeyError, IndexError, TypeError, InvalidVersion):
            filename = "a platform-specific wheel"
        return (
            f"{requirement.name} is published only as compiled wheels ({filename}): compiled"
            " extensions cannot run in the WebAssembly sandbox, only pure-Python wheels"
            " (py3-none-any). `%pip list` shows the compiled packages the runtime ships."
        )

    def _fetch(self, pip: Pip, plan: list[Planned]) -> list[Wheel]:
        """Each planned wheel, from the cache, the wheelhouse or downloaded by pip, checked
        against what pip announced."""
        found: dict[str, tuple[Path, str]] = {}
        missing = []
        for item in plan:
            cached = self.cache.get(item.sha256, item.filename)
            local = self._in_wheelhouse(item)
            if cached is not None:
                found[item.name] = cached, cached.parent.name
            elif local is not None:
                found[item.name] = self._accept(item, local)
            else:
                missing.append(item)
        if missing:
            folder = pip.work / "downloads"
            folder.mkdir()
            status, errors = pip.download(
                [f"{item.name}=={item.version}" for item in missing], folder
            )
            if status != 0:
                raise PackageError(self._explain(pip, errors, [item.name for item in missing]))
            for item in missing:
                found[item.name] = self._accept(item, folder / item.filename)
        wheels = []
        for item in plan:
            path, sha256 = found[item.name]
            wheel = Wheel.open(path, sha256, expected=item.name)
            if wheel.version != item.version:
                raise PackageError(
                    f"asked for {item.name} {item.version}, the package source answered {path.name}"
                )
            wheel.check_tags()
            wheels.append(wheel)
        return wheels


def _plain_name(filename: str) -> bool:
    """A file name that is only a name: no folder, no way up, nothing hidden in it."""
    return (
        filename not in ("", ".", "..")
        and "/" not in filename
        and "\\" not in filename
        and filename.isprintable()
    )


def _metadata_version(metadata: Message) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in str(metadata.get("Metadata-Version", "")).split("."))
    except ValueError:
        return ()


def _lower_first(row: tuple[str, str]) -> str:
    return row[0].lower()
