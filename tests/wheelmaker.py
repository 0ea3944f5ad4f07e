"""Wheels and sdists written on the fly, as build backends write them, for tests and
benchmarks of %pip (``tests/packages/test_packages.py``, ``bench/packages.py``): good ones, and
hostile ones made by bending one part (a member's path or kind, METADATA, WHEEL, RECORD)."""

from __future__ import annotations

import base64
import hashlib
import io
import struct
import tarfile
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    folder: Path,
    name: str,
    version: str = "1.0",
    files: dict[str, str | bytes] | None = None,
    requires: tuple[str, ...] = (),
    tag: str = "py3-none-any",
    metadata: str | None = None,
    lie_in_record: bool = False,
    wheel_version: str = "1.0",
    extra: tuple[tuple[zipfile.ZipInfo, bytes], ...] = (),
    compression: int = zipfile.ZIP_DEFLATED,
) -> Path:
    """A wheel as build backends write it: METADATA, WHEEL and a RECORD of every file."""
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    members = {
        path: data.encode() if isinstance(data, str) else data
        for path, data in (files or {}).items()
    }
    members[f"{info}/METADATA"] = (
        metadata
        if metadata is not None
        else f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {name} {version}\n"
        + "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    ).encode()
    members[f"{info}/WHEEL"] = (
        f"Wheel-Version: {wheel_version}\nGenerator: test\nRoot-Is-Purelib: true\n"
        f"Tag: {tag}\n".encode()
    )
    rows = [f"{path},{_record_hash(data)},{len(data)}" for path, data in members.items()]
    rows += [f"{item.filename},{_record_hash(data)},{len(data)}" for item, data in extra]
    if lie_in_record:
        rows[0] = rows[0].replace(rows[0].split(",")[1], _record_hash(b"something else"))
    members[f"{info}/RECORD"] = ("\n".join([*rows, f"{info}/RECORD,,"]) + "\n").encode()
    path = folder / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(path, "w", compression) as archive:
        for member, data in members.items():
            archive.writestr(member, data)
        for item, data in extra:
            archive.writestr(item, data)
    return path


def symlink_member(name: str, target: str) -> tuple[zipfile.ZipInfo, bytes]:
    item = zipfile.ZipInfo(name)
    item.external_attr = 0o120777 << 16
    return item, target.encode()


def declare_size(wheel: Path, member: str, size: int) -> None:
    """Make the wheel's central directory declare ``size`` bytes for ``member``, whatever its
    data holds: a wheel that lies about how much it unpacks to."""
    data = bytearray(wheel.read_bytes())
    with zipfile.ZipFile(wheel) as archive:
        names = [info.filename for info in archive.infolist()]
    entry = data.index(b"PK\x01\x02")  # the first central directory record
    for name in names:
        if name == member:
            data[entry + 24 : entry + 28] = struct.pack("<I", size)
        name_length, extra_length, comment_length = struct.unpack_from("<HHH", data, entry + 28)
        entry += 46 + name_length + extra_length + comment_length
    wheel.write_bytes(bytes(data))


def make_sdist(folder: Path, name: str, setup_py: str) -> None:
    """A source distribution whose build would run ``setup_py`` on the host."""
    dist = f"{name.replace('-', '_')}-1.0"
    with tarfile.open(folder / f"{dist}.tar.gz", "w:gz") as archive:
        for member, text in (
            ("setup.py", setup_py + f"from setuptools import setup; setup(name={name!r})\n"),
            ("PKG-INFO", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"),
        ):
            data = text.encode()
            item = tarfile.TarInfo(f"{dist}/{member}")
            item.size = len(data)
            archive.addfile(item, io.BytesIO(data))
