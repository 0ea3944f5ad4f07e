"""Where a path beside the notebook lives, for the private layer (``_wasm_kernel_layer``):
the layer's copy, the host's entry, or nothing (a host entry a cell deleted is hidden); and
the mechanics of writing there: folders made in the layer, host files copied up.

The state here is set by ``_wasm_kernel_layer.activate``.
"""

import errno
import json
import os
import posixpath
import stat
import sys

COPY_CHUNK = 1 << 20

folders = ()  # guest folders with a layer, e.g. ("/notebook",)
files = ""  # where the layer mirrors them: files + "/notebook/out.csv"
record = ""  # the file listing deleted, for an interpreter started afresh on the same /tmp
deleted = set()  # guest paths whose host entry is hidden, with everything below it
real = {}  # the os functions as they were, and "builtins.open"


def load_deleted():
    names = []
    try:
        with real["builtins.open"](record, encoding="utf-8") as file:
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


def hide(absolute):
    """Hide the host's entry, recorded by appending a line (deleting a folder of thousands
    of host files costs a line each)."""
    if hidden(absolute):
        return
    deleted.add(absolute)
    os.makedirs(posixpath.dirname(record), exist_ok=True)
    with real["builtins.open"](record, "a", encoding="utf-8") as file:
        file.write(json.dumps(absolute) + "\n")


def layered(path):
    """The absolute guest path if ``path`` (str or path-like) is in a layered folder, else
    None (descriptors, bytes and every other folder go to the real function untouched)."""
    if not folders or isinstance(path, int):
        return None
    try:
        text = os.fspath(path)
    except TypeError:
        return None
    if not isinstance(text, str) or "\0" in text:
        return None
    if not text.startswith("/"):
        text = posixpath.join(getcwd(), text)
    elif not text.startswith(folders):
        return None
    absolute = posixpath.normpath(text)
    for folder in folders:
        if absolute == folder or absolute.startswith(folder + "/"):
            return absolute
    return None


def layer_path(absolute):
    return files + absolute


def exists(path):
    try:
        real["lstat"](path)
    except (OSError, ValueError):
        return False
    return True


def is_folder(path):
    try:
        return stat.S_ISDIR(real["stat"](path).st_mode)
    except (OSError, ValueError):
        return False


def hidden(absolute):
    """Whether the host's entry at ``absolute`` (or a folder above it) was deleted here."""
    if not deleted:
        return False
    path = absolute
    while path not in folders and path != "/":
        if path in deleted:
            return True
        path = posixpath.dirname(path)
    return path in deleted


def host_has(absolute):
    return not hidden(absolute) and exists(absolute)


def missing(original):
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), original)


def read_target(absolute, original):
    """What a read of ``absolute`` opens: the layer's copy, else the path as given (the
    host's file, or nothing); a hidden host entry reads as missing."""
    upper = layer_path(absolute)
    if exists(upper):
        return upper
    if hidden(absolute):
        raise missing(original)
    return original


def write_target(absolute, original, copy=False, exclusive=False):
    """The layer's path a write to ``absolute`` goes to, its folder made in the layer; with
    ``copy`` the host's file is copied up first (appending, ``r+``, truncating)."""
    upper = layer_path(absolute)
    if exists(upper):
        if exclusive:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), original)
        return upper
    on_host = host_has(absolute)
    if exclusive and on_host:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), original)
    make_folder(posixpath.dirname(absolute), original)
    if copy and on_host:
        copy_up(absolute, upper, original)
    return upper


def make_folder(absolute, original):
    """The layer's copy of folder ``absolute``, made if the merged view has that folder."""
    upper = layer_path(absolute)
    if is_folder(upper):
        return
    if absolute in folders:
        os.makedirs(upper, exist_ok=True)
        # import found no folder there before: let it look again (a module written beside
        # the notebook imports)
        sys.path_importer_cache.pop(upper, None)
        return
    if hidden(absolute) or not is_folder(absolute):
        raise missing(original)
    make_folder(posixpath.dirname(absolute), original)
    try:
        real["mkdir"](upper)
    except FileExistsError:
        pass


def copy_up(absolute, upper, original):
    """The host's regular file at ``absolute`` copied into the layer: the notebook's folder
    may hold FIFOs and devices, which are refused before they are opened (opening a FIFO
    would wait for a writer, in the host, where no interrupt reaches), and checked again.
    Copied beside the layer, then moved into place: a copy the scratch limit stopped never
    stands for the host's file."""
    if not stat.S_ISREG(real["stat"](absolute).st_mode):
        raise _not_regular(original)
    staging = drop_staging()  # one left by a copy stopped hard: removing needs no room
    source = real["open"](absolute, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(source).st_mode):
            raise _not_regular(original)
        target = real["open"](staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            while chunk := os.read(source, COPY_CHUNK):
                while chunk:
                    chunk = chunk[os.write(target, chunk) :]
        except BaseException:
            os.close(target)
            real["remove"](staging)
            raise
        os.close(target)
        real["replace"](staging, upper)
    finally:
        os.close(source)


def drop_staging():
    """Remove the copy-up in progress, if any; its path."""
    staging = posixpath.dirname(files) + "/copying"
    try:
        real["remove"](staging)
    except OSError:
        pass
    return staging


def _not_regular(original):
    return PermissionError(
        errno.EACCES,
        "only regular files beside the notebook can be changed (this one stays read-only)",
        original,
    )


def copy_tree(absolute, upper, original):
    """A host folder copied into the layer, merged with what the layer has of it (a rename)."""
    make_folder(absolute, original)
    for name in merged_names(absolute, original):
        child = absolute + "/" + name
        if not exists(layer_path(child)):
            if is_folder(child):
                copy_tree(child, layer_path(child), original)
            else:
                copy_up(child, layer_path(child), original)


def merged_names(absolute, original):
    """The merged folder's entry names; FileNotFoundError if neither side has it."""
    upper = layer_path(absolute)
    names = set()
    found = False
    if is_folder(upper):
        names.update(real["listdir"](upper))
        found = True
    if not hidden(absolute) and (not found or is_folder(absolute)):
        try:
            names.update(
                name for name in real["listdir"](absolute) if absolute + "/" + name not in deleted
            )
            found = True
        except OSError:
            if not found:
                raise
    if not found:
        raise missing(original)
    return sorted(names)


def fixed(error, mapped, original):
    """An error of a redirected call, naming the path the cell gave."""
    if error.filename == mapped:
        error.filename = original
    return error


def redirected(function, mapped, original, *args, **kwargs):
    try:
        return function(mapped, *args, **kwargs)
    except OSError as error:
        raise fixed(error, mapped, original) from None


def getcwd():
    cwd = real["getcwd"]()
    if files and cwd.startswith(files + "/"):
        inner = cwd[len(files) :]
        if any(inner == folder or inner.startswith(folder + "/") for folder in folders):
            return inner
    return cwd
