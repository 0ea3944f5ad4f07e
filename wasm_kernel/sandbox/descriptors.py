"""The guest's file descriptors, guarded: what it may close, how many it may hold open, and
what a rollback must put right.

wasmtime keeps the guest's descriptor table on the host, outside guest memory, so neither a
checkpoint nor a rollback covers it. Without a guard a cell could close the kernel's own
plumbing for good (stdout, stderr, the runtime's read-only folders) or open files until the
kernel process has no descriptors left for its sockets. ``GuestFiles`` shadows the few WASI
calls that create, close or renumber descriptors, or that change the private /tmp:

- stdio and the pre-opened folders cannot be closed (closing stdio reports success, as
  closing a real fd 1 does under the native kernel, where output does not go through it);
  nor can they be renumbered;
- the guest may hold at most ``limit`` descriptors it opened; one more is ``EMFILE``
  (``OSError: [Errno 33] Too many open files``), leaving the host room for its own;
- descriptors opened by a cell that is then rolled back are closed: the restored guest has
  never heard of them;
- an open or removal of a file in a layered folder (the notebook's, under
  ``notebook_writes = "overlay"`` or ``"new-files"``) goes to the private layer in /tmp
  (``files/layer_opens``): whatever code opens it, Python's or C's, the guest never writes
  the host folder (under ``new-files`` the host copies new files there between cells);
- a file of /tmp removed while the guest holds it open is moved aside instead, and removed
  when its last descriptor is closed (``unlinked_files``);
- a path_open of a FIFO, socket or device is refused with ``ENXIO`` before wasmtime opens it
  (the open would block out of reach of every interrupt): ``host_paths`` knows the host file
  behind each descriptor, and the check looks at the real target, after any layer redirect;
- during a service turn, what a call may create or grow in /tmp is noted in ``journal``
  (``scratch_journal``), so that a turn stopped at the scratch limit can be undone;
- every descriptor's guest path and open flags are kept, so that an image can carry them
  and a resumed guest finds its files open again at the same numbers (``held_files``);
- every call that may grow the private /tmp is reported through ``touched`` (the scratch
  watch only measures the folder after one), and while /tmp has no room (it is over its size
  limit) such calls fail with ``EDQUOT`` (``OSError: [Errno 19] Disk quota exceeded``);
  every call that may shrink it (a file or folder removed, or renamed out) through
  ``removed``, so that a cell's ``scratch_bytes`` is not the size before it.

The shadows must reach wasmtime's own WASI functions, which read the *calling instance's*
``memory`` export. A host function has no such instance, so the real calls go through a
tiny adapter module (wasi_adapter.py) that imports the guest's memory, re-exports it, and
forwards each call.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import wasmtime

from ..files.layer_opens import LayerOpens
from ..runtime.cache import exported
from ..runtime.wasi_adapter import I64, SIGNATURES, WASI
from .guest_paths import (
    FIRST_PREOPEN,
    OFLAG_CREAT,
    OFLAG_DIRECTORY,
    OFLAG_TRUNC,
    GuestPaths,
    OpenFile,
)
from .host_paths import HostPaths
from .scratch_journal import ScratchJournal
from .unlinked_files import UnlinkedFiles

ERRNO_SUCCESS = 0
ERRNO_BADF = 8
ERRNO_DQUOT = 19
ERRNO_MFILE = 33
ERRNO_NXIO = 60  # a FIFO, socket or device: never opened (see host_paths)
ERRNO_PERM = 63
RIGHT_FD_WRITE = 1 << 6
MAX_GUEST_FILES = 512  # descriptors a guest may hold open (at most half the process's limit)
MIN_GUEST_FILES = 16  # however small the process's limit: fewer and imports fail
HOST_RESERVE = 64  # kept for the kernel's own: sockets of new threads, folder walks, images
LAYER_ONLY = ("path_filestat_get",)  # shadowed only where a layer needs it (called very often)


def _valtype(name: str) -> wasmtime.ValType:
    return wasmtime.ValType.i64() if name == I64 else wasmtime.ValType.i32()


def default_limit() -> int:
    """What the guest may hold: half the process's limit, less what the kernel holds already
    and HOST_RESERVE, at most MAX_GUEST_FILES. Under a small limit (128) the guest's half
    left the kernel fewer than it holds after boot: its next thread to publish output found
    none for its ZMQ socket, and no cell was answered again."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_GUEST_FILES
    free = soft - _held_now() - HOST_RESERVE
    return max(MIN_GUEST_FILES, min(MAX_GUEST_FILES, soft // 2, free))


def _held_now() -> int:
    """How many descriptors this process holds (0 where that cannot be listed)."""
    try:
        return len(os.listdir("/dev/fd")) - 1  # less the listing's own
    except OSError:
        return 0


class GuestFiles(GuestPaths):
    """Descriptor bookkeeping for one guest interpreter (see the module docstring).

    ``folders`` are the pre-opened folders as (host folder, guest path) pairs, in the order
    WASI numbers them; ``scratch_index`` is the position of the private /tmp among them.
    """

    def __init__(
        self,
        folders: Sequence[tuple[Path, str]],
        scratch_index: int,
        touched: Callable[[], None],
        room: Callable[[], bool],
        limit: int | None = None,
        removed: Callable[[], None] | None = None,
        scratch_folder: Path | None = None,
        layer: LayerOpens | None = None,
    ):
        self.folders = [guest for _, guest in folders]
        self.protected = FIRST_PREOPEN + len(folders)  # descriptors below this are the kernel's
        self.scratch = FIRST_PREOPEN + scratch_index
        self.limit = default_limit() if limit is None else limit
        self._touched = touched
        self._room = room  # whether /tmp may grow now
        self._removed = removed or (lambda: None)  # /tmp may have shrunk
        self._real: dict[str, wasmtime.Func] = {}
        self._memory: wasmtime.Memory | None = None
        self.open: dict[int, OpenFile] = {}
        self._kept: set[int] = set()  # what was open at the last checkpoint
        self._unlinked = UnlinkedFiles(scratch_folder) if scratch_folder is not None else None
        self._layer = layer
        self._stack_pointer = ""  # the guest's stack pointer's export name, once bound
        self.paths = HostPaths(FIRST_PREOPEN, [host for host, _ in folders])
        self.journal = ScratchJournal()  # what a service turn adds to /tmp (see there)

    # -- wiring ---------------------------------------------------------------------------------

    def shadow(self, linker: wasmtime.Linker) -> None:
        """Define the guarded functions; call after ``define_wasi`` with shadowing allowed."""
        for name, params in SIGNATURES.items():
            if name in LAYER_ONLY and self._layer is None:
                continue  # wasmtime's own, at no cost per call
            func_type = wasmtime.FuncType([_valtype(p) for p in params], [wasmtime.ValType.i32()])
            linker.define_func(WASI, name, func_type, getattr(self, f"_{name}"), access_caller=True)

    def bind(
        self,
        engine: wasmtime.Engine,
        adapter: wasmtime.Module,
        store: wasmtime.Store,
        memory: wasmtime.Memory,
        stack_pointer: str = "",
    ) -> None:
        """Connect to the real WASI functions through ``adapter`` (see wasi_adapter.py);
        ``stack_pointer`` names the guest's stack pointer's export (a redirected path is
        written below it, in stack the call does not use)."""
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        linker.define(store, "guest", "memory", memory)
        exports = linker.instantiate(store, adapter).exports(store)
        self._real = {}
        for name in SIGNATURES:
            self._real[name] = exported(exports, name, wasmtime.Func)
        self._memory = memory
        self._stack_pointer = stack_pointer
        if not stack_pointer:  # a runtime that cannot say where its stack is: no redirects
            self._layer = None

    # -- checkpoints and rollback --------------------------------------------------------------

    def checkpoint(self) -> None:
        self._kept = set(self.open)

    def close_newer(self, store: wasmtime.Store) -> None:
        """After a rollback: close what the rolled-back cell opened (the guest forgot it)."""
        for fd in [fd for fd in self.open if fd not in self._kept]:
            self._real["fd_close"](store, fd)
            self._forget(fd)

    def _forget(self, fd: int) -> None:
        """``fd`` is closed: a held file goes with the last descriptor on it."""
        self.paths.forget(fd)
        held = self.open.pop(fd, None)
        if held is None or held.path is None or self._unlinked is None:
            return
        if all(other.path != held.path for other in self.open.values()):
            self._unlinked.release(held.path)

    def writing_to_scratch(self) -> bool:
        """Whether a file in the private /tmp is open for writing (it may grow any time)."""
        return any(held.in_scratch and held.writable for held in self.open.values())

    def held_writers(self) -> list[bytes]:
        """Host paths of the files in /tmp the guest holds open for writing."""
        writers = [fd for fd, held in self.open.items() if held.in_scratch and held.writable]
        return self.paths.paths_of(writers)

    def _note_growth(self, caller: wasmtime.Caller, fd: int, path: int, path_len: int) -> None:
        """Tell the journal what a call in /tmp may create or grow."""
        host = self.paths.resolve(fd, self._call_name(caller, path, path_len))
        if host is not None and self._in_scratch(fd):
            self.journal.note(host[1])

    def _in_scratch(self, fd: int) -> bool:
        held = self.open.get(fd)
        return fd == self.scratch or (held is not None and held.in_scratch)

    def real(self, name: str) -> wasmtime.Func:
        """wasmtime's own WASI function ``name`` (one of those shadowed), for held_files."""
        return self._real[name]

    # -- the shadowed WASI functions --------------------------------------------------------------

    def _fd_close(self, caller: wasmtime.Caller, fd: int) -> int:
        if 0 <= fd < self.protected:
            return ERRNO_SUCCESS if fd < FIRST_PREOPEN else ERRNO_PERM
        errno = self._real["fd_close"](caller, fd)
        if errno == ERRNO_SUCCESS:
            self._forget(fd)
        return errno

    def _fd_renumber(self, caller: wasmtime.Caller, fd: int, to: int) -> int:
        if 0 <= fd < self.protected or 0 <= to < self.protected:
            return ERRNO_PERM
        if fd not in self.open:
            return ERRNO_BADF
        errno = self._real["fd_renumber"](caller, fd, to)
        if errno == ERRNO_SUCCESS:
            moved = self.open.pop(fd)
            self._forget(to)
            self.open[to] = moved
            self.paths.move(fd, to)
        return errno

    def _path_open(
        self,
        caller: wasmtime.Caller,
        fd: int,
        dirflags: int,
        path: int,
        path_len: int,
        oflags: int,
        rights: int,
        inheriting: int,
        fdflags: int,
        opened: int,
    ) -> int:
        if len(self.open) >= self.limit:
            return ERRNO_MFILE
        writable = bool(rights & RIGHT_FD_WRITE) or bool(oflags & (OFLAG_CREAT | OFLAG_TRUNC))
        if self._layered(fd) is not None:
            if writable and not self._may_grow(self.scratch):  # before any copy-up
                return ERRNO_DQUOT
            redirect = self._open_redirect(caller, fd, path, path_len, oflags, writable)
            if isinstance(redirect, int):
                return redirect
            fd, path, path_len = redirect
        if writable and not self._may_grow(fd):
            return ERRNO_DQUOT
        assert self._memory is not None  # bound before the guest runs
        host = self.paths.resolve(fd, self._call_name(caller, path, path_len))
        if host is not None and not self.paths.may_open(host, follow=bool(dirflags & 1)):
            return ERRNO_NXIO
        if writable and host is not None and self._in_scratch(fd):
            self.journal.note(host[1])
        errno = self._real["path_open"](
            caller, fd, dirflags, path, path_len, oflags, rights, inheriting, fdflags, opened
        )
        if errno == ERRNO_SUCCESS:
            at = opened & 0xFFFFFFFF  # wasm i32 values arrive signed
            new_fd = int.from_bytes(self._memory.read(caller, at, at + 4), "little")
            self.open[new_fd] = OpenFile(
                in_scratch=self._in_scratch(fd),
                writable=writable,
                path=self._opened_path(caller, fd, path, path_len),
                oflags=oflags,
                rights=rights,
                inheriting=inheriting,
                fdflags=fdflags,
                lookup=dirflags,
            )
            self.paths.opened(new_fd, host)
        return errno

    def _path_create_directory(
        self, caller: wasmtime.Caller, fd: int, path: int, path_len: int
    ) -> int:
        redirect = self._redirect(caller, fd, path, path_len, LayerOpens.folder_target)
        if isinstance(redirect, int):
            return redirect
        fd, path, path_len = redirect
        if not self._may_grow(fd):
            return ERRNO_DQUOT
        self._note_growth(caller, fd, path, path_len)
        return self._real["path_create_directory"](caller, fd, path, path_len)

    def _path_rename(
        self,
        caller: wasmtime.Caller,
        fd: int,
        old: int,
        old_len: int,
        new_fd: int,
        new: int,
        new_len: int,
    ) -> int:
        if not (self._may_grow(new_fd) or self._in_scratch(fd)):  # within /tmp: no growth
            return ERRNO_DQUOT
        before = self._opened_path(caller, fd, old, old_len)
        after = self._opened_path(caller, new_fd, new, new_len)
        host_before = self.paths.resolve(fd, self._call_name(caller, old, old_len))
        host_after = self.paths.resolve(new_fd, self._call_name(caller, new, new_len))
        if self._in_scratch(fd):
            self._removed()
            if self._in_scratch(new_fd) and before != after:
                self._hold(after)  # a file held open that the rename replaces
        errno = self._real["path_rename"](caller, fd, old, old_len, new_fd, new, new_len)
        if errno == ERRNO_SUCCESS:
            self.paths.renamed(host_before, host_after)
            if before is not None:
                self._renamed(before, after)
        return errno

    def _path_link(
        self,
        caller: wasmtime.Caller,
        fd: int,
        flags: int,
        old: int,
        old_len: int,
        new_fd: int,
        new: int,
        new_len: int,
    ) -> int:
        if not self._may_grow(new_fd):
            return ERRNO_DQUOT
        self._note_growth(caller, new_fd, new, new_len)
        return self._real["path_link"](caller, fd, flags, old, old_len, new_fd, new, new_len)

    def _path_unlink_file(self, caller: wasmtime.Caller, fd: int, path: int, path_len: int) -> int:
        redirect = self._redirect(caller, fd, path, path_len, LayerOpens.removal_target)
        if isinstance(redirect, int):
            return redirect
        fd, path, path_len = redirect
        if self._in_scratch(fd):
            self._removed()
            if self._hold(self._opened_path(caller, fd, path, path_len)):
                return ERRNO_SUCCESS
        return self._real["path_unlink_file"](caller, fd, path, path_len)

    def _hold(self, target: str | None) -> bool:
        """A /tmp file removed while open is moved aside (see unlinked_files)."""
        holders = [
            number
            for number, held in self.open.items()
            if held.path == target and not held.oflags & OFLAG_DIRECTORY
        ]
        if target is None or not holders or self._unlinked is None:
            return False
        moved = self._unlinked.hold(target)
        if moved is None:
            return False
        for number in holders:
            self.open[number] = replace(self.open[number], path=moved)
        self.paths.renamed(self._scratch_host(target), self._scratch_host(moved))
        return True

    def _path_remove_directory(
        self, caller: wasmtime.Caller, fd: int, path: int, path_len: int
    ) -> int:
        redirect = self._redirect(caller, fd, path, path_len, LayerOpens.removal_target)
        if isinstance(redirect, int):
            return redirect
        fd, path, path_len = redirect
        if self._in_scratch(fd):
            self._removed()
        return self._real["path_remove_directory"](caller, fd, path, path_len)

    def _path_filestat_get(
        self, caller: wasmtime.Caller, fd: int, flags: int, path: int, path_len: int, out: int
    ) -> int:
        redirect = self._redirect(caller, fd, path, path_len, LayerOpens.look_target)
        if isinstance(redirect, int):
            return redirect
        fd, path, path_len = redirect
        return self._real["path_filestat_get"](caller, fd, flags, path, path_len, out)

    def _may_grow(self, fd: int) -> bool:
        """For a call that adds to folder ``fd``: report it if that is in /tmp, and refuse it
        there while /tmp is full."""
        if not self._in_scratch(fd):
            return True
        if not self._room():
            return False
        self._touched()
        return True
