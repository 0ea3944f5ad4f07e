"""Writes beside the notebook, kept private: a copy-on-write layer over read-only folders.

The host mounts the notebook's folder read-only, so wasmtime refuses every write there
whatever runs in here: this module never widens what the guest may do, it only redirects.
With ``WasmKernel.notebook_writes = "overlay"`` the host names the layered folders
(``activate``), and the file functions Python code reaches them through (``open``,
``io.open``, ``os.open``, ``os.stat``, ``os.listdir``, ``os.scandir``, ``os.mkdir``,
``os.rename``, ``os.remove`` ...) see one merged folder:

- a file written there goes to the layer, a folder in the private /tmp that mirrors guest
  paths (``<layer>/files/notebook/out.csv``); so it counts against the scratch quota and is
  carried by snapshots and hibernation with the rest of /tmp;
- a name the layer holds hides the host's; an append, ``r+`` or truncation first copies the
  host's file up (regular files only: a FIFO or device is refused before it is opened);
- a deleted or renamed host entry is hidden with everything below it (its path is kept in
  ``<layer>/deleted``, one JSON string a line); a folder made again under that name starts
  empty.

Code that opens files through C (sqlite3, lxml's own writers) reaches the read-only mount
itself and gets ``PermissionError`` there, as without the layer.
"""

import builtins
import errno
import functools
import io
import json
import os
import posixpath
import stat
import sys

COPY_CHUNK = 1 << 20
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

_folders = ()  # guest folders with a layer, e.g. ("/notebook",)
_files = ""  # where the layer mirrors them: _files + "/notebook/out.csv"
_record = ""  # the file listing _deleted, for an interpreter started afresh on the same /tmp
_deleted = set()  # guest paths whose host entry is hidden, with everything below it
_real = {}  # the os functions as they were, and "builtins.open"
_LAYERED_FUNCTIONS = {}  # their replacements, made at the first activation


def activate(folders, layer):
    """Layer ``folders`` (guest paths of read-only mounts) in the guest folder ``layer``; no
    folders puts the plain functions back (a snapshot of a layered session restored where
    writes are refused). A layered folder on sys.path gets its layer's copy just before it,
    so a module written beside the notebook imports."""
    global _folders, _files, _record, _deleted
    if not _real:
        _real.update((name, getattr(os, name)) for name in LAYERED if hasattr(os, name))
        _real["builtins.open"] = builtins.open
        _LAYERED_FUNCTIONS.update(_layered_functions())
    if _files:
        sys.path[:] = [entry for entry in sys.path if not entry.startswith(_files + "/")]
    _folders = tuple(folders)
    if not _folders:
        os.__dict__.update((name, _real[name]) for name in _LAYERED_FUNCTIONS)
        _set_open(_real["builtins.open"])
        return
    _files, _record = layer + "/files", layer + "/deleted"
    _deleted = set(_load_deleted())
    for folder in _folders:  # made by the first write (until then /tmp holds nothing of it)
        if folder in sys.path:
            sys.path.insert(sys.path.index(folder), _files + folder)
    os.__dict__.update(_LAYERED_FUNCTIONS)
    _set_open(_LayeredOpen(_real["builtins.open"]))


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
    record in /tmp (like every file it wrote) stays, so the record is read again."""
    global _deleted
    if _folders:
        _deleted = set(_load_deleted())


def _load_deleted():
    names = []
    try:
        with _real["builtins.open"](_record, encoding="utf-8") as file:
            for line in file:
                try:
                    name = json.loads(line)
                except ValueError:
                    continue  # a line cut short (the cell was stopped as it wrote)
                if isinstance(name, str):
                    names.append(name)
    except (OSError, ValueError):
        pass
    return names


def _hide(absolute):
    """Hide the host's entry, recorded by appending a line (deleting a folder of thousands
    of host files costs a line each)."""
    if _hidden(absolute):
        return
    _deleted.add(absolute)
    os.makedirs(posixpath.dirname(_record), exist_ok=True)
    with _real["builtins.open"](_record, "a", encoding="utf-8") as file:
        file.write(json.dumps(absolute) + "\n")


# -- paths ------------------------------------------------------------------------------------


def _layered(path):
    """The absolute guest path if ``path`` (str or path-like) is in a layered folder, else
    None (descriptors, bytes and every other folder go to the real function untouched)."""
    if not _folders or isinstance(path, int):
        return None
    try:
        text = os.fspath(path)
    except TypeError:
        return None
    if not isinstance(text, str) or "\0" in text:
        return None
    if not text.startswith("/"):
        text = posixpath.join(_getcwd(), text)
    elif not text.startswith(_folders):
        return None
    absolute = posixpath.normpath(text)
    for folder in _folders:
        if absolute == folder or absolute.startswith(folder + "/"):
            return absolute
    return None


def _upper(absolute):
    return _files + absolute


def _exists(path):
    try:
        _real["lstat"](path)
    except (OSError, ValueError):
        return False
    return True


def _is_folder(path):
    try:
        return stat.S_ISDIR(_real["stat"](path).st_mode)
    except (OSError, ValueError):
        return False


def _hidden(absolute):
    """Whether the host's entry at ``absolute`` (or a folder above it) was deleted here."""
    if not _deleted:
        return False
    path = absolute
    while path not in _folders and path != "/":
        if path in _deleted:
            return True
        path = posixpath.dirname(path)
    return path in _deleted


