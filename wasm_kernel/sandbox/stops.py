"""Why a turn stopped, in the words users read: the errors a trap or a limit ends a cell with.

Every text that names a limit is written here once, with the setting that raises it, so that
the sandbox decides *that* a cell stopped and this module says *why*.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import wasmtime

from ..files.mounts import SCRATCH
from ..files.scratch import Usage
from ..guest.modules import _wasm_kernel_contract as declared
from .metrics import CellMetrics

if TYPE_CHECKING:
    from .limits import Limits

# why a turn is interrupted or stopped (see interrupts.Interrupts)
INTERRUPT = "interrupt"  # the user's interrupt (signal or interrupt_request)
TIME = "time"  # the cell's wall-clock limit
SCRATCH_FULL = "scratch"  # the private /tmp grew past its limit
SHUTDOWN = "shutdown"  # the kernel is closing
SCRATCH_STOP = "ScratchLimitExceeded"  # the ename of a turn stopped for it


def set_by_operator(setting: str) -> str:
    """Where a limit comes from, for whoever reads the error: often not the one who can change
    it (a student's kernel is set up by the course)."""
    return (
        f"The limit is the kernel's setting WasmKernel.{setting}, which whoever set up this"
        " kernel can change."
    )


TIME_LIMIT_HINT = set_by_operator("time_limit")


class CellStopped(Exception):
    """A turn ended in a trap or past a limit; ``recovered``: the sandbox already put the
    interpreter right (the cell's changes stand); ``fresh``: only a new one will do."""

    def __init__(self, ename: str, evalue: str, recovered: bool = False, fresh: bool = False):
        super().__init__(f"{ename}: {evalue}")
        self.ename = ename
        self.evalue = evalue
        self.recovered = recovered
        self.fresh = fresh
        self.metrics: CellMetrics | None = None  # what the cell cost, set by the sandbox


def memory_limit_text(limit: int) -> str:
    return (
        f"the cell needed more than the sandbox's memory limit of {limit / (1 << 20):,.0f} MiB."
        f" {set_by_operator('memory_limit')}"
    )


def time_limit_interrupted(limits: Limits) -> str:
    """The time limit's text when the cell took the interrupt: raised inside the cell as
    TimeLimitExceeded, or told when the cell caught it and finished."""
    return (
        f"the cell ran longer than its wall-clock limit of {limits.time_limit:g} s and was"
        " interrupted (TimeLimitExceeded, a KeyboardInterrupt, inside it); what it did"
        f" until then stays. {TIME_LIMIT_HINT}"
    )


def time_limit_stopped(limits: Limits, ignored_interrupt: bool) -> CellStopped:
    """The time limit, when the cell was stopped hard."""
    ignored = (
        f" and did not stop within {limits.interrupt_grace:g} s of being interrupted,"
        " so it was stopped hard"
        if ignored_interrupt
        else ""
    )
    return CellStopped(
        "TimeLimitExceeded",
        f"the cell ran longer than its wall-clock limit of {limits.time_limit:g} s"
        f"{ignored}. {TIME_LIMIT_HINT}",
    )


def service_scratch_text(limits: Limits) -> str:
    return (
        f"code run for a service request filled the private {SCRATCH} past its limit of"
        f" {limits.scratch_limit >> 20} MiB; what that request wrote there was removed."
    )


def scratch_text(size: Usage, limits: Limits) -> str:
    if size.unmeasured:
        return (
            f"the kernel could not measure the private {SCRATCH} ({size.unmeasured}), so it"
            f" counts as past its limit of {limits.scratch_limit >> 20} MiB. Its files stay:"
            " delete some (os.remove, shutil.rmtree) to go on."
        )
    return (
        f"the cell filled the private {SCRATCH} past its limit of {limits.scratch_limit >> 20}"
        f" MiB ({size >> 20} MiB there now; files count at least 4 KiB each, and so do deleted"
        " files still open). Its files stay: delete some (os.remove, shutil.rmtree) to go"
        f" on. {set_by_operator('scratch_limit')}"
    )


def output_notice(budget: int) -> str:
    return (
        f"\n[wasm-kernel] output limit reached: this cell's output went past {budget:,}"
        f" bytes; what did not fit is not shown. {set_by_operator('output_limit')}\n"
    )


def explain_trap(
    trap: wasmtime.Trap,
    limits: Limits,
    stop_reason: str | None,
    soft_reason: str | None,
    scratch_size: Callable[[], Usage],
    hit_memory_limit: Callable[[], bool],
) -> CellStopped:
    """What a trap means for the user: which budget ran out, or who stopped the cell."""
    code = trap.trap_code
    if code == wasmtime.TrapCode.OUT_OF_FUEL:
        return CellStopped(
            "FuelExhausted",
            f"the cell used up its budget of {limits.fuel:,} units of work (about one per"
            f" WebAssembly instruction). {set_by_operator('fuel')}",
        )
    if code == wasmtime.TrapCode.INTERRUPT:
        if stop_reason == TIME:
            return time_limit_stopped(limits, ignored_interrupt=soft_reason == TIME)
        if stop_reason == SCRATCH_FULL:
            return CellStopped(SCRATCH_STOP, scratch_text(scratch_size(), limits))
        if stop_reason == SHUTDOWN:
            return CellStopped("KernelShutdown", "the kernel was shut down while the cell ran.")
        return CellStopped(
            "KeyboardInterrupt",
            "the cell did not stop within"
            f" {limits.interrupt_grace:g} s of the interrupt, so it was stopped hard.",
        )
    if code == wasmtime.TrapCode.STACK_OVERFLOW:
        return CellStopped(
            "StackOverflow",
            "the cell overflowed the interpreter's native stack (very deep recursion in C"
            " code, or a raised sys.setrecursionlimit).",
        )
    if hit_memory_limit():  # an allocation failed at the limit, and then C code gave up
        return CellStopped("MemoryLimitExceeded", memory_limit_text(limits.memory_limit))
    return CellStopped("GuestCrashed", f"the interpreter trapped: {trap.message}.")


def explain_status(status: int, limits: Limits, hit_memory_limit: bool) -> CellStopped | None:
    """A turn that returns non-zero escaped the guest's own error handling: it ran out of
    memory while reporting, or the cell broke the kernel's guest code (the guest checks its
    own integrity at the end of each cell). Either way the turn is undone."""
    if status == 0:
        return None
    if status == declared.TURN_REFUSED:
        return CellStopped(
            "KernelSupportDamaged", "the interpreter refused to run further cells.", fresh=True
        )
    if hit_memory_limit:
        return CellStopped("MemoryLimitExceeded", memory_limit_text(limits.memory_limit))
    return CellStopped(
        "KernelSupportDamaged",
        "the cell changed or removed the kernel's own code inside the sandbox (its"
        " _wasm_kernel module or the import system), which later cells need.",
    )
