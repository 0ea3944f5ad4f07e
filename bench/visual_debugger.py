"""Cost of JupyterLab's visual debugger: a cell with the panel open and no breakpoint in it,
and stepping over a loop, against the native kernel (debugpy), same run.

    python bench/visual_debugger.py [--rounds 7] [--json out.json]

For each kernel (``wasm-python`` and ipykernel's ``python3``):

- ``fib(20)`` timed inside the cell, with no debug session and with one attached that has a
  breakpoint in another cell. wasm-kernel's rounds alternate (disconnect, then initialize
  again); debugpy's run without a session first, then with one (it is not restarted);
- ``next`` over a call that loops 1,000 times, in a cell stopped at a breakpoint: from the
  request to the ``stopped`` event, as the panel sees it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from jupyter_client.manager import start_new_kernel

FIB = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
TIMED = "import time\n_t = time.perf_counter(); fib(20); print((time.perf_counter() - _t) * 1e3)\n"
ELSEWHERE = "def elsewhere():\n    return 1\n"
LOOP = (
    "def g():\n    s = 0\n    for i in range(1000):\n        s += i\n    return s\n"
    "r = g()\nr += 1\n"
)
INITIALIZE = {"clientID": "bench", "adapterID": "python", "pathFormat": "path"}
INITIALIZE |= {"linesStartAt1": True, "columnsStartAt1": True}


class Panel:
    def __init__(self, kernel_name: str):
        self.manager, self.client = start_new_kernel(kernel_name=kernel_name)
        self.seq = 0
        self.started = False

    def request(self, command: str, **arguments: object) -> dict:
        self.seq += 1
        content = {"type": "request", "seq": self.seq, "command": command, "arguments": arguments}
        self.client.control_channel.send(self.client.session.msg("debug_request", content))
        return self.client.control_channel.get_msg(timeout=120)["content"]

    def attach(self, code: str, line: int) -> None:
        if not self.started:
            self.request("initialize", **INITIALIZE)
            self.request("attach")
            self.started = True
        path = self.request("dumpCell", code=code)["body"]["sourcePath"]
        self.request("setBreakpoints", source={"path": path}, breakpoints=[{"line": line}])
        self.request("configurationDone")

    def run(self, code: str) -> str:
        msg_id, text = self.client.execute(code), ""
        while True:
            message = self.client.get_iopub_msg(timeout=300)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "stream":
                text += message["content"]["text"]
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                return text

    def event(self, name: str) -> None:
        while True:
            message = self.client.get_iopub_msg(timeout=120)
            if message["msg_type"] == "debug_event" and message["content"]["event"] == name:
                return

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def fib_costs(panel: Panel, rounds: int, alternate: bool) -> dict[str, list[float]]:
    panel.run(FIB)
    off: list[float] = []
    on: list[float] = []
    for number in range(rounds):
        if alternate or number == 0:
            off.append(float(panel.run(TIMED)))
        if not alternate:
            continue
        panel.attach(ELSEWHERE, 2)
        on.append(float(panel.run(TIMED)))
        panel.request("disconnect", restart=False, terminateDebuggee=False)
        panel.started = False
    if not alternate:
        off += [float(panel.run(TIMED)) for _ in range(rounds - 1)]
        panel.attach(ELSEWHERE, 2)
        on += [float(panel.run(TIMED)) for _ in range(rounds)]
    return {"no session ms": sorted(off), "session, breakpoint elsewhere ms": sorted(on)}


def step_costs(panel: Panel, rounds: int) -> list[float]:
    panel.attach(LOOP, 6)
    seconds = []
    for _ in range(rounds):
        msg_id = panel.client.execute(LOOP)
        panel.event("stopped")
        began = time.perf_counter()
        panel.request("next", threadId=1)
        panel.event("stopped")
        seconds.append((time.perf_counter() - began) * 1e3)
        panel.request("continue", threadId=1)
        while panel.client.get_shell_msg(timeout=120)["parent_header"].get("msg_id") != msg_id:
            pass
    return sorted(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", default=None, help="where to write the results")
    args = parser.parse_args()
    results = {}
    for name, alternate in (("wasm-python", True), ("python3", False)):
        panel = Panel(name)
        try:
            results[name] = fib_costs(panel, args.rounds, alternate)
            results[name]["next over 1,000 iterations ms"] = step_costs(panel, 3)
        finally:
            panel.close()
        for measure, values in results[name].items():
            print(f"{name:12} {measure:36} {' '.join(f'{v:.2f}' for v in values)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
