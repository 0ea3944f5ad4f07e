"""The paths behind the guest's WASI calls, for ``GuestFiles`` (a mixin of it): which guest
path a call names, what the host knows of each open descriptor, and where a call into a
layered folder goes instead (``files/layer_opens``).

A path the guest passes is relative to a folder descriptor; WASI keeps it inside that
folder, so the folder's guest path joined with it names the file. A redirected call gets
its new path written below the guest's stack pointer: the guest is inside the call, which
uses no stack of its own there.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, replace

import wasmtime

from ..files.layer_opens import LAYER_FILES, STAGING, LayerOpens, LayerRefusal, wasi_errno
from .host_paths import HostPath, HostPaths
from .scratch_journal import ScratchJournal

OFLAG_CREAT, OFLAG_DIRECTORY, OFLAG_EXCL, OFLAG_TRUNC = 1, 2, 4, 8
FIRST_PREOPEN = 3
MAX_PATH = 4096  # bytes of a path a call names (longer: left to the real call, which refuses it)
MAX_KEPT_PATH = 1024  # bytes of a path kept for an image (longer: the file cannot come back)
REDIRECT_ROOM = 4096  # guest stack bytes below its pointer that a redirected path may use

Redirect = tuple[int, int, int] | int  # the call's (folder, path, length), or an errno to return


@dataclass(frozen=True)
class OpenFile:
    """What the host knows of a descriptor the guest opened: enough to open it again."""

    in_scratch: bool
    writable: bool
    path: str | None  # the guest path; None: opened where the host cannot name it
    oflags: int
    rights: int
    inheriting: int
    fdflags: int
    lookup: int


class GuestPaths:
    """Guest paths of descriptors and calls, and the layer's redirects (see the module)."""

    folders: list[str]  # guest paths of the pre-opened folders, in order
    protected: int
    scratch: int
    open: dict[int, OpenFile]
    _memory: wasmtime.Memory | None
    _layer: LayerOpens | None
    _stack_pointer: str
    paths: HostPaths
    journal: ScratchJournal

    def folder_path(self, fd: int) -> str | None:
        """The guest path of folder descriptor ``fd``, if the host knows it."""
        if FIRST_PREOPEN <= fd < self.protected:
            return self.folders[fd - FIRST_PREOPEN]
        held = self.open.get(fd)
        return held.path if held is not None else None

    def _opened_path(self, caller: wasmtime.Caller, fd: int, path: int, length: int) -> str | None:
        """The guest path a call names (None: too long, or from a folder the host cannot
        name)."""
        folder = self.folder_path(fd)
        if folder is None or not 0 < length <= MAX_KEPT_PATH:
            return None
        assert self._memory is not None  # bound before the guest runs
        at = path & 0xFFFFFFFF
        name = bytes(self._memory.read(caller, at, at + length)).decode("utf-8", "surrogateescape")
        joined = posixpath.normpath(posixpath.join(folder, name))
        return joined if len(joined) <= MAX_KEPT_PATH and "\0" not in joined else None

    def _renamed(self, before: str, after: str | None) -> None:
        """Files held open keep up with their names (None: a name the host cannot tell)."""
        for number, held in list(self.open.items()):
            path = held.path
            if path is not None and (path == before or path.startswith(before + "/")):
                moved = None if after is None else after + path[len(before) :]
                self.open[number] = replace(held, path=moved)

    def _scratch_host(self, guest_path: str) -> HostPath | None:
        """The host path of ``guest_path``, a path in /tmp."""
        relative = posixpath.relpath(guest_path, self.folders[self.scratch - FIRST_PREOPEN])
        return self.paths.resolve(self.scratch, relative.encode("utf-8", "surrogateescape"))

    def _call_name(self, caller: wasmtime.Caller, path: int, length: int) -> bytes | None:
        """The path a call names, as it names it (relative to its folder), or None if it is
        too long to be one (the real call says so)."""
        if not 0 < length <= MAX_PATH:
            return None
        assert self._memory is not None  # bound before the guest runs
        at = path & 0xFFFFFFFF
        return bytes(self._memory.read(caller, at, at + length))

    def _layered(self, fd: int) -> LayerOpens | None:
        """The layer, if paths from folder ``fd`` may lead into a layered folder."""
        folder = self.folder_path(fd)
        layer = self._layer
        if layer is None or folder is None or layer.folder_of(folder + "/") is None:
            return None
        return layer

    def _redirect(
        self,
        caller: wasmtime.Caller,
        fd: int,
        path: int,
        length: int,
        target: Callable[[LayerOpens, str], str | None],
    ) -> Redirect:
        """The call's arguments, redirected where ``target`` (a LayerOpens method) says."""
        layer = self._layered(fd)
        if layer is None:
            return fd, path, length
        guest_path = self._opened_path(caller, fd, path, length) or ""
        if layer.folder_of(guest_path) is None:
            return fd, path, length
        self._note_layer(guest_path)
        try:
            upper = target(layer, guest_path)
        except (LayerRefusal, OSError) as refusal:
            return wasi_errno(refusal)
        if upper is None:
            return fd, path, length
        return self.scratch, *self._written_below_stack(caller, upper)

    def _note_layer(self, guest_path: str) -> None:
        """During a service turn, what the layer may write in /tmp for ``guest_path`` (its
        copy, the folders above it, a copy-up's staging file) is noted before it writes."""
        if not self.journal.active:
            return
        parts = (LAYER_FILES + guest_path).split("/")
        for inner in ["/".join(parts[:end]) for end in range(1, len(parts) + 1)] + [STAGING]:
            host = self.paths.resolve(self.scratch, inner.encode("utf-8", "surrogateescape"))
            if host is not None:
                self.journal.note(host[1])

    def _open_redirect(
        self,
        caller: wasmtime.Caller,
        fd: int,
        path: int,
        length: int,
        oflags: int,
        writable: bool,
    ) -> Redirect:
        """path_open's redirect: a folder to list, or a file to read or write."""
        if oflags & OFLAG_DIRECTORY:
            return self._redirect(caller, fd, path, length, LayerOpens.folder_open_target)
        exclusive = bool(oflags & OFLAG_CREAT and oflags & OFLAG_EXCL)
        truncates = bool(oflags & OFLAG_TRUNC)

        def target(layer: LayerOpens, guest_path: str) -> str | None:
            return layer.open_target(guest_path, writable, truncates, exclusive)

        return self._redirect(caller, fd, path, length, target)

    def _written_below_stack(self, caller: wasmtime.Caller, inner: str) -> tuple[int, int]:
        """``inner`` (a path in /tmp) written below the caller's stack pointer, for the real
        call: (pointer, length)."""
        pointer = caller.get(self._stack_pointer)
        assert isinstance(pointer, wasmtime.Global) and self._memory is not None
        data = inner.encode("utf-8", "surrogateescape")
        at = (pointer.value(caller) & 0xFFFFFFFF) - REDIRECT_ROOM
        self._memory.write(caller, data, at)
        return at, len(data)
