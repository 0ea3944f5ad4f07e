"""The sandbox described for people: the kernel_info banner and ``%sandbox``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import __version__, notebook_writes
from .checkpoints import checkpoint_method
from .grants import Grants
from .limits import Limits
from .mounts import SCRATCH

if TYPE_CHECKING:
    from .sandbox import Sandbox


def describe(
    settings: Any,
    problem: Exception | None,
    grants: Grants,
    limits: Limits,
    started_from: str | None,
    sandbox: Sandbox | None,
    hibernation: str,
) -> str:
    """The running configuration (``sandbox``: the running one, once started; ``hibernation``:
    what becomes of the session when the notebook is closed); or, with invalid settings
    (``problem``), why there is none."""
    runtime = grants.runtime
    if problem is not None:
        return (
            f"Python {runtime.python_version} in a WebAssembly sandbox"
            f" (wasm-kernel {__version__}): not started.\n{problem}"
        )
    scratch_size = (
        f"up to {limits.scratch_limit >> 20} MiB" if limits.scratch_limit else "no size limit"
    )
    scratch = sandbox.scratch_folder if sandbox is not None else None
    time_limit = f"time {limits.time_limit:.10g} s" if limits.time_limit else "no time limit"
    return (
        f"Python {runtime.python_version} in a WebAssembly sandbox"
        f" (wasm-kernel {__version__}, runtime {runtime.name})\n"
        f"Profile: {settings.profile}\n"
        f"Host folders:\n{grants.describe_folders()}\n"
        f"  {SCRATCH}: private scratch, deleted when the kernel stops, {scratch_size}\n"
        f"{notebook_writes.describe(settings.notebook_writes, grants.layered, scratch)}\n"
        f"Starting folder: {grants.start_dir}\n"
        f"Interpreter: {f'from {started_from}' if started_from else 'still starting'}\n"
        f"Per cell: fuel {limits.fuel:,}, {time_limit},"
        f" memory {_size(limits.memory_limit)}, output {_size(limits.output_limit)}\n"
        f"Packages: {grants.packages.describe() if grants.packages else 'off'}\n"
        f"Rollback: {_rollback(settings, runtime.restorable, sandbox)}\n"
        f"Hibernation: {hibernation}\n"
        "No host environment, network or processes."
    )


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
