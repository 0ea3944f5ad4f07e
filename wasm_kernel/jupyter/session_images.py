"""A session's images on the kernel's side: ``%snapshot`` and hibernation.

The guest asks (``%snapshot save NAME`` ...); the kernel answers list, delete and forget at
once and notes save and restore on the cell, to be done between turns on the guest thread. At
shutdown, a session may hibernate: its image is saved under the notebook's name, within the
bounds ``hibernation`` keeps, to be resumed by the next kernel started for it (see ``boot``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ..files.mounts import SCRATCH, Mount
from ..images import image_folder, images
from ..images.image_fields import HostState
from ..images.image_folder import ImageFolder
from ..memory.live_memory import LiveMemory
from ..packages.packages import Packages
from ..packages.pip_driver import Cancelled
from ..packages.wheels import PackageError
from ..sandbox.limits import Limits
from .hibernation import Hibernation
from .history import History

if TYPE_CHECKING:
    from ..sandbox.sandbox import Sandbox
    from .cell_messages import CellMessages

log = logging.getLogger(__name__)
IMAGE_PACKAGES_SECONDS = 120  # longest a resume or restore spends installing its %pip packages
SNAPSHOT_ACTIONS = ("save", "restore", "fork", "list", "delete", "forget")
LIVE_FORKS = 16  # fork images whose memory this kernel keeps (the oldest is let go past it)


class SessionImages:
    """Saving, restoring and hibernating one kernel's session."""

    def __init__(
        self,
        folder: ImageFolder,
        runtime_sha256: str,
        limits: Limits,
        packages: Packages | None,
        history: History,
        granted: list[Mount],
        snapshots: bool,
        hibernation: Hibernation,
        fork_memory_limit: int = 0,
    ):
        self.folder = folder
        self.needs = images.identity(runtime_sha256)
        self.limits = limits
        self.packages = packages
        self.history = history
        self.granted = granted
        self.snapshots = snapshots
        self.hibernation = hibernation
        self.boot_file: Path | None = None  # the boot memory file a fork's image may map
        self.boot_digest = ""  # its sha256, which an image that builds on it names
        self._live: dict[str, list[int]] = {}  # fork image name -> its frozen memory, open
        self.fork_memory_limit = fork_memory_limit  # bytes those may hold together; 0: none

    def read(self, path: Path, memory_file: Path | None = None) -> images.Image:
        return images.read_image(
            path,
            needs=self.needs,
            memory_limit=self.limits.memory_limit,
            scratch_limit=self.limits.scratch_limit,
            memory_file=memory_file,
            boot_file=self.boot_file,
            guest_folders=self._guest_folders(),
            boot_digest=self.boot_digest,
        )

    def _guest_folders(self) -> list[Path]:
        """The host folders this kernel's guest reaches (an image there is copied in, not
        mapped: the guest could truncate it under the mapping)."""
        folders = [mount.host for mount in self.granted]
        if self.packages is not None and self.packages.source is not None:
            folders.append(self.packages.mount.host)
        return folders

    def snapshot_message(self, cell: CellMessages, action: str, name: str) -> dict:
        """``%snapshot`` from the guest, during its turn: list, delete and forget at once;
        save and restore are noted on the cell and done when its turn has ended."""
        try:
            if action == "forget":  # this notebook's own hibernation, snapshots or not
                return {"text": self.hibernation.forget()}
            if not self.snapshots:
                raise images.ImageError(
                    "%snapshot is off in this kernel (--WasmKernel.snapshots, off in the"
                    " strict profile)"
                )
            if action not in SNAPSHOT_ACTIONS:
                raise images.ImageError(
                    "usage: %snapshot save NAME | restore NAME | fork NAME | list | delete NAME"
                    " | forget"
                )
            if action == "list":
                return {"text": self.folder.describe()}
            if name.startswith(ImageFolder.HIBERNATED):
                raise images.ImageError(
                    "hibernated sessions belong to their own notebooks; they cannot be saved,"
                    " restored or deleted from a cell"
                )
            if action == "delete":
                self.folder.delete(name)
                self._let_go(name)
                return {"text": f"Deleted snapshot {name!r}."}
            path = self.folder.path(name)
            if action == "restore" and not path.exists():
                raise images.ImageError(f"there is no snapshot named {name!r}")
            cell.snapshot = (action, name)
            return {}
        except images.ImageError as exc:
            return {"error": str(exc)}

    def act(self, sandbox: Sandbox, action: str, name: str, execution_count: int) -> str:
        """Save or restore between turns (on the guest thread); returns what to tell the user."""
        began = time.perf_counter()
        if action in ("save", "fork"):
            fork = action == "fork"
            live: LiveMemory | None = None  # a fork's frozen memory, once written

            def write(out: BinaryIO) -> None:
                nonlocal live
                live = self._write(sandbox, execution_count, out, fork=fork)

            try:
                path = self.folder.store(name, write)
            except BaseException:
                for fd in live.fds if live is not None else ():
                    os.close(fd)
                raise
            self._let_go(name)
            if live is not None:
                self._keep(name, live.fds)
                self._check_fork_memory(name)
                how = "sharing this session's memory: it lasts while this kernel runs"
            else:
                how = "a whole image" if fork else ""
            size = path.stat().st_size
            return (
                f"Saved {'fork image' if fork else 'snapshot'} {name!r}"
                f" ({size / (1 << 20):.1f} MiB, {time.perf_counter() - began:.2f} s"
                f"{'; ' + how if how else ''})."
            )
        image = self.read(self.folder.path(name))
        sandbox.restore_image(image)
        return (
            f"Restored snapshot {name!r} (taken {image.taken or 'at an unknown time'}) in"
            f" {time.perf_counter() - began:.2f} s: the interpreter's state and the private"
            f" {SCRATCH} were replaced in place; what later cells did is gone."
        ) + "".join(f"\n{line}" for line in self.match_packages(image.host.packages))

    def match_packages(self, pins: list[str]) -> list[str]:
        """Give a resumed or restored guest the %pip packages its image names, from this
        kernel's own package source; returns what the user should be told."""
        if self.packages is None or not (pins or self.packages.pins()):
            return []
        deadline = time.monotonic() + IMAGE_PACKAGES_SECONDS  # no cell to interrupt it

        def past_deadline(seconds: float) -> bool:
            time.sleep(seconds)
            return time.monotonic() > deadline

        try:
            return self.packages.match(pins, past_deadline)
        except PackageError as exc:
            return [str(exc)]
        except Cancelled:
            return [
                f"installing the image's packages ({', '.join(pins)}) took longer than"
                f" {IMAGE_PACKAGES_SECONDS} s and was stopped; %pip install them again"
            ]

    def _write(
        self,
        sandbox: Sandbox,
        execution_count: int,
        out: BinaryIO,
        fork: bool = False,
        on_boot_image: bool = False,
    ) -> LiveMemory | None:
        """The session's image into ``out``; returns a fork's frozen memory (see
        ``Sandbox.save_image``)."""
        entries = self.history.range(0, 0, None)
        host = HostState(
            execution_count=execution_count,
            history=[(line, source) for _, line, source in entries],
            packages=self.packages.pins() if self.packages is not None else [],
        )
        mounts = [str(mount) for mount in self.granted]
        return sandbox.save_image(out, host, mounts, fork=fork, on_boot_image=on_boot_image)

    def _keep(self, name: str, fds: list[int]) -> None:
        """Keep a fork image's memory open while the image exists, LIVE_FORKS at most."""
        self._live[name] = fds
        while len(self._live) > LIVE_FORKS:
            self._let_go(next(iter(self._live)))

    def _check_fork_memory(self, name: str) -> None:
        """Refuse (and remove) fork image ``name`` if the fork images now keep more memory
        alive than ``fork_memory_limit``; first let go of the memory of images deleted
        meanwhile by other means than %snapshot delete."""
        for kept in [kept for kept in self._live if not self.folder.path(kept).exists()]:
            self._let_go(kept)
        pinned = self.fork_memory()
        if not self.fork_memory_limit or pinned <= self.fork_memory_limit:
            return
        self.folder.delete(name)
        self._let_go(name)
        raise images.ImageError(
            f"fork {name!r} refused: with it, this session's fork images would keep"
            f" {pinned >> 20} MiB of memory alive, past their limit of"
            f" {self.fork_memory_limit >> 20} MiB (WasmKernel.fork_memory_limit). Delete the"
            " fork images no longer needed (%snapshot delete NAME), or save a whole image"
            " (%snapshot save NAME), which counts against snapshot_quota instead."
        )

    def fork_memory(self) -> int:
        """Bytes of memory the fork images' frozen files hold (each file counted once)."""
        sizes: dict[tuple[int, int], int] = {}
        for fds in self._live.values():
            for fd in fds:
                status = os.fstat(fd)
                sizes[status.st_dev, status.st_ino] = status.st_blocks * 512
        return sum(sizes.values())

    def _let_go(self, name: str) -> None:
        for fd in self._live.pop(name, ()):
            os.close(fd)

    def hibernate(self, sandbox: Sandbox, execution_count: int) -> None:
        """At shutdown: this notebook's session, for the next kernel started for it."""
        name = self.hibernation.at_shutdown()
        if name is None:
            return
        try:
            # short-lived, resumed on this machine: it may build on the boot image
            write = partial(self._write, sandbox, execution_count, on_boot_image=True)
            self.folder.store(name, write, admit=self.hibernation.make_room)
        except images.ImageError as exc:
            log.warning("could not hibernate this session: %s", exc)

    def to_resume(
        self, resume_from: str, wait: float = 0.0, give_up: threading.Event | None = None
    ) -> Path | None:
        """``resume_from`` (a snapshot's name or a path), else this notebook's hibernated image.
        A named image that does not exist yet is waited for up to ``wait`` seconds, or until
        ``give_up`` is set: a fork's, which its parent kernel writes while this one starts
        (see ``Session.fork``)."""
        if resume_from:
            try:
                named = self.folder.path(resume_from)
            except images.ImageError:
                named = None
            given = Path(resume_from).expanduser()
            if named is not None and image_folder.wait_for(
                named, 0 if given.exists() else wait, give_up
            ):
                return named
            return given
        name = self.hibernation.name
        if name is not None and self.folder.path(name).exists():
            return self.folder.path(name)
        return None
