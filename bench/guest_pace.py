"""The interpreter's own pace: bench/programs in a bare guest, under chosen engine settings.

    python bench/guest_pace.py [--rounds N] [--reps N] [--perfmap] [VARIANT ...]

A VARIANT is ``name`` or ``name:setting=value,setting=value`` over the kernel's engine settings
(``wasm_kernel.runtime.cache.ENGINE_SETTINGS``), e.g. ``nofuel:consume_fuel=False``; ``base``
(the kernel's own settings) and ``native`` (this Python) always run. Rounds alternate the
variants' order. No kernel, IPython or checkpoint is involved: each variant is one process
that instantiates the runtime and runs every program in one turn, so what differs between
variants is the engine alone. Every guest clock reads the CPU time of the thread running the
guest (and native programs are timed with ``time.thread_time``), so other processes' turns on
the cores are not counted. Prints, per program, the best run in ms and its ratio to native, and
the geometric means. A variant's compiled module is kept in a private folder of the user's
cache (``wasm-kernel-bench/guest-pace``), as compiling one takes minutes.

``--perfmap`` makes wasmtime write ``/tmp/perf-PID.map`` for ``perf report``; run one variant
under ``perf record -e cpu-clock`` (the machine's hardware counters may be absent) with
``--one VARIANT`` to attribute samples to guest functions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import platformdirs

BENCH = Path(__file__).resolve().parent
PROGRAMS = BENCH / "programs"
MARKER = "PACE-RESULT "
RUNNER = """\
import json, sys, time
clock = time.thread_time if sys.platform != "wasi" else time.perf_counter
namespace = {{"__name__": "bench_program"}}
exec(compile({source!r}, {name!r}, "exec"), namespace)
namespace["bench"]()
times = []
for _ in range({reps}):
    began = clock()
    namespace["bench"]()
    times.append(clock() - began)
print({marker!r} + json.dumps([{name!r}, times]), flush=True)
"""


def program_source(reps: int) -> str:
    return "\n".join(
        RUNNER.format(source=p.read_text(), name=p.stem, reps=reps, marker=MARKER)
        for p in sorted(PROGRAMS.glob("*.py"))
    )


def parse_variant(text: str) -> tuple[str, dict[str, object]]:
    name, _, rest = text.partition(":")
    settings: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        settings[key] = {"True": True, "False": False}.get(value, value)
        if isinstance(settings[key], str) and value.isdigit():
            settings[key] = int(value)
    return name, settings


def run_guest(overrides: dict[str, object], reps: int, perfmap: bool) -> None:
    """Compile (or reload) the runtime under the kernel's settings plus ``overrides``; run."""
    import wasmtime

    from wasm_kernel.runtime import rewrite
    from wasm_kernel.runtime.cache import (
        ENGINE_SETTINGS,
        RuntimeCache,
        exported,
    )
    from wasm_kernel.runtime.runtime import load_runtime

    cache = RuntimeCache()
    compiled = cache.load(load_runtime())  # the kernel's own entry: its stdlib, its module
    settings = {**ENGINE_SETTINGS, **overrides}
    config = wasmtime.Config()
    for key, value in settings.items():
        setattr(config, key, value)
    if perfmap:
        config.profiler = "perfmap"
    engine = wasmtime.Engine(config)
    if settings == ENGINE_SETTINGS:
        entry_module = cache.entry_dir(compiled.runtime) / cache.MODULE
        module = wasmtime.Module.deserialize_file(engine, str(entry_module))
    else:
        identity = json.dumps([compiled.runtime.key, settings], sort_keys=True)
        folder = platformdirs.user_cache_path("wasm-kernel-bench") / "guest-pace"
        path = folder / (hashlib.sha256(identity.encode()).hexdigest()[:24] + ".cwasm")
        if path.exists():
            module = wasmtime.Module.deserialize_file(engine, str(path))
        else:
            print(f"compiling the runtime with {overrides} (minutes)", file=sys.stderr)
            module = wasmtime.Module(
                engine, rewrite.make_restorable(compiled.runtime.module.path.read_bytes())
            )
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, delete=False) as partial:
                partial.write(module.serialize())  # private (0600) until complete, then renamed
            os.replace(partial.name, path)
    store = wasmtime.Store(engine)
    if settings["consume_fuel"]:
        store.set_fuel(1 << 62)
    if settings["epoch_interruption"]:
        store.set_epoch_deadline(1 << 62)
    wasi = wasmtime.WasiConfig()
    wasi.argv = ["/usr/local/bin/python.wasm"]
    wasi.env = [["HOME", "/tmp"], ["TMPDIR", "/tmp"], ["PYTHONTZPATH", ""]]
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    wasi.preopen_dir(str(compiled.lib_dir), compiled.runtime.lib_guest_dir, False)
    store.set_wasi(wasi)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    linker.allow_shadowing = True
    i32, i64 = wasmtime.ValType.i32(), wasmtime.ValType.i64()

    def thread_clock(caller: wasmtime.Caller, _clock: int, _precision: int, out: int) -> int:
        memory = caller["memory"]
        assert isinstance(memory, wasmtime.Memory)
        memory.write(caller, time.thread_time_ns().to_bytes(8, "little"), out)
        return 0

    linker.define_func(
        "wasi_snapshot_preview1",
        "clock_time_get",
        wasmtime.FuncType([i32, i64, i32], [i32]),
        thread_clock,
        access_caller=True,
    )
    linker.define_func("host", "call", wasmtime.FuncType([i32] * 4, [i32]), lambda *_: -1)
    exports = linker.instantiate(store, module).exports(store)
    if not compiled.runtime.preinitialized:
        exported(exports, "_initialize", wasmtime.Func)(store)
    source = program_source(reps).encode()
    pointer = exported(exports, "host_alloc", wasmtime.Func)(store, len(source))
    exported(exports, "memory", wasmtime.Memory).write(store, source, pointer)
    status = exported(exports, "turn", wasmtime.Func)(store, pointer, len(source))
    store.close()
    if status:
        sys.exit(f"the guest's turn ended with status {status}")


