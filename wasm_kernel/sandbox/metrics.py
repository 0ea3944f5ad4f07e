"""What one cell cost: measured by the sandbox around the cell's turn, sent to clients in the
``execute_reply``'s metadata under ``wasm_kernel``, read back by the client and the MCP server.

Each figure is taken where it is really known (see ``CellMeter``): fuel from the store,
CPU and wall time from the guest thread's clocks around the turn, peak memory from the
guest's program break, /tmp from the scratch watch, the checkpoint from the checkpoint
in force. This module imports nothing heavy: the client reads it too.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields
from typing import Any

METADATA_KEY = "wasm_kernel"  # the execute_reply metadata key the figures travel under


@dataclass(frozen=True)
class CellMetrics:
    """One cell's costs (see the README's "What execute_reply carries")."""

    fuel: int  # fuel units the cell's turn used (all of the budget, if it ran out)
    cpu_seconds: float  # CPU time of the thread running the guest, over the turn
    wall_seconds: float  # wall-clock time of the turn
    peak_memory: int  # bytes of guest linear memory in use at the turn's highest point
    scratch_bytes: int  # bytes the private /tmp takes on disk when the turn ended
    checkpoint_bytes: int  # guest memory held by the checkpoint the cell could roll back to
    rolled_back: bool  # the cell was stopped and the interpreter put back as it was before

    def as_metadata(self) -> dict[str, Any]:
        return {
            "fuel": self.fuel,
            "cpu_seconds": self.cpu_seconds,
            "wall_seconds": self.wall_seconds,
            "peak_memory": self.peak_memory,
            "scratch_bytes": self.scratch_bytes,
            "checkpoint_bytes": self.checkpoint_bytes,
            "rolled_back": self.rolled_back,
        }  # dataclasses.asdict costs ~20 µs: it deep-copies

    @classmethod
    def from_metadata(cls, metadata: Any) -> CellMetrics | None:
        """The figures in an ``execute_reply``'s metadata; None if absent or not what the
        kernel sends (a client treats everything from the kernel as data)."""
        if not isinstance(metadata, dict):
            return None
        figures = metadata.get(METADATA_KEY)
        if not isinstance(figures, dict):
            return None
        values: dict[str, Any] = {}
        for field in fields(cls):
            value = figures.get(field.name)
            if field.type == "bool":
                if not isinstance(value, bool):
                    return None
            elif field.type == "int":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    return None
            elif (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                return None
            values[field.name] = value
        return cls(**values)

    def describe(self) -> str:
        """One line for people (``%sandbox``)."""
        return (
            f"fuel {self.fuel:,}, CPU {self.cpu_seconds:.3f} s, wall {self.wall_seconds:.3f} s,"
            f" peak memory {_mib(self.peak_memory)}, /tmp {_mib(self.scratch_bytes)},"
            f" checkpoint {_mib(self.checkpoint_bytes)}"
            + (", rolled back" if self.rolled_back else "")
        )


def _mib(count: int) -> str:
    return f"{count / (1 << 20):,.1f} MiB"


class CellMeter:
    """Clocks and fuel around one cell's turn, read on the thread that runs the guest.

    ``time.thread_time`` counts that thread's CPU: the guest's WebAssembly and the host
    functions it calls synchronously (file calls, its messages), not its waits (sleep,
    ``input()``), nor the kernel's other threads."""

    def __init__(self, fuel_budget: int, checkpoint_bytes: int):
        self.fuel_budget = fuel_budget
        self.checkpoint_bytes = checkpoint_bytes
        self.fuel_left = fuel_budget
        self.peak_memory = 0
        self._wall = time.perf_counter()
        self._cpu = time.thread_time()
        self.wall_seconds = 0.0
        self.cpu_seconds = 0.0

    def stop(self, fuel_left: int, peak_memory: int) -> None:
        """The turn ended (before any recovery, which is the kernel's work, not the cell's)."""
        self.cpu_seconds = time.thread_time() - self._cpu
        self.wall_seconds = time.perf_counter() - self._wall
        self.fuel_left = fuel_left
        self.peak_memory = peak_memory

    def metrics(self, scratch_bytes: int, rolled_back: bool) -> CellMetrics:
        return CellMetrics(
            fuel=max(0, self.fuel_budget - self.fuel_left),
            cpu_seconds=self.cpu_seconds,
            wall_seconds=self.wall_seconds,
            peak_memory=self.peak_memory,
            scratch_bytes=scratch_bytes,
            checkpoint_bytes=self.checkpoint_bytes,
            rolled_back=rolled_back,
        )
