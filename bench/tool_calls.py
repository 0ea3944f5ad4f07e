"""Cost of a host tool call from the sandbox, against a plain call on the host, same run.

    python bench/tool_calls.py [--calls 500] [--rounds 5] [--json out.json]

Three ways to call the same small function (``lookup(key) -> dict``), each timed per call
over ``--calls`` calls, ``--rounds`` times, rounds alternating:

- host: a plain call in this process (the baseline);
- client tool: a cell's loop calls it as ``sandbox_tools.lookup``; it runs in this process,
  served by ``Session(tools=...)`` over the stdin channel (guest -> kernel -> client -> back);
- operator tool: the same function named by ``WasmKernel.tools``, run in the kernel process
  (guest -> kernel -> back).

The guest times its loop with its own clock (the host's monotonic clock). Reports min and
median microseconds per call and their ratio to the plain host call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from wasm_kernel.client import Session

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tool_functions import lookup  # noqa: E402 (the bench folder, also the kernel's path)

LOOP = (
    "import time\nfrom sandbox_tools import {name}\n"
    "_t = time.perf_counter()\n"
    "for _i in range({calls}): {name}('k' + str(_i))\n"
    "(time.perf_counter() - _t) / {calls}"
)


def host_round(calls: int) -> float:
    began = time.perf_counter()
    for index in range(calls):
        lookup("k" + str(index))
    return (time.perf_counter() - began) / calls


def guest_round(session: Session, name: str, calls: int) -> float:
    execution = session.run(LOOP.format(name=name, calls=calls))
    if execution.error is not None or execution.text is None:
        raise RuntimeError(f"the loop failed: {execution.error}")
    return float(execution.text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write every sample here")
    args = parser.parse_args()
    env = {"PYTHONPATH": str(HERE), "WASM_KERNEL_TOOLS": "operator_lookup=tool_functions:lookup"}
    samples: dict[str, list[float]] = {"host": [], "client tool": [], "operator tool": []}
    with Session(profile="strict", env=env, tools=[lookup]) as session:
        guest_round(session, "lookup", 20)  # warm: imports, first calls
        guest_round(session, "operator_lookup", 20)
        for _ in range(args.rounds):
            samples["host"].append(host_round(args.calls))
            samples["client tool"].append(guest_round(session, "lookup", args.calls))
            samples["operator tool"].append(guest_round(session, "operator_lookup", args.calls))
    base = statistics.median(samples["host"])
    print(f"{'per call':<14} {'min us':>10} {'median us':>10} {'x host (median)':>16}")
    for name, values in samples.items():
        low, mid = min(values) * 1e6, statistics.median(values) * 1e6
        print(f"{name:<14} {low:>10.1f} {mid:>10.1f} {statistics.median(values) / base:>16.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"calls": args.calls, "samples": samples}, indent=1))


if __name__ == "__main__":
    main()
