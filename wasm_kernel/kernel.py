"""The Jupyter side: an ipykernel ``Kernel`` whose cells run in the WebAssembly sandbox.

Messages, history and configuration live here; everything about wasmtime lives in
``sandbox``. The sandbox boots on a worker thread while the kernel already answers
kernel_info, and every guest turn runs on that same single worker, so the event loop stays
free for control messages and SIGINT while a cell runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from copy import deepcopy
from functools import partial
from pathlib import Path
from typing import Any

import platformdirs
import psutil
from ipykernel._version import kernel_protocol_version
from ipykernel.kernelbase import Kernel
from jupyter_client.session import Session
from traitlets import Float, List, TraitError, TraitType, Unicode, default
from traitlets.config import Config
from traitlets.config.loader import DeferredConfig, LazyConfigValue

from . import __version__, images, messages, scratch_folders
from .active_output import ActiveOutput
from .cache import RuntimeCache
from .guest.modules import _wasm_kernel_messages as ops
from .history import History
from .mounts import SCRATCH, Mount, MountError, guest_cwd, holds_home, parse_mounts
from .packages import GUEST_FOLDER, INDEX, OFF, Cancelled, Packages, Source, WheelCache
from .profiles import DEFAULT_PROFILE, PROFILES
from .runtime import DEFAULT_RUNTIME, Runtime, RuntimeUnavailable, load_runtime
from .sandbox import CellStopped, Interrupts, Limits, QuietHost, Sandbox, memory_limit_text
from .settings import (
    INT64_MAX,
    MAX_GRACE,
    MAX_MEMORY,
    MAX_SECONDS,
    MIN_FUEL,
    MIN_MEMORY,
    MIN_OUTPUT,
    MIN_PACKAGES_QUOTA,
    MIN_SCRATCH,
    MIN_SECONDS,
    CheckedBool,
    CheckedEnum,
    InvalidSettings,
    Limit,
    PackageSource,
    Text,
    config_source,
    describe_refusal,
)
from .snapshot import CHECKPOINT_MODES, checkpoint_method
from .wheels import PackageError

ENV_PREFIX = "WASM_KERNEL_"
INPUT_POLL = 0.05  # seconds between checks for an input_reply or an interrupt
BACKLOG_FLOOR = 64 << 20  # bytes of cell output that may wait for slow IOPub clients
COMPLETION_TYPES = "_jupyter_types_experimental"  # ipykernel's key for typed completions
BRIEF_ERROR = 1024  # characters of an error's value shown when the output budget is spent
MISSING_PATH_ERRORS = ("FileNotFoundError", "PermissionError", "NotADirectoryError")
NOTHING_MOUNTED = (
    " (no host folder is mounted in this kernel: it sees only its private /tmp and the Python"
    " runtime. Files come in through the operator: a mount, or a client's upload.)"
)
_QUOTED_PATH = re.compile(r": '(/[^']*)'")
DEFAULT_HISTORY_FILE = str(Path(platformdirs.user_data_dir("wasm-kernel")) / "history.sqlite")
DEFAULT_SNAPSHOT_DIR = str(Path(platformdirs.user_data_dir("wasm-kernel")) / "snapshots")
MIN_SNAPSHOT_QUOTA = 16 << 20  # smaller holds no image at all: a unit slip
SESSION_ENV = "JPY_SESSION_NAME"  # the notebook's path, set by Jupyter Server
HIBERNATE_SECONDS = 60.0  # longest a shutdown waits for a running cell before it hibernates
IMAGE_PACKAGES_SECONDS = 120  # longest a resume or restore spends installing its %pip packages


def _env_default(trait: str, fallback: Any) -> Any:
    """A trait default read from ``WASM_KERNEL_<TRAIT>`` in the environment, else ``fallback``
    (a value, or a function of the kernel such as a profile's setting).

    The variable is checked by the trait itself; a value it refuses is recorded for every
    cell to report, and ``fallback`` stands in for it (so the kernel can describe itself)."""

    def read(kernel: WasmKernel) -> Any:
        value = fallback(kernel) if callable(fallback) else fallback
        variable = ENV_PREFIX + trait.upper()
        raw = os.environ.get(variable)
        if raw is None:
            return value
        given: Any = raw
        if isinstance(value, (list, tuple)):
            given = [item.strip() for item in raw.split(";") if item.strip()]
        try:
            return _validated(kernel.traits()[trait], kernel, given)
        except TraitError as exc:
            kernel._refuse_setting(trait, raw, f"the environment ({variable})", str(exc))
            return value

    return default(trait)(read)


def _validated(trait: TraitType, kernel: WasmKernel, value: Any) -> Any:
    """``value`` as ``trait`` accepts it, else TraitError. Every concrete trait type (Int,
    Unicode, the kernel's own checked traits...) defines ``validate``; TraitType declares only
    ``_validate``, which also lets None through and runs the owner's cross-validation."""
    return trait.validate(kernel, value)  # type: ignore[attr-defined]  # see above


def history_file(profile: str) -> str:
    """Where a profile keeps input history by default: the per-user file, or only memory."""
    return DEFAULT_HISTORY_FILE if PROFILES[profile].keeps_history else ":memory:"


def _from_profile(setting: str) -> Callable[[WasmKernel], Any]:
    return lambda kernel: getattr(PROFILES[kernel.profile], setting)


def _keep_working_folder_off_sys_path() -> None:
    """The working folder is the notebook's, which a writable mount lets the guest fill, so
    the host must not import from it. Our kernelspec runs python with -P; launchers that use
    ipykernel's own application (Enterprise Gateway's) put it on sys.path all the same."""
    here = os.getcwd()
    sys.path[:] = [entry for entry in sys.path if entry not in ("", ".", here)]


def _log_to_process_stderr() -> None:
    """Send this package's log records to the process's own stderr (the kernel log).

    Without a handler they would reach Python's last-resort handler, which writes to
    ``sys.stderr``: ipykernel forwards that to every client as stream output, so host
    diagnostics (quoting guest-controlled bytes) would appear in notebooks.
    """
    package = logging.getLogger("wasm_kernel")
    if not package.handlers:
        handler = logging.StreamHandler(sys.__stderr__)
        handler.setFormatter(logging.Formatter("[wasm-kernel] %(levelname)s | %(message)s"))
        package.addHandler(handler)
        package.propagate = False


class WasmKernel(Kernel):
    implementation = "wasm-kernel"
    implementation_version = __version__
    language = "python"
    help_links = [{"text": "Python", "url": "https://docs.python.org/3/"}]
    # ipykernel sleeps this long before each execute_reply so that output its OutStream holds
    # reaches the clients first; cells' output here never passes through an OutStream (the
    # sandbox publishes it) and the kernel process has none (see WasmKernelApp).
    _execute_sleep = Float(0.0)

    profile = CheckedEnum(
        sorted(PROFILES),
        DEFAULT_PROFILE,
        help="Named defaults for limits and mounts; explicit settings win over them. "
        + "; ".join(f"{name}: {profile.summary}" for name, profile in PROFILES.items())
        + ". Env: WASM_KERNEL_PROFILE.",
    ).tag(config=True)
    mounts = List(
        Unicode(),
        help="Host folders the guest may use, each 'HOST:GUEST[:ro|rw]' (read-only unless"
        " ':rw'), e.g. 'data:/data:ro'. A relative HOST is taken from the kernel's working"
        " folder. Default: the profile's. Env: WASM_KERNEL_MOUNTS, ';'-separated.",
    ).tag(config=True)
    working_dir = Text(
        help="Guest folder cells start in: a mount's guest path or /tmp. Default: the mount of"
        " the kernel's working folder (the notebook's folder), else /tmp."
        " Env: WASM_KERNEL_WORKING_DIR.",
    ).tag(config=True)
    # Limits: each refuses values outside its range (see settings.py for why these bounds).
    fuel = Limit(
        integer=True,
        low=MIN_FUEL,
        high=INT64_MAX,
        unit="units",
        help="Fuel per cell (about one unit per WebAssembly instruction; ~1e10 per second of"
        " pure-Python work). A cell that runs out stops with FuelExhausted. The interpreter's"
        " start-up has its own budget. Env: WASM_KERNEL_FUEL.",
    ).tag(config=True)
    time_limit = Limit(
        integer=False,
        low=MIN_SECONDS,
        high=MAX_SECONDS,
        unit="seconds",
        zero="no limit",
        help="Wall-clock seconds a cell may run, 0 for no limit. Env: WASM_KERNEL_TIME_LIMIT.",
    ).tag(config=True)
    memory_limit = Limit(
        integer=True,
        low=MIN_MEMORY,
        high=MAX_MEMORY,
        unit="bytes",
        help="Bytes of linear memory the guest interpreter may use (about 52 MiB to boot; 78"
        " MiB to start from the boot image, which has numpy and pandas loaded: below that the"
        " kernel boots, a second slower). Env: WASM_KERNEL_MEMORY_LIMIT.",
    ).tag(config=True)
    output_limit = Limit(
        integer=True,
        low=MIN_OUTPUT,
        high=INT64_MAX,
        unit="bytes",
        help="Bytes of output (streams and display data) shown per cell; the rest is dropped"
        " with a notice. Env: WASM_KERNEL_OUTPUT_LIMIT.",
    ).tag(config=True)
    scratch_limit = Limit(
        integer=True,
        low=MIN_SCRATCH,
        high=INT64_MAX,
        unit="bytes",
        zero="no limit",
        help="Bytes a cell may fill the private /tmp with (on the host's disk; each file counts"
        " at least 4 KiB), 0 for no limit. A cell that grows it past the limit is stopped."
        " Env: WASM_KERNEL_SCRATCH_LIMIT.",
    ).tag(config=True)
    interrupt_grace = Limit(
        integer=False,
        low=0.0,
        high=MAX_GRACE,
        unit="seconds",
        default_text="1.0",
        help="Seconds an interrupted cell gets to stop by itself (KeyboardInterrupt) before it"
        " is stopped hard; 0 stops it hard at once. Env: WASM_KERNEL_INTERRUPT_GRACE.",
    ).tag(config=True)
    rollback = CheckedBool(
        True,
        help="Checkpoint the interpreter after each cell and roll back to it when a cell traps"
        " (fuel, time, memory, stack, hard interrupt). Costs, per cell, the pages the cell"
        " wrote (or, with copy checkpoints, a copy of guest memory and as much host memory"
        " again; see checkpoint_mode); off: a trap restarts the interpreter."
        " Env: WASM_KERNEL_ROLLBACK.",
    ).tag(config=True)
    checkpoint_mode = CheckedEnum(
        list(CHECKPOINT_MODES),
        "auto",
        help="How rollback checkpoints are kept: 'auto' copy-on-write where the OS allows"
        " (Linux on x86_64 or aarch64: a memfd, written pages found with PAGEMAP_SCAN or in"
        " /proc/self/pagemap; a checkpoint costs the pages the cell wrote), else a copy of"
        " guest memory; 'copy' always copies. %sandbox shows which is active."
        " Env: WASM_KERNEL_CHECKPOINT_MODE.",
    ).tag(config=True)
    active_output = CheckedEnum(
        ["block", "allow"],
        help="Output that runs code in the front end (JavaScript, scripts and event handlers in"
        " HTML and SVG, widget and other script-bearing mime types): 'block' drops or sanitizes"
        " it, with a notice; 'allow' passes it on, so a cell can act in the user's browser with"
        " the server's credentials. Default: the profile's. Env: WASM_KERNEL_ACTIVE_OUTPUT.",
    ).tag(config=True)
    packages = PackageSource(
        help="Where %pip install takes packages from: 'index' (the package index the host's pip"
        " is configured for), 'off', or the path of a folder of wheels (a wheelhouse). Only"
        " pure-Python wheels are taken, never built; the runtime's own packages cannot be"
        " replaced. Default: the profile's. Env: WASM_KERNEL_PACKAGES.",
    ).tag(config=True)
    packages_quota = Limit(
        integer=True,
        low=MIN_PACKAGES_QUOTA,
        high=INT64_MAX,
        unit="bytes",
        help="Bytes of unpacked packages one kernel may install with %pip."
        " Env: WASM_KERNEL_PACKAGES_QUOTA.",
    ).tag(config=True)
    packages_user_quota = Limit(
        integer=True,
        low=MIN_PACKAGES_QUOTA,
        high=INT64_MAX,
        unit="bytes",
        default_text="4 GiB",
        help="Bytes of %pip packages one user may hold on the host: the unpacked packages of"
        " all their running kernels together, plus the per-user cache of downloaded wheels"
        " (trimmed, least recently used first, to what the kernels leave)."
        " Env: WASM_KERNEL_PACKAGES_USER_QUOTA.",
    ).tag(config=True)
    plain_tracebacks = CheckedBool(
        False,
        help="Tracebacks without colours (ANSI escapes), for programmatic clients that read"
        " them as text. Env: WASM_KERNEL_PLAIN_TRACEBACKS.",
    ).tag(config=True)
    runtime_name = Text(DEFAULT_RUNTIME, help="Runtime manifest to load.").tag(config=True)
    cache_dir = Text(
        help="Folder of compiled runtimes. Env: WASM_KERNEL_CACHE_DIR; default: the per-user"
        " cache folder."
    ).tag(config=True)
    history_file = Text(
        help="SQLite file of input history (':memory:' to keep none on disk). Default: the"
        " per-user file, or ':memory:' for the strict profile. Env: WASM_KERNEL_HISTORY_FILE."
    ).tag(config=True)
    snapshot_dir = Text(
        help="Folder of saved interpreter images (%snapshot, hibernation)."
        " Env: WASM_KERNEL_SNAPSHOT_DIR; default: the per-user data folder.",
    ).tag(config=True)
    snapshot_quota = Limit(
        integer=True,
        low=MIN_SNAPSHOT_QUOTA,
        high=INT64_MAX,
        unit="bytes",
        zero="no quota",
        default_text="2 GiB",
        help="Bytes all images in snapshot_dir may take together; a save past it is refused."
        " Env: WASM_KERNEL_SNAPSHOT_QUOTA.",
    ).tag(config=True)
    resume_from = Text(
        help="Start from a saved image instead of a fresh interpreter: a snapshot name (see"
        " %snapshot list) or an image file's path. The kernel's own mounts and limits apply."
        " Env: WASM_KERNEL_RESUME_FROM.",
    ).tag(config=True)
    snapshots = CheckedBool(
        help="Let cells save, restore, list and delete images with %snapshot. Images are the"
        " user's, shared by their notebooks (restoring one brings its variables into this"
        " session), so the strict profile, for untrusted code, has it off. Default: the"
        " profile's. Env: WASM_KERNEL_SNAPSHOTS.",
    ).tag(config=True)
    hibernate = CheckedBool(
        help="At shutdown (not restart) save the session's image, keyed by the notebook"
        f" ({SESSION_ENV}, set by Jupyter Server), and resume it in the next kernel started for"
        " that notebook. Default: the profile's. Env: WASM_KERNEL_HIBERNATE.",
    ).tag(config=True)

    _profile_default = _env_default("profile", DEFAULT_PROFILE)
    _mounts_default = _env_default("mounts", _from_profile("mounts"))
    _working_dir_default = _env_default("working_dir", "")
    _fuel_default = _env_default("fuel", _from_profile("fuel"))
    _time_limit_default = _env_default("time_limit", _from_profile("time_limit"))
    _memory_limit_default = _env_default("memory_limit", _from_profile("memory_limit"))
    _output_limit_default = _env_default("output_limit", _from_profile("output_limit"))
    _scratch_limit_default = _env_default("scratch_limit", _from_profile("scratch_limit"))
    _interrupt_grace_default = _env_default("interrupt_grace", 1.0)
    _rollback_default = _env_default("rollback", True)
    _checkpoint_mode_default = _env_default("checkpoint_mode", "auto")
    _active_output_default = _env_default("active_output", _from_profile("active_output"))
    _packages_default = _env_default("packages", _from_profile("packages"))
    _packages_quota_default = _env_default("packages_quota", _from_profile("packages_quota"))
    _packages_user_quota_default = _env_default("packages_user_quota", 4 << 30)
    _history_file_default = _env_default(
        "history_file", lambda kernel: history_file(kernel.profile)
    )
    _snapshot_dir_default = _env_default("snapshot_dir", DEFAULT_SNAPSHOT_DIR)
    _snapshot_quota_default = _env_default("snapshot_quota", 2 << 30)
    _resume_from_default = _env_default("resume_from", "")
    _hibernate_default = _env_default("hibernate", _from_profile("hibernate"))
    _snapshots_default = _env_default("snapshots", _from_profile("snapshots"))
    _plain_tracebacks_default = _env_default("plain_tracebacks", False)

    def __init__(self, **kwargs: Any):
        self._ending: asyncio.Future | None = None  # exit() in a cell: the kernel's end
        self._closed = False
        self._refused: list[str] = []  # settings refused at start, reported by every cell
        parent = kwargs.get("parent")
        config = kwargs.get("config") or getattr(parent, "config", None)
        if config is not None:
            kwargs["config"] = self._screened(config, parent)
        super().__init__(**kwargs)
        self.live_session.pack = messages.pack  # guest text may hold what UTF-8 cannot
        self.guest_output = messages.GuestPublisher(
            self.live_session, self.iopub_thread, max(BACKLOG_FLOOR, 2 * self.output_limit)
        )
        _keep_working_folder_off_sys_path()
        _log_to_process_stderr()
        if threading.current_thread() is threading.main_thread():
            scratch_folders.remove_on_sigterm()  # SIGTERM would leave the guest's files
        settings = self.class_own_traits(config=True)
        self._configured = {name for name in settings if self.trait_has_value(name)}
        for name in settings:
            getattr(self, name)  # reads, and so checks, every WASM_KERNEL_* variable now
        self.runtime = self._load_runtime()
        self._settings_error = InvalidSettings(self._refused) if self._refused else None
        self.limits = Limits(
            fuel=self.fuel,
            seconds=self.time_limit,
            memory=self.memory_limit,
            output=self.output_limit,
            interrupt_grace=self.interrupt_grace,
            scratch=self.scratch_limit,
        )
        self.history = History(self.history_file)
        self.granted: list[Mount] = []
        self.start_dir = SCRATCH
        self._mount_error: MountError | None = None
        here = Path.cwd()
        self.withheld = self._withheld_folder(here)
        self._withheld_told = False  # said once, on the first cell's stderr
        try:
            specs = [] if self.withheld else self.mounts
            reserved = (self.runtime.lib_guest_dir, GUEST_FOLDER)
            self.granted = parse_mounts(specs, here, reserved=reserved)
            self.start_dir = guest_cwd(self.granted, here, self.working_dir)
        except MountError as exc:
            self._mount_error = exc  # reported by every cell; the kernel itself stays up
        self.package_set = self._package_set()
        self.image_folder = images.ImageFolder(
            Path(self.snapshot_dir).expanduser(), self.snapshot_quota
        )
        self._resumed: images.HostState | None = None  # host state to apply before cell 1
        self._resume_note = ""  # why an image could not be resumed, told on the first cell
        self._started_from = "a fresh boot"  # or the boot image, or a saved image
        self._interrupt_relay = InterruptRelay(self._interrupt_sandbox)
        self._worker = GuestThread()
        self._boot_stage = "starting"
        self._boot: Future[Sandbox] = self._worker.submit(self._start_sandbox)

    def _screened(self, config: Config, app: Any) -> Config:
        """``config`` less the WasmKernel values their traits refuse, each recorded instead:
        traitlets would raise on loading one, and the kernel process would end."""
        if "WasmKernel" not in config:
            return config
        screened = deepcopy(config)
        section = screened["WasmKernel"]
        traits = self.traits(config=True)
        for name, value in list(section.items()):
            trait = traits.get(name)
            if trait is None or isinstance(value, LazyConfigValue):
                continue
            given = value.get_value(trait) if isinstance(value, DeferredConfig) else value
            try:
                _validated(trait, self, given)
            except TraitError as exc:
                del section[name]
                self._refuse_setting(name, given, config_source(app, name), str(exc))
        return screened

    def _refuse_setting(self, name: str, value: Any, source: str, reason: str) -> None:
        """Record a refused value (the first one per setting: argv and config win over the
        environment, so a refused argv value is what the user meant to set)."""
        if not any(problem.startswith(f"WasmKernel.{name} = ") for problem in self._refused):
            self._refused.append(describe_refusal(name, value, source, reason))

    def _load_runtime(self) -> Runtime:
        """The configured runtime; if there is none by that name, the setting is refused and
        the default one describes the kernel (no sandbox starts)."""
        try:
            return load_runtime(self.runtime_name)
        except RuntimeUnavailable as exc:
            if self.runtime_name == DEFAULT_RUNTIME:
                raise
            source = config_source(self.parent, "runtime_name")
            self._refuse_setting("runtime_name", self.runtime_name, source, str(exc))
            return load_runtime(DEFAULT_RUNTIME)

    def _withheld_folder(self, here: Path) -> str:
        """Why the profile's folder is not mounted, or "". A notebook in the home folder would
        expose keys and tokens; mounts set explicitly (config, argv, env) are the operator's."""
        explicit = "mounts" in self._configured or ENV_PREFIX + "MOUNTS" in os.environ
        if explicit or not self.mounts or not holds_home(here):
            return ""
        return (
            f"the notebook's folder {here} is (or holds) the home folder, with its keys and"
            " settings, so it is not mounted. Keep notebooks and their data in a project"
            " folder, or mount one with --WasmKernel.mounts."
        )

    def _package_set(self) -> Packages | None:
        """This kernel's %pip packages (None with invalid settings: no sandbox starts)."""
        if self._settings_error is not None:
            return None
        source = None
        if self.packages != OFF:
            source = Source(None if self.packages == INDEX else Path(self.packages))
        wheels = Path(platformdirs.user_cache_dir("wasm-kernel")) / "wheels"  # per user
        return Packages(
            source,
            self.packages_quota,
            self.packages_user_quota,
            self.runtime.stdlib.path,
            self.runtime.stdlib_guest_path,
            WheelCache(wheels),
            self.runtime.python_version,
        )

    def run_pip(self, message: dict, interrupts: Interrupts) -> dict:
        """A %pip command from the guest, run while its cell waits (the cell's time limit is
        paused, see Sandbox); an interrupt kills pip and the cell gets KeyboardInterrupt."""
        if self.package_set is None:
            return {"error": "packages are not available: the kernel has invalid settings"}

        def cancelled(seconds: float) -> bool:
            interrupts.wait(seconds)
            return interrupts.take()

        try:
            text = self.package_set.run(
                message["command"], message["args"], message["upgrade"], cancelled
            )
        except Cancelled:
            return {"error": "interrupted"}
        except PackageError as exc:
            return {"error": str(exc)}
        except OSError as exc:
            self.log.exception("%pip failed")
            return {"error": f"the host could not complete this: {exc.strerror or exc}"}
        return {"text": text}

    # -- sandbox start-up ---------------------------------------------------------------------

    def _start_sandbox(self) -> Sandbox:
        sandbox = self._boot_sandbox()
        if self.package_set is not None:  # IPython's packages are the guest's too, for %pip
            self.package_set.ships_folder(sandbox.packages)
        return sandbox

    def _boot_sandbox(self) -> Sandbox:
        """A booted or resumed sandbox, from the compiled-runtime cache."""
        for problem in (self._settings_error, self._mount_error):
            if problem is not None:  # raised in every cell; the kernel itself stays up
                raise problem
        cache = RuntimeCache(Path(self.cache_dir) if self.cache_dir else None)

        @contextmanager
        def stage(description: str):
            self._boot_stage = description
            yield

        compiled = cache.load(self.runtime, progress=stage)
        self._boot_stage = "starting the interpreter"
        mounts, paths = list(self.granted), []
        if self.package_set is not None and self.package_set.source is not None:
            mounts.append(self.package_set.mount)
            paths.append(GUEST_FOLDER)
        start = partial(
            Sandbox,
            compiled,
            self.limits,
            rollback=self.rollback,
            mounts=mounts,
            cwd=self.start_dir,
            import_paths=paths,
            checkpoint_mode=self.checkpoint_mode,
            plain_tracebacks=self.plain_tracebacks,
        )
        source = self._image_to_resume()
        if source is None:
            return self._boot_from_image(cache.entry_dir(self.runtime), start)
        try:
            image = self._read_image(source)
            sandbox = start(image=image)
        except images.ImageError as exc:
            self._resume_note = (
                f"wasm-kernel: could not resume from {source}: {exc}. Started a fresh"
                " interpreter instead.\n"
            )
            return start()
        self._started_from = f"image {source.name}"
        if source.name.startswith(images.ImageFolder.HIBERNATED):
            source.unlink(missing_ok=True)  # used up: a restart afterwards starts afresh
        self._resumed = image.host
        self._resume_note += "".join(
            f"wasm-kernel: {line}\n" for line in self._match_packages(image.host.packages)
        )
        sandbox.checkpoint()  # so that a trap in the first cell rolls back to the image
        return sandbox

    def _boot_from_image(self, entry: Path, start: Callable[..., Sandbox]) -> Sandbox:
        """A fresh guest from the cache's boot image (built by install/precompile), where
        there is one for this guest code; else booted the ordinary way."""
        path = images.boot_image_path(entry)
        if not path.exists() or self.plain_tracebacks:  # the image's shell colours them
            return start()
        try:
            image = self._read_image(path, memory_file=images.boot_memory_path(path))
            image.host.cwd = self.start_dir  # a boot image has no folder of its own
            sandbox = start(image=image)
            self._started_from = "the boot image"
            return sandbox
        except images.ImageError as exc:
            self.log.warning("booting without the boot image %s: %s", path, exc)
            return start()

    def _image_to_resume(self) -> Path | None:
        """``resume_from`` (a snapshot's name or a path), else this notebook's hibernated image."""
        if self.resume_from:
            try:
                named = self.image_folder.path(self.resume_from)
            except images.ImageError:
                named = None
            if named is not None and named.exists():
                return named
            return Path(self.resume_from).expanduser()
        session = os.environ.get(SESSION_ENV)
        if self.hibernate and session:
            hibernated = self.image_folder.path(self.image_folder.hibernation_name(session))
            if hibernated.exists():
                return hibernated
        return None

    def _read_image(self, path: Path, memory_file: Path | None = None) -> images.Image:
        return images.read_image(
            path,
            needs=images.identity(self.runtime.module.sha256),
            memory_limit=self.limits.memory,
            scratch_limit=self.limits.scratch,
            memory_file=memory_file,
        )

    async def _sandbox(self, notify: Any) -> Sandbox:
        """The booted sandbox; while a one-time compile runs, say so through ``notify``."""
        boot = asyncio.wrap_future(self._boot)
        told = False
        while not self._boot.done():
            if not told and "compil" in self._boot_stage:
                notify(
                    "wasm-kernel: compiling the Python runtime for this machine. This happens"
                    " once (about 1-4 minutes); later kernels start in well under a second.\n"
                )
                told = True
            await asyncio.wait([boot], timeout=0.2)
        return await boot

    @property
    def live_session(self) -> Session:
        """ipykernel's ``session``: declared optional, but the kernel app always gives one."""
        session = self.session
        assert session is not None, "the kernel was started without a Jupyter session"
        return session

    @property
    def kernel_info(self) -> dict[str, Any]:
        """ipykernel's version imports its debugger to offer it whenever debugpy is installed:
        the guest has none, and importing debugpy prints a warning about frozen modules that
        reaches clients as stderr output (``jupyter console`` shows it after the banner)."""
        return {
            "protocol_version": kernel_protocol_version,
            "implementation": self.implementation,
            "implementation_version": self.implementation_version,
            "language_info": self.language_info,
            "banner": self.banner,
            "help_links": self.help_links,
            "supported_features": ["kernel subshells"] if self._supports_kernel_subshells else [],
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

    @property
    def banner(self) -> str:  # type: ignore[override]
        return self.describe_sandbox()

    def describe_sandbox(self) -> str:
        """The running configuration, for the banner and ``%sandbox``; or why there is none."""
        limits = self.limits
        if self._settings_error is not None:
            return (
                f"Python {self.runtime.python_version} in a WebAssembly sandbox"
                f" (wasm-kernel {__version__}): not started.\n{self._settings_error}"
            )
        if self._mount_error is not None or self.withheld:
            folders = f"  none: {self._mount_error or self.withheld}"
        else:
            folders = "\n".join(f"  {mount}" for mount in self.granted) or "  none"
        scratch_size = f"up to {limits.scratch >> 20} MiB" if limits.scratch else "no size limit"
        return (
            f"Python {self.runtime.python_version} in a WebAssembly sandbox"
            f" (wasm-kernel {__version__}, runtime {self.runtime.name})\n"
            f"Profile: {self.profile}\n"
            f"Host folders:\n{folders}\n"
            f"  {SCRATCH}: private scratch, deleted when the kernel stops, {scratch_size}\n"
            f"Starting folder: {self.start_dir}\n"
            f"Interpreter: from {self._started_from}\n"
            f"Per cell: fuel {limits.fuel:,},"
            f" {f'time {limits.seconds:.10g} s' if limits.seconds else 'no time limit'},"
            f" memory {_size(limits.memory)}, output {_size(limits.output)}\n"
            f"Packages: {self.package_set.describe() if self.package_set else 'off'}\n"
            f"Rollback: {self._describe_rollback()}\n"
            "No host environment, network or processes."
        )

    def _describe_rollback(self) -> str:
        """What a trapping cell rolls back to, and how checkpoints are taken (the running
        sandbox's way once it has started: it may have had to fall back to copying)."""
        if not (self.rollback and self.runtime.restorable):
            return "off (a trap restarts the interpreter)"
        if self._boot.done() and self._boot.exception() is None:
            method = self._boot.result().checkpoint_method
            if method is None:
                return "off (a trap restarts the interpreter)"
        else:
            method = checkpoint_method(self.checkpoint_mode)
        return f"to the state after the last cell; checkpoints by {method}"

    # -- execution --------------------------------------------------------------------------------

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: Any = None,
        cell_id: Any = None,
    ) -> dict:
        cell = CellHost(self, silent=silent, allow_stdin=allow_stdin)
        if not isinstance(code, str):
            return cell.fail("TypeError", "the code of an execute_request must be a string")
        try:
            sandbox = await self._sandbox(lambda text: cell.stream("stderr", text))
        except InvalidSettings as exc:
            return cell.fail(exc.ename, str(exc))
        except Exception as exc:
            return cell.fail("SandboxUnavailable", f"the sandbox could not start: {exc}")
        if self.withheld and not self._withheld_told:
            cell.stream("stderr", f"wasm-kernel: {self.withheld}\n")
            self._withheld_told = True
        if self._resume_note:
            cell.stream("stderr", self._resume_note)
            self._resume_note = ""
        if store_history and not silent:
            self.history.store(self.execution_count, code)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                self._worker,
                partial(sandbox.run_cell, store_history=store_history, silent=silent),
                code,
                self.execution_count,
                cell,
            )
        except CellStopped as stop:
            if stop.recovered:  # the cell's changes stand: keep them
                self._worker.defer(sandbox.checkpoint)
            return cell.fail(stop.ename, stop.evalue)
        if any(item["source"] == "ask_exit" and not item["keepkernel"] for item in cell.payload):
            self._end_after_reply()
        if cell.snapshot is not None:  # %snapshot save/restore: now that the turn is over
            try:
                told = await loop.run_in_executor(
                    self._worker, self._act_on_snapshot, sandbox, *cell.snapshot
                )
            except images.ImageError as exc:
                return cell.fail("SnapshotError", str(exc))
            except Exception as exc:  # a bug, not a refusal: the session must still go on
                self.log.exception("the snapshot %s failed", cell.snapshot[0])
                return cell.fail("SnapshotError", f"{type(exc).__name__}: {exc}")
            cell.stream("stdout", told + "\n")
        # Checkpoint once the client has the reply and the kernel is idle (see dispatch_shell),
        # while the user reads the output; the next cell queues behind it.
        self._worker.defer(sandbox.checkpoint)
        if cell.error:
            return cell.reply()
        expressions = {}
        if user_expressions and isinstance(user_expressions, dict):
            expressions = await self._service(
                "evaluate_expressions", {str(k): str(v) for k, v in user_expressions.items()}
            )
            expressions = cell.active_output.expressions(expressions)  # active-output policy
        return cell.reply(expressions)

    # -- images ---------------------------------------------------------------------------------

    def snapshot_message(self, cell: CellHost, action: str, name: str) -> dict:
        """``%snapshot`` from the guest, during its turn: list and delete at once; save and
        restore are noted on the cell and done when its turn has ended."""
        try:
            if not self.snapshots:
                raise images.ImageError(
                    "%snapshot is off in this kernel (--WasmKernel.snapshots, off in the"
                    " strict profile)"
                )
            if action not in ("save", "restore", "list", "delete"):
                raise images.ImageError(
                    "usage: %snapshot save NAME | restore NAME | list | delete NAME"
                )
            if action == "list":
                return {"text": self.image_folder.describe()}
            if name.startswith(images.ImageFolder.HIBERNATED):
                raise images.ImageError(
                    "hibernated sessions belong to their own notebooks; they cannot be saved,"
                    " restored or deleted from a cell"
                )
            if action == "delete":
                self.image_folder.delete(name)
                return {"text": f"Deleted snapshot {name!r}."}
            path = self.image_folder.path(name)
            if action == "restore" and not path.exists():
                raise images.ImageError(f"there is no snapshot named {name!r}")
            cell.snapshot = (action, name)
            return {}
        except images.ImageError as exc:
            return {"error": str(exc)}

    def _act_on_snapshot(self, sandbox: Sandbox, action: str, name: str) -> str:
        """Save or restore between turns (on the worker); returns what to tell the user."""
        began = time.perf_counter()
        if action == "save":
            path = self.image_folder.store(name, self._image_bytes(sandbox))
            size = path.stat().st_size
            return (
                f"Saved snapshot {name!r} ({size / (1 << 20):.1f} MiB,"
                f" {time.perf_counter() - began:.2f} s)."
            )
        image = self._read_image(self.image_folder.path(name))
        sandbox.restore_image(image)
        return (
            f"Restored snapshot {name!r} (taken {image.taken or 'at an unknown time'}) in"
            f" {time.perf_counter() - began:.2f} s: the interpreter's state and the private"
            f" {SCRATCH} were replaced in place; what later cells did is gone."
        ) + "".join(f"\n{line}" for line in self._match_packages(image.host.packages))

    def _match_packages(self, pins: list[str]) -> list[str]:
        """Give a resumed or restored guest the %pip packages its image names, from this
        kernel's own package source; returns what the user should be told."""
        if self.package_set is None or not (pins or self.package_set.pins()):
            return []
        deadline = time.monotonic() + IMAGE_PACKAGES_SECONDS  # no cell to interrupt it

        def past_deadline(seconds: float) -> bool:
            time.sleep(seconds)
            return time.monotonic() > deadline

        try:
            return self.package_set.match(pins, past_deadline)
        except PackageError as exc:
            return [str(exc)]
        except Cancelled:
            return [
                f"installing the image's packages ({', '.join(pins)}) took longer than"
                f" {IMAGE_PACKAGES_SECONDS} s and was stopped; %pip install them again"
            ]

    def _image_bytes(self, sandbox: Sandbox) -> bytes:
        entries = self.history.range(0, 0, None)
        host = images.HostState(
            execution_count=self.execution_count,
            history=[(line, source) for _, line, source in entries],
            packages=self.package_set.pins() if self.package_set is not None else [],
        )
        return sandbox.save_image(host, [str(mount) for mount in self.granted])

    def _hibernate(self, sandbox: Sandbox) -> None:
        session = os.environ.get(SESSION_ENV)
        if not (self.hibernate and session):
            return
        try:
            self.image_folder.store(
                self.image_folder.hibernation_name(session), self._image_bytes(sandbox)
            )
        except images.ImageError as exc:
            self.log.warning("could not hibernate this session: %s", exc)

    async def _service(self, function: str, *args: Any) -> dict:
        """Run a guest service function (completion, inspection...) and return its reply."""
        try:
            sandbox = await self._sandbox(lambda _: None)
        except Exception:  # no sandbox (bad settings or mounts): cells say why; this answers empty
            return {}
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._worker, lambda: sandbox.request(function, *args, host=QuietHost())
            )
        except CellStopped as stop:
            self.log.warning("%s request stopped: %s", function, stop)
            return {}

    def _process_children(self) -> list[Any]:
        """Children ipykernel waits for at shutdown, less zombies. The kernel starts none
        (the guest cannot), but a launcher's helper that has exited unreaped (Enterprise
        Gateway's) would otherwise hold every shutdown for ipykernel's whole retry schedule."""
        alive = []
        for child in super()._process_children():
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE:
                    alive.append(child)
        return alive

    # Jupyter interrupts (signal mode, or interrupt_request, which ipykernel turns into a
    # SIGINT to this process) reach the sandbox while a handler runs. Signal handlers can
    # only be set on the main thread; subshell handlers run elsewhere and keep the main one's.
    def pre_handler_hook(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._saved_signals = self._interrupt_relay.install()

    def post_handler_hook(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._interrupt_relay.uninstall(self._saved_signals)

    def _interrupt_sandbox(self) -> None:
        if self._boot.done() and not self._boot.exception():
            self._boot.result().interrupt()

    # -- malformed requests -----------------------------------------------------------------
    # ipykernel's handlers drop requests whose content lacks what they read (no reply at all,
    # so the client waits forever). These wrappers answer them with an error reply instead.

    async def dispatch_shell(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().dispatch_shell(*args, **kwargs)
        finally:
            # The checkpoint once the idle status is on its way (the IOPub thread sends in
            # order): taken earlier, it would hold the thread back, and clients wait for idle.
            if self.iopub_thread is not None:
                self.iopub_thread.schedule(self._worker.run_deferred)
            else:
                self._worker.run_deferred()

    async def execute_request(self, stream: Any, ident: Any, parent: dict) -> None:
        if not self._refuse_malformed(stream, ident, parent, "execute_reply", {"code": str}):
            if not self._boot.done() and self._image_to_resume() is not None:
                # a resumed session numbers this cell after its own
                await asyncio.wait([asyncio.wrap_future(self._boot)])
            self._take_resumed_state()
            await super().execute_request(stream, ident, parent)

    def _take_resumed_state(self) -> None:
        """Once, on the event loop: a resumed image's execution count and input history."""
        resumed, self._resumed = self._resumed, None
        if resumed is None:
            return
        self.execution_count = resumed.execution_count
        for line, source in resumed.history:
            self.history.store(line, source)

    async def complete_request(self, stream: Any, ident: Any, parent: dict) -> None:
        fields = {"code": str, "cursor_pos": int}
        if not self._refuse_malformed(stream, ident, parent, "complete_reply", fields):
            await super().complete_request(stream, ident, parent)

    async def inspect_request(self, stream: Any, ident: Any, parent: dict) -> None:
        fields = {"code": str, "cursor_pos": int}
        if not self._refuse_malformed(stream, ident, parent, "inspect_reply", fields):
            await super().inspect_request(stream, ident, parent)

    async def is_complete_request(self, stream: Any, ident: Any, parent: dict) -> None:
        fields = {"code": str}
        if not self._refuse_malformed(stream, ident, parent, "is_complete_reply", fields):
            await super().is_complete_request(stream, ident, parent)

    async def comm_info_request(self, stream: Any, ident: Any, parent: dict) -> None:
        if not self._refuse_malformed(stream, ident, parent, "comm_info_reply", {}):
            await super().comm_info_request(stream, ident, parent)

    async def history_request(self, stream: Any, ident: Any, parent: dict) -> None:
        fields = {"hist_access_type": str}
        if not self._refuse_malformed(stream, ident, parent, "history_reply", fields):
            await super().history_request(stream, ident, parent)

    def _refuse_malformed(
        self, stream: Any, ident: Any, parent: dict, reply_type: str, fields: Mapping[str, type]
    ) -> bool:
        """Send an error reply when the request's content is not what the protocol says."""
        content = parent.get("content")
        problem = None
        if not isinstance(content, dict):
            problem = "the request's content must be an object"
        else:
            for name, kind in fields.items():
                value = content.get(name)
                if not isinstance(value, kind) or isinstance(value, bool):
                    problem = f"{name!r} must be {kind.__name__}"
                    break
                if isinstance(value, str) and not _encodable(value):
                    problem = f"{name!r} contains unpaired surrogates (not valid Unicode)"
                    break
            else:
                if not isinstance(parent.get("metadata", {}), dict):
                    problem = "the request's metadata must be an object"
        if problem is None:
            return False
        reply: dict[str, Any] = {
            "status": "error",
            "ename": "MalformedRequest",
            "evalue": problem,
            "traceback": [],
        }
        if reply_type == "execute_reply":  # the protocol gives every execute_reply a count
            reply["execution_count"] = self.execution_count
        self.live_session.send(stream, reply_type, reply, parent, ident=ident)
        return True

    # -- introspection requests ------------------------------------------------------------

    async def do_complete(self, code: str, cursor_pos: int | None) -> dict:
        code, cursor = _clean_request(code, cursor_pos)
        reply = await self._service("complete", code, cursor)
        types = (reply.get("metadata") or {}).get(COMPLETION_TYPES)
        return {
            "status": "ok",
            "matches": [m for m in reply.get("matches", []) if isinstance(m, str)],
            "cursor_start": _clamp(reply.get("cursor_start"), cursor, len(code)),
            "cursor_end": _clamp(reply.get("cursor_end"), cursor, len(code)),
            "metadata": {COMPLETION_TYPES: _completion_types(types, len(code))},
        }

    async def do_inspect(
        self, code: str, cursor_pos: int | None, detail_level: int = 0, omit_sections: Any = ()
    ) -> dict:
        code, cursor = _clean_request(code, cursor_pos)
        omit = [str(name) for name in omit_sections] if isinstance(omit_sections, list) else []
        reply = await self._service("inspect_object", code, cursor, 1 if detail_level else 0, omit)
        data = reply.get("data") if isinstance(reply.get("data"), dict) else {}
        data = ActiveOutput(self.active_output).inspect(data)  # active-output policy
        return {"status": "ok", "found": bool(reply.get("found")), "data": data, "metadata": {}}

    async def do_is_complete(self, code: str) -> dict:
        code, _ = _clean_request(code, 0)
        reply = await self._service("is_complete", code)
        status = reply.get("status")
        if status not in ("complete", "incomplete", "invalid"):
            return {"status": "unknown"}
        result = {"status": status}
        if status == "incomplete":
            result["indent"] = str(reply.get("indent", ""))
        return result

    async def do_history(
        self,
        hist_access_type: str,
        output: bool = False,
        raw: bool = True,
        session: int | None = None,
        start: int | None = None,
        stop: int | None = None,
        n: int | None = None,
        pattern: str | None = None,
        unique: bool = False,
    ) -> dict:
        try:
            if hist_access_type == "tail":
                entries = self.history.tail(_bounded(n, 10), bool(unique))
            elif hist_access_type == "range":
                stop_line = None if stop is None else _bounded(stop, 0)
                entries = self.history.range(_bounded(session, 0), _bounded(start, 0), stop_line)
            elif hist_access_type == "search":
                entries = self.history.search(
                    str(pattern or "*"), _bounded(n, 0) or None, bool(unique)
                )
            else:
                entries = []
        except (TypeError, ValueError) as exc:
            return {
                "status": "error",
                "ename": "MalformedRequest",
                "evalue": str(exc),
                "traceback": [],
            }
        if output:
            return {"status": "ok", "history": [(s, n_, (src, None)) for s, n_, src in entries]}
        return {"status": "ok", "history": entries}

    def _end_after_reply(self) -> None:
        """exit() or quit() in a cell: as ipykernel does, the kernel process ends just after
        the cell's reply is sent. The user ended the session, so it does not hibernate."""

        async def end() -> None:
            await asyncio.sleep(0.1)  # ipykernel's delay: the reply is sent meanwhile
            await self._close(hibernate=False)
            self.io_loop.add_callback(self.io_loop.stop)

        self._ending = asyncio.ensure_future(end())

    async def do_shutdown(self, restart: bool) -> dict:
        await self._close(hibernate=not restart)
        return {"status": "ok", "restart": restart}

    async def _close(self, hibernate: bool) -> None:
        if self._closed:  # exit() and a shutdown request, both
            return
        self._closed = True
        if self._boot.done() and not self._boot.exception():
            sandbox = self._boot.result()
            if hibernate:
                hibernation = asyncio.wrap_future(self._worker.submit(self._hibernate, sandbox))
                done, _ = await asyncio.wait([hibernation], timeout=HIBERNATE_SECONDS)
                if not done:
                    self.log.warning("a cell was still running: this session did not hibernate")
            sandbox.close()
            sandbox.compiled.close()
        self._worker.shutdown(wait=False, cancel_futures=True)
        self.history.close()
        if self.package_set is not None:
            self.package_set.close()


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count % (1 << 20) == 0 else f"{count:,} bytes"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _clean_request(code: Any, cursor_pos: Any) -> tuple[str, int]:
    """Malformed introspection requests get a harmless, empty answer rather than an error."""
    code = code if isinstance(code, str) else ""
    valid = isinstance(cursor_pos, int) and not isinstance(cursor_pos, bool)
    cursor = cursor_pos if valid else len(code)
    return code, min(max(cursor, 0), len(code))


def _bounded(value: Any, fallback: int) -> int:
    """An integer history parameter, within SQLite's range."""
    if value is None:
        return fallback
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return max(min(value, 2**62), -(2**62))


def _completion_types(types: Any, length: int) -> list[dict]:
    """ipykernel's typed completions (JupyterLab shows their kind), checked field by field."""
    if not isinstance(types, list):
        return []
    checked = []
    for item in types:
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            continue
        checked.append(
            {
                "start": _clamp(item.get("start"), 0, length),
                "end": _clamp(item.get("end"), 0, length),
                "text": item["text"],
                "type": str(item.get("type") or ""),
                "signature": str(item.get("signature") or ""),
            }
        )
    return checked


def _clamp(value: Any, fallback: int, upper: int) -> int:
    valid = isinstance(value, int) and not isinstance(value, bool)
    return min(max(value, 0), upper) if valid else fallback


class GuestThread(ThreadPoolExecutor):
    """The one thread that runs the guest: every turn, checkpoint and image in order. A job
    can be deferred (the checkpoint after a cell, so that the execute_reply and the idle
    status do not wait behind it); it runs when :meth:`run_deferred` is called or before the
    next job submitted, whichever comes first. Thread-safe: subshells dispatch on threads of
    their own."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="wasm-kernel-guest")
        self._deferred: Callable[[], Any] | None = None
        self._order = threading.Lock()  # a deferred job is queued before anything after it

    def defer(self, job: Callable[[], Any]) -> None:
        with self._order:
            self._queue_deferred()
            self._deferred = job

    def run_deferred(self) -> None:
        with self._order:
            self._queue_deferred()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with self._order:
            self._queue_deferred()
            return super().submit(fn, *args, **kwargs)

    def _queue_deferred(self) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            with contextlib.suppress(RuntimeError):  # shut down: nothing to keep it for
                super().submit(deferred)


class InterruptRelay:
    """Carries SIGINTs to a thread that interrupts the sandbox, with no Python in between.

    A Python signal handler runs on the main thread between any two bytecodes, its own
    included: under a storm of signals its frames nest until a RecursionError breaks whatever
    the main thread was doing, and a handler that takes a lock can wait on itself forever. So
    while a request is handled, CPython's C-level handler writes each signal's number to a
    pipe (``signal.set_wakeup_fd``), the Python-level handler is a C function that does
    nothing (no frame: nothing nests), and a thread reading the pipe interrupts the sandbox,
    once per burst. A full pipe drops the extra bytes: the interrupts merge.
    """

    def __init__(self, interrupt: Callable[[], None]):
        self._interrupt = interrupt
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        threading.Thread(target=self._run, name="wasm-kernel-interrupts", daemon=True).start()

    def install(self) -> tuple[Any, int]:
        """On the main thread: route SIGINT to the pipe; returns what to restore."""
        previous = signal.signal(signal.SIGINT, _DO_NOTHING)
        return previous, signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)

    def uninstall(self, saved: tuple[Any, int]) -> None:
        handler, wakeup = saved
        signal.set_wakeup_fd(wakeup)
        signal.signal(signal.SIGINT, handler)

    def _run(self) -> None:
        while data := os.read(self._read, 1 << 16):  # a whole pipe's worth: one per burst
            if signal.SIGINT not in data:  # the pipe carries every handled signal's number
                continue
            try:
                self._interrupt()
            except Exception:
                logging.getLogger(__name__).exception("could not interrupt the sandbox")


_DO_NOTHING = operator.is_  # a C function of two arguments: a signal handler with no frame


class CellHost:
    """Turns what the guest produces during one execute_request into Jupyter messages.

    Runs on the worker thread (and, for output, wasmtime's threads): the parent header and
    stdin identity are captured up front, because the kernel's context variables are not
    visible there. ipykernel's iopub socket is safe to send on from any thread.
    """

    def __init__(self, kernel: WasmKernel, silent: bool, allow_stdin: bool):
        self.kernel = kernel
        self.session = kernel.live_session
        self.parent = kernel.get_parent("shell")
        self.stdin_ident = kernel._get_shell_context_var(kernel._shell_parent_ident)
        self.silent = silent
        self.allow_stdin = allow_stdin
        self.execution_count = kernel.execution_count
        self.error: dict | None = None
        self.snapshot: tuple[str, str] | None = None  # %snapshot save/restore, for the turn's end
        self.payload: list[dict] = []
        self._error_published = True
        self._told_backlog = False
        # active-output policy: passive bundles; one notice on stderr when the cell ends
        self.active_output = ActiveOutput(
            kernel.active_output, lambda text: self.stream("stderr", text)
        )

    def _publish(self, msg_type: str, content: dict) -> None:
        ident = self.kernel._topic(msg_type)
        published = self.kernel.guest_output.publish(msg_type, content, self.parent, ident)
        if not published and not self._told_backlog:
            self._told_backlog = True
            self.kernel.log.warning(
                "leaving out cell output: more than %d bytes wait for clients that do not"
                " read IOPub",
                self.kernel.guest_output.limit,
            )

    def stream(self, name: str, text: str) -> None:
        if not self.silent:
            self._publish("stream", {"name": name, "text": text})

    def message(self, message: dict, interrupts: Interrupts) -> dict:
        op = message["op"]
        if op in (ops.RESULT, ops.DISPLAY):  # active-output policy
            message["data"] = self.active_output.bundle(message["data"])
        if op == ops.RESULT:
            if not self.silent:
                self._publish(
                    "execute_result",
                    {
                        "execution_count": self.execution_count,
                        "data": message["data"],
                        "metadata": message["metadata"],
                    },
                )
        elif op == ops.DISPLAY:
            msg_type = "update_display_data" if message["update"] else "display_data"
            self._publish(
                msg_type,
                {
                    "data": message["data"],
                    "metadata": message["metadata"],
                    "transient": message["transient"],
                },
            )
        elif op == ops.CLEAR:
            self._publish("clear_output", {"wait": message["wait"]})
        elif op == ops.ERROR:
            ename, evalue = message["ename"], message["evalue"]
            # an allocation the limit refused (failed growth, or a bare MemoryError from the
            # allocator), not e.g. the parser's "too complex" MemoryError
            if ename == "MemoryError" and (message.get("memory_limit") or not evalue):
                ename = "MemoryLimitExceeded"
                evalue = memory_limit_text(self.kernel.limits.memory)
            elif ename in MISSING_PATH_ERRORS and self._outside_the_sandbox(evalue):
                evalue += NOTHING_MOUNTED
                message["traceback"] = [*message["traceback"], NOTHING_MOUNTED.strip()]
            shown = message.get("shown", True)  # False: past the output budget
            if message.get("publish", True):
                self._record_error(ename, evalue, message["traceback"], shown=shown)
            else:  # IPython printed it already (a UsageError): for the reply only
                self.error = {"ename": ename, "evalue": evalue, "traceback": []}
        elif op == ops.PAYLOAD:
            for item in message["payload"]:
                if item["source"] == "page":  # active-output policy
                    item["data"] = self.active_output.bundle(item["data"])
            self.payload = message["payload"]
        elif op == ops.INPUT:
            return self._input(message["prompt"], message["password"], interrupts)
        elif op == ops.DESCRIBE:
            return {"text": self.kernel.describe_sandbox()}
        elif op == "pip":
            return self.kernel.run_pip(message, interrupts)
        elif op == "snapshot":
            return self.kernel.snapshot_message(self, message["action"], message["name"])
        return {}

    def _outside_the_sandbox(self, evalue: str) -> bool:
        """Did a kernel without host folders fail on a path only the host could have?"""
        kernel = self.kernel
        if kernel.granted or kernel._mount_error is not None:
            return False
        quoted = _QUOTED_PATH.search(evalue)
        if quoted is None:
            return False
        path = quoted.group(1)
        inside = (SCRATCH, kernel.runtime.lib_guest_dir)
        return not any(path == top or path.startswith(top.rstrip("/") + "/") for top in inside)

    def _record_error(
        self, ename: str, evalue: str, traceback: list[str], shown: bool = True
    ) -> None:
        """The cell's error, for its reply; published now, or (past the output budget) in
        brief when the cell ends, so that an error never passes unseen."""
        self.error = {"ename": ename, "evalue": evalue, "traceback": traceback}
        self._error_published = shown
        if shown:
            self._publish("error", self.error)

    def fail(self, ename: str, evalue: str) -> dict:
        """End the cell with an error raised by the kernel rather than by the user's code."""
        self._record_error(ename, evalue, [f"{ename}: {evalue}"])
        return self.reply()

    def reply(self, user_expressions: dict | None = None) -> dict:
        self.active_output.finish()  # active-output policy: one notice for the cell, if any
        if self.error:
            if not self._error_published:
                self._publish_brief_error()
            return {"status": "error", "execution_count": self.execution_count, **self.error}
        return {
            "status": "ok",
            "execution_count": self.execution_count,
            "payload": self.payload,
            "user_expressions": user_expressions or {},
        }

    def _publish_brief_error(self) -> None:
        assert self.error is not None
        evalue = self.error["evalue"]
        if len(evalue) > BRIEF_ERROR:
            evalue = evalue[:BRIEF_ERROR] + " [...]"
        self.error = {
            "ename": self.error["ename"],
            "evalue": evalue,
            "traceback": [
                f"{self.error['ename']}: {evalue}",
                "(the traceback is not shown: the cell's output went past its output limit)",
            ],
        }
        self._publish("error", self.error)

    def _input(self, prompt: str, password: bool, interrupts: Interrupts) -> dict:
        """input_request over stdin; the wait ends early on interrupt."""
        if not self.allow_stdin:
            return {"error": "no-stdin"}
        kernel = self.kernel
        socket = kernel.stdin_socket
        while self.session.recv(socket)[1] is not None:  # drop stale replies
            pass
        self.session.send(
            socket,
            "input_request",
            {"prompt": prompt, "password": password},
            self.parent,
            ident=self.stdin_ident,
        )
        while True:
            if interrupts.take():
                return {"error": "interrupted"}
            if socket.poll(int(INPUT_POLL * 1000)):
                _, reply = self.session.recv(socket)
                if reply is None or reply.get("msg_type") != "input_reply":
                    continue
                value = reply.get("content", {}).get("value", "")
                if not isinstance(value, str):
                    value = ""
                return {"error": "eof"} if value == "\x04" else {"value": value}
