"""Kernel starts through the kernel server (bench/run.py, section starts).

Three ways to get a kernel, in the same run: the native ipykernel (``python3``), wasm-kernel
handed out by the kernel server (``wasm-python`` through the provisioner, the server running)
and wasm-kernel launched the ordinary way (``WASM_KERNEL_SERVER=off`` in this launcher's
environment, as a Jupyter server would set it). Measured:

- kernels started and stopped one after another, as an autograder does per submission
  (start, the execute_reply of a first cell ``1``, a graceful shutdown): the total, and each;
- idle memory per kernel with five running (Rss and Pss averaged over the five; the server's
  own memory, which its kernels share pages with, is in the note);
- where a served start goes, to choose between forking per request and a pool of ready
  kernels: jupyter_client's own work before the request, the request to the server's pid
  answer, the kernel's set-up after the fork (what a pool of pre-forked kernels could skip),
  its binding of the request (config, connection file, ports), the wait for the client's
  first message, and the replies; plus a sandbox's start from the boot image in process
  (what a pool of pre-booted sandboxes could also skip, where a request's settings match).
  The kernel's side comes from its own debug log, stamped with wall-clock times.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import cell_phases
import psutil
import startup_roundtrip
from jupyter_client.manager import KernelManager
from memory_use import process_kib
from rows import row

from wasm_kernel.server import kernel_server
from wasm_kernel.server.provisioner import SERVER_SWITCH, ServedKernel, WasmKernelProvisioner

NATIVE, WASM = startup_roundtrip.KERNELS["native"], startup_roundtrip.KERNELS["wasm"]
SERVED, LAUNCHED = "served", "launched"
STAMPED_LOG = ["--debug", "--Application.log_format=%(created).6f %(message)s"]
# lines of the kernel's debug log that mark its phases
FIRST_LINE = ""  # whatever the kernel logs first: its application has begun
BOUND = "To connect another client"  # after its ports are bound and its connection file read
ASKED = "MESSAGE TYPE:kernel_info_request"  # the client's first request has arrived


@contextlib.contextmanager
def launched_the_ordinary_way() -> Iterator[None]:
    """The provisioner launches every kernel itself while this lasts."""
    saved = os.environ.get(SERVER_SWITCH)
    os.environ[SERVER_SWITCH] = "off"
    try:
        yield
    finally:
        if saved is None:
            del os.environ[SERVER_SWITCH]
        else:
            os.environ[SERVER_SWITCH] = saved


def server_running() -> None:
    """Start wasm kernels (and so the server) until one is served."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        manager = KernelManager(kernel_name=WASM)
        manager.start_kernel()
        served = isinstance(manager.provisioner.process, ServedKernel)
        manager.shutdown_kernel(now=True)
        if served:
            return
        time.sleep(0.5)
    raise RuntimeError("the kernel server never handed out a kernel")


def kernel_of(way: str) -> tuple[str, contextlib.AbstractContextManager]:
    """The kernelspec and the setting that start a kernel ``way``."""
    if way == LAUNCHED:
        return WASM, launched_the_ordinary_way()
    return (NATIVE if way == NATIVE else WASM), contextlib.nullcontext()


def start_run_stop(name: str) -> tuple[float, bool]:
    """Seconds to start a kernel, have the execute_reply of ``1`` and shut it down; and
    whether the kernel server handed it out."""
    manager = KernelManager(kernel_name=name)
    began = time.perf_counter()
    manager.start_kernel()
    served = isinstance(manager.provisioner.process, ServedKernel)
    client = manager.client()
    client.start_channels()
    startup_roundtrip.await_reply(client, client.execute("1"))
    client.stop_channels()
    manager.shutdown_kernel()
    return time.perf_counter() - began, served


