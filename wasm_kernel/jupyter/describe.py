"""The sandbox described for people: the kernel_info banner (a few lines: what this is, the
profile, the limits, where files go) and ``%sandbox`` (everything, with how it works)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import __version__
from ..files import notebook_writes
from ..files.mounts import SCRATCH
from ..images.names import RUNNING_FROM, STILL_STARTING
from ..memory.checkpoints import checkpoint_method
from ..network.network import describe as describe_network
from ..sandbox.limits import Limits
from ..sandbox.metrics import CellMetrics
from .grants import Grants

if TYPE_CHECKING:
    from ..sandbox.sandbox import Sandbox


def summary(
    settings: Any,
    problem: Exception | None,
    grants: Grants,
    limits: Limits,
    started_from: str | None,
    sandbox: Sandbox | None,
    hibernation: str | None,
) -> str:
    """The banner: what a user needs before the first cell, and where the rest is
    (``hibernation``: what closing the notebook does, None when it does nothing)."""
    runtime = grants.runtime
    if problem is not None:
        return describe(settings, problem, grants, limits, started_from, sandbox, "", "")
    lines = [
        f"Python {runtime.python_version} in a WebAssembly sandbox (wasm-kernel {__version__}),"
        f" profile {settings.profile}",
        _per_cell(limits),
        f"Host folders: {_folders(grants)}",
        f"{SCRATCH}: private scratch, deleted when the kernel stops, {_scratch_size(limits)}",
        f"Network: {describe_network(settings)}",
        *([f"Hibernation: {hibernation}"] if hibernation is not None else []),
        _interpreter(sandbox, started_from),
        "%sandbox shows the whole configuration and what the last cell cost.",
    ]
    return "\n".join(lines)


def describe(
    settings: Any,
    problem: Exception | None,
    grants: Grants,
    limits: Limits,
    started_from: str | None,
    sandbox: Sandbox | None,
    hibernation: str,
    audit: str,
    last_cell: CellMetrics | None = None,
) -> str:
    """The running configuration (``sandbox``: the running one, once started; ``hibernation``:
    what becomes of the session when the notebook is closed; ``audit``: the audit log), and
    what ``last_cell`` cost; or, with invalid settings (``problem``), why there is none."""
    runtime = grants.runtime
    if problem is not None:
        return (
            f"Python {runtime.python_version} in a WebAssembly sandbox"
            f" (wasm-kernel {__version__}): not started.\n{problem}"
        )
    scratch = sandbox.scratch_folder if sandbox is not None else None
    tools = getattr(settings, "host_tools", None)
    operator_tools = (
        f"Host tools (WasmKernel.tools, run outside the sandbox): {', '.join(tools.operator)}\n"
        if tools is not None and tools.operator
        else ""
    )
    return (
        f"Python {runtime.python_version} in a WebAssembly sandbox"
        f" (wasm-kernel {__version__}, runtime {runtime.name})\n"
        f"Profile: {settings.profile}\n"
        f"Host folders:\n{grants.describe_folders()}\n"
        f"  {SCRATCH}: private scratch, deleted when the kernel stops, {_scratch_size(limits)}\n"
        f"{notebook_writes.describe(settings.notebook_writes, grants.layered, scratch)}\n"
        f"Starting folder: {grants.start_dir}\n"
        f"{_interpreter(sandbox, started_from)}\n"
        f"{_per_cell(limits)}\n"
        f"Packages: {grants.packages.describe() if grants.packages else 'off'}\n"
        f"Rollback: {_rollback(settings, runtime.restorable, sandbox)}\n"
        f"Hibernation: {hibernation}\n"
        f"Audit log: {audit}\n"
        f"Network: {describe_network(settings)}\n"
        f"{operator_tools}"
        "No host environment or processes."
        + (f"\nLast cell: {last_cell.describe()}" if last_cell is not None else "")
    )


def _folders(grants: Grants) -> str:
    """The granted folders in a line; writes to a layered one stay in the sandbox."""
    if grants.mount_error is not None or grants.withheld or not grants.granted:
        return grants.describe_folders().strip()
    shown = []
    for mount in grants.granted:
        if mount.writable:
            mode = "read-write"
        elif str(mount.guest) in grants.layered and grants.writes_through:
            mode = "read-only: new data files written there reach it after each cell"
        elif str(mount.guest) in grants.layered:
            mode = "read-only: writes there stay in the sandbox"
        else:
            mode = "read-only"
        shown.append(f"{mount.guest} <- {mount.host} ({mode})")
    return "; ".join(shown)


def _interpreter(sandbox: Sandbox | None, started_from: str | None) -> str:
    """Where the interpreter came from, once it runs: clients wait for this line."""
    running = sandbox is not None and started_from is not None
    return f"{RUNNING_FROM}{started_from}" if running else STILL_STARTING


def _per_cell(limits: Limits) -> str:
    time_limit = f"time {limits.time_limit:.10g} s" if limits.time_limit else "no time limit"
    return (
        f"Per cell: fuel {limits.fuel:,}, {time_limit},"
        f" memory {_size(limits.memory_limit)}, output {_size(limits.output_limit)}"
    )


def _scratch_size(limits: Limits) -> str:
    return f"up to {limits.scratch_limit >> 20} MiB" if limits.scratch_limit else "no size limit"


def _rollback(settings: Any, restorable: bool, sandbox: Sandbox | None) -> str:
    """What a trapping cell rolls back to, and how checkpoints are taken (the running
    sandbox's way once it has started: it may have had to fall back to copying)."""
    if not (settings.rollback and restorable):
        return "off (a trap restarts the interpreter)"
    if sandbox is not None:
        method = sandbox.checkpoint_method
        if method is None:
            return "off (a trap restarts the interpreter)"
    else:
        method = checkpoint_method(settings.checkpoint_mode)
    return f"to the state after the last cell; checkpoints by {method}"


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count % (1 << 20) == 0 else f"{count:,} bytes"
