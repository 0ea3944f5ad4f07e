"""One slider move's round trip: wasm-kernel against the native ipykernel, in one run.

    python bench/slider_round_trip.py [--moves 40]

Each kernel (the ``python3`` and ``wasm-python`` kernelspecs) runs an ``interact`` cell; then
the slider's ``comm_msg`` update is sent as JupyterLab's widget manager sends it, moves
alternating between the kernels, and timed from the send to the output it causes (the
function's print, captured by interact's Output widget) and to the kernel's idle status.
Reported as min / median in milliseconds and as wasm/native ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

from jupyter_client.manager import KernelManager

CELL = (
    "from ipywidgets import interact\n"
    "shown = interact(lambda x: print('twice', 2 * x), x=(0, 1000))\n"
    "shown.widget.children[0].model_id"
)


class Timed:
    def __init__(self, name: str):
        self.name = name
        self.manager = KernelManager(kernel_name=name)
        self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)
        reply = self.client.execute_interactive(CELL, timeout=120, output_hook=self._result)
        assert reply["content"]["status"] == "ok", reply["content"]
        self.to_output: list[float] = []
        self.to_idle: list[float] = []

    def _result(self, msg: dict) -> None:
        if msg["msg_type"] == "execute_result":
            self.slider = eval(msg["content"]["data"]["text/plain"])

    def move(self, value: int) -> None:
        update = {"method": "update", "state": {"value": value}, "buffer_paths": []}
        message = self.client.session.msg("comm_msg", {"comm_id": self.slider, "data": update})
        start = time.perf_counter()
        self.client.shell_channel.send(message)
        msg_id = message["header"]["msg_id"]
        while True:
            msg = self.client.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream" and f"twice {2 * value}" in msg["content"]["text"]:
                self.to_output.append(time.perf_counter() - start)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                self.to_idle.append(time.perf_counter() - start)
                return

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--moves", type=int, default=40)
    moves = parser.parse_args().moves
    native, wasm = Timed("python3"), Timed("wasm-python")
    try:
        for value in range(1, moves + 1):
            native.move(value)
            wasm.move(value)
    finally:
        native.close()
        wasm.close()
    for what in ("to_output", "to_idle"):
        figures = []
        for kernel in (native, wasm):
            times = getattr(kernel, what)
            assert len(times) == moves, (kernel.name, what, len(times))
            figures.append((min(times) * 1000, statistics.median(times) * 1000))
        (n_min, n_med), (w_min, w_med) = figures
        print(
            f"slider move {what.replace('_', ' ')}: native {n_min:.1f} / {n_med:.1f} ms,"
            f" wasm {w_min:.1f} / {w_med:.1f} ms (min / median of {moves});"
            f" ratio {w_min / n_min:.2f} / {w_med / n_med:.2f}"
        )


if __name__ == "__main__":
    main()
