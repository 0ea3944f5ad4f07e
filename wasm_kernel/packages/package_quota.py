"""The per-user package quota: one lock for a user's kernels, and what their folders take.

A kernel checks a wheel against what the user's other kernels hold, then unpacks it; two
kernels doing that at once would each see room for one package and both take it. So the
measurement, the unpack and the move into place happen under one lock: ``flock`` on a file in
the user's own cache folder (which other users cannot write, so they cannot plant it or
hold it). The kernel releases it when it is done or dies; waiting for it can be interrupted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from ..files import kernel_folders, scratch
from ..files.private_files import private_folder
from .pip_driver import Cancelled
from .wheels import PackageError

LOCK_NAME = ".packages.lock"
WAIT_STEP = 0.1  # seconds between attempts to take the lock, while an interrupt is watched


@contextlib.contextmanager
def user_lock(folder: Path, cancelled: Callable[[float], bool]) -> Iterator[None]:
    """Hold the user's package lock (in ``folder``) for the block; raises Cancelled if the
    user interrupts the wait."""
    private_folder(folder)
    path = folder / LOCK_NAME
    try:
        descriptor = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600
        )
    except OSError as exc:
        raise PackageError(
            f"the lock shared by your kernels' packages ({path}) cannot be opened:"
            f" {exc.strerror}. If it is a link or not a file, remove it."
        ) from None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.getuid():
            raise PackageError(
                f"the lock shared by your kernels' packages ({path}) is not a file of yours;"
                " remove it"
            )
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            if cancelled(WAIT_STEP):
                raise Cancelled()
        yield
    finally:
        os.close(descriptor)  # and with it the lock


def others_held(own: Path) -> int:
    """Disk bytes in the package folders of this user's (or tenant's) other running kernels,
    which are beside ``own`` (allocated blocks, at least an entry's worth per file and
    folder)."""
    held = 0
    for root in kernel_folders.running(kernel_folders.PACKAGES_PREFIX, str(own.parent)):
        if root == own:
            continue
        taken = scratch.usage(root)
        if taken.unmeasured:
            raise PackageError(
                f"the packages of your other kernels could not be measured ({taken.unmeasured}),"
                " so the per-user quota cannot be checked"
            )
        held += taken
    return held
