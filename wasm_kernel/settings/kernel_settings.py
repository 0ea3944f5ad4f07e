"""Every setting of the kernel, declared once: its type and bounds, its default (a value, or
its profile's), its help. The kernel, ``--help-all``, the client and the MCP server all read
these declarations; none of them imports the kernel (ipykernel, wasmtime) to do it.

Every setting is checked when the kernel starts, whatever its source (the kernelspec argv,
``jupyter_wasm_kernel_config.py``, a ``WASM_KERNEL_*`` variable). A refused value must not end
the process (a front end would show "kernel died" in a restart loop) and must not be used:
it is recorded, the declared default stands in, the kernel stays up and every cell reports it
(see ``settings.InvalidSettings``).
"""

from __future__ import annotations

from copy import deepcopy
from pathlib import Path
from typing import Any

import platformdirs
from traitlets import HasTraits, TraitError, Unicode
from traitlets.config import Config, Configurable
from traitlets.config.loader import DeferredConfig, LazyConfigValue

from ..files.notebook_writes import NOTEBOOK_WRITES
from ..runtime.runtime import DEFAULT_RUNTIME
from ..sandbox.limits import DEFAULT_GRACE
from .profiles import DEFAULT_PROFILE, PROFILES, Profile
from .settings import (
    CHECKPOINT_MODES,
    FROM_PROFILE,
    INT64_MAX,
    MAX_GRACE,
    MAX_MEMORY,
    MAX_NETWORK_BYTES,
    MAX_NETWORK_REQUESTS,
    MAX_NETWORK_SECONDS,
    MAX_SECONDS,
    MIN_FUEL,
    MIN_MEMORY,
    MIN_NETWORK_BYTES,
    MIN_OUTPUT,
    MIN_PACKAGES_QUOTA,
    MIN_SCRATCH,
    MIN_SECONDS,
    AbsoluteFileOrOff,
    AbsoluteFolder,
    AllowList,
    CheckedBool,
    CheckedEnum,
    Limit,
    PackageSource,
    PerProfile,
    Text,
    TextList,
    config_source,
    describe_refusal,
)

MIN_AUDIT_LOG_LIMIT = 1 << 20  # some thousands of lines: smaller is a unit slip (MiB meant)
MIN_SNAPSHOT_QUOTA = 16 << 20  # smaller holds no image at all: a unit slip
MIN_HIBERNATION_DAYS = 0.01  # about a quarter of an hour: shorter is a unit slip (hours meant?)
MAX_HIBERNATION_DAYS = 3650.0
MAX_RESUME_WAIT = 600.0  # seconds: longer than any image takes to write, so a unit slip
SESSION_ENV = "JPY_SESSION_NAME"  # the notebook's path, set by Jupyter Server
# the notebook's file ID, which a rename keeps, set by our session manager in Jupyter Server
# (server/notebook_sessions.py); where it is set, hibernation follows it instead of the path
NOTEBOOK_ID_ENV = "WASM_KERNEL_NOTEBOOK_ID"
# config sections the settings are read from (the second, as the class they are declared on)
SECTIONS = ("WasmKernel", "KernelSettings")


def user_data(name: str) -> str:
    """A file or folder in the per-user data folder, worked out when a kernel reads its
    settings (never at import: the kernel server imports this for kernels of other
    environments)."""
    return str(Path(platformdirs.user_data_dir("wasm-kernel")) / name)


def history_file(profile: Profile) -> str:
    """Where a profile keeps input history by default: the per-user file, or only memory."""
    return user_data("history.sqlite") if profile.keeps_history else ":memory:"


def default_snapshot_dir(_profile: Profile | None = None) -> str:
    return user_data("snapshots")


def _starting_folder(profile: Profile) -> str:
    """The working_dir a profile starts cells in (for --help-all): its mount of '.', or /tmp."""
    here = [spec.split(":")[1] for spec in profile.mounts if spec.split(":")[0] == "."]
    return repr(here[0]) if here else "'/tmp'"


