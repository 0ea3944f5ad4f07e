"""What a cell cost, in its execute_reply's metadata (``wasm_kernel``), the client's Execution,
the MCP tool result and ``%sandbox``: real kernels through jupyter_client, bounds taken from
the run itself (the kernel process's own thread clocks, the checkpoint after the cell before,
the fuel of the same loop run twice as long)."""

from __future__ import annotations

import os
import time
from typing import Any

import psutil
import pytest
from conftest import Kernel, ok

from wasm_kernel.client import Session
from wasm_kernel.sandbox.metrics import METADATA_KEY, CellMetrics
from wasm_kernel.settings.profiles import PROFILES

MIB = 1 << 20
FIGURES = {
    "fuel",
    "cpu_seconds",
    "wall_seconds",
    "peak_memory",
    "scratch_bytes",
    "checkpoint_bytes",
    "rolled_back",
}
SPIN = """
import time
block = bytearray(50 << 20)
begun = time.perf_counter()
while time.perf_counter() - begun < 1.0:
    pass
time.perf_counter() - begun
"""
# work that grows linearly with the count: adding ``i`` itself would make the sum a two-digit
# int past 2**30 (at about 46,000), and each addition dearer from there
LOOP = "total = 0\nfor i in range({} * 100_000):\n    total += 1\ntotal"


def metrics_of(run: Any) -> CellMetrics:
    figures = run.reply["metadata"].get(METADATA_KEY)
    assert isinstance(figures, dict) and set(figures) == FIGURES, run.reply["metadata"]
    measured = CellMetrics.from_metadata(run.reply["metadata"])
    assert measured is not None, figures
    return measured


