"""Build the toy interpreter both ways for wasm32-wasi and time it under wasmtime.

    pip install ziglang   # its clang targets wasm32-wasi with wasi-libc included
    python bench/dispatch/run.py [N]

Prints the best CPU time (of three) of each build under the kernel's limits (fuel and epochs)
and without them, and the native builds' times for comparison.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import wasmtime

HERE = Path(__file__).resolve().parent
SETTINGS = {"fuel + epochs": (True, True), "neither": (False, False)}


def build(folder: Path, style: str, wasm: bool) -> Path:
    out = folder / (f"{style}.wasm" if wasm else style)
    target = ["-target", "wasm32-wasi", "-mtail-call"] if wasm else []
    sources = [str(HERE / "main.c"), str(HERE / f"{style}.c")]
    command = [sys.executable, "-m", "ziglang", "cc", *target, "-O3", "-o", str(out), *sources]
    subprocess.run(command, check=True)
    return out


def run_wasm(path: Path, fuel: bool, epochs: bool, n: int) -> float:
    config = wasmtime.Config()
    config.consume_fuel, config.epoch_interruption, config.wasm_tail_call = fuel, epochs, True
    engine = wasmtime.Engine(config)
    store = wasmtime.Store(engine)
    if fuel:
        store.set_fuel(1 << 62)
    if epochs:
        store.set_epoch_deadline(1 << 62)
    wasi = wasmtime.WasiConfig()
    wasi.argv = ["toy", str(n)]
    store.set_wasi(wasi)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    start = linker.instantiate(store, wasmtime.Module.from_file(engine, str(path)))
    began = time.thread_time()
    try:
        start.exports(store)["_start"](store)  # type: ignore[operator]
    except wasmtime.ExitTrap:
        pass
    return time.thread_time() - began


def run_native(path: Path, n: int) -> float:
    began = time.perf_counter()
    subprocess.run([str(path), str(n)], check=True, capture_output=True)
    return time.perf_counter() - began


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30_000_000
    with tempfile.TemporaryDirectory() as folder:
        for style in ("switch", "tail"):
            wasm, native = build(Path(folder), style, True), build(Path(folder), style, False)
            for label, (fuel, epochs) in SETTINGS.items():
                best = min(run_wasm(wasm, fuel, epochs, n) for _ in range(3))
                print(f"{style:6s} wasm, {label:13s} {best:6.3f} s")
            best = min(run_native(native, n) for _ in range(3))
            print(f"{style:6s} native (wall)        {best:6.3f} s")


if __name__ == "__main__":
    main()
