"""Hibernated sessions: a notebook's session, saved when its kernel shuts down (not at a
restart) and resumed by the next kernel started for that notebook (``session_images`` saves
and resumes them).

Each closed notebook leaves one, never looked at again if the notebook is not reopened, so
they are bounded: by age (``hibernation_days``: older ones are removed when a kernel starts)
and by a quota of their own (``hibernation_quota``: the least recently saved are removed to
make room for a new one). A user can forget their notebook's (``%snapshot forget``), or every
one (``python -m wasm_kernel snapshot forget``).
"""

from __future__ import annotations

import os
import time

from ..files import tenancy
from ..images.image_folder import Entry, ImageFolder
from ..images.images import ImageError
from ..settings.kernel_settings import NOTEBOOK_ID_ENV, SESSION_ENV

DAY = 86400.0
MAX_KEY = 4096  # characters of a notebook's name or ID: longer is no notebook's


def hibernated(folder: ImageFolder) -> list[Entry]:
    """Every notebook's hibernated session in ``folder``, the least recently saved first."""
    found = [e for e in folder.entries() if e.name.startswith(ImageFolder.HIBERNATED)]
    return sorted(found, key=lambda entry: entry.modified)


def remove(entries: list[Entry]) -> int:
    """Remove these images (one that is gone already, or cannot be removed, is passed
    over); returns the bytes freed."""
    freed = 0
    for entry in entries:
        try:
            entry.path.unlink()
        except OSError:
            continue
        freed += entry.size
    return freed


def notebook_key() -> str:
    """Which notebook this kernel's session belongs to: its file ID where Jupyter Server
    gives one (a rename or move keeps it; a new notebook at an old name gets a new one), else
    its path, as Jupyter Server names it; "" for a kernel of no notebook."""
    file_id = os.environ.get(NOTEBOOK_ID_ENV, "")
    if 0 < len(file_id) <= MAX_KEY:
        return "file-id:" + file_id
    path = os.environ.get(SESSION_ENV, "")
    return path if len(path) <= MAX_KEY else ""


def no_session_reason() -> str:
    """Why no notebook names this kernel's session, as the user can act on it."""
    if not tenancy.under_gateway():
        return f"Jupyter Server names one in {SESSION_ENV}"
    return (
        f"behind a gateway, {SESSION_ENV} reaches the kernel only when the Jupyter server"
        f" forwards it (--GatewayClient.allowed_envs={SESSION_ENV}) and the gateway lets it"
        f" through (EG_CLIENT_ENVS={SESSION_ENV})"
    )


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB"


class Hibernation:
    """One kernel's hibernation: whether it will hibernate, and the bounds it keeps."""

    def __init__(self, folder: ImageFolder, enabled: bool, quota: int, days: float):
        self.folder = folder
        self.enabled = enabled  # the setting (hibernate)
        self.quota = quota  # bytes for all notebooks' hibernated sessions, 0 for no quota
        self.days = days  # how long one is kept, 0 for as long as the folder's quota allows
        self.session = notebook_key()
        self.forgotten = False  # %snapshot forget: this kernel does not hibernate

    @property
    def name(self) -> str | None:
        """This notebook's hibernated image's name, where this kernel hibernates at all."""
        if not (self.enabled and self.session):
            return None
        return self.folder.hibernation_name(self.session)

    def at_shutdown(self) -> str | None:
        """The name to hibernate under at shutdown, unless this kernel is not to."""
        return None if self.forgotten else self.name

    def sweep(self) -> str:
        """At start: remove hibernated sessions older than ``days``; returns what to tell the
        user if this notebook's own was one of them."""
        if not (self.enabled and self.days):
            return ""
        cutoff = time.time() - self.days * DAY
        expired = [entry for entry in hibernated(self.folder) if entry.modified < cutoff]
        remove(expired)
        if any(entry.name == self.name for entry in expired):
            return (
                f"this notebook's hibernated session was older than {self.days:g} days"
                " (--WasmKernel.hibernation_days) and was removed: this is a fresh interpreter"
            )
        return ""

    def make_room(self, size: int) -> None:
        """Before this notebook's image of ``size`` bytes is kept: remove other notebooks'
        hibernated sessions, the least recently saved first, until all fit in the quota."""
        if not self.quota:
            return
        if size > self.quota:
            raise ImageError(
                f"this session's image ({_mib(size)}) is larger than the hibernation quota of"
                f" {_mib(self.quota)} (--WasmKernel.hibernation_quota)"
            )
        others = [entry for entry in hibernated(self.folder) if entry.name != self.name]
        used = sum(entry.size for entry in others)
        evicted = []
        while others and used + size > self.quota:
            evicted.append(others.pop(0))
            used -= evicted[-1].size
        remove(evicted)

    def forget(self) -> str:
        """``%snapshot forget``: this notebook starts fresh next time; returns what to say."""
        if not self.enabled:
            return (
                "This kernel does not hibernate (--WasmKernel.hibernate is off): nothing to forget."
            )
        if self.name is None:
            return (
                f"This kernel does not hibernate: it belongs to no notebook ({SESSION_ENV}, which"
                " Jupyter Server sets, is not set). Nothing to forget."
            )
        self.forgotten = True
        kept = [entry for entry in hibernated(self.folder) if entry.name == self.name]
        note = " Its hibernated session was deleted." if remove(kept) else ""
        return (
            "This notebook's session will not be kept: its kernel will not hibernate when it"
            " shuts down, and the notebook opens with a fresh interpreter next time." + note
        )

    def describe(self) -> str:
        """For the banner and ``%sandbox``: what happens to the session when the notebook is
        closed, where it goes, for how long, and how to prevent it."""
        if not self.enabled:
            return "off"
        if not self.session:
            return f"off (no notebook: {no_session_reason()})"
        if self.forgotten:
            return "off for this kernel (%snapshot forget)"
        bounds = [f"kept {self.days:g} days" if self.days else "kept until reopened"]
        if self.quota:
            bounds.append(f"{_mib(self.quota)} for all notebooks' sessions")
        follows = (
            "the notebook, renamed or moved"
            if self.session.startswith("file-id:")
            else "the notebook's path (this server gives no file ID: a renamed notebook starts"
            " fresh)"
        )
        return (
            "on: shutting this notebook's kernel down (closing the notebook, not restarting the"
            " kernel) saves its session (variables, /tmp, input history) in"
            f" {self.folder.directory}; reopening the notebook resumes it ({', '.join(bounds)};"
            f" it follows {follows}). `%snapshot forget` keeps this one from being saved."
        )
