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

MAX_MEMBERS = 20_000  # files in one wheel
MAX_WHEEL_BYTES = 256 << 20  # one wheel's unpacked size, whatever the quota
MAX_RATIO = 200  # a member may unpack to at most this many times its compressed size...
RATIO_FREE = 1 << 20  # ...once it is past this size
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
    size: int = 0

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


def same_version(text: str, version: Version) -> bool:
    try:
        return Version(str(text)) == version
    except InvalidVersion:
        return False
