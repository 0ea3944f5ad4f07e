"""A kernel's package folder: wheels unpacked into a staging folder, checked, then moved in.

Only when every wheel of a request unpacked and passed its checks do its files move from the
staging folder into the folder the guest sees, so a refused wheel leaves nothing behind and
nothing is ever written outside that folder.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import os
import re
import shutil
import tempfile
import zipfile
from email.message import Message
from pathlib import Path

from packaging.utils import canonicalize_name

from ..files import scratch
from .wheel_cache import open_regular
from .wheels import (
    CHUNK,
    MAX_METADATA,
    Distribution,
    PackageError,
    Wheel,
    check_members,
    declared_disk,
    parse_metadata,
    record_hash,
    same_version,
)


class WheelFolder:
    """This kernel's package folder: what is installed, and the quota it must stay within."""

    def __init__(self, root: Path, quota: int, location: str, user_quota: int):
        self.root = root
        self.location = location  # the site folder's guest path
        self.site = root / "site"  # the folder the guest sees
        self.site.mkdir()
        self.quota = quota
        self.user_quota = user_quota  # all of the user's kernels' package folders together
        self.installed: dict[str, Distribution] = {}

    @property
    def used(self) -> int:
        return sum(dist.size for dist in self.installed.values())

    def owner(self, top: str) -> Distribution | None:
        for dist in self.installed.values():
            if top in dist.tops:
                return dist
        return None

    def install(self, wheels: list[Wheel], user_room: int) -> list[Distribution]:
        """Unpack each wheel into a staging folder and check it; only when all pass do they
        move in (replacing their earlier versions), so a refused one leaves nothing installed.
        ``user_room``: bytes the user's quota leaves for this folder to grow by."""
        staging = Path(tempfile.mkdtemp(prefix="staging-", dir=self.root))
        try:
            staged: list[tuple[Distribution, Path]] = []
            room = self.quota - self.used
            for index, wheel in enumerate(wheels):
                wheel.check_tags()
                replacing = self.installed.get(wheel.name)
                room += replacing.size if replacing else 0
                user_room += replacing.size if replacing else 0
                folder = staging / str(index)
                folder.mkdir()
                dist = self._unpack(wheel, folder, room, user_room)
                room -= dist.size
                user_room -= dist.size
                staged.append((dist, folder))
            self._check_owners([dist for dist, _ in staged])
            for dist, folder in staged:
                replacing = self.installed.get(dist.key)
                if replacing is not None:
                    self.remove(replacing)
                for top in sorted(dist.tops):
                    os.rename(folder / top, self.site / top)
                self.installed[dist.key] = dist
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return [dist for dist, _ in staged]

    def _check_owners(self, incoming: list[Distribution]) -> None:
        """No file or folder may belong to two packages, installed or incoming."""
        replaced = {dist.key for dist in incoming}
        claimed: dict[str, Distribution] = {}
        for dist in incoming:
            for top in sorted(dist.tops):
                owner = claimed.get(top)
                installed = self.owner(top)
                if owner is None and installed is not None and installed.key not in replaced:
                    owner = installed
                if owner is not None and owner is not dist:
                    raise PackageError(
                        f"{dist.name} {dist.version} would overwrite {top!r}, which belongs to"
                        f" {owner.name} {owner.version}"
                    )
                claimed[top] = dist

    def remove(self, dist: Distribution) -> None:
        for top in dist.tops:
            target = self.site / top
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        self.installed.pop(dist.key, None)

    def _unpack(self, wheel: Wheel, staging: Path, room: int, user_room: int) -> Distribution:
        """One wheel into ``staging``: the disk it declares checked against the quotas before
        anything is written, each member bounded by its declared size, and what the disk
        really took checked again after."""
        stem = wheel.path.name
        with open_regular(wheel.path) as source:
            try:
                archive = zipfile.ZipFile(source)
            except (zipfile.BadZipFile, OSError) as exc:
                raise PackageError(f"{stem} is not a valid wheel: {exc}") from None
            with archive:
                members = check_members(archive, stem)
                info_dir = self._info_dir(members, wheel)
                installed = {}  # the files it installs, by their declared sizes
                for info in members:
                    target = None if info.is_dir() else self._target(info.filename, info_dir)
                    if target:
                        installed[target] = info.file_size
                size = sum(info.file_size for info in members)
                archive_size = os.fstat(source.fileno()).st_size
                declared = declared_disk(installed, size, archive_size, stem)
                self._check_room(wheel, declared, room, user_room)
                files, metadata = self._unpack_members(archive, members, info_dir, staging, wheel)
        taken = scratch.usage(staging)
        if taken.unmeasured:
            raise PackageError(
                f"{stem}: the host could not measure it unpacked: {taken.unmeasured}"
            )
        disk = max(int(taken), declared)
        self._check_room(wheel, disk, room, user_room)
        return Distribution(
            metadata["Name"], metadata["Version"], metadata, self.location, files, disk
        )

    def _unpack_members(
        self,
        archive: zipfile.ZipFile,
        members: list[zipfile.ZipInfo],
        info_dir: str,
        staging: Path,
        wheel: Wheel,
    ) -> tuple[list[str], Message]:
        """Write the installed members, every file's hash checked against RECORD: the files
        written (relative to ``staging``) and the wheel's METADATA."""
        stem = wheel.path.name
        metadata = parse_metadata(self._read(archive, f"{info_dir}/METADATA"), "METADATA")
        self._check_metadata(metadata, wheel)
        self._check_wheel_file(self._read(archive, f"{info_dir}/WHEEL"))
        record = self._record(self._read(archive, f"{info_dir}/RECORD"))
        files = []
        for info in members:
            if info.is_dir():
                continue
            target = self._target(info.filename, info_dir)
            digest = self._extract(archive, info, staging / target if target else None)
            listed = record.pop(info.filename, None)
            if info.filename != f"{info_dir}/RECORD" and listed != digest:
                raise PackageError(
                    f"{stem}: its RECORD does not match the file {info.filename!r}"
                    " (a wheel whose RECORD lies is refused)"
                )
            if target:
                files.append(target)
        leftover = [name for name in record if not name.endswith("/")]
        if leftover:
            raise PackageError(f"{stem}: its RECORD lists files it lacks: {leftover[:3]}")
        return files, metadata

    def _check_room(self, wheel: Wheel, need: int, room: int, user_room: int) -> None:
        if need > room:
            raise PackageError(
                f"installing {wheel.name} {wheel.version} ({need:,} bytes on disk, its files and"
                f" folders) would take this kernel's packages past their quota of"
                f" {self.quota:,} bytes ({self.used:,} used). The quota is"
                " --WasmKernel.packages_quota=BYTES."
            )
        if need > user_room:
            raise PackageError(
                f"installing {wheel.name} {wheel.version} ({need:,} bytes on disk) would take"
                f" the packages of all your running kernels past their per-user quota of"
                f" {self.user_quota:,} bytes. Stop kernels you no longer use, or ask for a"
                " larger --WasmKernel.packages_user_quota=BYTES."
            )

    @staticmethod
    def _info_dir(members: list[zipfile.ZipInfo], wheel: Wheel) -> str:
        tops = {info.filename.split("/", 1)[0] for info in members if "/" in info.filename}
        info_dirs = [top for top in tops if top.endswith(".dist-info")]
        if len(info_dirs) != 1:
            raise PackageError(f"{wheel.path.name} must hold exactly one .dist-info folder")
        name, _, version = info_dirs[0][: -len(".dist-info")].rpartition("-")
        if canonicalize_name(name) != wheel.name or not same_version(version, wheel.version):
            raise PackageError(f"{wheel.path.name}: its metadata folder is {info_dirs[0]!r}")
        return info_dirs[0]

    @staticmethod
    def _read(archive: zipfile.ZipFile, name: str) -> bytes:
        try:
            info = archive.getinfo(name)
        except KeyError:
            raise PackageError(f"the wheel has no {name}") from None
        if info.file_size > MAX_METADATA:
            raise PackageError(f"{name} is larger than {MAX_METADATA >> 20} MiB")
        with archive.open(info) as member:
            return member.read(MAX_METADATA + 1)

    @staticmethod
    def _check_metadata(metadata: Message, wheel: Wheel) -> None:
        name, version = metadata["Name"], metadata["Version"]
        if not name or not version:
            raise PackageError(f"{wheel.path.name}: METADATA lacks Name or Version")
        if canonicalize_name(str(name)) != wheel.name or not same_version(version, wheel.version):
            raise PackageError(
                f"{wheel.path.name}: its METADATA names {str(name)[:100]!r}"
                f" {str(version)[:100]!r}, not the wheel's own name and version"
            )

    @staticmethod
    def _check_wheel_file(data: bytes) -> None:
        wheel_file = parse_metadata(data, "WHEEL")
        version = str(wheel_file["Wheel-Version"] or "")
        if not re.fullmatch(r"1\.\d+", version.strip()):
            raise PackageError(f"WHEEL gives Wheel-Version {version[:40]!r}; only 1.x is known")

    @staticmethod
    def _record(data: bytes) -> dict[str, str]:
        try:
            rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
        except (UnicodeDecodeError, csv.Error) as exc:
            raise PackageError(f"RECORD cannot be read: {exc}") from None
        record = {}
        for row in rows:
            if row:
                record[row[0]] = row[1] if len(row) > 1 else ""
        return record

    @staticmethod
    def _target(name: str, info_dir: str) -> str | None:
        """Where a member goes, relative to the folder; None for files not installed
        (scripts, headers and data files: nothing here can run or use them)."""
        data_dir = info_dir[: -len(".dist-info")] + ".data"
        if name.startswith(data_dir + "/"):
            parts = name.split("/", 2)
            if len(parts) == 3 and parts[1] in ("purelib", "platlib"):
                return parts[2]
            return None
        return name

    @staticmethod
    def _extract(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path | None) -> str:
        """Write one member (or only read it, if it is not installed); its RECORD hash. No
        more than its declared size is ever read: that is what the quotas were checked on."""
        digest = hashlib.sha256()
        left = info.file_size
        try:
            with contextlib.ExitStack() as stack:
                out = None
                if target is not None:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    out = stack.enter_context(open(target, "xb"))  # a file, never replaced
                member = stack.enter_context(archive.open(info))
                while chunk := member.read(min(CHUNK, left + 1)):
                    left -= len(chunk)
                    if left < 0:
                        raise PackageError(
                            f"{info.filename!r} unpacks to more than the {info.file_size:,}"
                            " bytes the wheel declares for it"
                        )
                    digest.update(chunk)
                    if out is not None:
                        out.write(chunk)
        except (zipfile.BadZipFile, EOFError) as exc:
            raise PackageError(f"{info.filename!r} is damaged: {exc}") from None
        except OSError as exc:  # e.g. a file and a folder of the same name
            raise PackageError(f"{info.filename!r} cannot be unpacked: {exc.strerror}") from None
        return record_hash(digest.digest())
