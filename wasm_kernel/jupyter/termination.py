"""A kernel told to end from outside ends as a closed notebook does: its session hibernates.

Jupyter Server shuts its kernels down (a shutdown_request: they hibernate) only when it is
stopped by SIGTERM. Stopped by SIGINT with no terminal (as JupyterHub's LocalProcessSpawner
stops it), or killed, it exits and leaves its kernels to notice: a served kernel by its
lifeline closing (``lifeline.watch``), a launched one by its parent going away (``watch_parent``,
instead of ipykernel's poller, which ends the process at once); both then send the kernel
SIGTERM, as do systemd, Docker and jupyter_client's own escalation. On SIGTERM the kernel
hibernates and ends, within HIBERNATE_SECONDS and so within any spawner's grace period; if its
event loop cannot do that by END_SECONDS, the kernel's folders are removed and it exits.
A SIGTERM that comes while the kernel is already closing (jupyter_client sends one 2.5 s into
a shutdown) lets the closing finish.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from ..files import kernel_folders

HIBERNATE_SECONDS = 4.0  # a shutdown_request's hibernation: jupyter_client kills at 5 s
END_SECONDS = HIBERNATE_SECONDS + 2.0  # from SIGTERM to the process's end at the latest
PARENT_POLL = 1.0  # seconds between looks at the launcher, as ipykernel's poller
TERMINATED = 128 + signal.SIGTERM

log = logging.getLogger(__name__)


def hibernate_on_sigterm(end: Callable[[], bool]) -> None:
    """On the main thread: SIGTERM calls ``end`` (which starts the kernel's hibernating close
    on its loop and says whether it could, False when it is closing already); a deadline
    thread makes sure the process is gone END_SECONDS later all the same."""
    ending = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        if ending.is_set():
            return
        ending.set()
        if end():
            log.warning("SIGTERM: this notebook's session hibernates, then the kernel ends")
        threading.Thread(target=_deadline, name="termination", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)


def _deadline() -> None:
    time.sleep(END_SECONDS)
    log.warning("the kernel did not end %g s after SIGTERM: ending it now", END_SECONDS)
    end_now()


def end_now() -> None:
    """End the process at once, its folders (the guest's files) removed."""
    kernel_folders.remove_all()
    os._exit(TERMINATED)


def watch_parent(parent: int) -> None:
    """SIGTERM this kernel once its launcher is gone: its parent process changes from the
    one it had at the start (``parent`` is Jupyter's JPY_PARENT_PID, only a sign that a
    launcher wants watching: a wrapper may sit between them)."""
    first = os.getppid()
    if first == 1 or parent <= 1:
        return  # started by init, or nobody to watch

    def watch() -> None:
        while os.getppid() == first:
            time.sleep(PARENT_POLL)
        log.warning("the kernel's launcher (pid %d) is gone", first)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class Ending:
    """The kernel's ways to end its process (mixed into WasmKernel, which closes itself)."""

    _closed: bool  # closed: the session saved or not, the sandbox gone
    _ending: asyncio.Future | None  # the process is ending
    io_loop: Any  # the kernel's main loop, once it serves

    async def _close(self, hibernate: bool) -> None:
        raise NotImplementedError

    def _end_process(self, hibernate: bool, delay: float) -> None:
        """exit() or quit() in a cell: as ipykernel does, the process ends just after the
        cell's reply (``delay``); the user ended the session, so it does not hibernate.
        SIGTERM: it ends now, hibernated (``_end_from_outside``)."""
        if self._ending is None:
            self._ending = asyncio.ensure_future(self._end(hibernate, delay))

    def _end_from_outside(self) -> bool:
        """SIGTERM (a stopped server, a gone launcher): end as a closed notebook does, its
        session hibernated; False when the kernel is ending already."""
        if self._closed or self._ending is not None:
            return False
        if getattr(self, "io_loop", None) is None:  # not serving yet: nothing to keep
            end_now()
        # threadsafe even on the loop's own thread: a signal handler must wake its select
        self.io_loop.asyncio_loop.call_soon_threadsafe(self._end_process, True, 0.0)
        return True

    async def _end(self, hibernate: bool, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._close(hibernate=hibernate)
        self.io_loop.add_callback(self.io_loop.stop)
