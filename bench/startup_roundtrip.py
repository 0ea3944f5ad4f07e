"""Kernel start and cell round trip: wasm-kernel against the native ipykernel, same run.

    python bench/startup_roundtrip.py [--starts 5] [--trips 200] [--json out.json]

Start: from KernelManager.start_kernel() to the execute_reply of a first trivial cell
(warm compiled-runtime cache). Round trip: execute_request of ``x + 1`` to its
execute_reply, through jupyter_client's blocking client. Reports min / median and the
ratio of medians (wasm / native).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from jupyter_client.manager import KernelManager

KERNELS = {"native": "python3", "wasm": "wasm-python"}


def await_reply(client, msg_id: str, timeout: float = 120) -> None:
    """Wait for the shell reply to ``msg_id`` (ZMQ queues the request until the kernel binds);
    an error reply stops the bench, which would otherwise time a failure."""
    reply = client.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = client.get_shell_msg(timeout=timeout)
    content = reply["content"]
    if content.get("status") != "ok":
        raise RuntimeError(
            f"the bench's cell failed: {content.get('ename')}: {content.get('evalue')}"
        )


def started(kernel_name: str, arguments: list[str]) -> tuple[KernelManager, Any]:
    """A running kernel and its ready client, for benches that time cells in it."""
    manager = KernelManager(kernel_name=kernel_name)
    manager.start_kernel(extra_arguments=arguments)
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=300)
    return manager, client


def time_start(
    kernel_name: str, env: dict[str, str] | None = None, timeout: float = 120, code: str = "1"
) -> float:
    """Seconds from start_kernel() to the execute_reply of a first cell ``code``; ``env``
    replaces the kernel's environment (e.g. to point its caches at an empty folder)."""
    manager = KernelManager(kernel_name=kernel_name)
    began = time.perf_counter()
    manager.start_kernel(**({"env": env} if env is not None else {}))
    client = manager.client()
    client.start_channels()
    await_reply(client, client.execute(code), timeout)
    elapsed = time.perf_counter() - began
    client.stop_channels()
    manager.shutdown_kernel(now=True)
    return elapsed


def time_round_trips(kernel_name: str, trips: int) -> list[float]:
    manager = KernelManager(kernel_name=kernel_name)
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    await_reply(client, client.execute("x = 1"))
    samples = []
    for _ in range(trips):
        began = time.perf_counter()
        await_reply(client, client.execute("x + 1"))
        samples.append(time.perf_counter() - began)
    client.stop_channels()
    manager.shutdown_kernel(now=True)
    return samples


def summarize(samples: list[float]) -> dict[str, float]:
    return {"min_ms": min(samples) * 1e3, "median_ms": statistics.median(samples) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--trips", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, float]]] = {"start": {}, "round_trip": {}}
    for label, name in KERNELS.items():
        time_start(name)  # warm the OS file cache and compiled-runtime cache
        results["start"][label] = summarize([time_start(name) for _ in range(args.starts)])
        results["round_trip"][label] = summarize(time_round_trips(name, args.trips))
    print(f"{'measure':<12}{'kernel':<8}{'min ms':>10}{'median ms':>12}{'ratio':>8}")
    for measure, by_kernel in results.items():
        ratio = by_kernel["wasm"]["median_ms"] / by_kernel["native"]["median_ms"]
        for label, stats in by_kernel.items():
            shown = f"{ratio:.2f}" if label == "wasm" else ""
            print(
                f"{measure:<12}{label:<8}{stats['min_ms']:>10.1f}{stats['median_ms']:>12.1f}{shown:>8}"
            )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
