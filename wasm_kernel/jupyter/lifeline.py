"""A served kernel's lifeline to its launcher: a pipe whose closing ends the kernel, and on which
the kernel says once that it has started.

Kept apart from ``kernel_server`` so that the kernel, which tells its launcher, does not import
the server that forks it."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

_lifeline: int | None = None


def tell_started() -> None:
    """In a served kernel: tell the launcher that its clients may connect now (one byte on
    the lifeline, which the launcher otherwise only watches for its end)."""
    global _lifeline
    if _lifeline is not None:
        with contextlib.suppress(OSError):
            os.write(_lifeline, b"\n")
        _lifeline = None


def watch(lifeline: int) -> None:
    """End this kernel when its launcher's end of the lifeline closes (the launcher died),
    through SIGTERM, so that the kernel's folders are removed as on any termination."""

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(lifeline, 1):
                pass
        os.kill(os.getpid(), signal.SIGTERM)

    global _lifeline
    _lifeline = lifeline
    threading.Thread(target=watch, name="lifeline", daemon=True).start()
