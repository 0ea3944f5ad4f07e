"""New files beside the notebook written through to the host's folder
(``notebook_writes = "new-files"``), and the one notice of a write that stays private.

Cells always write into the private layer, however they open a file (the guest's
``_wasm_kernel_layer`` for Python's file functions, ``layer_opens`` for WASI calls from C
code). After each cell, before its reply, the host copies the layer's *new* files into the
notebook's folder, so that JupyterLab's file browser, nbconvert and papermill find them there
as under the native kernel. Each copy is checked on the host, every time:

- only regular files whose name has a data format's suffix (``DATA_SUFFIXES``), outside hidden
  folders: nothing a host program runs or loads as code (``conftest.py``,
  ``jupyter_server_config.py``, a module shadowing one the native kernel imports, ``.git``);
- only where the host has no entry of that name, or has the file this kernel wrote there
  itself, untouched since (same device, inode, size and modification time): a file that was
  already in the folder, or that someone changed since, is never changed or removed (a cell's
  changes to it stay in the layer);
- the host's folder is walked one descriptor at a time from the mount's root, each name
  opened without following a link and never ``..`` (a link in the way keeps the file
  private); folders are made 0700 and files 0600: private to the account the kernel runs as
  (the Jupyter server's, which serves them), never executable;
- at most ``quota`` bytes (the scratch limit; 0: none) in at most MAX_WRITTEN files; past
  that, the file stays private and the cell's stderr says so.

A file the kernel wrote through that a cell deletes or renames is removed from the host too,
if it is still the kernel's. What the kernel wrote is known for the life of its process: in a
resumed session those files are the folder's like any other.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .layer_opens import COPY_CHUNK, FOLDER_FLAGS, LAYER_FILES, LayerOpens, open_beneath
from .notebook_writes import GUEST_LAYER, NEW_FILES, WALKED

# what a notebook saves: tables, text, figures, arrays, databases, archives, media. Never code
# or configuration: the host's own programs run those (the native kernel imports ``*.py`` from
# the notebook's folder, Jupyter reads ``jupyter_*_config.*`` from where it starts, pytest runs
# ``conftest.py``); nor pickles, which run code when loaded. HTML and SVG are served by
# jupyter_server's file handler under a ``sandbox`` content security policy.
DATA_SUFFIXES = frozenset(
    (
        *(".csv", ".tsv", ".txt", ".json", ".jsonl", ".geojson", ".md", ".log", ".tex", ".bib"),
        *(".png", ".jpg", ".jpeg", ".gif", ".svg", ".pdf", ".eps", ".ps", ".webp", ".tif"),
        *(".tiff", ".bmp", ".html", ".htm", ".xml"),
        *(".npy", ".npz", ".h5", ".hdf5", ".nc", ".parquet", ".feather", ".arrow", ".mat"),
        *(".xlsx", ".xls", ".ods", ".db", ".sqlite", ".sqlite3", ".duckdb", ".bin", ".dat"),
        *(".zip", ".gz", ".bz2", ".xz", ".wav", ".mp3", ".mp4"),
    )
)
MAX_WRITTEN = 1000  # files one kernel keeps in the notebook's folder
FILE_MODE, FOLDER_MODE = 0o600, 0o700
NAMED = 5  # file names a notice names

# why a file stays in the layer, as the cell is told
OVERLAID = (
    "notebook_writes is 'overlay' (the setting WasmKernel.notebook_writes = 'new-files' writes"
    " new data files through)"
)
EXISTING = "it was already in the folder, whose files cells never change"
NOT_DATA = (
    "only data files (.csv, .json, .png, .npy, .db ...) outside hidden folders are written"
    " through, never code or configuration"
)
IN_THE_WAY = "a link, or a file that is not a folder, is in its way there"
QUOTA = "the kernel's files there are at their limit"


@dataclass(frozen=True)
class _Written:
    """A file this kernel wrote through: the host's file, and the layer's copy it came from."""

    host: tuple[int, int, int, int]  # its (device, inode, size, mtime in ns) once written
    size: int
    source: tuple[int, int, int]  # the layer copy's (inode, size, mtime in ns) when copied


class WriteThrough:
    """After each cell: new files copied from the layer to the host (under ``new-files``),
    and the text for the cell's stderr (see the module docstring). ``folders`` maps each
    layered guest folder to its host folder."""

    def __init__(self, choice: str, folders: Mapping[str, Path], quota: int):
        self.writes_through = choice == NEW_FILES
        self.folders = dict(folders)
        self.quota = quota
        self._written: dict[str, _Written] = {}  # by guest path
        self._bytes = 0  # their sizes, together
        self._ever_written: set[str] = set()
        self._told_private = False
        self._told_quota: set[str] = set()

    def after_cell(self, scratch: Path, shown: bool = True) -> str:
        """Write the layer's new files through; what the cell's stderr should say (or "").
        A cell whose output is not ``shown`` (a silent request) says nothing, and uses up
        no notice."""
        if not self.folders or (self._told_private and not self.writes_through):
            return ""
        layer = LayerOpens(self.folders, scratch)
        files = _layer_files(scratch, self.folders)
        if self.writes_through:  # first: what they took counts no longer
            self._remove_deleted(layer, scratch)
        private: dict[str, str] = {}  # guest path -> why it stays in the layer
        for guest, status in sorted(files.items()):
            why = self._write(scratch, guest, status) if self.writes_through else OVERLAID
            if why:
                private[guest] = why
        if not shown:
            return ""
        return self._quota_notice(private) + self._private_notice(private, layer)

    # -- one file -----------------------------------------------------------------------------

    def _write(self, scratch: Path, guest: str, status: os.stat_result) -> str:
        """Write ``guest``'s layer copy through; "" when done (or nothing changed), else why
        it stays private."""
        folder, parts = self._place(guest)
        if any(part in ("", "..") or part.startswith(".") for part in parts):
            return NOT_DATA
        if posixpath.splitext(parts[-1])[1].lower() not in DATA_SUFFIXES:
            return NOT_DATA
        source = (status.st_ino, status.st_size, status.st_mtime_ns)
        known = self._written.get(guest)
        if known is not None and known.source == source:
            return ""  # written through already, unchanged since
        others = self._bytes - (known.size if known is not None else 0)
        if (self.quota and others + status.st_size > self.quota) or (
            known is None and len(self._written) >= MAX_WRITTEN
        ):
            return QUOTA
        try:
            folder_fd = _host_folder(self.folders[folder], parts[:-1], make=True)
        except OSError:
            return IN_THE_WAY
        try:
            written = _copy(scratch, guest, folder_fd, parts[-1], known)
        except _Existing:
            return EXISTING
        except OSError as error:
            return f"it could not be written there ({os.strerror(error.errno or errno.EIO)})"
        finally:
            os.close(folder_fd)
        self._written[guest] = _Written(written, written[2], source)
        self._bytes = others + written[2]
        self._ever_written.add(guest)
        self._told_quota.discard(guest)
        return ""

    def _place(self, guest: str) -> tuple[str, list[str]]:
        """The written-through folder holding guest path ``guest``, and the names below it."""
        folder = next(f for f in self.folders if guest.startswith(f + "/"))
        return folder, guest[len(folder) + 1 :].split("/")

    def _remove_deleted(self, layer: LayerOpens, scratch: Path) -> None:
        """Files written through that cells deleted or renamed away (hidden, and not made
        again in the layer) go from the host too, if they are still the kernel's."""
        for guest, written in list(self._written.items()):
            if not layer.hides(guest) or os.path.lexists(scratch / (LAYER_FILES + guest)):
                continue
            del self._written[guest]
            self._bytes -= written.size
            folder, (*inner, name) = self._place(guest)
            try:
                folder_fd = _host_folder(self.folders[folder], inner, make=False)
            except OSError:
                continue
            try:
                found = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
                if _stamp(found) == written.host and stat.S_ISREG(found.st_mode):
                    os.unlink(name, dir_fd=folder_fd)
            except OSError:
                pass
            finally:
                os.close(folder_fd)

    # -- what the cell is told ---------------------------------------------------------------------

    def _quota_notice(self, private: Mapping[str, str]) -> str:
        """Every time new files are kept back by the quota: the files, and the limit."""
        new = [guest for guest, why in private.items() if why == QUOTA]
        new = [guest for guest in new if guest not in self._told_quota]
        if not new:
            return ""
        self._told_quota.update(new)
        self._told_private = True
        limit = f"{self.quota:,} bytes (scratch_limit) and " if self.quota else ""
        return (
            f"wasm-kernel: not written to the notebook's folder: {_names(new)}; the files this"
            f" kernel writes there may take at most {limit}{MAX_WRITTEN:,} files. They stay in"
            " the session's private layer (%sandbox lists it); delete files to make room.\n"
        )

    def _private_notice(self, private: Mapping[str, str], layer: LayerOpens) -> str:
        """Once per kernel: the first write that stays private, where it went and why."""
        if self._told_private:
            return ""
        hidden = sorted(layer.hidden_entries() - self._ever_written)
        if not private and not hidden:
            return ""
        self._told_private = True
        if private:
            guest, why = next(iter(private.items()))
            what = f"{_names([guest])} was written to"
        else:
            guest, why = hidden[0], EXISTING
            what = f"the deletion of {_names([guest])} stays in"
        return (
            f"wasm-kernel: {what} this session's private layer ({GUEST_LAYER}), not to the"
            f" notebook's folder on disk: {why}. Later cells read it; %sandbox lists the"
            " layer's files. (Said once.)\n"
        )


