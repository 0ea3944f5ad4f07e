"""The host's half of the private layer beside the notebook: files opened by path.

The guest's layer (``_wasm_kernel_layer``) redirects the file functions Python code looks
up when it calls them. Code that opens files by its own means reaches WASI's ``path_open``
without it: numpy's text I/O (it kept the ``open`` it saw when the boot image imported it),
``io.FileIO``, sqlite3, lxml and every other C library. So the host redirects those opens
too, where every path to a file meets (GuestFiles asks ``LayerOpens`` before each open or
removal of a file in a layered folder), with the guest's layout: a file written there is
``<layer>/files/<guest path>`` in the private /tmp, read in preference to the host's; a
host file opened for writing without truncation is copied up first; a host entry a cell
deleted (listed in ``<layer>/deleted``, one JSON string a line) reads as missing.

The host's folder is only ever read, and only through descriptors opened without following
links, one folder at a time from the mount's root; only regular files are copied. The
layer is written the same way, inside the kernel's own /tmp folder, which never holds a
link (the guest cannot make one, and an image's archive holds plain files and folders
only): a look there is one ``lstat``, since a stat of the notebook's folder asks first.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import stat
from collections.abc import Mapping
from pathlib import Path

from .notebook_writes import LAYER

LAYER_FILES = f"{LAYER}/files"  # in /tmp: the layer's copy of guest path P is LAYER_FILES + P
RECORD = f"{LAYER}/deleted"
STAGING = f"{LAYER}/copying"  # a copy-up in progress (the guest's layer uses the same name)
RECORD_LIMIT = 1 << 20  # bytes of the deleted-names record read
COPY_CHUNK = 1 << 20
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
WASI_ERRNO = {  # host errno -> WASI errno (wasi-libc's numbering)
    errno.EACCES: 2,
    errno.EEXIST: 20,
    errno.EISDIR: 31,
    errno.ENOENT: 44,
    errno.ENOTDIR: 54,
    errno.EDQUOT: 19,
}
WASI_EIO = 29


def wasi_errno(error: OSError | LayerRefusal) -> int:
    """The WASI errno the guest gets for an open or look-up the layer could not do."""
    if isinstance(error, LayerRefusal):
        return error.wasi_errno
    return WASI_ERRNO.get(error.errno or 0, WASI_EIO)


class LayerRefusal(Exception):
    """The open or removal fails with this WASI errno, as the guest's layer would fail it."""

    def __init__(self, host_errno: int):
        super().__init__(host_errno)
        self.wasi_errno = WASI_ERRNO.get(host_errno, WASI_EIO)


