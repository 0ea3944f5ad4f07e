"""What the sandbox does after a failed turn: roll the interpreter back to its checkpoint,
reinstall the kernel's code inside it, or start it afresh, and say which to the user.

A mixin of ``Sandbox``, as ``SandboxState`` is: the sandbox's class keeps its life cycle and
turns; this one the repairs a trap calls for, and the kernel's own short turns they run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import wasmtime

from ..guest.modules import _wasm_kernel_contract as declared
from ..images import images
from .contract import guest_turn
from .interpreter import Interpreter
from .sandbox_state import SandboxState

if TYPE_CHECKING:
    from .interrupts import Metering

REPAIR_FUEL = 2_000_000_000  # budget of the kernel's own short turns (after a rollback ...)
REPAIR_SECONDS = 2.0
ROLLED_BACK = (
    "The interpreter was rolled back to its state before this cell: names, imports and"
    " objects from earlier cells are intact."
)
ROLLED_BACK_REINSTALLED = (
    "The interpreter was rolled back to its state before this cell and the kernel's code"
    " inside it reinstalled: your names are intact."
)
REINSTALLED = (
    "The kernel's code inside the interpreter was reinstalled: names, imports and objects"
    " from earlier cells are kept, with this cell's changes."
)
FRESH_AGAIN = (
    "The interpreter was rolled back to its fresh state: no earlier cell had finished, so"
    " nothing was lost."
)
RESTARTED = (
    "The interpreter was restarted: variables, imports and objects from earlier cells are gone."
)
UNDONE = (ROLLED_BACK, ROLLED_BACK_REINSTALLED, FRESH_AGAIN)  # the state is as before the cell


class SandboxRecovery(SandboxState):
    """Repairs of the sandbox's one interpreter after a trap, under its turn lock."""

    _metering: Metering
    restart: Callable[[], None]
    _install_source: Callable[[], str]

    def _recover(self, fresh: bool) -> str:
        """Make the interpreter usable after a failed turn; returns what became of the user's
        state, for the error. Roll back to the checkpoint where there is one; if even the
        checkpoint cannot run the kernel's code, reinstall that code; else start afresh."""
        interpreter = self._interpreter
        state = interpreter.state
        if fresh:
            pass  # only a new interpreter will do
        elif state is not None and state.taken:
            state.restore(interpreter.store)
            if self._after_rollback(interpreter):
                return ROLLED_BACK
            state.restore(interpreter.store)
            if self._reinstall(interpreter):
                return ROLLED_BACK_REINSTALLED
        elif not interpreter.fresh and self._reinstall(interpreter):  # rollback off: an
            return REINSTALLED  # interpreter that did not trap takes its code again
        was_fresh = interpreter.fresh
        self.restart()
        return FRESH_AGAIN if was_fresh else RESTARTED

    def _repair_turn(
        self,
        interpreter: Interpreter,
        source: str,
        failure: str | None = None,
        before: Callable[[], None] | None = None,
    ) -> int | None:
        """One of the kernel's own short turns (after ``before``, host work that runs guest
        code too), bounded like a cell and not interruptible by the user; a trap raises an
        ImageError saying ``failure``, or (None) returns None."""
        self._metering.watch_signals(interpreter.memory, interpreter.store)
        with self._metering.turn(
            interpreter.store, REPAIR_FUEL, REPAIR_SECONDS, interruptible=False
        ):
            try:
                if before is not None:
                    before()
                return interpreter.call_turn(source)
            except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:  # any trap, or an exit
                if failure is not None:
                    raise images.ImageError(f"{failure}: {exc}") from None
                return None

    def _after_rollback(self, interpreter: Interpreter) -> bool:
        """Close the descriptors the rolled-back cell opened, and let the restored guest close
        file objects whose descriptor that cell closed (the host's descriptor table is not
        part of the checkpoint). False if the kernel's guest code cannot run even there; if
        this trapped, the checkpoint is restored again and the file check skipped."""
        status = self._repair_turn(
            interpreter,
            guest_turn(declared.CLOSE_STALE_FILES),
            before=lambda: interpreter.files.close_newer(interpreter.store),
        )
        if status is None:
            assert interpreter.state is not None
            interpreter.state.restore(interpreter.store)
            return True  # the checkpoint stands; only the file check was skipped
        self._changed = True  # the next checkpoint keeps the files closed
        return status == 0

    def _reinstall(self, interpreter: Interpreter) -> bool:
        """Load the kernel's guest code again (names in __main__ stay); True if it worked."""
        if self._repair_turn(interpreter, self._install_source()) != 0:
            return False
        if interpreter.state is not None:
            self._take_checkpoint(interpreter)
        return True
