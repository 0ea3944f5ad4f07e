"""Host folders granted to the guest: parsing and checking ``HOST:GUEST[:ro|rw]`` specs.

A mount becomes a WASI preopen, so wasmtime resolves every guest path inside the granted
folder (``..``, absolute symlinks and links leading out are refused there). This module
makes sure the grant itself is what the operator meant: the host side is an existing folder
named unambiguously, the guest side a clean absolute path that hides none of the sandbox's
own folders and overlaps no other mount, and the mode defaults to read-only.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

SCRATCH = "/tmp"  # the private, writable folder every kernel has
MODES = {"ro": False, "rw": True}


class MountError(ValueError):
    """A mount spec that cannot be granted as written."""


@dataclass(frozen=True)
class Mount:
    host: Path  # resolved, existing folder
    guest: str  # absolute, normalised guest path
    writable: bool

    def __str__(self) -> str:
        return f"{self.guest} <- {self.host} ({'read-write' if self.writable else 'read-only'})"


def parse_mount(spec: str, base: Path) -> Mount:
    """``HOST:GUEST[:ro|rw]``; a relative HOST is taken from ``base`` (the kernel's folder)."""
    if not isinstance(spec, str) or not spec.strip():
        raise MountError("an empty mount spec; write HOST:GUEST[:ro|rw], e.g. data:/data:ro")
    body, writable = spec, False
    head, sep, mode = spec.rpartition(":")
    if sep and mode in MODES:
        body, writable = head, MODES[mode]
    elif sep and head.count(":") and not mode.startswith("/"):  # HOST:GUEST:typo
        raise MountError(f"mount {spec!r}: the mode must be ro or rw, not {mode!r}")
    host_text, sep, guest = body.rpartition(":")
    if not sep or not host_text or not guest:
        raise MountError(f"mount {spec!r}: write HOST:GUEST[:ro|rw], e.g. data:/data:ro")
    return Mount(_host_folder(spec, host_text, base), _guest_path(spec, guest), writable)


def _host_folder(spec: str, text: str, base: Path) -> Path:
    try:
        text.encode("utf-8")  # wasmtime takes folder names as UTF-8
    except UnicodeEncodeError:
        raise MountError(f"mount {spec!r}: the host folder's name is not valid UTF-8") from None
    folder = Path(text).expanduser()
    if not folder.is_absolute():
        folder = base / folder
    try:
        folder = folder.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise MountError(
            f"mount {spec!r}: the host folder {str(folder)!r} is missing ({exc})"
        ) from None
    if not folder.is_dir():
        raise MountError(f"mount {spec!r}: {str(folder)!r} is not a folder")
    if folder == Path(folder.anchor):
        # e.g. the notebook profile's '.' in a kernel started at / (a server rooted there)
        raise MountError(f"mount {spec!r}: that is the whole host file system; mount a folder")
    return folder


def _guest_path(spec: str, guest: str) -> str:
    clean = posixpath.normpath(guest)
    if (
        not guest.startswith("/")
        or clean != guest
        or guest == "/"
        or guest.startswith("//")
        or not guest.isprintable()
        or ":" in guest
    ):
        raise MountError(
            f"mount {spec!r}: the guest path must be a clean absolute folder other than /,"
            " such as /data"
        )
    return guest


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def parse_mounts(specs: list[str], base: Path, reserved: tuple[str, ...]) -> list[Mount]:
    """All mounts, checked against each other and against the sandbox's own folders."""
    mounts: list[Mount] = []
    for spec in specs:
        mount = parse_mount(spec, base)
        for taken in (SCRATCH, *reserved):
            if _overlap(mount.guest, taken):
                raise MountError(f"mount {spec!r}: {taken} belongs to the sandbox itself")
        for other in mounts:
            if _overlap(mount.guest, other.guest):
                raise MountError(f"mount {spec!r} overlaps the mount at {other.guest}")
            if (mount.writable or other.writable) and _overlap(str(mount.host), str(other.host)):
                # a cell could rename folders under a writable mount so that the other one
                # names something else when the interpreter is restarted
                raise MountError(
                    f"mount {spec!r} shares host folders with the mount at {other.guest};"
                    " a read-write mount must not"
                )
        mounts.append(mount)
    return mounts


def holds_home(folder: Path) -> bool:
    """Whether ``folder`` is the user's home folder or one above it (keys, tokens, settings)."""
    try:
        home = Path.home().resolve()
    except (RuntimeError, OSError):
        return False
    folder = folder.resolve()
    return folder == home or folder in home.parents


def guest_cwd(mounts: list[Mount], kernel_dir: Path, wanted: str = "") -> str:
    """Where the guest starts: ``wanted`` (a mount's folder or the scratch folder) if given,
    else the mount of the kernel's own folder (Jupyter starts kernels in the notebook's
    folder), else the private scratch folder."""
    roots = [SCRATCH, *(mount.guest for mount in mounts)]
    if wanted:
        if wanted not in roots:
            raise MountError(
                f"working folder {wanted!r} must be one of the mounted folders {roots}"
            )
        return wanted
    here = kernel_dir.resolve()
    for mount in mounts:
        if mount.host == here:
            return mount.guest
    return SCRATCH