def _host_has(absolute):
    return not _hidden(absolute) and _exists(absolute)


def _missing(original):
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), original)


def _read_target(absolute, original):
    """What a read of ``absolute`` opens: the layer's copy, else the path as given (the
    host's file, or nothing); a hidden host entry reads as missing."""
    upper = _upper(absolute)
    if _exists(upper):
        return upper
    if _hidden(absolute):
        raise _missing(original)
    return original


def _write_target(absolute, original, copy=False, exclusive=False):
    """The layer's path a write to ``absolute`` goes to, its folder made in the layer; with
    ``copy`` the host's file is copied up first (appending, ``r+``, truncating)."""
    upper = _upper(absolute)
    if _exists(upper):
        if exclusive:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), original)
        return upper
    on_host = _host_has(absolute)
    if exclusive and on_host:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), original)
    _make_folder(posixpath.dirname(absolute), original)
    if copy and on_host:
        _copy_up(absolute, upper, original)
    return upper


def _make_folder(absolute, original):
    """The layer's copy of folder ``absolute``, made if the merged view has that folder."""
    upper = _upper(absolute)
    if _is_folder(upper):
        return
    if absolute in _folders:
        os.makedirs(upper, exist_ok=True)
        # import found no folder there before: let it look again (a module written beside
        # the notebook imports)
        sys.path_importer_cache.pop(upper, None)
        return
    if _hidden(absolute) or not _is_folder(absolute):
        raise _missing(original)
    _make_folder(posixpath.dirname(absolute), original)
    try:
        _real["mkdir"](upper)
    except FileExistsError:
        pass


