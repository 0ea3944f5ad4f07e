"""Starting a kernel's sandbox: from the compiled-runtime cache, and from an image where
there is one (the notebook's hibernated session, ``resume_from``, or the cache's boot image).

Runs on the guest thread while the kernel already answers kernel_info; the kernel awaits it
before the first turn, and tells the user when a one-time compile makes them wait.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from ..images import images
from ..images.image_fields import HostState
from ..images.image_folder import ImageFolder
from ..images.names import NOT_RESUMED
from ..packages.packages import GUEST_FOLDER
from ..runtime.cache import RuntimeCache
from ..sandbox.limits import Limits
from ..sandbox.sandbox import Sandbox
from . import termination
from .grants import Grants
from .session_images import SessionImages

log = logging.getLogger(__name__)
COMPILING = (
    "wasm-kernel: compiling the Python runtime for this machine. This happens once (about"
    " 1-4 minutes); later kernels start in well under a second.\n"
)


class SandboxStart:
    """What one kernel's sandbox starts from, and what became of it (for ``%sandbox`` and the
    first cell): ``started_from``, ``resume_note`` and the resumed image's host state."""

    def __init__(
        self, settings: Any, limits: Limits, grants: Grants, session_images: SessionImages
    ):
        self.settings = settings  # rollback, checkpoint_mode, plain_tracebacks, cache_dir ...
        self.runtime = grants.runtime
        self.limits = limits
        self.granted = grants.granted
        self.start_dir = grants.start_dir
        self.layered = grants.layered
        self.packages = grants.packages
        self.images = session_images
        self.stage = "starting"
        # the boot image, a saved image or a fresh boot; None until the start is done
        self.started_from: str | None = None
        self.resume_note = ""  # why an image could not be resumed, told on the first cell
        self.resumed: HostState | None = None  # host state to apply before cell 1
        self.checkpoint_due = False  # resumed: the image is what a trap in cell 1 returns to
        # A cell waiting for resume_from's image (resume_wait) is interrupted, or runs out of
        # time, as any cell: the image is given up (the kernel starts fresh) and the cell
        # fails with the reason, kept here until it is told.
        self._give_up = threading.Event()
        self._waiting_for_image = False
        self._wait_stopped: tuple[str, str] | None = None

    def checkpoint_resumed(self, started: Future[Sandbox]) -> None:
        """A resumed sandbox's first checkpoint, so that a trap in the first cell rolls back to
        the image (a fresh one has nothing to lose). Run on the guest thread behind the start,
        not in it: kernel_info, which waits for the start, answers meanwhile, and every cell
        queues behind it."""
        if self.checkpoint_due and started.done() and started.exception() is None:
            self.checkpoint_due = False
            started.result().checkpoint()

    def run(self, problems: list[Exception]) -> Sandbox:
        """A booted or resumed sandbox (on the guest thread); a problem in ``problems`` is
        raised instead, for every cell to report while the kernel itself stays up."""
        for problem in problems:
            raise problem
        sandbox = self._boot()
        self.started_from = self.started_from or "a fresh boot"
        if self.packages is not None:  # IPython's packages are the guest's too, for %pip
            self.packages.ships_folder(sandbox.packages)
        return sandbox

    def _boot(self) -> Sandbox:
        settings = self.settings
        cache = RuntimeCache(Path(settings.cache_dir) if settings.cache_dir else None)

        @contextmanager
        def stage(description: str) -> Iterator[None]:
            self.stage = description
            yield

        compiled = cache.load(self.runtime, progress=stage)
        self.stage = "starting the interpreter"
        mounts, paths = list(self.granted), []
        if self.packages is not None and self.packages.source is not None:
            mounts.append(self.packages.mount)
            paths.append(GUEST_FOLDER)
        start = partial(
            Sandbox,
            compiled,
            self.limits,
            rollback=settings.rollback,
            mounts=mounts,
            cwd=self.start_dir,
            layered=self.layered,
            import_paths=paths,
            checkpoint_mode=settings.checkpoint_mode,
            plain_tracebacks=settings.plain_tracebacks,
            network=bool(settings.network_allow),
        )
        hibernated = self.images.hibernation.name
        if hibernated is not None:
            # the notebook's last kernel may be hibernating it now (its server was just stopped)
            self.images.folder.wait_saved(hibernated, termination.END_SECONDS)
        if self.images.snapshots or self.images.hibernation.enabled:
            self.images.folder.sweep()  # staging files of killed kernels' saves
        expired = self.images.hibernation.sweep()
        if expired:
            self.resume_note = f"wasm-kernel: {expired}.\n"
        boot_image = images.boot_image_path(cache.entry_dir(self.runtime))
        if boot_image.exists():
            self.images.boot_file = images.boot_memory_path(boot_image)
            self.images.boot_digest = images.boot_image_digest(boot_image)
        self._waiting_for_image = True
        try:
            source = self.images.to_resume(
                settings.resume_from, settings.resume_wait, self._give_up
            )
        finally:
            self._waiting_for_image = False
        if source is None:
            return self._from_boot_image(cache.entry_dir(self.runtime), start)
        try:
            image = self.images.read(source)
            sandbox = start(image=image)
        except images.ImageError as exc:
            why = f"{NOT_RESUMED} {source}: {exc}"
            self.resume_note = f"wasm-kernel: {why}. Started a fresh interpreter instead.\n"
            self.started_from = f"a fresh boot ({why})"
            return start()
        self.started_from = f"image {source.name}"
        if source.name.startswith(ImageFolder.HIBERNATED):
            source.unlink(missing_ok=True)  # used up: a restart afterwards starts afresh
            taken = image.taken or "an unknown time"
            self.started_from = f"this notebook's hibernated session, saved {taken}"
            self.resume_note = (
                "wasm-kernel: resumed this notebook's session as it was when its kernel shut"
                f" down ({taken}). Restart the kernel for a fresh interpreter; `%snapshot"
                " forget` keeps the session from being saved when the notebook is closed.\n"
            )
        self.resumed = image.host
        self.resume_note += "".join(
            f"wasm-kernel: {line}\n" for line in self.images.match_packages(image.host.packages)
        )
        self.checkpoint_due = True
        return sandbox

    def _from_boot_image(self, entry: Path, start: Callable[..., Sandbox]) -> Sandbox:
        """A fresh guest from the cache's boot image (built by install/precompile), where
        there is one for this guest code; else booted the ordinary way."""
        path = images.boot_image_path(entry)
        if not path.exists() or self.settings.plain_tracebacks:  # the image's shell colours them
            return start()
        try:
            image = self.images.read(path, memory_file=images.boot_memory_path(path))
            image.host.cwd = self.start_dir  # a boot image has no folder of its own
            sandbox = start(image=image)
            self.started_from = "the boot image"
            return sandbox
        except images.ImageError as exc:
            log.warning("booting without the boot image %s: %s", path, exc)
            return start()

    def interrupt(self) -> None:
        """A Jupyter interrupt before the sandbox stands: it ends a wait for an image."""
        self._stop_image_wait(
            "KeyboardInterrupt",
            f"interrupted while waiting for the image {self.settings.resume_from!r} to resume"
            " from (WasmKernel.resume_wait); the kernel starts a fresh interpreter instead.",
        )

    def abandon(self) -> None:
        """The kernel is ending: stop waiting for an image (the guest thread would hold the
        process up to resume_wait seconds after the kernel's end)."""
        self._give_up.set()

    def _stop_image_wait(self, ename: str, evalue: str) -> None:
        if self._waiting_for_image and not self._give_up.is_set():
            self._wait_stopped = (ename, evalue)
            self._give_up.set()

    async def wait(self, boot: Future[Sandbox], notify: Callable[[str], Any]) -> Sandbox:
        """The booted sandbox; while a one-time compile runs, say so through ``notify``.
        Raises ``WaitStopped`` for the cell whose wait for an image was cut short."""
        await self.settle(boot, notify)
        sandbox = boot.result()  # done: what the start returned, or raises what it raised
        stopped, self._wait_stopped = self._wait_stopped, None
        if stopped is not None:
            raise WaitStopped(*stopped)
        return sandbox

    async def settle(self, boot: Future[Sandbox], notify: Callable[[str], Any]) -> None:
        """Until the start is over (whether it failed or not), giving up a wait for an image
        once the cell's time limit has passed. A start that is over costs nothing: no future
        to chain across threads (a wake-up of the event loop), for every cell."""
        if boot.done():
            return
        booted = asyncio.wrap_future(boot)
        told = False
        began = time.monotonic()
        limit = self.limits.time_limit
        while not boot.done():
            if not told and "compil" in self.stage:
                notify(COMPILING)
                told = True
            if limit and time.monotonic() - began > limit:
                self._stop_image_wait(
                    "TimeLimitExceeded",
                    f"the cell waited its time limit of {limit:g} s for the image"
                    f" {self.settings.resume_from!r} to resume from (WasmKernel.resume_wait);"
                    " the kernel starts a fresh interpreter instead.",
                )
            await asyncio.wait([booted], timeout=0.2)


class WaitStopped(Exception):
    """A cell's wait for the sandbox was cut short: ``ename`` and ``evalue`` say why."""

    def __init__(self, ename: str, evalue: str):
        super().__init__(evalue)
        self.ename = ename
