"""The sources of the packages the runtime ships as bytecode only, for tracebacks and ``??``.

The runtime's stdlib zip holds ``.pyc`` files and no ``.py``, so a traceback through pandas
showed file names and no lines. ``install`` fetches wheels of the same releases (pinned by
sha256 in the runtime's manifest, one platform's files picked by pip options so that every
machine fetches the same bytes) and keeps a source only if it is the one the bytecode was
compiled from: the runtime writes hash-based pycs, whose header holds the SipHash of their
source keyed by the interpreter's magic number, and the host's ``_imp.source_hash`` computes
the same digest. A source that differs (a file the runtime's build changed) is left out
rather than shown beside the wrong line numbers. The standard library's own sources are on
no package index, so its frames stay without lines.

The result is one zip named like the stdlib zip, in the folder ``sources`` of the runtime's
files, which the guest sees read-only beside the stdlib zip.
"""

from __future__ import annotations

import _imp
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

from .runtime import Runtime, RuntimeUnavailable, sha256_file
from .runtime_files import pinned_download

PYC_HEADER = 16  # magic (4), flags (4), source hash (8)
HASH_BASED = 0b1  # pyc flag: the header holds the source's hash, not its mtime
MAX_SOURCE = 16 << 20  # bytes: no module of these packages is near it (pandas' largest: 0.5 MB)
FIXED_DATE = (1980, 1, 1, 0, 0, 0)  # zip dates carry no information here


def sources_zip(runtime: Runtime) -> Path:
    return runtime.sources_dir / runtime.stdlib_guest_path.rsplit("/", 1)[1]


def fetch(runtime: Runtime) -> int | None:
    """Make sure the runtime's sources zip exists, fetching and checking its wheels if not.
    Returns how many sources it holds when it was built now, None when it was there."""
    target = sources_zip(runtime)
    if target.is_file() or not runtime.source_wheels:
        return None
    folder = runtime.sources_dir.parent
    staging = Path(tempfile.mkdtemp(prefix=".sources-", dir=folder))
    try:
        if complaint := pinned_download(
            list(runtime.source_wheels), staging, *runtime.source_pip_options
        ):
            raise RuntimeUnavailable(f"pip could not download the sources' wheels:\n{complaint}")
        wheels = sorted(staging.glob("*.whl"))
        pinned = {sha256 for _, _, sha256 in runtime.source_wheels}
        if len(wheels) != len(pinned) or {sha256_file(wheel) for wheel in wheels} != pinned:
            raise RuntimeUnavailable("the sources' wheels are not the pinned files")
        ready = staging / target.parent.name
        ready.mkdir(mode=0o755)
        count = build(runtime.stdlib.path, wheels, ready / target.name)
        # readable by every user of a shared cache
        ready.chmod(0o755)
        (ready / target.name).chmod(0o644)
        os.replace(ready, target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return count


def compiled_from(stdlib: Path) -> dict[str, tuple[int, bytes]]:
    """Each hash-based pyc of the stdlib zip: the path of its source -> (key, source hash)."""
    expected = {}
    with zipfile.ZipFile(stdlib) as archive:
        for member in archive.infolist():
            if not member.filename.endswith(".pyc"):
                continue
            with archive.open(member) as pyc:
                header = pyc.read(PYC_HEADER)
            if len(header) == PYC_HEADER and int.from_bytes(header[4:8], "little") & HASH_BASED:
                key = int.from_bytes(header[:4], "little")
                expected[member.filename[:-1]] = (key, header[8:])
    return expected


def build(stdlib: Path, wheels: Iterable[Path], target: Path) -> int:
    """Write ``target``: every source in ``wheels`` that the stdlib zip's bytecode was
    compiled from. Returns how many it holds."""
    expected = compiled_from(stdlib)
    taken: set[str] = set()
    with zipfile.ZipFile(target, "x", zipfile.ZIP_DEFLATED) as out:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.infolist():
                    name = member.filename
                    if name in taken or name not in expected or member.file_size > MAX_SOURCE:
                        continue
                    with archive.open(member) as source:
                        text = source.read(MAX_SOURCE + 1)
                    key, digest = expected[name]
                    if len(text) <= MAX_SOURCE and _imp.source_hash(key, text) == digest:
                        out.writestr(zipfile.ZipInfo(name, FIXED_DATE), text, zipfile.ZIP_DEFLATED)
                        taken.add(name)
    return len(taken)