def run_native(reps: int) -> None:
    exec(compile(program_source(reps), "guest_pace", "exec"), {})


def measure(variant: str, reps: int, perfmap: bool) -> dict[str, float]:
    """Best time in ms per program, from a child process running ``variant``."""
    command = [sys.executable, __file__, "--one", variant, "--reps", str(reps)]
    if perfmap:
        command.append("--perfmap")
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    best = {}
    for line in output.splitlines():
        if line.startswith(MARKER):
            name, times = json.loads(line[len(MARKER) :])
            best[name] = min(times) * 1e3
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--perfmap", action="store_true")
    parser.add_argument("--one", help="run this one variant in this process")
    args = parser.parse_args()
    if args.one is not None:
        if args.one == "native":
            run_native(args.reps)
        else:
            run_guest(parse_variant(args.one)[1], args.reps, args.perfmap)
        return
    variants = ["native", "base", *args.variants]
    best: dict[str, dict[str, float]] = {v: {} for v in variants}
    for round_number in range(args.rounds):
        for variant in variants if round_number % 2 == 0 else variants[::-1]:
            for name, ms in measure(variant, args.reps, args.perfmap).items():
                best[variant][name] = min(ms, best[variant].get(name, math.inf))
    names = [parse_variant(v)[0] for v in variants]
    print("program".ljust(16) + "".join(n.rjust(20) for n in names))
    ratios: dict[str, list[float]] = {v: [] for v in variants}
    for program in sorted(best["native"]):
        cells = []
        for variant in variants:
            ms = best[variant][program]
            ratios[variant].append(ms / best["native"][program])
            cells.append(f"{ms:8.1f} ms {ratios[variant][-1]:5.2f}x".rjust(20))
        print(program.ljust(16) + "".join(cells))
    means = [math.exp(sum(map(math.log, ratios[v])) / len(ratios[v])) for v in variants]
    print("geometric mean".ljust(16) + "".join(f"{m:.3f}x".rjust(20) for m in means))


if __name__ == "__main__":
    main()
