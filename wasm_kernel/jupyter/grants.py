"""What a kernel grants its guest, worked out once from its settings: the runtime, the host
folders and the folder cells start in (or why there are none), and %pip packages.

A problem here never ends the kernel process: a refused runtime name falls back to the
default one (the setting is reported), a bad mount is kept as the error every cell reports.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import platformdirs

from ..files import tenancy
from ..files.mounts import SCRATCH, Mount, MountError, guest_cwd, holds_home, parse_mounts
from ..files.notebook_writes import NEW_FILES, layered_folders
from ..guest.modules import _wasm_kernel_contract as declared
from ..packages.packages import GUEST_FOLDER, INDEX, OFF, Packages
from ..packages.pip_driver import Cancelled, Source
from ..packages.wheel_cache import WheelCache
from ..packages.wheels import PackageError
from ..runtime.runtime import DEFAULT_RUNTIME, Runtime, RuntimeUnavailable, load_runtime
from ..sandbox.interrupts import Interrupts
from ..settings.settings import ENV_PREFIX, config_source

log = logging.getLogger(__name__)


def configured_runtime(settings: Any) -> Runtime:
    """The configured runtime; if there is none by that name, the setting is refused and the
    default one describes the kernel (no sandbox starts)."""
    cache_dir = Path(settings.cache_dir) if settings.cache_dir else None
    try:
        return load_runtime(settings.runtime_name, cache_dir=cache_dir)
    except RuntimeUnavailable as exc:
        if settings.runtime_name == DEFAULT_RUNTIME:
            raise
        source = config_source(settings.parent, "runtime_name")
        settings.refuse_setting("runtime_name", settings.runtime_name, source, str(exc))
        return load_runtime(DEFAULT_RUNTIME, cache_dir=cache_dir)


class Grants:
    """The guest's folders and packages. ``packages`` is None when the settings are invalid
    (no sandbox starts then)."""

    def __init__(
        self,
        settings: Any,
        runtime: Runtime,
        configured: set[str],
        valid: bool,
        tenant: str | None = None,
    ):
        self.runtime = runtime
        self.tenant = tenant  # behind a gateway, the tenant the kernel works for
        self.withheld = ""  # why the profile's folder is not mounted
        self.granted: list[Mount] = []
        self.start_dir = SCRATCH
        self.mount_error: MountError | None = None
        self.layered: tuple[str, ...] = ()  # read-only folders whose writes go to a layer
        self.writes_through = settings.notebook_writes == NEW_FILES  # new files reach the host
        here = Path.cwd()
        explicit = "mounts" in configured or ENV_PREFIX + "MOUNTS" in os.environ
        if not explicit:  # the profile's mounts are of the notebook's folder
            here, self.withheld = self._notebook_folder(settings, here)
        try:
            specs = [] if self.withheld else settings.mounts
            reserved = (runtime.lib_guest_dir, GUEST_FOLDER)
            self.granted = parse_mounts(specs, here, reserved=reserved)
            self.start_dir = guest_cwd(self.granted, here, settings.working_dir)
            self.layered = layered_folders(settings.notebook_writes, self.granted, here)
        except MountError as exc:
            self.mount_error = exc  # reported by every cell; the kernel itself stays up
        self.packages = self._package_set(settings) if valid else None

    @staticmethod
    def _notebook_folder(settings: Any, here: Path) -> tuple[Path, str]:
        """The folder the profile's mounts are taken from, and why it is not mounted, or "".
        Under a gateway it is the one the gateway names, never the gateway's own; a notebook
        in the home folder would expose keys and tokens. (Mounts set explicitly, in config,
        argv or env, are the operator's.)"""
        if not settings.mounts:
            return here, ""
        folder, refusal = tenancy.notebook_folder(here)
        if folder is None:
            return here, f"{refusal}. Mount one with --WasmKernel.mounts."
        if holds_home(folder):
            return folder, (
                f"the notebook's folder {folder} is (or holds) the home folder, with its keys"
                " and settings, so it is not mounted. Keep notebooks and their data in a"
                " project folder, or mount one with --WasmKernel.mounts."
            )
        return folder, ""

    def _package_set(self, settings: Any) -> Packages:
        source = None
        if settings.packages != OFF:
            source = Source(None if settings.packages == INDEX else Path(settings.packages))
        cache = Path(platformdirs.user_cache_dir("wasm-kernel"))
        own = cache / tenancy.TENANTS / "refused"
        running = None  # a tenant's kernels' package folders: theirs, counted apart
        try:  # per user, and per tenant behind a gateway
            own = tenancy.keyed(cache, self.tenant)
            if self.tenant is not None:
                running = own / "packages"
                running.mkdir(mode=0o700, exist_ok=True)
        except tenancy.ForeignFolder as exc:  # refused (no cell runs) rather than shared
            settings.refuse_setting("packages", settings.packages, "the tenant's folder", str(exc))
            running = None
        except OSError as exc:  # a read-only cache: no quota of the tenant's to count in
            log.warning("%%pip is off: the tenant's package folder cannot be made (%s)", exc)
            source, running = None, None
        runtime = self.runtime
        return Packages(
            source,
            settings.packages_quota,
            settings.packages_user_quota,
            runtime.stdlib.path,
            runtime.stdlib_guest_path,
            WheelCache(own / "wheels"),
            runtime.python_version,
            running,
        )

    def pip(self, message: dict, interrupts: Interrupts) -> dict:
        """A %pip command from the guest, run while its cell waits (the cell's time limit is
        paused, see the contract's PIP); an interrupt kills pip and the cell gets
        KeyboardInterrupt."""
        if self.packages is None:
            return {"error": "packages are not available: the kernel has invalid settings"}

        def cancelled(seconds: float) -> bool:
            interrupts.wait(seconds)
            return interrupts.take()

        try:
            text = self.packages.run(
                message["command"], message["args"], message["upgrade"], cancelled
            )
        except Cancelled:
            return {"error": declared.INTERRUPTED}
        except PackageError as exc:
            return {"error": str(exc)}
        except OSError as exc:
            log.exception("%pip failed")
            return {"error": f"the host could not complete this: {exc.strerror or exc}"}
        return {"text": text}

    def host_folders_in_guest(self) -> tuple[str, ...] | None:
        """Where the guest sees the host folders it was granted, for the hint on a path only
        the host has; None where the mounts could not be made (cells say why instead)."""
        if self.mount_error is not None:
            return None
        return tuple(mount.guest for mount in self.granted)

    def own_folders(self) -> tuple[str, ...]:
        """The guest's folders that are not host folders: scratch, runtime, packages."""
        return (SCRATCH, self.runtime.lib_guest_dir, GUEST_FOLDER)

    def describe_folders(self) -> str:
        if self.mount_error is not None or self.withheld:
            return f"  none: {self.mount_error or self.withheld}"
        return "\n".join(f"  {mount}" for mount in self.granted) or "  none"