def _cache_dir() -> str:
    from ..runtime.cache import default_cache_dir  # imports wasmtime: only for --help-all

    return repr(str(default_cache_dir()))


class SettingsRecord(Configurable):
    """What became of a kernel's settings as they were read: the values refused, and which
    were set explicitly. The declarations are ``KernelSettings``', below."""

    profile: str

    def __init__(self, **kwargs: Any):
        self.refused: list[str] = []  # settings refused at start, reported by every cell
        super().__init__(**kwargs)

    @property
    def profile_settings(self) -> Profile:
        return PROFILES[self.profile]

    def refuse_setting(self, name: str, value: Any, source: str, reason: str) -> None:
        """Record a refused value (the first one per setting: argv and config win over the
        environment, so a refused argv value is what the user meant to set)."""
        if not any(problem.startswith(f"WasmKernel.{name} = ") for problem in self.refused):
            self.refused.append(describe_refusal(name, value, source, reason))

    def read_settings(self) -> set[str]:
        """Read (and so check) every setting now, environment variables included; returns the
        names set explicitly (config or argv)."""
        names = setting_names()
        configured = {name for name in names if self.trait_has_value(name)}
        for name in names:
            getattr(self, name)
        return configured


DEBUGGER_HELP = (
    "Offer JupyterLab's visual debugger (breakpoints, stepping, the variables pane). A stopped"
    " cell waits for the person like input(): its time limit is paused, an interrupt ends it."
    " Off: kernel_info and the kernelspec do not offer it, and a debug_request gets an error"
    " response saying so."
)