def _copy_up(absolute, upper, original):
    """The host's regular file at ``absolute`` copied into the layer: the notebook's folder
    may hold FIFOs and devices, which are refused before they are opened (opening a FIFO
    would wait for a writer, in the host, where no interrupt reaches), and checked again."""
    if not stat.S_ISREG(_real["stat"](absolute).st_mode):
        raise _not_regular(original)
    source = _real["open"](absolute, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(source).st_mode):
            raise _not_regular(original)
        target = _real["open"](upper, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            while chunk := os.read(source, COPY_CHUNK):
                while chunk:
                    chunk = chunk[os.write(target, chunk) :]
        finally:
            os.close(target)
    finally:
        os.close(source)


def _not_regular(original):
    return PermissionError(
        errno.EACCES,
        "only regular files beside the notebook can be changed (this one stays read-only)",
        original,
    )


def _copy_tree(absolute, upper, original):
    """A host folder copied into the layer, merged with what the layer has of it (a rename)."""
    _make_folder(absolute, original)
    for name in _names(absolute, original):
        child = absolute + "/" + name
        if not _exists(_upper(child)):
            if _is_folder(child):
                _copy_tree(child, _upper(child), original)
            else:
                _copy_up(child, _upper(child), original)


def _names(absolute, original):
    """The merged folder's entry names; FileNotFoundError if neither side has it."""
    upper = _upper(absolute)
    names = set()
    found = False
    if _is_folder(upper):
        names.update(_real["listdir"](upper))
        found = True
    if not _hidden(absolute) and (not found or _is_folder(absolute)):
        try:
            names.update(
                name for name in _real["listdir"](absolute) if absolute + "/" + name not in _deleted
            )
            found = True
        except OSError:
            if not found:
                raise
    if not found:
        raise _missing(original)
    return sorted(names)


def _fixed(error, mapped, original):
    """An error of a redirected call, naming the path the cell gave."""
    if error.filename == mapped:
        error.filename = original
    return error


def _redirected(function, mapped, original, *args, **kwargs):
    try:
        return function(mapped, *args, **kwargs)
    except OSError as error:
        raise _fixed(error, mapped, original) from None


# -- the layered functions --------------------------------------------------------------------


class _LayeredOpen:
    """open() over the layer; the file object keeps the name the cell gave. A callable object,
    like _wasm_kernel_sandbox's, so it does not become a method as a class attribute."""

    def __init__(self, real_open):
        functools.update_wrapper(self, real_open)  # first: it copies the wrapped one's
        self._real_open = real_open  # attributes, _wasm_kernel_sandbox's own _real_open too

    def __call__(self, file, mode="r", *args, **kwargs):
        absolute = _layered(file)
        if absolute is None or not isinstance(mode, str):
            return self._real_open(file, mode, *args, **kwargs)
        if any(letter in mode for letter in "wax+"):
            copy = "w" not in mode and ("a" in mode or "+" in mode)
            target = _write_target(absolute, file, copy=copy, exclusive="x" in mode)
        else:
            target = _read_target(absolute, file)
        if target is file:
            return self._real_open(file, mode, *args, **kwargs)
        opened = _redirected(self._real_open, target, file, mode, *args, **kwargs)
        raw = getattr(getattr(opened, "buffer", opened), "raw", opened)
        if isinstance(raw, io.FileIO):
            raw.name = file
        return opened

    def __repr__(self):
        return repr(self._real_open)


def _open(path, flags, mode=0o777, *, dir_fd=None):
    absolute = _layered(path) if dir_fd is None else None
    if absolute is None:
        return _real["open"](path, flags, mode, dir_fd=dir_fd)
    writes = flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_CREAT | os.O_TRUNC)
    if writes:
        exclusive = flags & os.O_CREAT and flags & os.O_EXCL
        copy = not flags & os.O_TRUNC
        target = _write_target(absolute, path, copy=copy, exclusive=exclusive)
    else:
        target = _read_target(absolute, path)
    return _redirected(_real["open"], target, path, flags, mode)


def _looking(name):
    """os.stat / os.lstat / os.access over the layer."""
    real = _real[name]

    def look(path, *args, dir_fd=None, **kwargs):
        absolute = _layered(path) if dir_fd is None else None
        if absolute is None:
            return real(path, *args, dir_fd=dir_fd, **kwargs)
        target = _read_target(absolute, path)
        if name == "access" and args and args[0] & os.W_OK:  # writes go to the layer
            return _redirected(real, target, path, os.F_OK, **kwargs)
        return _redirected(real, target, path, *args, **kwargs)

    return functools.wraps(real)(look)


def _listdir(path="."):
    absolute = _layered(path)
    if absolute is None:
        return _real["listdir"](path)
    return _names(absolute, path)


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
    absolute = _layered(path)
    if absolute is None:
        return _real["scandir"](path)
    entries = {}
    upper = _upper(absolute)
    if not _hidden(absolute) and (_is_folder(absolute) or not _is_folder(upper)):
        with _real["scandir"](path) as found:
            for entry in found:
                if absolute + "/" + entry.name not in _deleted:
                    entries[entry.name] = entry
    if _is_folder(upper):
        shown = os.fspath(path)
        with _real["scandir"](upper) as found:
            for entry in found:
                entries[entry.name] = _Entry(posixpath.join(shown, entry.name), entry)
    elif _hidden(absolute):
        raise _missing(path)
    return _Listing(entries.values())


def _mkdir(path, mode=0o777, *, dir_fd=None):
    absolute = _layered(path) if dir_fd is None else None
    if absolute is None:
        return _real["mkdir"](path, mode, dir_fd=dir_fd)
    upper = _upper(absolute)
    if absolute in _folders or _exists(upper) or _host_has(absolute):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
    _make_folder(posixpath.dirname(absolute), path)
    return _redirected(_real["mkdir"], upper, path, mode)


