"""%pip install of pure-Python wheels: wasm-kernel against the native ipykernel, in one run.

    python bench/packages.py [--reps N]

Both kernels install the same three wheels (a package and its two dependencies) from the same
local wheelhouse, timed from execute_request to execute_reply through jupyter_client:
the native kernel with ``%pip install --no-index --find-links=HOUSE --target=FRESH_FOLDER``,
wasm-kernel (started with ``--WasmKernel.packages=HOUSE``) with ``%pip install``, uninstalling
between repetitions. Prints min / median seconds and the wasm/native ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from startup_roundtrip import KERNELS, started

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from wheelmaker import make_wheel  # the tests' wheel builder, found through sys.path

PACKAGES = ("bench-top", "bench-middle", "bench-leaf")


def wheelhouse(folder: Path) -> Path:
    for name, needs in zip(PACKAGES, (*PACKAGES[1:], None), strict=True):
        module = name.replace("-", "_")
        make_wheel(
            folder,
            name,
            files={f"{module}/__init__.py": "VALUE = 1\n" * 200},
            requires=(needs,) if needs else (),
        )
    return folder


def timed(client, code: str) -> float:
    began = time.perf_counter()
    reply = client.execute_interactive(code, timeout=300, output_hook=lambda msg: None)
    seconds = time.perf_counter() - began
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed: {reply['content'].get('evalue')}")
    client.execute_interactive("pass", timeout=300)  # the wasm checkpoint runs outside the timing
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    house = wheelhouse(Path(tempfile.mkdtemp(prefix="bench-wheelhouse-")))
    kernels = {
        "native": (KERNELS["native"], []),
        "wasm": (KERNELS["wasm"], [f"--WasmKernel.packages={house}"]),
    }
    clients, managers, samples = {}, [], {label: [] for label in kernels}
    for label, (name, arguments) in kernels.items():
        manager, clients[label] = started(name, arguments)
        managers.append(manager)
        timed(clients[label], "1")
    try:
        for rep in range(args.reps):
            target = tempfile.mkdtemp(prefix="bench-target-")
            native = (
                f"%pip install -q --isolated --no-index --find-links={house}"
                f" --target={target} {PACKAGES[0]}"
            )
            for label in ("native", "wasm") if rep % 2 == 0 else ("wasm", "native"):
                code = native if label == "native" else f"%pip install {PACKAGES[0]}"
                samples[label].append(timed(clients[label], code))
            timed(clients["wasm"], f"%pip uninstall -y {' '.join(PACKAGES)}")
    finally:
        for client in clients.values():
            client.stop_channels()
        for manager in managers:
            manager.shutdown_kernel(now=True)
    for label, values in samples.items():
        print(f"{label:6} min {min(values):.2f} s, median {statistics.median(values):.2f} s")
    native, wasm = samples["native"], samples["wasm"]
    print(
        f"wasm/native: {min(wasm) / min(native):.2f} (min),"
        f" {statistics.median(wasm) / statistics.median(native):.2f} (median)"
    )


if __name__ == "__main__":
    main()
