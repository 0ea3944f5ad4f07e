"""Where one bare ``x + 1`` cell's time goes inside the kernel process, phase by phase.

    python bench/cell_phases.py [--cells 80]

In process, on a Sandbox with rollback (checkpoint mode 'auto') started from the cache's boot
image, as the kernel drives it: the guest's turn when the previous cell's checkpoint was not
taken (only the cell's work), the same turn right after a checkpoint (the difference is what
re-touching the pages the checkpoint handled costs), the checkpoint itself, the bytes it
wrote (the pages the cell wrote), and the fuel the turn uses (counts, so steady on a busy
machine where times are not).
"""

from __future__ import annotations

import argparse
import statistics
import time

from wasm_kernel.images import images
from wasm_kernel.runtime.cache import RuntimeCache
from wasm_kernel.runtime.runtime import load_runtime
from wasm_kernel.sandbox.host_functions import Discard
from wasm_kernel.sandbox.limits import Limits
from wasm_kernel.sandbox.sandbox import Sandbox

LIMITS = Limits(fuel=10**12, time_limit=0, memory_limit=1 << 30, output_limit=1 << 20)
CELL = "x + 1"


def start_as_the_kernel_does() -> Sandbox:
    """A sandbox from the boot image, as a kernel starts (a fresh boot if there is none)."""
    cache = RuntimeCache()
    compiled = cache.load(load_runtime())
    boot = images.boot_image_path(cache.entry_dir(compiled.runtime))
    if not boot.exists():
        return Sandbox(compiled, LIMITS)
    image = images.read_image(
        boot,
        needs=images.identity(compiled.runtime.module.sha256),
        memory_limit=LIMITS.memory_limit,
        scratch_limit=LIMITS.scratch_limit,
        memory_file=images.boot_memory_path(boot),
    )
    image.host.cwd = "/tmp"  # as a kernel does: a boot image has no folder of its own
    return Sandbox(compiled, LIMITS, image=image)


def phases(cells: int) -> tuple[dict[str, list[float]], str]:
    """Seconds per phase over ``cells`` cells each, plus the turn's fuel (``fuel``) and the
    bytes each checkpoint wrote (``written``); and how checkpoints were taken."""
    sandbox = start_as_the_kernel_does()
    host = Discard()
    try:
        for _ in range(5):  # imports, caches and the first checkpoints settle
            sandbox.run_cell("x = 1", 1, host)
            sandbox.checkpoint()
        costs: dict[str, list[float]] = {
            "after": [],
            "checkpoint": [],
            "alone": [],
            "fuel": [],
            "written": [],
        }
        for _ in range(cells):
            began = time.perf_counter()
            sandbox.run_cell(CELL, 2, host)
            ran = time.perf_counter()
            costs["fuel"].append(LIMITS.fuel - sandbox._interpreter.store.get_fuel())
            sandbox.checkpoint()
            costs["after"].append(ran - began)
            costs["checkpoint"].append(time.perf_counter() - ran)
            stats = sandbox.checkpoint_stats
            costs["written"].append(stats.written if stats is not None else 0)
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
    print(f"{'written':>10}: {statistics.median(costs['written']) / 1024:.0f} KiB per checkpoint")


if __name__ == "__main__":
    main()
