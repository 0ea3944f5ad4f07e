"""The benchmark suite: wasm-kernel against the native ipykernel, side by side in one run.

    python bench/run.py [--quick] [--json results.json] [--markdown] [--only SECTION ...]

Needs numpy and pandas in this environment for the native side of section 4
(``pip install '.[bench]'``); without them that section reports "native n/a".

Sections (each figure measured for the native ``python3`` kernelspec and for ``wasm-python``
in the same run, reported as min / median over repetitions and as wasm/native ratios of the
minimums and of the medians; a ratio above 1 means wasm-kernel is slower or larger):

1. start: kernel start to the first execute_reply, warm caches, of a trivial first cell and
   of ``import numpy, pandas``; the same for an ipykernel kernel that runs nothing
   (``bench/null_kernel.py``: the floor for any kernel built on ipykernel); and with cold caches
   (wasm: an empty ``WASM_KERNEL_CACHE_DIR``, so the runtime is compiled, once; native: an
   empty ``PYTHONPYCACHEPREFIX``, so every module is compiled to bytecode). ``--quick``
   skips the cold start.
2. roundtrip: ``x + 1`` through jupyter_client; 1000 tiny cells through nbclient.
3. cpu: the pure-Python programs in ``bench/programs/*.py``, timed inside each kernel with
   ``time.perf_counter()`` (same cell source for both); geometric mean of the ratios.
4. numeric: the numpy/pandas programs in ``bench/programs/numeric/*.py``, the same way.
5. memory: RSS and PSS (``/proc/<pid>/smaps_rollup``, plus a copy-on-write checkpoint's
   pages that are not mapped) of one idle kernel, of five and of ten.
6. checkpoint: wasm-kernel's checkpoint per cell and its rollback, by checkpoint mode
   (``bench/checkpoint.py``), and the ``x + 1`` round trip with ~500 MiB of state, native
   against rollback off and on.
7. images: ``%snapshot save`` and ``%snapshot restore`` (cell round trips) and the image's
   size on disk, for an idle session and one with numpy and pandas loaded and a 64 MiB
   array and DataFrame; a kernel's start from such an image (``resume_from``) to the first
   execute_reply, against the native kernel's plain start; and ``Session.fork()`` of a
   session with 100 MiB of data to the fork's first reply (``bench/forks.py``).
8. starts: kernels from the kernel server against launched ones and native ones
   (``bench/starts.py``): many started and stopped one after another, idle memory per kernel
   with five running, and where a served start's time goes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cell_phases
import checkpoint as checkpoint_bench
import forks
import nbformat
import starts
import startup_roundtrip
from jupyter_client.manager import KernelManager
from memory_use import memory_kib
from nbclient import NotebookClient
from rows import row

from wasm_kernel.runtime.cache import default_cache_dir
from wasm_kernel.runtime.runtime import load_runtime

BENCH = Path(__file__).resolve().parent
PROGRAMS = BENCH / "programs"
NATIVE, WASM = startup_roundtrip.KERNELS["native"], startup_roundtrip.KERNELS["wasm"]
SECTIONS = ("start", "roundtrip", "cpu", "numeric", "memory", "checkpoint", "images", "starts")
MARKER = "BENCH-RESULT "

# Repetitions: (full run, --quick).
SETTINGS = {
    "starts": (9, 3),
    "cold_native_starts": (3, 0),
    "trip_rounds": (3, 1),
    "phase_cells": (200, 60),
    "trips_per_round": (100, 60),
    "notebook_cells": (1000, 1000),
    "notebook_reps": (3, 1),
    "program_rounds": (3, 1),
    "reps_per_round": (3, 3),
    "idle_one_reps": (5, 2),
    "idle_ten_reps": (2, 1),
    "checkpoint_reps": (7, 3),
    "checkpoint_trips": (40, 12),
    "image_reps": (5, 2),
    "serial_kernels": (50, 50),
    "serial_rounds": (3, 1),
    "starts_idle_reps": (3, 1),
    "phase_starts": (15, 5),
}
IMAGE_STATES = {
    "idle": "_bench_x = 1",
    "numpy+pandas, 64 MiB of data": (
        "import numpy as np, pandas as pd\n"
        "_bench_array = np.random.default_rng(1).random(4 << 20)\n"  # 32 MiB of float64
        "_bench_frame = pd.DataFrame({'a': np.arange(2 << 20), 'b': np.arange(2 << 20) * 0.5})"
    ),
}

# A program runs once to warm up (and check itself), then ``reps`` timed runs, in one cell.
# It is exec'd in a fresh namespace so programs cannot see each other's names.
PROGRAM_CELL = """\
import json as _bench_json, time as _bench_time
_bench_ns = {{"__name__": "bench_program"}}
exec(compile({source!r}, {filename!r}, "exec"), _bench_ns)
_bench_ns["bench"]()
_bench_times = []
for _ in range({reps}):
    _bench_began = _bench_time.perf_counter()
    _bench_ns["bench"]()
    _bench_times.append(_bench_time.perf_counter() - _bench_began)
