"""Cost of transactional cells: checkpoint time by guest memory size, and cell round trips.

    python bench/checkpoint.py [--reps 7] [--trips 40] [--json out.json]

1. In process: the time of one checkpoint (a copy of linear memory up to the break) after
   importing numpy and pandas, and again with about 500 MiB in use; reported per 10 MiB.
2. Through jupyter_client: the round trip of ``x + 1`` with rollback on and off, sent
   back to back (the checkpoint of the previous cell may still be running) and after a
   one-second pause (the checkpoint has finished while the "user" was reading).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from jupyter_client.manager import KernelManager

from wasm_kernel.cache import RuntimeCache
from wasm_kernel.runtime import load_runtime
from wasm_kernel.sandbox import Limits, Sandbox

KERNEL = "wasm-python"
STATES = {
    "numpy+pandas": "import numpy, pandas",
    "~500 MiB": "import numpy, pandas\nballast = bytearray(430 * 1024 * 1024)",
}


class Quiet:
    def stream(self, name: str, text: str) -> None:
        pass

    def message(self, message: dict, interrupts: object) -> dict:
        return {}


def checkpoint_costs(reps: int) -> dict[str, dict[str, float]]:
    compiled = RuntimeCache().load(load_runtime())
    results = {}
    for label, setup in STATES.items():
        sandbox = Sandbox(compiled, Limits(fuel=10**13, seconds=0, memory=3 << 30, output=1 << 20))
        sandbox.run_cell(setup, 1, Quiet())
        samples = []
        for rep in range(reps + 1):
            sandbox.run_cell("x = 1", rep + 2, Quiet())  # marks the state as changed
            sandbox.checkpoint()
            if rep:  # the first copy also faults in the buffer's pages
                samples.append(sandbox.checkpoint_stats.seconds)
        size_mib = sandbox.checkpoint_stats.bytes / (1 << 20)
        median = statistics.median(samples)
        results[label] = {
            "mib": size_mib,
            "min_ms": min(samples) * 1e3,
            "median_ms": median * 1e3,
            "ms_per_10_mib": median * 1e3 / size_mib * 10,
        }
        sandbox.close()
    return results


def round_trips(
    rollback: bool | None, trips: int, pause: float, kernel_name: str = KERNEL
) -> list[float]:
    """``x + 1`` round trips with the ~500 MiB state loaded; ``rollback`` None: the kernel's
    default (and the only choice for a kernel other than wasm-python)."""
    manager = KernelManager(kernel_name=kernel_name)
    rollback_flag = [] if rollback is None else [f"--WasmKernel.rollback={rollback}"]
    manager.start_kernel(extra_arguments=rollback_flag)
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

    costs = checkpoint_costs(args.reps)
    print(f"{'guest state':<14}{'MiB':>8}{'min ms':>9}{'median ms':>11}{'ms/10 MiB':>11}")
    for label, row in costs.items():
        print(
            f"{label:<14}{row['mib']:>8.0f}{row['min_ms']:>9.1f}{row['median_ms']:>11.1f}"
            f"{row['ms_per_10_mib']:>11.2f}"
        )

    trips: dict[str, dict[str, float]] = {}
    for pause in (0.0, 1.0):
        for rollback in (False, True):
            samples = round_trips(rollback, args.trips if pause == 0 else args.trips // 4, pause)
            key = f"pause {pause:.0f} s, rollback {'on' if rollback else 'off'}"
            trips[key] = {
                "min_ms": min(samples) * 1e3,
                "median_ms": statistics.median(samples) * 1e3,
            }
    print(f"\n{'x + 1 round trip (~500 MiB guest)':<36}{'min ms':>9}{'median ms':>11}")
    for key, row in trips.items():
        print(f"{key:<36}{row['min_ms']:>9.1f}{row['median_ms']:>11.1f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"checkpoint": costs, "round_trip": trips}, out, indent=1)


if __name__ == "__main__":
    main()