class LayerOpens:
    """Where a path_open or a removal of a layered folder's file goes (see the module
    docstring). ``folders`` maps each layered guest folder to its host folder; ``scratch``
    is the host folder that is the guest's /tmp; a copy-up larger than ``copy_limit``
    bytes is refused (0: no limit), as the scratch quota would refuse it."""

    def __init__(self, folders: Mapping[str, Path], scratch: Path, copy_limit: int = 0):
        self.folders = dict(folders)
        self.scratch = scratch
        self.copy_limit = copy_limit
        self._record: tuple[tuple[int, int], frozenset[str]] = ((-1, -1), frozenset())

    def folder_of(self, guest_path: str) -> str | None:
        for folder in self.folders:
            if guest_path.startswith(folder + "/"):
                return folder
        return None

    def open_target(
        self, guest_path: str, writes: bool, truncates: bool, exclusive: bool
    ) -> str | None:
        """The path in /tmp (relative to it) to open instead of ``guest_path``; None: open
        it as asked. Raises LayerRefusal where the merged folder refuses the open."""
        folder = self.folder_of(guest_path)
        if folder is None:
            return None
        upper = LAYER_FILES + guest_path
        if self._in_layer(upper) is not None:
            if exclusive:
                raise LayerRefusal(errno.EEXIST)
            return upper
        hidden = self._hidden(guest_path, folder)
        if not writes:
            if hidden:
                raise LayerRefusal(errno.ENOENT)
            return None
        below = None if hidden else _entry(self.folders[folder], guest_path[len(folder) + 1 :])
        if below is not None and (exclusive or stat.S_ISDIR(below.st_mode)):
            raise LayerRefusal(errno.EEXIST if exclusive else errno.EISDIR)
        self._make_folder(posixpath.dirname(guest_path), folder)
        if below is not None and not truncates:
            self._copy_up(folder, guest_path, upper)
        return upper

    def folder_open_target(self, guest_path: str) -> str | None:
        """Where a folder is opened (to list it): the host's where it has the folder (the
        guest's layer merges the layer's entries in), else the layer's."""
        folder = self.folder_of(guest_path)
        if folder is None:
            return None
        hidden = self._hidden(guest_path, folder)
        if not hidden and _entry(self.folders[folder], guest_path[len(folder) + 1 :]) is not None:
            return None
        upper = LAYER_FILES + guest_path
        if self._in_layer(upper) is not None:
            return upper
        if hidden:
            raise LayerRefusal(errno.ENOENT)
        return None

    def look_target(self, guest_path: str) -> str | None:
        """Where a stat of ``guest_path`` looks: the layer's copy if it has one, else the
        path as asked (None); a hidden host entry is missing (LayerRefusal)."""
        folder = self.folder_of(guest_path)
        if folder is None:
            return None
        upper = LAYER_FILES + guest_path
        if self._in_layer(upper) is not None:
            return upper
        if self._hidden(guest_path, folder):
            raise LayerRefusal(errno.ENOENT)
        return None

    def folder_target(self, guest_path: str) -> str:
        """Where a folder made at ``guest_path`` goes: into the layer, its parent made there
        first; refused where the merged view has the name already or lacks the parent."""
        folder = self.folder_of(guest_path)
        assert folder is not None
        upper = LAYER_FILES + guest_path
        below = _entry(self.folders[folder], guest_path[len(folder) + 1 :])
        if self._in_layer(upper) is not None or (
            below is not None and not self._hidden(guest_path, folder)
        ):
            raise LayerRefusal(errno.EEXIST)
        self._make_folder(posixpath.dirname(guest_path), folder)
        return upper

    def removal_target(self, guest_path: str) -> str | None:
        """The layer's copy to remove instead of ``guest_path`` where the layer has one and
        the host does not (a file or folder C code made and removes, such as sqlite3's
        journal and lock); a host entry stays as it is."""
        folder = self.folder_of(guest_path)
        if folder is None:
            return None
        upper = LAYER_FILES + guest_path
        if self._in_layer(upper) is None:
            return None
        below = _entry(self.folders[folder], guest_path[len(folder) + 1 :])
        if below is not None and not self._hidden(guest_path, folder):
            return None  # the host's would show again: left to the refusal it gets
        return upper

    def hides(self, guest_path: str) -> bool:
        """Whether a cell deleted (or renamed away) the host's entry at ``guest_path``."""
        folder = self.folder_of(guest_path)
        return folder is not None and self._hidden(guest_path, folder)

    def hidden_entries(self) -> frozenset[str]:
        """The guest paths of every host entry cells deleted or renamed away."""
        return self._deleted()

    # -- the merged view ---------------------------------------------------------------------

    def _in_layer(self, upper: str) -> os.stat_result | None:
        try:
            return os.lstat(self.scratch / upper)
        except (OSError, ValueError):
            return None

    def _hidden(self, guest_path: str, folder: str) -> bool:
        deleted = self._deleted()
        path = guest_path
        while path != folder and path != "/":
            if path in deleted:
                return True
            path = posixpath.dirname(path)
        return False

    def _deleted(self) -> frozenset[str]:
        """The guest's record of hidden host entries, read again when it changed."""
        found = self._in_layer(RECORD)
        if found is None:
            return frozenset()
        if (found.st_size, found.st_mtime_ns) == self._record[0]:
            return self._record[1]
        try:
            fd = open_beneath(self.scratch, RECORD, os.O_RDONLY)
        except OSError:
            return frozenset()
        try:
            status = os.fstat(fd)
            key = (status.st_size, status.st_mtime_ns)
            data = os.read(fd, RECORD_LIMIT) if stat.S_ISREG(status.st_mode) else b""
        finally:
            os.close(fd)
        names = set()
        for line in data.splitlines():
            try:
                name = json.loads(line)
            except ValueError:
                continue
            if isinstance(name, str):
                names.add(name)
        self._record = (key, frozenset(names))
        return self._record[1]

    def _make_folder(self, guest_folder: str, folder: str) -> None:
        """The layer's copy of ``guest_folder``, made where the merged view has the folder."""
        upper = LAYER_FILES + guest_folder
        found = self._in_layer(upper)
        if found is not None:
            if not stat.S_ISDIR(found.st_mode):
                raise LayerRefusal(errno.ENOTDIR)
            return
        if guest_folder != folder:
            below = _entry(self.folders[folder], guest_folder[len(folder) + 1 :])
            if self._hidden(guest_folder, folder) or below is None:
                raise LayerRefusal(errno.ENOENT)
            if not stat.S_ISDIR(below.st_mode):
                raise LayerRefusal(errno.ENOTDIR)
            self._make_folder(posixpath.dirname(guest_folder), folder)
        _make_folders(self.scratch, upper)

    def _copy_up(self, folder: str, guest_path: str, upper: str) -> None:
        """The host's regular file copied into the layer: beside it first, then moved into
        place, so that a copy cut short never stands for the host's file."""
        source = open_beneath(self.folders[folder], guest_path[len(folder) + 1 :], os.O_RDONLY)
        try:
            status = os.fstat(source)
            if not stat.S_ISREG(status.st_mode):
                raise LayerRefusal(errno.EACCES)
            if self.copy_limit and status.st_size > self.copy_limit:
                raise LayerRefusal(errno.EDQUOT)
            target = open_beneath(self.scratch, STAGING, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                os.set_blocking(source, True)
                while chunk := os.read(source, COPY_CHUNK):
                    while chunk:
                        chunk = chunk[os.write(target, chunk) :]
            finally:
                os.close(target)
        finally:
            os.close(source)
        root = os.open(self.scratch, FOLDER_FLAGS)
        try:
            os.replace(STAGING, upper, src_dir_fd=root, dst_dir_fd=root)
        finally:
            os.close(root)


# -- folders walked one descriptor at a time, never following a link -------------------------


def _parent(root: Path, relative: str) -> tuple[int, str]:
    """A descriptor on the folder holding ``relative`` (under ``root``) and its last name."""
    *folders, name = relative.split("/")
    fd = os.open(root, FOLDER_FLAGS)
    try:
        for part in folders:
            if part in ("", ".", ".."):
                raise LayerRefusal(errno.ENOENT)
            inner = os.open(part, FOLDER_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    if name in ("", ".", ".."):
        os.close(fd)
        raise LayerRefusal(errno.ENOENT)
    return fd, name


def _entry(root: Path, relative: str) -> os.stat_result | None:
    """The entry at ``relative`` under ``root``, not following links; None if absent."""
    try:
        fd, name = _parent(root, relative)
    except (OSError, LayerRefusal):
        return None
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(fd)


def open_beneath(root: Path, relative: str, flags: int) -> int:
    fd, name = _parent(root, relative)
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=fd)
    finally:
        os.close(fd)


def _make_folders(root: Path, relative: str) -> None:
    fd = os.open(root, FOLDER_FLAGS)
    try:
        for part in relative.split("/"):
            if part in ("", ".", ".."):
                raise LayerRefusal(errno.ENOENT)
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            inner = os.open(part, FOLDER_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