print({marker!r} + _bench_json.dumps(_bench_times))
del _bench_ns, _bench_times
"""

VERSIONS_CELL = f"""\
import json as _bench_json, platform as _bench_platform
_bench_versions = {{"python": _bench_platform.python_version()}}
for _bench_name in ("numpy", "pandas"):
    try:
        _bench_versions[_bench_name] = __import__(_bench_name).__version__
    except ImportError:
        _bench_versions[_bench_name] = None
print({MARKER!r} + _bench_json.dumps(_bench_versions))
"""


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


# -- kernels ---------------------------------------------------------------------------------


class Kernel:
    """One running kernel with a blocking client, for cells whose output we read back."""

    def __init__(self, name: str, extra_arguments: tuple[str, ...] = ()):
        self.name = name
        self.manager = KernelManager(kernel_name=name)
        self.manager.start_kernel(extra_arguments=list(extra_arguments))
        self.client = self.manager.client()
        self.client.start_channels()

    def ready(self) -> Kernel:
        self.client.wait_for_ready(timeout=300)
        self.run("_bench_x = 1")  # the wasm sandbox has booted once this is answered
        return self

    @property
    def pid(self) -> int:
        return self.manager.provisioner.process.pid

    def run(self, code: str, timeout: float = 900) -> str:
        """Run ``code``; return its stdout. A cell error (a failed self-check) raises."""
        chunks: list[str] = []

        def hook(msg: dict) -> None:
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                chunks.append(msg["content"]["text"])

        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=hook)
        content = reply["content"]
        if content["status"] != "ok":
            trace = "\n".join(content.get("traceback", []))
            raise CellFailed(content.get("ename", "?"), content.get("evalue", ""), trace)
        # A wasm-kernel checkpoints after the reply; wait for it so that it does not run
        # while the other kernel is being timed.
        self.client.execute_interactive("pass", timeout=timeout)
        return "".join(chunks)

    def result(self, code: str) -> object:
        output = self.run(code)
        lines = [line for line in output.splitlines() if line.startswith(MARKER)]
        if len(lines) != 1:
            raise RuntimeError(f"{self.name}: no result line in output {output!r}")
        return json.loads(lines[0][len(MARKER) :])

    def stop(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


class CellFailed(RuntimeError):
    def __init__(self, ename: str, evalue: str, trace: str):
        super().__init__(f"{ename}: {evalue}\n{trace}")
        self.ename = ename


# -- 1. start ----------------------------------------------------------------------------------

FIRST_IMPORTS = "import numpy, pandas"  # what a data notebook's first cell does


def bench_start(cfg: dict, quick: bool) -> list[dict]:
    rows = []
    for code, what in (
        ("1", "a first cell `1`"),
        (FIRST_IMPORTS, f"a first cell `{FIRST_IMPORTS}`"),
    ):
        samples: dict[str, list[float]] = {NATIVE: [], WASM: []}
        for name in samples:  # warm the OS file cache and the compiled-runtime cache
            startup_roundtrip.time_start(name, code=code)
        for i in range(cfg["starts"]):
            for name in (NATIVE, WASM) if i % 2 else (WASM, NATIVE):
                samples[name].append(startup_roundtrip.time_start(name, code=code))
        rows.append(
            row(
                "start",
                f"kernel start to the execute_reply of {what}, warm cache",
                "ms",
                [s * 1e3 for s in samples[NATIVE]],
                [s * 1e3 for s in samples[WASM]],
            )
        )
    rows.append(floor_row(cfg))
    if quick:
        return rows
    cold: dict[str, list[float]] = {NATIVE: [], WASM: []}
    for _ in range(cfg["cold_native_starts"]):
        with tempfile.TemporaryDirectory(prefix="bench-pycache-") as empty:
            env = {**os.environ, "PYTHONPYCACHEPREFIX": empty}
            cold[NATIVE].append(startup_roundtrip.time_start(NATIVE, env))
    log("cold wasm start: compiling the runtime into an empty cache (1-4 minutes)")
    with tempfile.TemporaryDirectory(prefix="bench-wasm-cache-") as empty:
        env = {**os.environ, "WASM_KERNEL_CACHE_DIR": empty}
        # a kernel never downloads: the runtime's files and the guest's packages come from
        # `install`, as for users; only the compiled runtime is missing
        for entry in [*default_cache_dir().glob("guest-*"), *default_cache_dir().glob("runtime-*")]:
            (Path(empty) / entry.name).symlink_to(entry)
        cold[WASM].append(startup_roundtrip.time_start(WASM, env, timeout=900))
    rows.append(
        row(
            "start",
            "kernel start to first execute_reply, cold cache",
            "s",
            cold[NATIVE],
            cold[WASM],
            "native: empty PYTHONPYCACHEPREFIX; wasm: empty WASM_KERNEL_CACHE_DIR",
        )
    )
    return rows


def floor_row(cfg: dict) -> dict:
    """The native kernel against an ipykernel kernel that runs nothing (null_kernel.py): what
    ipykernel's own start costs any kernel built on it, wasm-kernel included."""
    with tempfile.TemporaryDirectory(prefix="bench-null-kernel-") as folder:
        spec = Path(folder) / "kernels" / "null"
        spec.mkdir(parents=True)
        script = Path(__file__).with_name("null_kernel.py")
        argv = [sys.executable, str(script), "-f", "{connection_file}"]
        (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python"}))
        saved = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, (folder, saved)))
        try:
            samples: dict[str, list[float]] = {NATIVE: [], "null": []}
            for name in samples:
                startup_roundtrip.time_start(name)
            for i in range(cfg["starts"]):
                for name in (NATIVE, "null") if i % 2 else ("null", NATIVE):
                    samples[name].append(startup_roundtrip.time_start(name))
        finally:
            if saved is None:
                del os.environ["JUPYTER_PATH"]
            else:
                os.environ["JUPYTER_PATH"] = saved
    return row(
        "start",
        "kernel start to the execute_reply of a first cell `1`: an ipykernel kernel that runs"
        " nothing (the floor for kernels built on ipykernel)",
        "ms",
        [s * 1e3 for s in samples[NATIVE]],
        [s * 1e3 for s in samples["null"]],
        "the wasm column is bench/null_kernel.py, not wasm-kernel",
    )