def _removing(name):
    """os.remove / os.unlink / os.rmdir over the layer: the layer's entry goes, the host's
    is hidden."""
    real = _real[name]
    folder = name == "rmdir"

    def remove(path, *, dir_fd=None):
        absolute = _layered(path) if dir_fd is None else None
        if absolute is None:
            return real(path, dir_fd=dir_fd)
        if absolute in _folders:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        upper = _upper(absolute)
        on_host = _host_has(absolute)
        if not on_host and not _exists(upper):
            raise _missing(path)
        is_folder = _is_folder(upper) if _exists(upper) else _is_folder(absolute)
        if folder and not is_folder:
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        if not folder and is_folder:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if folder and _names(absolute, path):
            raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), path)
        if _exists(upper):
            _redirected(real, upper, path)
        if on_host:
            _hide(absolute)
        return None

    return functools.wraps(real)(remove)


def _renaming(name):
    """os.rename / os.replace over the layer: the source is copied up if it is the host's,
    moved within /tmp, and the host's entry hidden."""
    real = _real[name]

    def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        fds = src_dir_fd is not None or dst_dir_fd is not None
        source, target = (None, None) if fds else (_layered(src), _layered(dst))
        if source is None and target is None:
            return real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        moved, on_host = src, False
        if source is not None:
            if source in _folders:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), src)
            moved, on_host = _upper(source), _host_has(source)
            if not _exists(moved):
                if not on_host:
                    raise _missing(src)
                if _is_folder(source):
                    _copy_tree(source, moved, src)
                else:
                    _make_folder(posixpath.dirname(source), src)
                    _copy_up(source, moved, src)
        to = dst if target is None else _write_target(target, dst)
        try:
            real(moved, to)
        except OSError as error:
            error = _fixed(error, moved, src)
            if error.filename2 == to:
                error.filename2 = dst
            raise error from None
        if on_host:
            _hide(source)
        return None

    return functools.wraps(real)(rename)


def _changing(name):
    """os.truncate / os.utime over the layer: on the layer's copy, made first."""
    real = _real[name]

    def change(path, *args, **kwargs):
        absolute = _layered(path) if kwargs.get("dir_fd") is None else None
        if absolute is None:
            return real(path, *args, **kwargs)
        upper = _upper(absolute)
        if not _exists(upper):
            if not _host_has(absolute):
                raise _missing(path)
            if _is_folder(absolute):
                _make_folder(absolute, path)
            else:
                _write_target(absolute, path, copy=True)
        return _redirected(real, upper, path, *args, **kwargs)

    return functools.wraps(real)(change)


def _chdir(path):
    """Into a folder only the layer has, through its copy in /tmp (``os.getcwd`` still
    names it as the cell does)."""
    absolute = _layered(path)
    if absolute is None:
        return _real["chdir"](path)
    upper = _upper(absolute)  # absolute either way: the real working folder may be the copy
    if _is_folder(upper) and (_hidden(absolute) or not _is_folder(absolute)):
        return _redirected(_real["chdir"], upper, path)
    return _redirected(_real["chdir"], absolute, path)


def _getcwd():
    cwd = _real["getcwd"]()
    if _files and cwd.startswith(_files + "/"):
        inner = cwd[len(_files) :]
        if any(inner == folder or inner.startswith(folder + "/") for folder in _folders):
            return inner
    return cwd


def _layered_functions():
    """The replacement of each real os function this runtime has."""
    makers = {"open": lambda _: _open, "listdir": lambda _: _listdir}
    makers.update({"scandir": lambda _: _scandir, "mkdir": lambda _: _mkdir})
    makers.update({"chdir": lambda _: _chdir, "getcwd": lambda _: _getcwd})
    makers.update(dict.fromkeys(("stat", "lstat", "access"), _looking))
    makers.update(dict.fromkeys(("remove", "unlink", "rmdir"), _removing))
    makers.update(dict.fromkeys(("rename", "replace"), _renaming))
    makers.update(dict.fromkeys(("truncate", "utime"), _changing))
    return {name: make(name) for name, make in makers.items() if name in _real}
