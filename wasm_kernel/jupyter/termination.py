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
