"""What measuring a cell and auditing it cost, in process, next to the ``x + 1`` turn itself.

    python bench/metrics_cost.py [--cells 300] [--repeat 20000]

On a Sandbox from the boot image (as ``cell_phases``): the ``x + 1`` turn as the kernel runs
it (metrics included), then the measuring alone, repeated on the same interpreter (the
meter's clocks, the fuel and program-break reads, the /tmp size, the metadata dict), and one
audit line written to a file in a temporary folder. Medians in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from cell_phases import CELL, start_as_the_kernel_does

from wasm_kernel.jupyter.audit import AuditLog
from wasm_kernel.sandbox.host_functions import Discard
from wasm_kernel.sandbox.metrics import CellMeter


def per_call(action: object, repeat: int) -> float:
    """Median microseconds of one call, over batches of 100."""
    batches = []
    for _ in range(max(1, repeat // 100)):
        began = time.perf_counter()
        for _ in range(100):
            action()  # type: ignore[operator]
        batches.append((time.perf_counter() - began) / 100)
    return statistics.median(batches) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=20_000)
    args = parser.parse_args()
    sandbox = start_as_the_kernel_does()
    host = Discard()
    try:
        for _ in range(5):
            sandbox.run_cell("x = 1", 1, host)
            sandbox.checkpoint()
        turns = []
        for _ in range(args.cells):
            began = time.perf_counter()
            sandbox.run_cell(CELL, 2, host)
            turns.append(time.perf_counter() - began)
        interpreter = sandbox._interpreter
        scratch = sandbox._scratch

        def measure() -> None:
            meter = CellMeter(10**12, sandbox._checkpoint_held(interpreter))
            meter.stop(interpreter.store.get_fuel(), interpreter.heap_end)
            meter.metrics(scratch.size(), False).as_metadata()

        measuring = per_call(measure, args.repeat)
        figures = sandbox.last_cell.as_metadata() if sandbox.last_cell else {}
        with tempfile.TemporaryDirectory() as folder:
            audit = AuditLog.open(str(Path(folder) / "audit.jsonl"), "bench")
            auditing = per_call(lambda: audit.cell(CELL, "ok", figures), args.repeat)
            audit.close()
    finally:
        sandbox.close()
    turn = statistics.median(turns) * 1e6
    print(f"`{CELL}` turn (metrics included): {turn:.0f} µs median of {args.cells}")
    print(f"measuring one cell: {measuring:.1f} µs ({measuring / turn:.1%} of the turn)")
    print(f"one audit line:     {auditing:.1f} µs ({auditing / turn:.1%} of the turn)")


if __name__ == "__main__":
    main()
