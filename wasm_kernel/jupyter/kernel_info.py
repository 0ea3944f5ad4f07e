"""What a kernel says of itself: kernel_info (the language, the banner describing the
sandbox) and ``%sandbox``'s description.

A mixin of ``WasmKernel``, which owns the sandbox's start and the settings it describes.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ipykernel._version import kernel_protocol_version
from ipykernel.kernelbase import Kernel

from .describe import describe, summary

if TYPE_CHECKING:
    from ..runtime.runtime import Runtime
    from ..sandbox.limits import Limits
    from ..sandbox.sandbox import Sandbox
    from ..settings.settings import InvalidSettings
    from .audit import AuditLog
    from .boot import SandboxStart
    from .grants import Grants
    from .session_images import SessionImages

BANNER_WAIT = 2.0  # seconds kernel_info waits for the interpreter's start (a compile: minutes)


class KernelInfo(Kernel):
    """kernel_info and the sandbox's description, read from the kernel's parts."""

    runtime: Runtime
    limits: Limits
    grants: Grants
    audit: AuditLog | None
    session_images: SessionImages
    _boot: Future[Sandbox]
    _start: SandboxStart
    _settings_error: InvalidSettings | None
    debugger: bool

    @property
    def kernel_info(self) -> dict[str, Any]:
        """ipykernel's version imports debugpy to offer its debugger: this kernel's is its own
        (``debug_requests``), offered unless the operator turned it off."""
        features = ["kernel subshells"] if self._supports_kernel_subshells else []
        return {
            "protocol_version": kernel_protocol_version,
            "implementation": self.implementation,
            "implementation_version": self.implementation_version,
            "language_info": self.language_info,
            "banner": self.banner,
            "help_links": self.help_links,
            "supported_features": features + (["debugger"] if self.debugger else []),
        }

    @property
    def language_info(self) -> dict[str, Any]:  # type: ignore[override]
        return {
            "name": "python",
            "version": self.runtime.python_version,
            "mimetype": "text/x-python",
            "file_extension": ".py",
            "pygments_lexer": "ipython3",
            "codemirror_mode": {"name": "ipython", "version": 3},
            "nbconvert_exporter": "python",
        }

    async def kernel_info_request(self, stream: Any, ident: Any, parent: dict) -> None:
        """The banner says how the interpreter started: a start from the boot image takes a
        fraction of a second, worth waiting for rather than answering "still starting"."""
        with contextlib.suppress(Exception):  # not started in time, or failed: it says so
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._boot)), BANNER_WAIT)
        await super().kernel_info_request(stream, ident, parent)

    @property
    def banner(self) -> str:  # type: ignore[override]
        """A few lines in users' words; ``%sandbox`` has the rest (``describe_sandbox``)."""
        sandbox = self._running_sandbox()
        hibernation = self.session_images.hibernation
        return summary(
            self,
            self._settings_error,
            self.grants,
            self.limits,
            self._start.started_from,
            sandbox,
            hibernation.describe() if hibernation.enabled and hibernation.session else None,
        )

    def _running_sandbox(self) -> Sandbox | None:
        """The sandbox, once it has started; None while it starts or if it failed to."""
        return self._boot.result() if self._boot.done() and not self._boot.exception() else None

    def describe_sandbox(self, last_cell: bool = True) -> str:
        """The running configuration, for ``%sandbox`` (which also says what the last cell
        cost); or why there is none."""
        sandbox = self._running_sandbox()
        return describe(
            self,
            self._settings_error,
            self.grants,
            self.limits,
            self._start.started_from,
            sandbox,
            self.session_images.hibernation.describe(),
            self.audit.describe() if self.audit is not None else "off",
            sandbox.last_cell if sandbox is not None and last_cell else None,
        )
