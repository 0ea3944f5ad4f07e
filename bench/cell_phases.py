"""Where one bare ``x + 1`` cell's time goes inside the kernel process, phase by phase.

    python bench/cell_phases.py [--cells 80]

In process, on a Sandbox with rollback (checkpoint mode 'auto'), as the kernel drives it:
the guest's turn when the previous cell's checkpoint was not taken (only the cell's work),
the same turn right after a checkpoint (the difference is what re-touching the pages the
checkpoint handled costs), the checkpoint itself, and the fuel the turn uses (a count, so
steady on a busy machine where times are not).
"""

from __future__ import annotations

import argparse
import statistics
import time

from wasm_kernel.cache import RuntimeCache
from wasm_kernel.runtime import load_runtime
from wasm_kernel.sandbox import Limits, Sandbox

LIMITS = Limits(fuel=10**12, seconds=0, memory=1 << 30, output=1 << 20)
CELL = "x + 1"


class Quiet:
    def stream(self, name: str, text: str) -> None:
        pass

    def message(self, message: dict, interrupts: object) -> dict:
        return {}


def phases(cells: int) -> tuple[dict[str, list[float]], str]:
    """Seconds per phase over ``cells`` cells each, plus the turn's fuel (``fuel``); and how
    checkpoints were taken."""
    sandbox = Sandbox(RuntimeCache().load(load_runtime()), LIMITS)
    host = Quiet()
    try:
        for _ in range(5):  # imports, caches and the first checkpoints settle
            sandbox.run_cell("x = 1", 1, host)
            sandbox.checkpoint()
        costs: dict[str, list[float]] = {"after": [], "checkpoint": [], "alone": [], "fuel": []}
        for _ in range(cells):
            began = time.perf_counter()
            sandbox.run_cell(CELL, 2, host)
            ran = time.perf_counter()
            costs["fuel"].append(LIMITS.fuel - sandbox._live_store.get_fuel())
            sandbox.checkpoint()
            costs["after"].append(ran - began)
            costs["checkpoint"].append(time.perf_counter() - ran)
        for _ in range(cells):
            began = time.perf_counter()
            sandbox.run_cell(CELL, 2, host)
            costs["alone"].append(time.perf_counter() - began)
        return costs, sandbox.checkpoint_method or "rollback off"
    finally:
        sandbox.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=80)
    costs, method = phases(parser.parse_args().cells)
    for name in ("alone", "after", "checkpoint"):
        samples = costs[name]
        print(f"{name:>10}: {min(samples) * 1e3:.2f} / {statistics.median(samples) * 1e3:.2f} ms")
    print(f"{'fuel':>10}: {statistics.median(costs['fuel']) / 1e6:.2f} M  ({method})")


if __name__ == "__main__":
    main()
