"""What the private layer over the notebook's folder costs (``WasmKernel.notebook_writes``).

    python bench/notebook_writes.py [--repeat 5]

Three kernels started in the same folder, in the same run: the native ipykernel, wasm-kernel
with ``notebook_writes=refuse`` (today's read-only mount) and with ``overlay``. Each cell times
itself inside its interpreter (best of ``--repeat``):

- reading through the layer: 200 opens and reads of a small CSV beside the notebook, 200
  ``os.path.exists``, one 8 MiB read, and a ``pd.read_csv`` of a 10,000-row file, in the
  untouched folder and again once the layer holds files;
- a cell writing ``data.npy`` (1e6 floats) and ``out.csv`` (1e5 rows) beside the notebook
  (under ``refuse`` the same cell writes to /tmp, the only place it can).

Prints a table of milliseconds and the overlay/refuse and overlay/native ratios.
"""

from __future__ import annotations

import argparse
import ast
import os
import tempfile
from pathlib import Path

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

SETUP = "import os, time, numpy as np, pandas as pd"
READS = {
    "open+read small file x200": "for _ in range(200):\n    open('small.csv').read()",
    "os.path.exists x200": "for _ in range(200):\n    os.path.exists('small.csv')",
    "read 8 MiB file": "open('big.bin', 'rb').read()",
    "pd.read_csv 10,000 rows": "pd.read_csv('rows.csv')",
}
WRITE = (
    "np.save(PLACE + 'data.npy', np.random.default_rng(0).random(1_000_000))\n"
    "pd.DataFrame({'a': range(100_000), 'b': 1.5}).to_csv(PLACE + 'out.csv')"
)


def timed(body: str, repeat: int) -> str:
    """A cell printing the best time of ``body`` in ms, measured inside the interpreter."""
    inner = "\n".join("        " + line for line in body.splitlines())
    return (
        "def _timed():\n    best = float('inf')\n"
        f"    for _ in range({repeat}):\n        start = time.perf_counter()\n{inner}\n"
        "        best = min(best, time.perf_counter() - start)\n    return best * 1000\n_timed()"
    )


def run(client: BlockingKernelClient, code: str) -> object:
    """Run ``code``; its execute_result, read back as a literal (None if it has none)."""
    results: list[object] = []

    def keep(message: dict) -> None:
        if message["msg_type"] == "execute_result":
            results.append(ast.literal_eval(message["content"]["data"]["text/plain"]))

    reply = client.execute_interactive(code, timeout=600, output_hook=keep)
    assert reply["content"]["status"] == "ok", reply["content"]
    return results[-1] if results else None


def measure(kernel: str, arguments: list[str], folder: Path, repeat: int) -> dict[str, float]:
    manager = KernelManager(kernel_name=kernel)
    manager.start_kernel(extra_arguments=arguments, cwd=str(folder))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        place = "'/tmp/'" if "refuse" in " ".join(arguments) else "''"
        run(client, f"{SETUP}\nPLACE = {place}")
        numbers = {name: run(client, timed(body, repeat)) for name, body in READS.items()}
        numbers["write data.npy + out.csv"] = run(client, timed(WRITE, repeat))
        for name, body in READS.items():  # the same reads with files in the layer
            numbers[f"{name}, layer holding files"] = run(client, timed(body, repeat))
        return numbers  # type: ignore[return-value]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    with tempfile.TemporaryDirectory() as top:
        results = {}
        for name, kernel, arguments in (
            ("native", "python3", []),
            ("refuse", "wasm-python", ["--WasmKernel.notebook_writes=refuse"]),
            ("overlay", "wasm-python", ["--WasmKernel.notebook_writes=overlay"]),
        ):
            folder = Path(top) / name
            folder.mkdir()
            (folder / "small.csv").write_text("a,b\n1,2\n" * 10)
            (folder / "big.bin").write_bytes(os.urandom(8 << 20))
            (folder / "rows.csv").write_text("a,b\n" + "1,2.5\n" * 10_000)
            results[name] = measure(kernel, arguments, folder, repeat)
    print(f"{'ms (best of ' + str(repeat) + ')':<48} native  refuse overlay  ov/ref  ov/nat")
    for row in results["overlay"]:
        native, refuse, overlay = (results[k][row] for k in ("native", "refuse", "overlay"))
        print(
            f"{row:<48} {native:6.1f} {refuse:7.1f} {overlay:7.1f}"
            f" {overlay / refuse:7.2f} {overlay / native:7.2f}"
        )


if __name__ == "__main__":
    main()
