"""The compiled runtime installed for every user of a Python, and whether a cache may be trusted.

An install for everybody (as root, or ``--sys-prefix`` / ``--prefix``) compiles the runtime
into ``<prefix>/share/wasm-kernel/cache``, beside ``<prefix>/share/jupyter/kernels``, where
Jupyter keeps the kernelspecs: the conventional place for a prefix's shared data, removed
with the prefix, and found by every kernel of that Python through ``sys.prefix`` with nothing
written in anyone's home. (A ``--prefix`` other than this Python's is named in the
kernelspecs' argv instead, since no kernel could guess it.) Its folders are 0755 and its
files 0644, whatever the installer's umask, so every user reads it and only its owner
writes it; as the cache treats a folder its process cannot write as read-only, other users'
kernels load it without writing anything.

The cache holds native code that a kernel maps and runs outside the sandbox, so a kernel
trusts a cache folder only when nobody but root, its own user or the owner of the kernel's
own code (who could change that code anyway) may change it: the folder and every folder
above it owned by one of them and not writable by others (a sticky folder such as /tmp
excepted above it), and the entries' own files and folders not writable by group or
others. A cache of the kernel's own user that is wider is narrowed; anyone else's is refused.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import stat
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

SHARED_FOLDER = ("share", "wasm-kernel", "cache")
CACHE_DIR_ENV = "WASM_KERNEL_CACHE_DIR"  # a cache folder of the user's choosing
FOLDER_MODE = 0o755
FILE_MODE = 0o644
_GROUP_OTHERS_WRITE = 0o022


class UntrustedCache(Exception):
    """A cache folder or file that someone besides its trusted owners could change."""


def shared_cache_dir(prefix: Path | str) -> Path:
    """The compiled-runtime cache that an install into ``prefix`` makes for every user."""
    return Path(prefix).joinpath(*SHARED_FOLDER)


def installed_cache_dir() -> Path | None:
    """This Python's shared cache, if an install for everybody made one and it may be
    trusted (an untrusted one is passed over with a warning)."""
    folder = shared_cache_dir(sys.prefix)
    if not folder.is_dir():
        return None
    try:
        check_folder(folder)
    except (UntrustedCache, OSError) as exc:
        log.warning("not using the shared compiled runtime %s: %s", folder, exc)
        return None
    return folder


@functools.cache
def trusted_owners() -> frozenset[int]:
    """root, this process's user, and the owner of the kernel's own code."""
    package = Path(__file__).resolve().parent.parent
    return frozenset({0, os.geteuid(), package.stat().st_uid})


def check_folder(folder: Path) -> None:
    """UntrustedCache unless ``folder`` and every folder above it belong to a trusted owner
    and nobody else may write them (group-writable folders above it are taken: a system's
    /usr/local may be its staff's; world-writable ones only if sticky, like /tmp)."""
    resolved = folder.resolve()
    owners = trusted_owners()
    for current in (resolved, *resolved.parents):
        status = current.stat()
        if status.st_uid not in owners:
            raise UntrustedCache(f"{current} belongs to uid {status.st_uid}")
        mode = stat.S_IMODE(status.st_mode)
        if mode & 0o002 and not mode & stat.S_ISVTX:
            raise UntrustedCache(f"{current} is writable by every user (mode {mode:04o})")
        if current == resolved and mode & _GROUP_OTHERS_WRITE:
            _narrow_own(current, status)


def check_entry(entry: Path, *inside: str) -> None:
    """UntrustedCache unless ``entry``, what it holds at its top and in its folders
    ``inside`` are real files and folders of trusted owners that no one else may write;
    this user's own too-wide ones are narrowed."""
    owners = trusted_owners()
    for path in _top_of(entry, inside):
        status = path.lstat()
        if stat.S_ISLNK(status.st_mode):
            raise UntrustedCache(f"{path} is a symbolic link")
        if status.st_uid not in owners:
            raise UntrustedCache(f"{path} belongs to uid {status.st_uid}")
        if status.st_mode & _GROUP_OTHERS_WRITE:
            _narrow_own(path, status)


def check_cache(directory: Path, entry: Path, inside: str, files: Path) -> None:
    """UntrustedCache (never deleted, never built over) when anyone but root, this user or
    the owner of the kernel's code could have changed the cache entry ``entry`` of
    ``directory`` about to be run (its folder ``inside`` too), or the runtime's ``files``
    (the sources the guest reads) when they are kept in ``directory``."""
    try:
        check_folder(directory)
        check_entry(followed(entry), inside)
        if files.parent == directory and files.is_dir():
            check_entry(followed(files))
    except (UntrustedCache, OSError) as exc:
        raise UntrustedCache(
            f"the compiled-runtime cache {directory} is not safe to load: {exc}. Have its"
            " owner (root for an install for every user) make it writable by nobody else"
            f" (`python -m wasm_kernel install` does), or set {CACHE_DIR_ENV} to a folder"
            " of your own."
        ) from None


def followed(path: Path) -> Path:
    """Where ``path`` leads: a link in a trusted cache folder was put there by its owner, and
    the folders above its target must be trusted as well."""
    real = path.resolve()
    if real != path.absolute():
        check_folder(real.parent)
    return real


def _top_of(entry: Path, inside: Iterable[str]) -> Iterator[Path]:
    yield entry
    for folder in (entry, *(entry / name for name in inside)):
        with contextlib.suppress(FileNotFoundError), os.scandir(folder) as found:
            for item in found:
                yield Path(item.path)


def _narrow_own(path: Path, status: os.stat_result) -> None:
    mode = stat.S_IMODE(status.st_mode)
    if status.st_uid != os.geteuid():
        raise UntrustedCache(f"{path} is writable by group or others (mode {mode:04o})")
    os.chmod(path, mode & ~_GROUP_OTHERS_WRITE)
    log.warning("%s was writable by group or others (mode %04o); narrowed", path, mode)


# -- at install -------------------------------------------------------------------------------


@contextlib.contextmanager
def readable_by_all() -> Iterator[None]:
    """Files and folders made meanwhile get 0644 / 0755 unless made private on purpose,
    whatever the installer's umask (0o077 would hide them from other users, 0o000 let
    anyone change them). The command installing for everybody does nothing else meanwhile."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def publish(folder: Path) -> None:
    """Make the tree ``folder`` readable by all and writable by its owner only: folders
    0755, files 0644 (links are left alone, and never followed)."""
    for path in (folder, *folder.rglob("*")):
        status = path.lstat()
        if stat.S_ISDIR(status.st_mode):
            wanted = FOLDER_MODE
        elif stat.S_ISREG(status.st_mode):
            wanted = FILE_MODE
        else:
            continue
        if stat.S_IMODE(status.st_mode) != wanted:
            os.chmod(path, wanted)


def seed(target: Path, source: Path, names: Iterable[str]) -> list[str]:
    """Put into the cache ``target`` the folders ``names`` that the cache ``source`` (the
    installing user's own, already built) holds and ``target`` lacks: hard links where they
    share a file system, else copies, mtimes kept, so the install checks them instead of
    compiling again (minutes). Entries are never changed in place, only replaced, so the
    two caches sharing files is safe. Returns the names taken."""
    if not source.is_dir() or source.resolve() == target.resolve():
        return []
    taken = []
    for name in names:
        origin, destination = source / name, target / name
        if destination.exists() or not origin.is_dir() or origin.is_symlink():
            continue
        staging = target / f".seeding-{name}-{os.getpid()}"
        try:
            shutil.copytree(origin, staging, symlinks=True, copy_function=_link_or_copy)
            os.rename(staging, destination)
        except OSError as exc:
            log.info("could not take %s from %s: %s", name, source, exc)
            shutil.rmtree(staging, ignore_errors=True)
            continue
        taken.append(name)
    return taken


def _link_or_copy(origin: str, destination: str) -> None:
    try:
        os.link(origin, destination, follow_symlinks=False)
    except OSError:
        shutil.copy2(origin, destination)