class _Existing(Exception):
    """The host has a file of that name that this kernel did not write."""


def _copy(
    scratch: Path, guest: str, folder_fd: int, name: str, known: _Written | None
) -> tuple[int, int, int, int]:
    """The layer's copy of ``guest`` into ``name`` in the host folder ``folder_fd``: a new
    file, or the one this kernel wrote there (``known``), untouched since (same device,
    inode, size and modification time: a file someone changed or replaced is not the
    kernel's any more). The host file's stamp once written."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        target = os.open(name, flags | os.O_CREAT | os.O_EXCL, FILE_MODE, dir_fd=folder_fd)
        created = True
    except FileExistsError:
        if known is None or not _is_kernels(folder_fd, name, known):  # looked at, not opened
            raise _Existing from None
        try:
            target = os.open(name, flags, dir_fd=folder_fd)
        except OSError:  # replaced since by a link (ELOOP), a folder, a FIFO
            raise _Existing from None
        created = False
    try:
        found = os.fstat(target)
        if not created and (known is None or _stamp(found) != known.host):
            raise _Existing
        os.fchmod(target, FILE_MODE)
        os.ftruncate(target, 0)
        _copy_from_layer(scratch, guest, target)
        written = _stamp(os.fstat(target))
    except BaseException:
        os.close(target)
        if created:
            os.unlink(name, dir_fd=folder_fd)
        raise
    os.close(target)
    return written


def _stamp(status: os.stat_result) -> tuple[int, int, int, int]:
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


def _is_kernels(folder_fd: int, name: str, known: _Written) -> bool:
    """Whether ``name`` is still the regular file the kernel wrote, as it left it."""
    try:
        found = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(found.st_mode) and _stamp(found) == known.host


def _copy_from_layer(scratch: Path, guest: str, target: int) -> None:
    """Bytes of the layer's regular file ``guest`` into ``target``, up to the size it had
    when opened."""
    source = open_beneath(scratch, LAYER_FILES + guest, os.O_RDONLY)
    try:
        status = os.fstat(source)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        os.set_blocking(source, True)
        left = status.st_size
        while left > 0 and (chunk := os.read(source, min(COPY_CHUNK, left))):
            left -= len(chunk)
            while chunk:
                chunk = chunk[os.write(target, chunk) :]
    finally:
        os.close(source)


def _host_folder(root: Path, parts: list[str], make: bool) -> int:
    """A descriptor on the folder ``parts`` below ``root``, opened one name at a time without
    following a link; with ``make``, missing folders are made (0700)."""
    fd = os.open(root, FOLDER_FLAGS)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise OSError(errno.ENOENT, "not a plain name")
            made = False
            try:
                inner = os.open(part, FOLDER_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not make:
                    raise
                os.mkdir(part, FOLDER_MODE, dir_fd=fd)  # mkdirat never follows a link
                inner = os.open(part, FOLDER_FLAGS, dir_fd=fd)
                made = True
            os.close(fd)
            fd = inner
            if made:
                os.fchmod(fd, FOLDER_MODE)  # whatever the umask
    except BaseException:
        os.close(fd)
        raise
    return fd


def _layer_files(scratch: Path, folders: Mapping[str, Path]) -> dict[str, os.stat_result]:
    """The layer's regular files by guest path (at most WALKED entries looked at); links
    are not followed (the guest cannot make one, but the walk does not rely on that)."""
    found: dict[str, os.stat_result] = {}
    seen = 0
    base = scratch / LAYER_FILES
    pending = [(base / folder.lstrip("/"), folder) for folder in folders]
    while pending:
        host, guest = pending.pop()
        try:
            with os.scandir(host) as entries:
                for entry in entries:
                    seen += 1
                    if seen > WALKED:
                        return found
                    inner = f"{guest}/{entry.name}"
                    if entry.is_dir(follow_symlinks=False):
                        pending.append((Path(entry.path), inner))
                    elif entry.is_file(follow_symlinks=False):
                        found[inner] = entry.stat(follow_symlinks=False)
        except OSError:
            continue
    return found


def _names(guests: list[str]) -> str:
    """Guest paths as a notice names them: printable, at most NAMED of them."""
    shown = [name if name.isprintable() else repr(name) for name in guests[:NAMED]]
    return ", ".join(shown) + (f" and {len(guests) - NAMED} more" if len(guests) > NAMED else "")