def serial_rows(cfg: dict) -> list[dict]:
    count = cfg["serial_kernels"]
    totals: dict[str, list[float]] = {NATIVE: [], SERVED: [], LAUNCHED: []}
    each: dict[str, list[float]] = {way: [] for way in totals}
    unserved = 0
    for i in range(cfg["serial_rounds"]):
        ways = list(totals) if i % 2 == 0 else list(reversed(totals))
        for way in ways:
            name, setting = kernel_of(way)
            if way == SERVED:
                server_running()
            with setting:
                began = time.perf_counter()
                for _ in range(count):
                    seconds, served = start_run_stop(name)
                    each[way].append(seconds)
                    unserved += way == SERVED and not served
                totals[way].append(time.perf_counter() - began)
    note = f"{unserved} of the served kernels were launched instead" if unserved else ""
    measure = f"{count} kernels started and stopped one after another (cell `1`), total"
    return [
        row("starts", f"{measure}, {label}", "s", totals[NATIVE], totals[way], note)
        for way, label in ((SERVED, "wasm served"), (LAUNCHED, "wasm launched"))
    ] + [
        row(
            "starts",
            f"one of them: start, cell `1`, shutdown, {label}",
            "ms",
            [s * 1e3 for s in each[NATIVE]],
            [s * 1e3 for s in each[way]],
        )
        for way, label in ((SERVED, "wasm served"), (LAUNCHED, "wasm launched"))
    ]


def idle_five(way: str) -> tuple[dict[str, float], dict[str, int] | None]:
    """Rss and Pss (KiB) per kernel, averaged over five idle kernels started ``way``; and
    the kernel server's own when they were served."""
    name, setting = kernel_of(way)
    started = []
    try:
        with setting:
            for _ in range(5):
                started.append(startup_roundtrip.started(name, []))
                manager, client = started[-1]
                startup_roundtrip.await_reply(client, client.execute("1"))
        time.sleep(2)  # let start-up garbage and the first checkpoint settle
        pids = [manager.provisioner.process.pid for manager, _ in started]
        per_kernel = [process_kib(pid) for pid in pids]
        served = [m for m, _ in started if isinstance(m.provisioner.process, ServedKernel)]
        if way == SERVED and len(served) != len(started):
            raise RuntimeError(f"only {len(served)} of 5 kernels were served")
        server = process_kib(psutil.Process(pids[0]).ppid()) if served else None
        average = {key: statistics.mean(m[key] for m in per_kernel) for key in ("Rss", "Pss")}
        return average, server
    finally:
        for manager, client in started:
            client.stop_channels()
            manager.shutdown_kernel(now=True)


def memory_rows(cfg: dict) -> list[dict]:
    measured: dict[str, list[dict[str, float]]] = {NATIVE: [], SERVED: [], LAUNCHED: []}
    servers: list[dict[str, int]] = []
    for _ in range(cfg["starts_idle_reps"]):
        for way in measured:
            if way == SERVED:
                server_running()
            average, server = idle_five(way)
            measured[way].append(average)
            servers += [server] if server else []
    server_note = "the server itself: " + ", ".join(
        f"{key} {statistics.median([s[key] for s in servers]) / 1024:.0f} MiB"
        for key in ("Rss", "Pss")
    )
    rows = []
    for key in ("Pss", "Rss"):
        for way, label, note in (
            (SERVED, "wasm served", server_note),
            (LAUNCHED, "wasm launched", ""),
        ):
            rows.append(
                row(
                    "starts",
                    f"{key.upper()} per kernel, five idle kernels, {label}",
                    "MiB",
                    [m[key] / 1024 for m in measured[NATIVE]],
                    [m[key] / 1024 for m in measured[way]],
                    note,
                )
            )
    return rows


def stamps(log: Any) -> dict[str, float]:
    """Wall-clock times of the kernel's phases, from its stamped debug log."""
    log.seek(0)
    found: dict[str, float] = {}
    moment = None
    for line in log.read().splitlines():
        stamp, _, rest = line.partition(" ")
        try:
            moment, message = float(stamp), rest
        except ValueError:
            message = line  # a later line of a record that spans several
        for mark in (FIRST_LINE, BOUND, ASKED):
            if moment is not None and mark in message and mark not in found:
                found[mark] = moment
    return found


