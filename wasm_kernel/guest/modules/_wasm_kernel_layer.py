"""Writes beside the notebook, kept private: a copy-on-write layer over read-only folders.

The host mounts the notebook's folder read-only, so wasmtime refuses every write there
whatever runs in here: this module never widens what the guest may do, it only redirects.
With ``WasmKernel.notebook_writes = "overlay"`` (or ``"new-files"``, where the host then
copies the layer's new data files to the host's folder after each cell) the host names the
layered folders (``activate``), and the file functions Python code reaches them through
(``open``, ``io.open``, ``os.open``, ``os.stat``, ``os.listdir``, ``os.scandir``,
``os.mkdir``, ``os.rename``, ``os.remove`` ...) see one merged folder:

- a file written there goes to the layer, a folder in the private /tmp that mirrors guest
  paths (``<layer>/files/notebook/out.csv``); so it counts against the scratch quota and is
  carried by snapshots and hibernation with the rest of /tmp;
- a name the layer holds hides the host's; an append, ``r+`` or truncation first copies the
  host's file up (regular files only: a FIFO or device is refused before it is opened);
- a deleted or renamed host entry is hidden with everything below it (its path is kept in
  ``<layer>/deleted``, one JSON string a line); a folder made again under that name starts
  empty.

Code that reaches files by its own means (numpy's text I/O, ``io.FileIO``, sqlite3, lxml)
goes past these functions to WASI, where the host redirects the same way (its
``files/layer_opens``); the two share the layout and the record of hidden names.
"""

import builtins
import errno
import functools
import io
import os
import posixpath
import sys

import _wasm_kernel_layer_paths as paths

# the os functions this module layers; each is replaced while active, put back when not
LAYERED = (
    "open",
    "stat",
    "lstat",
    "access",
    "listdir",
    "scandir",
    "mkdir",
    "rmdir",
    "remove",
    "unlink",
    "rename",
    "replace",
    "truncate",
    "utime",
    "chdir",
    "getcwd",
)

_LAYERED_FUNCTIONS = {}  # the replacements, made at the first activation


def activate(folders, layer):
    """Layer ``folders`` (guest paths of read-only mounts) in the guest folder ``layer``; no
    folders puts the plain functions back (a snapshot of a layered session restored where
    writes are refused). A layered folder on sys.path gets its layer's copy just before it,
    so a module written beside the notebook imports."""
    if not paths.real:
        paths.real.update((name, getattr(os, name)) for name in LAYERED if hasattr(os, name))
        paths.real["builtins.open"] = builtins.open
        _LAYERED_FUNCTIONS.update(_layered_functions())
    if paths.files:
        sys.path[:] = [entry for entry in sys.path if not entry.startswith(paths.files + "/")]
    paths.folders = tuple(folders)
    if not paths.folders:
        os.__dict__.update((name, paths.real[name]) for name in _LAYERED_FUNCTIONS)
        _set_open(paths.real["builtins.open"])
        return
    paths.files, paths.record = layer + "/files", layer + "/deleted"
    paths.deleted.clear()
    paths.deleted.update(paths.load_deleted())
    for folder in paths.folders:  # made by the first write (until then /tmp holds nothing of it)
        if folder in sys.path:
            sys.path.insert(sys.path.index(folder), paths.files + folder)
    os.__dict__.update(_LAYERED_FUNCTIONS)
    _set_open(_LayeredOpen(paths.real["builtins.open"]))


def _set_open(function):
    """open() everywhere: builtins, io, and the copies kept by IPython's shell (the open
    cells see) and by tokenize (what %run, %load and %pycat read files with)."""
    builtins.open = io.open = function
    for module, name in (
        ("IPython.core.interactiveshell", "io_open"),
        ("tokenize", "_builtin_open"),
    ):
        module = sys.modules.get(module)
        if module is not None and hasattr(module, name):
            setattr(module, name, function)


def reload():
    """After a rollback: the guest's memory forgot what the rolled-back cell hid, but its
    record in /tmp (like every file it wrote) stays, so the record is read again; a copy-up
    the stop cut short goes (the cell could not know to delete it to make room)."""
    if paths.folders:
        paths.deleted.clear()
        paths.deleted.update(paths.load_deleted())
        paths.drop_staging()


# -- the layered functions --------------------------------------------------------------------