def thread_seconds(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of the kernel process (clock ticks: 10 ms steps)."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


@pytest.mark.slow
def test_a_cell_that_allocates_50_mib_and_spins_for_a_second(start_kernel: Any) -> None:
    kernel: Kernel = start_kernel()
    pid = kernel.manager.provisioner.process.pid  # type: ignore[union-attr]
    before = metrics_of(ok(kernel.execute("x = 1")))
    ok(kernel.execute("None"))  # the checkpoint after "x = 1" is in force from here on
    threads = thread_seconds(pid)
    sent = time.monotonic()
    run = ok(kernel.execute(SPIN))
    round_trip = time.monotonic() - sent
    after = thread_seconds(pid)
    spun = float(run.result_text() or "nan")  # the guest's own clock
    spin = metrics_of(run)

    assert spun <= spin.wall_seconds <= round_trip
    # the guest thread is the one that burnt most CPU; the cell's figure is its share of
    # that (the thread also took the checkpoint of the cell before, after that reply)
    guest = max(after[tid] - threads.get(tid, 0.0) for tid in after)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert guest - 0.1 - 2 * tick <= spin.cpu_seconds <= guest + 2 * tick
    assert 0 < spin.cpu_seconds <= spin.wall_seconds
    # the heap grew by the block, less what was free at its top (the allocator takes that
    # first: 0.1 MiB seen), and stayed within the limit
    assert spin.peak_memory - before.peak_memory >= 50 * MIB - 4 * MIB
    assert spin.peak_memory <= PROFILES["notebook"].memory_limit
    assert spin.fuel > before.fuel > 0
    assert not spin.rolled_back and spin.scratch_bytes == 0

    # the checkpoint a cell runs on is the state after the cell before it
    follow = metrics_of(ok(kernel.execute("del block")))
    assert follow.checkpoint_bytes == spin.peak_memory
    assert follow.peak_memory == spin.peak_memory  # guest memory never shrinks


def test_fuel_counts_the_work_and_tmp_its_files(kernel: Kernel) -> None:
    empty = metrics_of(ok(kernel.execute("None")))
    ok(kernel.execute(LOOP.format(1)))  # the loop's first run in this kernel costs more
    # each cell's own costs (a new cell's compile, its result) cancel out in the differences
    fuel = [metrics_of(ok(kernel.execute(LOOP.format(n)))).fuel for n in (2, 3, 4)]
    first, second = fuel[1] - fuel[0], fuel[2] - fuel[1]  # each 100,000 more additions
    assert first > 10 * empty.fuel
    assert abs(second - first) <= 0.05 * first
    files = "open('/tmp/m.bin', 'wb').write(b'x' * (1 << 20))"
    wrote = metrics_of(ok(kernel.execute(files)))
    assert wrote.scratch_bytes >= 1 << 20
    removed = metrics_of(ok(kernel.execute("import os; os.remove('/tmp/m.bin')")))
    assert removed.scratch_bytes < wrote.scratch_bytes


@pytest.mark.slow
def test_a_rolled_back_cell_says_so(start_kernel: Any) -> None:
    kernel: Kernel = start_kernel(["--WasmKernel.fuel=1e9"])
    ok(kernel.execute("kept = 41"))
    ok(kernel.execute("kept += 1"))
    stopped = kernel.execute("while True: pass")
    assert stopped.content["ename"] == "FuelExhausted"
    measured = metrics_of(stopped)
    assert measured.rolled_back and measured.fuel == 10**9  # all of the budget
    after = kernel.execute("kept")
    assert ok(after).result_text() == "42"
    assert not metrics_of(after).rolled_back


def test_sandbox_shows_the_last_cell(kernel: Kernel) -> None:
    first = ok(kernel.execute("sum(range(1000))"))
    shown = ok(kernel.execute("%sandbox")).stream_text()
    assert f"Last cell: {metrics_of(first).describe()}" in shown


@pytest.mark.slow
def test_the_client_execution_carries_the_metrics() -> None:
    with Session(fuel=10**9) as session:
        done = session.run("y = [0] * 1000\nlen(y)")
        assert done.error is None and done.metrics is not None
        assert 0 < done.metrics.wall_seconds <= done.duration
        assert done.metrics.fuel > 0 and not done.metrics.rolled_back
        stopped = session.run("while True: pass")
        assert stopped.error is not None and stopped.error.name == "FuelExhausted"
        assert stopped.metrics is not None and stopped.metrics.rolled_back
        assert stopped.metrics.fuel == 10**9


@pytest.mark.nokernel
def test_metrics_from_a_kernel_are_read_as_data() -> None:
    good = {
        "fuel": 5,
        "cpu_seconds": 0.5,
        "wall_seconds": 1,
        "peak_memory": 7,
        "scratch_bytes": 0,
        "checkpoint_bytes": 0,
        "rolled_back": False,
    }
    assert CellMetrics.from_metadata({METADATA_KEY: good}) == CellMetrics(**good)  # type: ignore[arg-type]
    for name, bad in [
        ("fuel", 1.5),
        ("fuel", True),
        ("fuel", -1),
        ("cpu_seconds", float("nan")),
        ("cpu_seconds", "1"),
        ("rolled_back", 0),
    ]:
        assert CellMetrics.from_metadata({METADATA_KEY: {**good, name: bad}}) is None
    assert CellMetrics.from_metadata({METADATA_KEY: {}}) is None
    assert CellMetrics.from_metadata(None) is None


@pytest.mark.slow
def test_the_mcp_tool_result_carries_the_metrics() -> None:
    """The official SDK's client over stdio, as an agent's host runs the server."""
    pytest.importorskip("mcp")
    import asyncio
    import sys

    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "wasm_kernel", "mcp", "--set", "fuel=1e9", "--set", "interrupt_grace=0.5"],
    )

    async def main() -> tuple[Any, Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            done = await session.call_tool("run_python", {"code": "print('hi')\n6 * 7"})
            stopped = await session.call_tool("run_python", {"code": "while True: pass"})
            return done, stopped

    done, stopped = asyncio.run(main())
    assert not done.is_error
    measured = CellMetrics.from_metadata(done.meta)
    assert measured is not None and measured.fuel > 0 and not measured.rolled_back
    assert stopped.is_error
    failed = CellMetrics.from_metadata(stopped.meta)
    assert failed is not None and failed.rolled_back and failed.fuel == 10**9
    assert all(METADATA_KEY not in block.text for block in done.content if block.type == "text")