def served_phases() -> dict[str, float]:
    """Seconds of each phase of one served start (see the module's docstring)."""
    moments: dict[str, float] = {}
    asking = WasmKernelProvisioner._from_server

    def timed(self: WasmKernelProvisioner, cmd: list[str], kwargs: dict) -> Any:
        moments["request"] = time.time()
        try:
            return asking(self, cmd, kwargs)
        finally:
            moments["pid"] = time.time()

    manager = KernelManager(kernel_name=WASM)
    with tempfile.TemporaryFile("w+") as log:
        WasmKernelProvisioner._from_server = timed  # type: ignore[method-assign]
        try:
            began = time.time()
            manager.start_kernel(extra_arguments=STAMPED_LOG, stderr=log)
        finally:
            WasmKernelProvisioner._from_server = asking  # type: ignore[method-assign]
        if not isinstance(manager.provisioner.process, ServedKernel):
            manager.shutdown_kernel(now=True)
            raise RuntimeError("the kernel was not served")
        client = manager.client()
        client.start_channels()
        startup_roundtrip.await_reply(client, client.kernel_info())
        informed = time.time()
        startup_roundtrip.await_reply(client, client.execute("1"))
        answered = time.time()
        client.stop_channels()
        manager.shutdown_kernel(now=True)
        kernel = stamps(log)
    return {
        "start_kernel() to the request (jupyter_client: kernelspec, ports, connection file)": (
            moments["request"] - began
        ),
        "the request to the server's pid answer (code fingerprint, connect, fork)": (
            moments["pid"] - moments["request"]
        ),
        "the pid answer to the kernel's first log line (set-up after the fork)": (
            kernel[FIRST_LINE] - moments["pid"]
        ),
        "first log line to ports bound (config, connection file, sockets)": (
            kernel[BOUND] - kernel[FIRST_LINE]
        ),
        "ports bound to the client's kernel_info_request arriving (ZMQ reconnect wait)": (
            kernel[ASKED] - kernel[BOUND]
        ),
        "kernel_info_request arriving to its reply at the client": informed - kernel[ASKED],
        "kernel_info_reply to the execute_reply of `1`": answered - informed,
        "start_kernel() to the execute_reply of `1` (all)": answered - began,
    }


def phase_rows(cfg: dict) -> list[dict]:
    server_running()
    runs = [served_phases() for _ in range(cfg["phase_starts"])]
    python = KernelManager(kernel_name=WASM).kernel_spec.argv[0]
    fingerprints, boots = [], []
    cell_phases.start_as_the_kernel_does().close()  # the compiled runtime is loaded once
    for _ in range(cfg["phase_starts"]):
        began = time.perf_counter()
        kernel_server.code_fingerprint(python)
        fingerprints.append(time.perf_counter() - began)
        began = time.perf_counter()
        sandbox = cell_phases.start_as_the_kernel_does()
        boots.append(time.perf_counter() - began)
        sandbox.close()
    rows = [
        row("starts", f"served start: {phase}", "ms", None, [r[phase] * 1e3 for r in runs])
        for phase in runs[0]
    ]
    return rows + [
        row(
            "starts",
            "served start, in process: the code fingerprint (part of the request)",
            "ms",
            None,
            [s * 1e3 for s in fingerprints],
        ),
        row(
            "starts",
            "served start, in process: a sandbox from the boot image (runs beside the binding)",
            "ms",
            None,
            [s * 1e3 for s in boots],
            "what a pool of pre-booted sandboxes could skip at most, where the settings match",
        ),
    ]


def bench_starts(cfg: dict) -> list[dict]:
    return phase_rows(cfg) + memory_rows(cfg) + serial_rows(cfg)
