"""Cost of transactional cells: checkpoint and rollback time by guest memory size, and cell
round trips, for each checkpoint mode ('auto': copy-on-write where the OS allows; 'copy').

    python bench/checkpoint.py [--reps 7] [--trips 40] [--json out.json]

1. In process: the time of one checkpoint after a one-line cell, with numpy and pandas
   imported, and again with about 500 MiB in use; and what it wrote.
2. In process: the time to put memory and globals back after a trap, with about 500 MiB in
   use, when the trapped cell wrote one variable, and when it rewrote all 430 MiB of ballast.
3. Through jupyter_client: the round trip of ``x + 1`` with rollback on and off, sent
   back to back (the checkpoint of the previous cell may still be running) and after a
   one-second pause (the checkpoint has finished while the "user" was reading).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from jupyter_client.manager import KernelManager

from wasm_kernel.runtime.cache import RuntimeCache
from wasm_kernel.runtime.runtime import load_runtime
from wasm_kernel.sandbox.host_functions import Discard
from wasm_kernel.sandbox.limits import Limits
from wasm_kernel.sandbox.sandbox import Sandbox
from wasm_kernel.sandbox.stops import CellStopped

KERNEL = "wasm-python"
MODES = ("auto", "copy")
STATES = {
    "numpy+pandas": "import numpy, pandas",
    "~500 MiB": "import numpy, pandas\nballast = bytearray(430 * 1024 * 1024)",
}
TRAPPING_CELLS = {
    "one variable written": "x = 2",
    "430 MiB rewritten": "ballast[:] = b'y' * len(ballast)",
}
LIMITS = Limits(fuel=10**13, time_limit=0, memory_limit=3 << 30, output_limit=1 << 20)
TRAP_LIMITS = Limits(fuel=3 * 10**9, time_limit=0, memory_limit=3 << 30, output_limit=1 << 20)


def checkpoint_costs(reps: int, mode: str) -> dict[str, dict[str, float]]:
    compiled = RuntimeCache().load(load_runtime())
    results = {}
    for label, setup in STATES.items():
        sandbox = Sandbox(compiled, LIMITS, checkpoint_mode=mode)
        sandbox.run_cell(setup, 1, Discard())
        samples, written = [], []
        for rep in range(reps + 1):
            sandbox.run_cell("x = 1", rep + 2, Discard())  # marks the state as changed
            sandbox.checkpoint()
            if rep:  # the first one also copies the state the setup made
                samples.append(sandbox.checkpoint_stats.seconds)
                written.append(sandbox.checkpoint_stats.written)
        size_mib = sandbox.checkpoint_stats.bytes / (1 << 20)
        median = statistics.median(samples)
        results[label] = {
            "mib": size_mib,
            "written_mib": statistics.median(written) / (1 << 20),
            "min_ms": min(samples) * 1e3,
            "median_ms": median * 1e3,
            "ms_per_10_mib": median * 1e3 / size_mib * 10,
            "method": sandbox.checkpoint_method,
        }
        sandbox.close()
    return results


def rollback_costs(reps: int, mode: str) -> dict[str, list[float]]:
    """Seconds to restore memory and globals, ~500 MiB state, by what the trapped cell wrote."""
    compiled = RuntimeCache().load(load_runtime())
    sandbox = Sandbox(compiled, LIMITS, checkpoint_mode=mode)
    sandbox.run_cell(STATES["~500 MiB"], 1, Discard())
    sandbox.checkpoint()
    results: dict[str, list[float]] = {}
    for label, code in TRAPPING_CELLS.items():
        samples = results[label] = []
        for rep in range(reps):
            sandbox.limits = TRAP_LIMITS
            try:
                sandbox.run_cell(f"{code}\nwhile True:\n    pass", rep + 2, Discard())
            except CellStopped as stopped:
                assert "rolled back" in stopped.evalue, stopped.evalue
            else:
                raise AssertionError("the trapping cell finished")
            samples.append(sandbox.restore_seconds)
            sandbox.limits = LIMITS
            sandbox.checkpoint()  # after the repair turn, as the kernel does
    sandbox.close()
    return results


def round_trips(
    rollback: bool | None, trips: int, pause: float, kernel_name: str = KERNEL, mode: str = "auto"
) -> list[float]:
    """``x + 1`` round trips with the ~500 MiB state loaded; ``rollback`` None: the kernel's
    default (and the only choice for a kernel other than wasm-python)."""
    manager = KernelManager(kernel_name=kernel_name)
    flags = [] if rollback is None else [f"--WasmKernel.rollback={rollback}"]
    if rollback:
        flags.append(f"--WasmKernel.checkpoint_mode={mode}")
    manager.start_kernel(extra_arguments=flags)
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    client.execute_interactive(
        STATES["~500 MiB"] + "\nx = 1", timeout=120, output_hook=lambda _: None
    )
    samples = []
    for _ in range(trips):
        time.sleep(pause)
        began = time.perf_counter()
        msg_id = client.execute("x + 1")
        while client.get_shell_msg(timeout=60)["parent_header"].get("msg_id") != msg_id:
            pass
        samples.append(time.perf_counter() - began)
    client.stop_channels()
    manager.shutdown_kernel(now=True)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--trips", type=int, default=40)
    parser.add_argument("--json")
    args = parser.parse_args()

    results: dict[str, dict] = {"checkpoint": {}, "rollback": {}, "round_trip": {}}
    print(f"{'mode':<6}{'guest state':<14}{'MiB':>6}{'written':>9}{'min ms':>9}{'median ms':>11}")
    for mode in MODES:
        costs = results["checkpoint"][mode] = checkpoint_costs(args.reps, mode)
        for label, row in costs.items():
            print(
                f"{mode:<6}{label:<14}{row['mib']:>6.0f}{row['written_mib']:>9.2f}"
                f"{row['min_ms']:>9.1f}{row['median_ms']:>11.1f}"
            )
    print(f"\n{'rollback, ~500 MiB guest':<40}{'min ms':>9}{'median ms':>11}")
    for mode in MODES:
        for label, samples in rollback_costs(args.reps, mode).items():
            results["rollback"][f"{mode}, {label}"] = samples
            print(
                f"{mode + ', ' + label:<40}{min(samples) * 1e3:>9.1f}"
                f"{statistics.median(samples) * 1e3:>11.1f}"
            )
    print(f"\n{'x + 1 round trip (~500 MiB guest)':<40}{'min ms':>9}{'median ms':>11}")
    for pause in (0.0, 1.0):
        for rollback, mode in ((False, "auto"), (True, "auto"), (True, "copy")):
            count = args.trips if pause == 0 else args.trips // 4
            samples = round_trips(rollback, count, pause, mode=mode)
            key = f"pause {pause:.0f} s, rollback {f'on ({mode})' if rollback else 'off'}"
            results["round_trip"][key] = samples
            print(f"{key:<40}{min(samples) * 1e3:>9.1f}{statistics.median(samples) * 1e3:>11.1f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