class KernelSettings(SettingsRecord):
    """The sandbox's settings (section ``WasmKernel`` of the config, which inherits them).
    Each refuses values outside its range (see settings.py for why these bounds)."""

    profile = CheckedEnum(
        sorted(PROFILES),
        default=DEFAULT_PROFILE,
        help="Named defaults for limits and mounts; explicit settings win over them. "
        + "; ".join(f"{name}: {profile.summary}" for name, profile in PROFILES.items())
        + ".",
    ).tag(config=True)
    mounts = TextList(
        Unicode(),
        default=FROM_PROFILE,
        help="Host folders the guest may use, each 'HOST:GUEST[:ro|rw]' (read-only unless ':rw'),"
        " e.g. 'data:/data:ro'. A relative HOST is taken from the kernel's working folder.",
    ).tag(config=True)
    working_dir = Text(
        default=PerProfile(lambda profile: "", shown=_starting_folder),
        help="Guest folder cells start in: a mount's guest path or /tmp. Default: the mount of"
        " the kernel's working folder (the notebook's folder), else /tmp.",
    ).tag(config=True)
    fuel = Limit(
        integer=True,
        low=MIN_FUEL,
        high=INT64_MAX,
        unit="units",
        default=FROM_PROFILE,
        help="Fuel per cell (about one unit per WebAssembly instruction; ~1e10 per second of"
        " pure-Python work). A cell that runs out stops with FuelExhausted. The interpreter's"
        " start-up has its own budget.",
    ).tag(config=True)
    time_limit = Limit(
        integer=False,
        low=MIN_SECONDS,
        high=MAX_SECONDS,
        unit="seconds",
        zero="no limit",
        default=FROM_PROFILE,
        help="Wall-clock seconds a cell may run, 0 for no limit.",
    ).tag(config=True)
    memory_limit = Limit(
        integer=True,
        low=MIN_MEMORY,
        high=MAX_MEMORY,
        unit="bytes",
        default=FROM_PROFILE,
        help="Bytes of linear memory the guest interpreter may use (about 52 MiB to boot; 78"
        " MiB to start from the boot image, which has numpy and pandas loaded: below that the"
        " kernel boots, a second slower).",
    ).tag(config=True)
    output_limit = Limit(
        integer=True,
        low=MIN_OUTPUT,
        high=INT64_MAX,
        unit="bytes",
        default=FROM_PROFILE,
        help="Bytes of output (streams and display data) shown per cell; the rest is dropped"
        " with a notice.",
    ).tag(config=True)
    scratch_limit = Limit(
        integer=True,
        low=MIN_SCRATCH,
        high=INT64_MAX,
        unit="bytes",
        zero="no limit",
        default=FROM_PROFILE,
        help="Bytes a cell may fill the private /tmp with (on the host's disk; each file counts"
        " at least 4 KiB), 0 for no limit. A cell that grows it past the limit is stopped.",
    ).tag(config=True)
    interrupt_grace = Limit(
        integer=False,
        low=0.0,
        high=MAX_GRACE,
        unit="seconds",
        default=DEFAULT_GRACE,
        help="Seconds an interrupted cell gets to stop by itself (KeyboardInterrupt) before it"
        " is stopped hard; 0 stops it hard at once.",
    ).tag(config=True)
    rollback = CheckedBool(
        default=True,
        help="Checkpoint the interpreter after each cell and roll back to it when a cell traps"
        " (fuel, time, memory, stack, hard interrupt). Costs, per cell, the pages the cell"
        " wrote (or, with copy checkpoints, a copy of guest memory and as much host memory"
        " again; see checkpoint_mode); off: a trap restarts the interpreter.",
    ).tag(config=True)
    checkpoint_mode = CheckedEnum(
        list(CHECKPOINT_MODES),
        default="auto",
        help="How rollback checkpoints are kept: 'auto' copy-on-write where the OS allows"
        " (Linux on x86_64 or aarch64: a memfd, written pages found with PAGEMAP_SCAN or in"
        " /proc/self/pagemap; a checkpoint costs the pages the cell wrote), else a copy of"
        " guest memory; 'copy' always copies. %sandbox shows which is active.",
    ).tag(config=True)
    active_output = CheckedEnum(
        ["block", "allow"],
        default=FROM_PROFILE,
        help="Output that runs code in the front end (JavaScript, scripts and event handlers in"
        " HTML and SVG, in widgets' HTML state, custom widgets and other script-bearing mime"
        " types): 'block' drops or sanitizes"
        " it, with a notice; 'allow' passes it on, so a cell can act in the user's browser with"
        " the server's credentials.",
    ).tag(config=True)
    notebook_writes = CheckedEnum(
        list(NOTEBOOK_WRITES),
        default=FROM_PROFILE,
        help="Files cells write in the notebook's folder (its read-only mount): 'overlay'"
        " keeps them in a private copy-on-write layer in /tmp (the host's files never change;"
        " later cells read them; they count against scratch_limit, go with snapshots and"
        " hibernation, and %sandbox lists them); 'refuse' raises PermissionError.",
    ).tag(config=True)
    packages = PackageSource(
        default=FROM_PROFILE,
        help="Where %pip install takes packages from: 'index' (the package index the host's pip"
        " is configured for), 'off', or the path of a folder of wheels (a wheelhouse). Only"
        " pure-Python wheels are taken, never built; the runtime's own packages cannot be"
        " replaced.",
    ).tag(config=True)
    packages_quota = Limit(
        integer=True,
        low=MIN_PACKAGES_QUOTA,
        high=INT64_MAX,
        unit="bytes",
        default=FROM_PROFILE,
        help="Bytes of unpacked packages one kernel may install with %pip.",
    ).tag(config=True)
    packages_user_quota = Limit(
        integer=True,
        low=MIN_PACKAGES_QUOTA,
        high=INT64_MAX,
        unit="bytes",
        default=4 << 30,
        help="Bytes of %pip packages one user may hold on the host: the unpacked packages of"
        " all their running kernels together, plus the per-user cache of downloaded wheels"
        " (trimmed, least recently used first, to what the kernels leave).",
    ).tag(config=True)
    network_allow = AllowList(
        Unicode(),
        default=[],
        help="Hosts a cell may reach over HTTP, each 'http://HOST' or 'https://HOST' with an"
        " optional ':PORT' (else the scheme's own), HOST a name, '*.example.com' (the names"
        " below it) or an address ('127.0.0.1', '[::1]'). The host makes each request, never"
        " the guest; names resolving to loopback, private, link-local or metadata addresses are"
        " refused unless the address itself is listed. Empty (the default): no network.",
        shown=lambda: "none: no network (every profile)",
    ).tag(config=True)
    network_requests = Limit(
        integer=True,
        low=1,
        high=MAX_NETWORK_REQUESTS,
        unit="requests",
        default=100,
        help="HTTP requests a cell may make (each redirect is one).",
    ).tag(config=True)
    network_bytes = Limit(
        integer=True,
        low=MIN_NETWORK_BYTES,
        high=MAX_NETWORK_BYTES,
        unit="bytes",
        default=64 << 20,
        help="Bytes a cell may send and receive over HTTP (request and response bodies, as"
        " sent); a response that would go past it is refused.",
    ).tag(config=True)
    network_timeout = Limit(
        integer=False,
        low=MIN_SECONDS,
        high=MAX_NETWORK_SECONDS,
        unit="seconds",
        default=30.0,
        help="Seconds an HTTP request may take, from its start to its last byte. Waiting on"
        " the network counts against the cell's time_limit too.",
    ).tag(config=True)
    debugger = CheckedBool(default=True, help=DEBUGGER_HELP).tag(config=True)
    plain_tracebacks = CheckedBool(
        default=False,
        help="Tracebacks without colours (ANSI escapes), for programmatic clients that read"
        " them as text.",
    ).tag(config=True)
    tools = TextList(
        Unicode(),
        default=[],
        help="Host functions every cell may call, as functions of the guest's module"
        " sandbox_tools: each '[NAME=]module:function', imported by the kernel's Python at"
        " start. They run in the kernel process, outside the sandbox, with its rights: list"
        " only functions you would let the author of any cell call. Clients add tools of their"
        " own to the cells they run (wasm_kernel.client's Session(tools=...)).",
        shown=lambda: "none (every profile)",
    ).tag(config=True)
    runtime_name = Text(
        default=DEFAULT_RUNTIME,
        env=False,
        help="Runtime manifest to load.",
    ).tag(config=True)
    cache_dir = Text(
        default="",
        env=False,
        shown=_cache_dir,
        help="Folder of compiled runtimes. Env: WASM_KERNEL_CACHE_DIR; default: the per-user"
        " cache folder.",
    ).tag(config=True)
    history_file = Text(
        default=PerProfile(history_file),
        help="SQLite file of input history (':memory:' to keep none on disk). Default: the"
        " per-user file, or ':memory:' for the strict profile.",
    ).tag(config=True)
    snapshot_dir = AbsoluteFolder(
        default=PerProfile(default_snapshot_dir),
        help="Folder of saved interpreter images (%snapshot, hibernation); an absolute path"
        " (or ~/...).",
    ).tag(config=True)
    snapshot_quota = Limit(
        integer=True,
        low=MIN_SNAPSHOT_QUOTA,
        high=INT64_MAX,
        unit="bytes",
        zero="no quota",
        default=2 << 30,
        help="Bytes all images in snapshot_dir may take together; a save past it is refused.",
    ).tag(config=True)
    fork_memory_limit = Limit(
        integer=True,
        low=MIN_SNAPSHOT_QUOTA,
        high=INT64_MAX,
        unit="bytes",
        zero="no limit",
        default=1 << 30,
        help="Bytes of host memory a session's fork images may keep alive together (each keeps"
        " its memory, frozen, while it exists). Past it a fork is refused: %snapshot delete.",
    ).tag(config=True)
    resume_from = Text(
        default="",
        shown=lambda: (
            "none: a fresh interpreter (or, with hibernate, the notebook's hibernated one)"
        ),
        help="Start from a saved image instead of a fresh interpreter: a snapshot name (see"
        " %snapshot list) or an image file's path. The kernel's own mounts and limits apply.",
    ).tag(config=True)
    resume_wait = Limit(
        integer=False,
        low=0.0,
        high=MAX_RESUME_WAIT,
        unit="seconds",
        default=0.0,
        help="Seconds to wait for the resume_from image to appear when it does not exist yet:"
        " Session.fork() starts the new kernel while the old one still writes the image. 0"
        " starts a fresh interpreter at once (and says so) when the image is missing.",
    ).tag(config=True)
    snapshots = CheckedBool(
        default=FROM_PROFILE,
        help="Let cells save, restore, list and delete images with %snapshot. Images are the"
        " user's, shared by their notebooks (restoring one brings its variables into this"
        " session), so the strict profile, for untrusted code, has it off.",
    ).tag(config=True)
    hibernate = CheckedBool(
        default=FROM_PROFILE,
        help="At shutdown (not restart) save the session's image, keyed by the notebook"
        f" ({SESSION_ENV}, set by Jupyter Server), and resume it in the next kernel started for"
        " that notebook. The banner and %sandbox say so; %snapshot forget opts one notebook"
        " out.",
    ).tag(config=True)
    hibernation_quota = Limit(
        integer=True,
        low=MIN_SNAPSHOT_QUOTA,
        high=INT64_MAX,
        unit="bytes",
        zero="no quota of their own; snapshot_quota still applies",
        default=512 << 20,
        help="Bytes the hibernated sessions of all notebooks may take together (each is about"
        " 16 MiB plus the session's data); to make room for a new one, the least recently"
        " saved are removed.",
    ).tag(config=True)
    hibernation_days = Limit(
        integer=False,
        low=MIN_HIBERNATION_DAYS,
        high=MAX_HIBERNATION_DAYS,
        unit="days",
        zero="kept until resumed",
        default=14.0,
        help="Days a hibernated session is kept for its notebook to be reopened; older ones are"
        " removed when a kernel starts.",
    ).tag(config=True)
    audit_log = AbsoluteFileOrOff(
        default="",
        help="A file (absolute path, or ~/...) where the host appends one JSON line per cell,"
        " tool call and network request: time, session, sha256 of the code, verdict and"
        " metrics, never the code's output. Empty: no audit log. Opened for appending without"
        " following a link; refused (no cell runs) if it cannot be, or if it lies in a folder"
        " mounted into the sandbox.",
        shown=lambda: "none: no audit log (every profile)",
    ).tag(config=True)
    audit_log_limit = Limit(
        integer=True,
        low=MIN_AUDIT_LOG_LIMIT,
        high=INT64_MAX,
        unit="bytes",
        default=64 << 20,
        help="Bytes the audit log's file may reach: the line that would pass it renames the"
        " file to the same name with '.1' (replacing the one before) and starts a new one,"
        " whose first line says so. So the log takes at most twice this on disk.",
    ).tag(config=True)


def setting_names() -> tuple[str, ...]:
    return tuple(sorted(KernelSettings.class_own_traits(config=True)))


def screened(config: Config, app: Any, refuse: Any) -> Config:
    """``config`` less the WasmKernel values their settings refuse, each passed to ``refuse``
    instead: traitlets would raise on loading one, and the kernel process would end."""
    sections = [name for name in SECTIONS if name in config]
    if not sections:
        return config
    result = deepcopy(config)
    traits = KernelSettings.class_own_traits(config=True)
    probe = HasTraits()  # the checks look at no other setting
    for section in (result[name] for name in sections):
        for name, value in list(section.items()):
            trait = traits.get(name)
            if trait is None or isinstance(value, LazyConfigValue):
                continue
            given = value.get_value(trait) if isinstance(value, DeferredConfig) else value
            try:
                trait.validate(probe, given)  # type: ignore[attr-defined]
            except TraitError as exc:
                del section[name]
                refuse(name, given, config_source(app, name), str(exc))
    return result