class _LayeredOpen:
    """open() over the layer; the file object keeps the name the cell gave. A callable object,
    like _wasm_kernel_sandbox's, so it does not become a method as a class attribute."""

    def __init__(self, real_open):
        functools.update_wrapper(self, real_open)  # first: it copies the wrapped one's
        self._real_open = real_open  # attributes, _wasm_kernel_sandbox's own _real_open too

    def __call__(self, file, mode="r", *args, **kwargs):
        absolute = paths.layered(file)
        if absolute is None or not isinstance(mode, str):
            return self._real_open(file, mode, *args, **kwargs)
        if any(letter in mode for letter in "wax+"):
            copy = "w" not in mode and ("a" in mode or "+" in mode)
            target = paths.write_target(absolute, file, copy=copy, exclusive="x" in mode)
        else:
            target = paths.read_target(absolute, file)
        if target is file:
            return self._real_open(file, mode, *args, **kwargs)
        opened = paths.redirected(self._real_open, target, file, mode, *args, **kwargs)
        raw = getattr(getattr(opened, "buffer", opened), "raw", opened)
        if isinstance(raw, io.FileIO):
            raw.name = file
        return opened

    def __repr__(self):
        return repr(self._real_open)


def _open(path, flags, mode=0o777, *, dir_fd=None):
    absolute = paths.layered(path) if dir_fd is None else None
    if absolute is None:
        return paths.real["open"](path, flags, mode, dir_fd=dir_fd)
    writes = flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_CREAT | os.O_TRUNC)
    if writes:
        exclusive = flags & os.O_CREAT and flags & os.O_EXCL
        copy = not flags & os.O_TRUNC
        target = paths.write_target(absolute, path, copy=copy, exclusive=exclusive)
    else:
        target = paths.read_target(absolute, path)
    return paths.redirected(paths.real["open"], target, path, flags, mode)


def _looking(name):
    """os.stat / os.lstat / os.access over the layer."""
    real = paths.real[name]

    def look(path, *args, dir_fd=None, **kwargs):
        absolute = paths.layered(path) if dir_fd is None else None
        if absolute is None:
            return real(path, *args, dir_fd=dir_fd, **kwargs)
        target = paths.read_target(absolute, path)
        if name == "access" and args and args[0] & os.W_OK:  # writes go to the layer
            return paths.redirected(real, target, path, os.F_OK, **kwargs)
        return paths.redirected(real, target, path, *args, **kwargs)

    return functools.wraps(real)(look)


def _listdir(path="."):
    absolute = paths.layered(path)
    if absolute is None:
        return paths.real["listdir"](path)
    return paths.merged_names(absolute, path)


class _Entry:
    """An os.DirEntry of the layer, named as in the merged folder."""

    __slots__ = ("_entry", "name", "path")

    def __init__(self, path, entry):
        self.name, self.path, self._entry = entry.name, path, entry

    def is_dir(self, *, follow_symlinks=True):
        return self._entry.is_dir(follow_symlinks=follow_symlinks)

    def is_file(self, *, follow_symlinks=True):
        return self._entry.is_file(follow_symlinks=follow_symlinks)

    def is_symlink(self):
        return self._entry.is_symlink()

    def is_junction(self):
        return False

    def stat(self, *, follow_symlinks=True):
        return self._entry.stat(follow_symlinks=follow_symlinks)

    def inode(self):
        return self._entry.inode()

    def __fspath__(self):
        return self.path

    def __repr__(self):
        return f"<DirEntry {self.name!r}>"


class _Listing:
    """What os.scandir returns: an iterator and a context manager."""

    def __init__(self, entries):
        self._entries = iter(entries)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._entries)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._entries = iter(())


def _scandir(path="."):
    absolute = paths.layered(path)
    if absolute is None:
        return paths.real["scandir"](path)
    entries = {}
    upper = paths.layer_path(absolute)
    if not paths.hidden(absolute) and (paths.is_folder(absolute) or not paths.is_folder(upper)):
        with paths.real["scandir"](path) as found:
            for entry in found:
                if absolute + "/" + entry.name not in paths.deleted:
                    entries[entry.name] = entry
    if paths.is_folder(upper):
        shown = os.fspath(path)
        with paths.real["scandir"](upper) as found:
            for entry in found:
                entries[entry.name] = _Entry(posixpath.join(shown, entry.name), entry)
    elif paths.hidden(absolute):
        raise paths.missing(path)
    return _Listing(entries.values())


