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
``sys.path``. Wheels are cached per user by sha256 and shared between kernels. The user's
other kernels are measured, and wheels unpacked and moved in, under one per-user lock
(``package_quota``), so kernels installing at once cannot each take the same room.
"""

from __future__ import annotations

import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from packaging.utils import canonicalize_name

from ..files import kernel_folders
from ..files.mounts import Mount

if TYPE_CHECKING:
    from packaging.requirements import Requirement
from .package_quota import others_held, user_lock
from .pip_answers import Planned, explain, read_plan
from .pip_driver import Pip, Source, parse_requests, requirement_text
from .pip_text import pip_list, pip_show
from .wheel_cache import WheelCache, file_sha256
from .wheel_folder import WheelFolder
from .wheels import (
    Distribution,
    PackageError,
    Wheel,
    guest_markers,
    parse_metadata,
)

GUEST_FOLDER = "/usr/local/packages"  # where the guest sees this kernel's packages
OFF, INDEX = "off", "index"


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


# -- the service: %pip commands ----------------------------------------------------------------


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
        folder: Path | None = None,
    ):
        """``folder``: where this kernel's package folder goes, beside those of the other
        kernels its user quota counts (default: TMPDIR, all of this user's)."""
        self.source = source
        self.markers = guest_markers(python_version)
        self.cache = cache
        self._stdlib_zip, self._shipped_location = stdlib_zip, shipped_location
        self._shipped: dict[str, Distribution] | None = None
        self._shipped_folders: list[Mount] = []
        self.root = kernel_folders.create(kernel_folders.PACKAGES_PREFIX, folder)
        if folder is not None:  # killed kernels' folders there: TMPDIR's are swept anyway
            kernel_folders.sweep_beside(str(folder))
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
        return pip_list(self._all().values())

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
                found.append(pip_show(dist, everything, self.markers))
        if missing:
            raise PackageError(
                "\n---\n".join(found + [f"Package(s) not found: {', '.join(missing)}"])
            )
        return "\n---\n".join(found)

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
                with user_lock(self.cache.folder, cancelled):  # measure, unpack, move in
                    others = others_held(self.root)
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

    def _resolve(self, pip: Pip, wanted: list[str], upgrade: bool) -> list[Planned]:
        report = pip.work / "report.json"
        status, errors = pip.resolve(wanted, upgrade, report)
        if status != 0:
            raise PackageError(explain(pip, errors, wanted, self.shipped))
        plan = read_plan(report)
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
                raise PackageError(
                    explain(pip, errors, [item.name for item in missing], self.shipped)
                )
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
