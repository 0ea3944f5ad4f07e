"""The budgets of one guest turn, named as the settings that give them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

DEFAULT_GRACE = 1.0  # seconds an interrupted cell gets to stop by itself
# Completion, inspection and user_expressions run the user's code too (properties, reprs):
# bounded like a cell, and more tightly, since a client waits on each as someone types.
SERVICE_FUEL = 20_000_000_000
SERVICE_SECONDS = 10.0


@dataclass(frozen=True)
class Limits:
    """Per-turn budgets. ``time_limit`` and ``scratch_limit`` of 0 mean none."""

    fuel: int
    time_limit: float
    memory_limit: int
    output_limit: int
    interrupt_grace: float = DEFAULT_GRACE
    scratch_limit: int = 0

    @classmethod
    def of(cls, settings: Any) -> Limits:
        """The limits a kernel's settings (or a profile) give; the one place they are built."""
        return cls(
            fuel=settings.fuel,
            time_limit=settings.time_limit,
            memory_limit=settings.memory_limit,
            output_limit=settings.output_limit,
            interrupt_grace=getattr(settings, "interrupt_grace", DEFAULT_GRACE),
            scratch_limit=settings.scratch_limit,
        )

    def for_service(self, output_limit: int) -> Limits:
        """A service request's budgets: the cell's, capped; its output is never shown."""
        return replace(
            self,
            fuel=min(self.fuel, SERVICE_FUEL),
            time_limit=min(self.time_limit or SERVICE_SECONDS, SERVICE_SECONDS),
            output_limit=output_limit,
        )