def _mkdir(path, mode=0o777, *, dir_fd=None):
    absolute = paths.layered(path) if dir_fd is None else None
    if absolute is None:
        return paths.real["mkdir"](path, mode, dir_fd=dir_fd)
    upper = paths.layer_path(absolute)
    if absolute in paths.folders or paths.exists(upper) or paths.host_has(absolute):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
    paths.make_folder(posixpath.dirname(absolute), path)
    return paths.redirected(paths.real["mkdir"], upper, path, mode)


def _removing(name):
    """os.remove / os.unlink / os.rmdir over the layer: the layer's entry goes, the host's
    is hidden."""
    real = paths.real[name]
    folder = name == "rmdir"

    def remove(path, *, dir_fd=None):
        absolute = paths.layered(path) if dir_fd is None else None
        if absolute is None:
            return real(path, dir_fd=dir_fd)
        if absolute in paths.folders:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        upper = paths.layer_path(absolute)
        on_host = paths.host_has(absolute)
        if not on_host and not paths.exists(upper):
            raise paths.missing(path)
        is_folder = paths.is_folder(upper) if paths.exists(upper) else paths.is_folder(absolute)
        if folder and not is_folder:
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        if not folder and is_folder:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if folder and paths.merged_names(absolute, path):
            raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), path)
        if paths.exists(upper):
            paths.redirected(real, upper, path)
        if on_host:
            paths.hide(absolute)
        return None

    return functools.wraps(real)(remove)


def _renaming(name):
    """os.rename / os.replace over the layer: the source is copied up if it is the host's,
    moved within /tmp, and the host's entry hidden."""
    real = paths.real[name]

    def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        fds = src_dir_fd is not None or dst_dir_fd is not None
        source, target = (None, None) if fds else (paths.layered(src), paths.layered(dst))
        if source is None and target is None:
            return real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        moved, on_host = src, False
        if source is not None:
            if source in paths.folders:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), src)
            moved, on_host = paths.layer_path(source), paths.host_has(source)
            if not paths.exists(moved):
                if not on_host:
                    raise paths.missing(src)
                if paths.is_folder(source):
                    paths.copy_tree(source, moved, src)
                else:
                    paths.make_folder(posixpath.dirname(source), src)
                    paths.copy_up(source, moved, src)
        to = dst if target is None else paths.write_target(target, dst)
        try:
            real(moved, to)
        except OSError as error:
            error = paths.fixed(error, moved, src)
            if error.filename2 == to:
                error.filename2 = dst
            raise error from None
        if on_host:
            paths.hide(source)
        return None

    return functools.wraps(real)(rename)


def _changing(name):
    """os.truncate / os.utime over the layer: on the layer's copy, made first."""
    real = paths.real[name]

    def change(path, *args, **kwargs):
        absolute = paths.layered(path) if kwargs.get("dir_fd") is None else None
        if absolute is None:
            return real(path, *args, **kwargs)
        upper = paths.layer_path(absolute)
        if not paths.exists(upper):
            if not paths.host_has(absolute):
                raise paths.missing(path)
            if paths.is_folder(absolute):
                paths.make_folder(absolute, path)
            else:
                paths.write_target(absolute, path, copy=True)
        return paths.redirected(real, upper, path, *args, **kwargs)

    return functools.wraps(real)(change)


def _chdir(path):
    """Into a folder only the layer has, through its copy in /tmp (``os.getcwd`` still
    names it as the cell does)."""
    absolute = paths.layered(path)
    if absolute is None:
        return paths.real["chdir"](path)
    upper = paths.layer_path(absolute)  # absolute either way: the working folder may be the copy
    if paths.is_folder(upper) and (paths.hidden(absolute) or not paths.is_folder(absolute)):
        return paths.redirected(paths.real["chdir"], upper, path)
    return paths.redirected(paths.real["chdir"], absolute, path)


def _layered_functions():
    """The replacement of each real os function this runtime has."""
    makers = {"open": lambda _: _open, "listdir": lambda _: _listdir}
    makers.update({"scandir": lambda _: _scandir, "mkdir": lambda _: _mkdir})
    makers.update({"chdir": lambda _: _chdir, "getcwd": lambda _: paths.getcwd})
    makers.update(dict.fromkeys(("stat", "lstat", "access"), _looking))
    makers.update(dict.fromkeys(("remove", "unlink", "rmdir"), _removing))
    makers.update(dict.fromkeys(("rename", "replace"), _renaming))
    makers.update(dict.fromkeys(("truncate", "utime"), _changing))
    return {name: make(name) for name, make in makers.items() if name in paths.real}
