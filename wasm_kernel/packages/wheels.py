"""Wheels as hostile input: checked, unpacked into a staging folder, then moved into place.

A wheel comes from a package index or a folder the kernel does not control, so nothing in it
is trusted: its file name must be a wheel's, for a platform the guest runs; every member must
be a regular file or folder with a plain relative path (no absolute paths, ``..``, links or
devices), within bounded counts, sizes and compression ratios; METADATA and WHEEL must
parse and agree with the file name; and every file's sha256 must be the one RECORD gives.
Only then do its files move from the staging folder into the kernel's package folder, so a
refused wheel leaves nothing behind and nothing is ever written outside that folder.
"""

from __future__ import annotations

import base64
import zipfile
from dataclasses import dataclass, field
from email.message import Message
from email.parser import BytesParser
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import (
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from ..files.scratch import ENTRY_BYTES

MAX_MEMBERS = 20_000  # files in one wheel
MAX_ENTRIES = 40_000  # files and folders one wheel makes (the largest seen make ~18,000)
MAX_DEPTH = 32  # folders a member's path goes down (real wheels: up to ~15)
MAX_PATH_TEXT = 1000  # characters of a member's path (real wheels: up to ~250)
MAX_WHEEL_BYTES = 256 << 20  # one wheel's unpacked size, whatever the quota
MAX_RATIO = 200  # a member may unpack to at most this many times its compressed size...
MAX_WHEEL_RATIO = 100  # ...and the whole wheel to this many times its file (real ones: < 20)...
RATIO_FREE = 1 << 20  # ...once past this size
BLOCK = 4096  # a file takes whole blocks of this size on disk
MAX_METADATA = 4 << 20  # bytes of METADATA, WHEEL or RECORD read
CHUNK = 1 << 16
REGULAR, FOLDER = 0o100000, 0o040000


class PackageError(Exception):
    """A request refused or failed, with a message for the notebook user."""


@dataclass
class Distribution:
    """An installed (or shipped) distribution, as `%pip list` and `%pip show` present it."""

    name: str
    version: str
    metadata: Message
    location: str  # as the guest sees it
    files: list[str] = field(default_factory=list)  # installed ones, relative to the folder
    size: int = 0  # disk bytes its files and folders take (installed ones), for the quotas

    @property
    def key(self) -> NormalizedName:
        return canonicalize_name(self.name)

    @property
    def tops(self) -> set[str]:
        return {path.split("/", 1)[0] for path in self.files}

    def requires(self, markers: dict[str, str]) -> list[str]:
        """Names this distribution needs where ``markers`` hold (extras' needs left out), as
        pip show lists them."""
        from packaging.markers import UndefinedComparison, UndefinedEnvironmentName
        from packaging.requirements import InvalidRequirement, Requirement  # see parse_requests

        names = set()
        for text in self.metadata.get_all("Requires-Dist") or []:
            try:
                requirement = Requirement(text)
                if requirement.marker is None or requirement.marker.evaluate(
                    {**markers, "extra": ""}
                ):
                    names.add(requirement.name)
            except (InvalidRequirement, UndefinedComparison, UndefinedEnvironmentName):
                continue
        return sorted(names, key=str.lower)


def guest_markers(python_version: str) -> dict[str, str]:
    """Environment markers as the guest evaluates them (``packaging.markers.
    default_environment()`` inside the runtime), for its Python version."""
    return {
        "implementation_name": "cpython",
        "implementation_version": python_version,
        "os_name": "posix",
        "platform_machine": "wasm32",
        "platform_release": "0.0.0",
        "platform_system": "wasi",
        "platform_version": "0.0.0",
        "python_full_version": python_version,
        "platform_python_implementation": "CPython",
        "python_version": ".".join(python_version.split(".")[:2]),
        "sys_platform": "wasi",
    }


def parse_metadata(data: bytes, what: str) -> Message:
    if len(data) > MAX_METADATA:
        raise PackageError(f"{what} is larger than {MAX_METADATA >> 20} MiB")
    try:
        return BytesParser().parsebytes(data)
    except Exception as exc:  # any parser failure is a malformed file
        raise PackageError(f"{what} cannot be read: {exc}") from None


def runs_on_guest(tags: frozenset[Tag]) -> bool:
    """A wheel the guest can load: Python code for no particular ABI, for any platform or
    for WASI (the guest cannot load compiled extensions built for another platform)."""
    return any(
        tag.abi == "none"
        and (tag.platform == "any" or tag.platform.startswith("wasi"))
        and tag.interpreter.startswith(("py", "cp3"))
        for tag in tags
    )


def record_hash(digest: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def check_member_name(name: str, wheel: str) -> None:
    """A member's path inside the wheel, refused unless it is plainly relative and inside."""
    if len(name) > MAX_PATH_TEXT or name.count("/", 0, len(name) - 1) > MAX_DEPTH:
        raise PackageError(
            f"{wheel} holds a file more than {MAX_DEPTH} folders deep or with a path longer"
            f" than {MAX_PATH_TEXT} characters: {name[:100]!r}..."
        )
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or ":" in name
        or "\x00" in name
        or any(part in ("", ".", "..") for part in name.rstrip("/").split("/"))
        or not name.isprintable()
    ):
        raise PackageError(
            f"{wheel} holds a file whose path leaves its folder or is not plain: {name!r}"
        )


@dataclass
class Wheel:
    """One downloaded wheel file and what its name says."""

    path: Path
    sha256: str
    name: NormalizedName
    version: Version
    tags: frozenset[Tag]

    @property
    def tag_text(self) -> str:
        return "-".join(self.path.name[:-4].split("-")[-3:])

    @classmethod
    def open(cls, path: Path, sha256: str, expected: NormalizedName | None = None) -> Wheel:
        try:
            name, version, _build, tags = parse_wheel_filename(path.name)
        except (InvalidWheelFilename, InvalidVersion) as exc:
            raise PackageError(f"{path.name!r} is not a wheel's file name ({exc})") from None
        if expected is not None and name != expected:
            raise PackageError(f"asked for {expected}, the package source answered {path.name}")
        return cls(path, sha256, name, version, tags)

    def check_tags(self) -> None:
        if not runs_on_guest(self.tags):
            raise PackageError(
                f"{self.name} {self.version} is a compiled wheel ({self.tag_text}): compiled"
                " extensions cannot run in the WebAssembly sandbox, only pure-Python wheels"
                " (py3-none-any)."
            )


def check_members(archive: zipfile.ZipFile, stem: str) -> list[zipfile.ZipInfo]:
    """The wheel's members, each a plain file or folder, named once, not a bomb by itself."""
    members = archive.infolist()
    if len(members) > MAX_MEMBERS:
        raise PackageError(f"{stem} holds more than {MAX_MEMBERS:,} files")
    seen = set()
    for info in members:
        check_member_name(info.filename, stem)
        kind = (info.external_attr >> 16) & 0o170000
        if kind not in (0, REGULAR, FOLDER) or (kind == FOLDER and not info.is_dir()):
            raise PackageError(f"{stem}: {info.filename!r} is a link or special file")
        if info.flag_bits & 0x1:
            raise PackageError(f"{stem}: {info.filename!r} is encrypted")
        key = info.filename.rstrip("/")
        if key in seen:
            raise PackageError(f"{stem}: {info.filename!r} appears twice")
        seen.add(key)
        if info.file_size > RATIO_FREE and info.file_size > MAX_RATIO * info.compress_size:
            raise PackageError(
                f"{stem}: {info.filename!r} is compressed more than {MAX_RATIO}:1"
                " (a zip bomb is refused)"
            )
    return members


def declared_disk(files: dict[str, int], size: int, archive_size: int, stem: str) -> int:
    """The disk a wheel's installed files and folders will take, from what it declares,
    before anything is written; refused past the wheel-wide limits. ``files``: the installed
    paths and their declared sizes; ``size``: all members' declared bytes; ``archive_size``:
    the wheel file's. A file costs its whole blocks and at least an entry (``ENTRY_BYTES``),
    a folder an entry: so 16,000 empty folders count."""
    if size > MAX_WHEEL_BYTES:
        raise PackageError(f"{stem} unpacks to more than {MAX_WHEEL_BYTES >> 20} MiB")
    if size > RATIO_FREE and size > MAX_WHEEL_RATIO * archive_size:
        raise PackageError(
            f"{stem} unpacks to {size:,} bytes from {archive_size:,}: it is compressed more"
            f" than {MAX_WHEEL_RATIO}:1 (a zip bomb is refused)"
        )
    folders: set[str] = set()
    disk = 0
    for path, length in files.items():
        disk += max(ENTRY_BYTES, -(-length // BLOCK) * BLOCK)
        parent = path.rpartition("/")[0]
        while parent and parent not in folders:  # each path's folders, counted once
            folders.add(parent)
            parent = parent.rpartition("/")[0]
        if len(files) + len(folders) > MAX_ENTRIES:
            raise PackageError(
                f"{stem} would make more than {MAX_ENTRIES:,} files and folders, the most"
                " one package may make"
            )
    return disk + len(folders) * ENTRY_BYTES


def same_version(text: str, version: Version) -> bool:
    try:
        return Version(str(text)) == version
    except InvalidVersion:
        return False
