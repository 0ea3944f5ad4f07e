"""Writes beside the notebook (``WasmKernel.notebook_writes``): which folders get a private
layer, and what it holds, for ``%sandbox``.

The layer is the guest's (``_wasm_kernel_layer``) for the file functions Python code calls,
and the host's (``layer_opens``) for the WASI calls that reach the folder anyway (numpy's text
I/O, ``io.FileIO``, C libraries): the notebook's folder stays a read-only WASI mount, and what
cells write there lands in a folder of the private /tmp. That is why it needs nothing else of
its own: the scratch quota measures it, images carry it with /tmp, and it goes when the kernel
does. The layer only ever reads the notebook's folder, by descriptor, without following links;
under ``new-files`` the host then copies the layer's new data files there after each cell
(``write_through``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from .host_files import open_regular
from .mounts import SCRATCH, Mount

OVERLAY, NEW_FILES, REFUSE = "overlay", "new-files", "refuse"
NOTEBOOK_WRITES = (OVERLAY, NEW_FILES, REFUSE)
LAYER = ".wasm-kernel-writes"  # the layer's folder in /tmp
GUEST_LAYER = f"{SCRATCH}/{LAYER}"
LISTED = 20  # files %sandbox names
WALKED = 10_000  # entries %sandbox looks at, at most (the guest may have made millions)
RECORD_LIMIT = 1 << 20  # bytes of the deleted-names record %sandbox reads


def layered_folders(choice: str, mounts: Sequence[Mount], here: Path) -> tuple[str, ...]:
    """The guest folders whose writes go to the layer: under ``overlay`` and ``new-files``,
    the read-only mount of the kernel's own folder (Jupyter starts kernels in the notebook's)."""
    if choice not in (OVERLAY, NEW_FILES):
        return ()
    here = here.resolve()
    return tuple(mount.guest for mount in mounts if not mount.writable and mount.host == here)


def describe(choice: str, folders: Sequence[str], scratch: Path | None) -> str:
    """The %sandbox line (and list): where writes beside the notebook go, and what the layer
    holds in the running sandbox's /tmp (``scratch``, None before it starts)."""
    if choice not in (OVERLAY, NEW_FILES):
        return "Writes beside the notebook: refused (PermissionError; write to /tmp)"
    if not folders:
        return f"Writes beside the notebook: {choice}, but no notebook folder is mounted"
    if choice == NEW_FILES:
        head = (
            f"Writes beside the notebook ({', '.join(folders)}): new data files are written"
            " through to the host's folder after each cell (mode 0600); changes to the files"
            f" already there are kept in a private layer in {GUEST_LAYER}"
        )
    else:
        head = (
            f"Writes beside the notebook ({', '.join(folders)}): kept in a private layer in"
            f" {GUEST_LAYER}; the host's files never change"
            " (notebook_writes = 'new-files' writes new files through)"
        )
    if scratch is None:
        return head
    layer = scratch / LAYER
    files, total, more = _written(layer / "files", folders)
    lines = [f"{head}; {len(files)}{'+' if more else ''} files written, {total:,} bytes"]
    lines += [f"    {name} ({size:,} bytes)" for name, size in files[:LISTED]]
    if len(files) > LISTED or more:
        lines.append("    ...")
    deleted = _deleted(layer / "deleted")
    if deleted:
        shown = ", ".join(deleted[:LISTED]) + (", ..." if len(deleted) > LISTED else "")
        lines.append(f"    hidden (deleted or renamed by cells): {shown}")
    return "\n".join(lines)


def _written(root: Path, folders: Sequence[str]) -> tuple[list[tuple[str, int]], int, bool]:
    """(guest path, size) of the layer's files, their total size, and whether the walk
    stopped at WALKED entries. Never follows a link (the guest cannot make one, but the
    walk does not rely on that)."""
    found: list[tuple[str, int]] = []
    total = seen = 0
    pending = [root / folder.lstrip("/") for folder in folders]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    seen += 1
                    if seen > WALKED:
                        return sorted(found), total, True
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(Path(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        size = entry.stat(follow_symlinks=False).st_size
                        name = "/" + str(Path(entry.path).relative_to(root))
                        found.append((_shown(name), size))
                        total += size
        except OSError:
            continue
    return sorted(found), total, False


def _deleted(record: Path) -> list[str]:
    """The guest paths cells hid, from the layer's record: one JSON string a line, written by
    the guest, so opened as a regular file only and read up to RECORD_LIMIT."""
    try:
        fd = open_regular(record)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as file:
        lines = file.read(RECORD_LIMIT).splitlines()
    names = set()
    for line in lines:
        try:
            name = json.loads(line)
        except ValueError:
            continue
        if isinstance(name, str):
            names.add(_shown(name))
    return sorted(names)


def _shown(name: str) -> str:
    """A guest-chosen name as %sandbox prints it: one line, no control characters."""
    return name if name.isprintable() else repr(name)