# -- 2. round trip and nbclient throughput ----------------------------------------------------


def time_notebook(name: str, cells: int, reps: int) -> list[float]:
    """Seconds to run ``cells`` tiny cells (``x + i``, each with a result) through nbclient,
    kernel start excluded; ``reps`` passes over the same notebook in one kernel."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("x = 0")]
    notebook.cells += [nbformat.v4.new_code_cell(f"x + {i}") for i in range(cells)]
    client = NotebookClient(notebook, kernel_name=name, timeout=120)
    samples = []
    with client.setup_kernel():
        client.execute_cell(notebook.cells[0], 0)
        for _ in range(reps):
            began = time.perf_counter()
            for index in range(1, cells + 1):
                client.execute_cell(notebook.cells[index], index)
            samples.append(time.perf_counter() - began)
    last = notebook.cells[-1].outputs[0]["data"]["text/plain"]
    if last != str(cells - 1):
        raise RuntimeError(f"{name}: the last cell gave {last!r}")
    return samples


def bench_roundtrip(cfg: dict, quick: bool) -> list[dict]:
    trips: dict[str, list[float]] = {NATIVE: [], WASM: []}
    for i in range(cfg["trip_rounds"]):
        for name in (NATIVE, WASM) if i % 2 == 0 else (WASM, NATIVE):
            trips[name] += startup_roundtrip.time_round_trips(name, cfg["trips_per_round"])
    notebook = {
        name: time_notebook(name, cfg["notebook_cells"], cfg["notebook_reps"])
        for name in (NATIVE, WASM)
    }
    cells = cfg["notebook_cells"]
    phases, method = cell_phases.phases(cfg["phase_cells"])
    fuel = statistics.median(phases["fuel"]) / 1e6
    in_process = [
        row(
            "roundtrip",
            f"`x + 1` in process: {label}",
            "ms",
            None,
            [s * 1e3 for s in samples],
            note,
        )
        for label, samples, note in (
            ("guest turn alone", phases["alone"], f"{fuel:.2f} M fuel; no native counterpart"),
            (
                "guest turn after a checkpoint",
                phases["after"],
                "the difference from the turn alone is re-touching the pages the checkpoint"
                " handled",
            ),
            (
                "checkpoint",
                phases["checkpoint"],
                f"{statistics.median(phases['written']) / 1024:.0f} KiB written per cell; {method}",
            ),
        )
    ]
    return in_process + [
        row(
            "roundtrip",
            "`x + 1` round trip through jupyter_client",
            "ms",
            [s * 1e3 for s in trips[NATIVE]],
            [s * 1e3 for s in trips[WASM]],
        ),
        row(
            "roundtrip",
            f"{cells} tiny cells through nbclient",
            "s",
            notebook[NATIVE],
            notebook[WASM],
            "cells/s (median): "
            + ", ".join(
                f"{label} {cells / statistics.median(notebook[name]):.0f}"
                for label, name in (("native", NATIVE), ("wasm", WASM))
            ),
        ),
    ]


# -- 3. and 4. programs timed inside the kernels ----------------------------------------------


def time_programs(
    folder: Path, cfg: dict, section: str, versions: dict | None = None
) -> tuple[list[dict], dict]:
    """Each program of ``folder`` in both kernels, rounds alternating between them."""
    programs = sorted(folder.glob("*.py"))
    kernels = {name: Kernel(name) for name in (NATIVE, WASM)}
    samples: dict[str, dict[str, list[float]]] = {p.stem: {NATIVE: [], WASM: []} for p in programs}
    unavailable: dict[str, str] = {}
    try:
        for kernel in kernels.values():
            kernel.ready()
            if versions is not None:
                versions[kernel.name] = kernel.result(VERSIONS_CELL)
        for program in programs:
            cell = PROGRAM_CELL.format(
                source=program.read_text(),
                filename=program.name,
                reps=cfg["reps_per_round"],
                marker=MARKER,
            )
            for i in range(cfg["program_rounds"]):
                for name in (NATIVE, WASM) if i % 2 == 0 else (WASM, NATIVE):
                    if name in unavailable:
                        continue
                    try:
                        times = kernels[name].result(cell)
                    except CellFailed as failure:
                        if failure.ename != "ModuleNotFoundError" or name != NATIVE:
                            raise RuntimeError(
                                f"{program.name} failed in {name}: {failure}"
                            ) from failure
                        unavailable[name] = str(failure).splitlines()[0]
                        continue
                    samples[program.stem][name] += [t * 1e3 for t in times]
            log(f"{section}: {program.stem} done")
    finally:
        for kernel in kernels.values():
            kernel.stop()
    rows = []
    for program in programs:
        by_kernel = samples[program.stem]
        note = "native n/a: " + unavailable[NATIVE] if NATIVE in unavailable else ""
        rows.append(
            row(section, program.stem, "ms", by_kernel[NATIVE] or None, by_kernel[WASM], note)
        )
    return rows, unavailable


def summary_row(section: str, measure: str, rows: list[dict]) -> dict:
    timed = [r for r in rows if "ratio_median" in r]
    result = {
        "section": section,
        "measure": measure,
        "unit": "ratio",
        "native": None,
        "wasm": None,
        "note": f"geometric mean over {len(timed)} programs",
    }
    if timed:
        result["ratio_min"] = geomean([r["ratio_min"] for r in timed])
        result["ratio_median"] = geomean([r["ratio_median"] for r in timed])
    return result


def bench_cpu(cfg: dict, quick: bool, versions: dict) -> list[dict]:
    rows, _ = time_programs(PROGRAMS, cfg, "cpu", versions)
    return rows + [summary_row("cpu", "pure-Python suite, geometric mean", rows)]


def bench_numeric(cfg: dict, quick: bool, versions: dict) -> list[dict]:
    rows, unavailable = time_programs(PROGRAMS / "numeric", cfg, "numeric", versions)
    if unavailable:
        log("numeric: native n/a (pip install numpy pandas, or pip install '.[bench]')")
    return rows + [summary_row("numeric", "numpy/pandas, geometric mean", rows)]


# -- 5. memory -------------------------------------------------------------------------------


def idle_memory(name: str, count: int, extra_arguments: tuple[str, ...] = ()) -> dict[str, int]:
    """Summed Rss/Pss (KiB) of ``count`` kernels, each idle after one trivial cell."""
    kernels = [Kernel(name, extra_arguments) for _ in range(count)]
    try:
        for kernel in kernels:
            kernel.ready()
        time.sleep(2)  # let start-up garbage and the first checkpoint settle
        totals = {"Rss": 0, "Pss": 0}
        for kernel in kernels:
            for key, value in memory_kib(kernel.pid).items():
                totals[key] += value
        return totals
    finally:
        for kernel in kernels:
            kernel.stop()


def bench_memory(cfg: dict, quick: bool) -> list[dict]:
    rows = []
    plans = [
        ("one idle kernel", 1, cfg["idle_one_reps"], ()),
        ("ten idle kernels (total)", 10, cfg["idle_ten_reps"], ()),
        ("five idle kernels (total)", 5, cfg["idle_ten_reps"], ()),
        (
            "five idle kernels (total), wasm copy checkpoints",
            5,
            cfg["idle_ten_reps"],
            ("--WasmKernel.checkpoint_mode=copy",),
        ),
        (
            "one idle kernel, wasm rollback off",
            1,
            cfg["idle_one_reps"],
            ("--WasmKernel.rollback=False",),
        ),
    ]
    for label, count, reps, wasm_arguments in plans:
        measured: dict[str, list[dict[str, int]]] = {NATIVE: [], WASM: []}
        for _ in range(reps):
            measured[NATIVE].append(idle_memory(NATIVE, count))
            measured[WASM].append(idle_memory(WASM, count, wasm_arguments))
        for key in ("Rss", "Pss"):
            rows.append(
                row(
                    "memory",
                    f"{key.upper()}, {label}",
                    "MiB",
                    [m[key] / 1024 for m in measured[NATIVE]],
                    [m[key] / 1024 for m in measured[WASM]],
                )
            )
        log(f"memory: {label} done")
    return rows


# -- 6. checkpoint -----------------------------------------------------------------------------


def bench_checkpoint(cfg: dict, quick: bool) -> list[dict]:
    rows = []
    reps = cfg["checkpoint_reps"]
    for mode in checkpoint_bench.MODES:
        for label, cost in checkpoint_bench.checkpoint_costs(reps, mode).items():
            rows.append(
                {
                    "section": "checkpoint",
                    "measure": f"one checkpoint, guest state {label}, mode {mode}",
                    "unit": "ms",
                    "native": None,
                    "wasm": {"min": cost["min_ms"], "median": cost["median_ms"], "n": reps},
                    "note": f"{cost['mib']:.0f} MiB held, {cost['written_mib']:.2f} MiB written"
                    f" (median); {cost['method']}; no native counterpart",
                }
            )
        for label, samples in checkpoint_bench.rollback_costs(reps, mode).items():
            rows.append(
                row(
                    "checkpoint",
                    f"rollback of a ~500 MiB guest, {label}, mode {mode}",
                    "ms",
                    None,
                    [s * 1e3 for s in samples],
                    "memory and globals put back; no native counterpart",
                )
            )
    log("checkpoint: in-process costs done")
    trips = cfg["checkpoint_trips"]
    for pause in (0.0, 1.0):
        count = trips if pause == 0 else max(trips // 4, 3)
        native = checkpoint_bench.round_trips(None, count, pause, kernel_name=NATIVE)
        for rollback, mode in ((False, "auto"), *((True, mode) for mode in checkpoint_bench.MODES)):
            wasm = checkpoint_bench.round_trips(rollback, count, pause, mode=mode)
            when = "back to back" if pause == 0 else f"after a {pause:.0f} s pause"
            rows.append(
                row(
                    "checkpoint",
                    f"`x + 1` round trip, ~500 MiB state, {when},"
                    f" rollback {f'on ({mode})' if rollback else 'off'}",
                    "ms",
                    [s * 1e3 for s in native],
                    [s * 1e3 for s in wasm],
                )
            )
    return rows


def timed_cell(kernel: Kernel, code: str) -> float:
    began = time.perf_counter()
    kernel.run(code)
    return time.perf_counter() - began


def bench_images(cfg: dict, quick: bool) -> list[dict]:
    rows = []
    native_starts = [startup_roundtrip.time_start(NATIVE) for _ in range(cfg["image_reps"])]
    for label, setup in IMAGE_STATES.items():
        with tempfile.TemporaryDirectory(prefix="bench-images-") as folder:
            kernel = Kernel(WASM, (f"--WasmKernel.snapshot_dir={folder}",)).ready()
            try:
                kernel.run(setup)
                saves, restores = [], []
                for _ in range(cfg["image_reps"]):
                    saves.append(timed_cell(kernel, "%snapshot save bench"))
                    restores.append(timed_cell(kernel, "%snapshot restore bench"))
            finally:
                kernel.stop()
            size = (Path(folder) / "bench.wkimg").stat().st_size / (1 << 20)
            env = {**os.environ, "WASM_KERNEL_SNAPSHOT_DIR": folder}
            env["WASM_KERNEL_RESUME_FROM"] = "bench"
            resumes = [startup_roundtrip.time_start(WASM, env) for _ in range(cfg["image_reps"])]
        note = f"image {size:.1f} MiB on disk"
        rows += [
            row("images", f"`%snapshot save`, {label}", "ms", None, [s * 1e3 for s in saves], note),
            row("images", f"`%snapshot restore`, {label}", "ms", None, [s * 1e3 for s in restores]),
            row(
                "images",
                f"start from the image to first execute_reply, {label}",
                "ms",
                [s * 1e3 for s in native_starts],
                [s * 1e3 for s in resumes],
                "native: a plain start",
            ),
        ]
        log(f"images: {label} done ({note})")
    return rows + forks.fork_rows(cfg)


# -- table and main ----------------------------------------------------------------------------


def number(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def pair(result: dict | None) -> str:
    return f"{number(result['min'])} / {number(result['median'])}" if result else "n/a"


def ratio_text(result: dict) -> str:
    if "ratio_median" not in result:
        return "n/a"
    return f"{number(result['ratio_min'])} / {number(result['ratio_median'])}"


def table(rows: list[dict]) -> str:
    header = ("measure", "unit", "native min / median", "wasm min / median", "ratio min / median")
    body = [
        (r["measure"], r["unit"], pair(r["native"]), pair(r["wasm"]), ratio_text(r)) for r in rows
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = []
    section = None
    for r, line in zip([None, *rows], [header, *body], strict=True):
        if r is not None and r["section"] != section:
            section = r["section"]
            lines.append(f"-- {section}")
        lines.append(
            "  ".join(
                cell.ljust(w) if i < 2 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            )
        )
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    lines = [
        "| measure | unit | native min / median | wasm-kernel min / median | ratio min / median |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['measure']} | {r['unit']} | {pair(r['native'])} | {pair(r['wasm'])}"
            f" | {ratio_text(r)} |"
        )
    return "\n".join(lines)


def meta(args: argparse.Namespace, versions: dict) -> dict:
    from importlib.metadata import version

    memory = next(
        line
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "quick": args.quick,
        "machine": {
            "cpus": os.cpu_count(),
            "memory_kib": int(memory.split()[1]),
            "platform": platform.platform(),
        },
        "native": {
            "kernelspec": NATIVE,
            "python": platform.python_version(),
            "ipykernel": version("ipykernel"),
            "jupyter_client": version("jupyter_client"),
            "nbclient": version("nbclient"),
        },
        "wasm": {
            "kernelspec": WASM,
            "wasm-kernel": version("wasm-kernel"),
            "wasmtime": version("wasmtime"),
            "runtime": load_runtime().name,  # its wheel is not installed: see runtime.py
        },
        "kernel_versions": versions,
        "ratio": (
            "wasm / native (of the minimums and of the medians); above 1: wasm slower or larger"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions, no cold start (a few minutes)"
    )
    parser.add_argument("--json", default="results.json", help="where to write the results")
    parser.add_argument(
        "--markdown", action="store_true", help="also print the table in Markdown (as in README.md)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        help="run only these sections",
    )
    args = parser.parse_args()
    cfg = {key: value[1 if args.quick else 0] for key, value in SETTINGS.items()}
    versions: dict[str, dict] = {}
    runners: dict[str, Callable[[], list[dict]]] = {
        "start": lambda: bench_start(cfg, args.quick),
        "roundtrip": lambda: bench_roundtrip(cfg, args.quick),
        "cpu": lambda: bench_cpu(cfg, args.quick, versions),
        "numeric": lambda: bench_numeric(cfg, args.quick, versions),
        "memory": lambda: bench_memory(cfg, args.quick),
        "checkpoint": lambda: bench_checkpoint(cfg, args.quick),
        "images": lambda: bench_images(cfg, args.quick),
        "starts": lambda: starts.bench_starts(cfg),
    }
    rows: list[dict] = []
    began = time.perf_counter()
    for section in SECTIONS:
        if section in args.only:
            log(f"{section} ...")
            rows += runners[section]()
            log(f"{section} done ({time.perf_counter() - began:.0f} s so far)")
    print(table(rows))
    if args.markdown:
        print("\n" + markdown(rows))
    results = {
        "meta": meta(args, versions),
        "settings": cfg,
        "rows": rows,
        "seconds": time.perf_counter() - began,
    }
    Path(args.json).write_text(json.dumps(results, indent=1))
    log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
