"""Load and soak over jupyter_client: many kernels at once, and many cells in one kernel.

Load: six kernels run side by side, each driven by its own thread through 300 mixed cells
(prints, results, errors, displays, mixed output, a counter that must survive everything, an
output-limit hit and a fuel-limit hit every 25 cells). Cells are sent in pipelined batches with
``stop_on_error=False``, so several requests are queued in the kernel while its iopub traffic
is read back. Every message is accounted for: each cell gets exactly its expected output,
between its own busy and idle, carrying only its own token (tokens name the kernel and the
cell), and nothing arrives for a request that was not sent. At the end every kernel is still
the same live process and answers a fresh cell.

Soak: one kernel runs 3000 tiny mixed cells one at a time (including allocations, errors and
fuel-limit rollbacks); its resident memory after the whole run stays within a fixed margin of
what it was after cell 200, no reply is lost and the execution count is exact.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import Kernel

pytestmark = pytest.mark.slow  # each test takes seconds to minutes

SMALL_FUEL = 2_000_000_000
# Anchored at a line's start: unanchored, the leading \S* made each search of a flood cell's
# 64 KiB line without spaces quadratic (~10 s each, holding the GIL of every driver thread).
CACHE_NOTICE = re.compile(
    r"(?m)^\S*displayhook\.py:\d+: UserWarning: Output cache limit.*\n.*\n.*\n"
)
OUTPUT_LIMIT = 64 << 10
KERNELS = 6
CELLS_PER_KERNEL = 300
BATCH = 8  # cells queued in the kernel at once
SOAK_CELLS = 3000
SOAK_BASELINE_AT = 200
RSS_MARGIN = 60 << 20
SETUP_CELLS = 1
TIMEOUT = 180  # seconds for any single message; generous, the machine may be loaded

# <kind letter>-<kernel>-<cell>, e.g. p-3-127; case-insensitive because results upper-case it.
TOKEN = re.compile(r"\b([a-z])-(\d+)-(\d+)\b", re.IGNORECASE)
LIMIT_NOTICE = "output limit reached"
ROLLBACK_NOTICE = "rolled back to its state before this cell"


@dataclass
class Cell:
    """One execute_request and what it must produce.

    ``outputs`` lists the expected iopub messages between execute_input and idle as
    (msg_type, check) pairs, in order; streams of one name are compared joined.
    """

    kernel: int
    index: int
    kind: str
    code: str
    status: str
    outputs: list[tuple[str, Any]]
    ename: str | None = None
    evalue_part: str | None = None

    @property
    def token(self) -> tuple[int, int]:
        return (self.kernel, self.index)


@dataclass
class Outcome:
    """What came back for one request."""

    reply: dict | None = None
    messages: list[dict] = field(default_factory=list)  # every iopub message with its parent


def make_cell(kernel: int, index: int, counter: list[int], kind: str | None = None) -> Cell:
    """The cell at ``index`` of kernel ``kernel``'s deterministic mix.

    ``counter`` is the expected value of the guest's ``n``, updated as the cell would.
    """
    if kind is None:
        if index % 25 == 24:
            kind = "fuel"
        elif index % 25 == 12:
            kind = "flood"
        else:
            kind = ("print", "expr", "error", "display", "mixed", "count")[(index * 7 + kernel) % 6]
    tag = f"{kernel}-{index}"
    if kind == "print":
        return Cell(
            kernel, index, kind, f"print('p-{tag}')", "ok", [("stream", ("stdout", f"p-{tag}\n"))]
        )
    if kind == "expr":
        return Cell(
            kernel, index, kind, f"'x-{tag}'.upper()", "ok", [("execute_result", repr(f"X-{tag}"))]
        )
    if kind == "error":
        counter[0] += 1  # an ordinary exception keeps what the cell did before it
        return Cell(
            kernel,
            index,
            kind,
            f"n += 1\nraise ValueError('e-{tag}')",
            "error",
            [("error", None)],
            ename="ValueError",
            evalue_part=f"e-{tag}",
        )
    if kind == "display":
        return Cell(
            kernel,
            index,
            kind,
            f"display({{'text/plain': 'd-{tag}'}}, raw=True)",
            "ok",
            [("display_data", {"text/plain": f"d-{tag}"})],
        )
    if kind == "mixed":
        code = (
            f"print('m-{tag}')\nprint('m-{tag}', file=sys.stderr)\n"
            f"display({{'text/plain': 'm-{tag}'}}, raw=True)\n'm-{tag}'"
        )
        return Cell(
            kernel,
            index,
            kind,
            code,
            "ok",
            [
                ("stream", ("stdout", f"m-{tag}\n")),
                ("stream", ("stderr", f"m-{tag}\n")),
                ("display_data", {"text/plain": f"m-{tag}"}),
                ("execute_result", repr(f"m-{tag}")),
            ],
        )
    if kind == "count":
        counter[0] += 1
        return Cell(
            kernel,
            index,
            kind,
            f"n += 1\n(n, 'c-{tag}')",
            "ok",
            [("execute_result", repr((counter[0], f"c-{tag}")))],
        )
    if kind == "flood":  # far past the output limit: truncated, with one notice
        return Cell(kernel, index, kind, f"print('o-{tag}|' * 20000)", "ok", [("flood", tag)])
    if kind == "fuel":  # the change to n is undone by the rollback
        return Cell(
            kernel,
            index,
            kind,
            f"n += 1000  # f-{tag}\nwhile True: pass",
            "error",
            [("error", None)],
            ename="FuelExhausted",
            evalue_part=ROLLBACK_NOTICE,
        )
    if kind == "alloc":  # soak only: a few MB allocated and dropped
        return Cell(
            kernel,
            index,
            kind,
            f"b = bytearray({1 + index % 4} << 20)\nkeep[{index % 50}] = 'a-{tag}' * 100\n"
            f"(len(b) >> 20, 'a-{tag}')",
            "ok",
            [("execute_result", repr((1 + index % 4, f"a-{tag}")))],
        )
    raise ValueError(kind)


def tokens_in(message: dict) -> set[tuple[int, int]]:
    text = json.dumps(message["content"])
    return {(int(k), int(i)) for _, k, i in TOKEN.findall(text)}


def send(kernel: Kernel, cells: list[Cell]) -> list[Outcome]:
    """Queue ``cells`` in the kernel at once, then read back everything they produce.

    Returns one Outcome per cell; raises AssertionError for any message whose parent is
    not one of these requests (lost or misrouted traffic shows up here or as a timeout).
    """
    client = kernel.client
    ids = [client.execute(c.code, allow_stdin=False, stop_on_error=False) for c in cells]
    outcomes = {msg_id: Outcome() for msg_id in ids}
    idle: set[str] = set()
    while len(idle) < len(ids):
        msg = client.get_iopub_msg(timeout=TIMEOUT)
        parent = msg["parent_header"].get("msg_id")
        assert parent in outcomes, (
            f"iopub {msg['msg_type']} for an unknown request {parent!r}: {msg['content']!r}"
            f" (waiting for kernel {cells[0].kernel} cells {cells[0].index}..{cells[-1].index})"
        )
        assert parent not in idle, (
            f"{msg['msg_type']} after idle for kernel {cells[0].kernel}: {msg['content']!r}"
        )
        outcomes[parent].messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle.add(parent)
    for msg_id in ids:
        reply = client.get_shell_msg(timeout=TIMEOUT)
        assert reply["parent_header"]["msg_id"] == msg_id, (
            f"shell reply out of order: expected {msg_id}, got one for"
            f" {reply['parent_header'].get('msg_id')}"
        )
        assert reply["msg_type"] == "execute_reply"
        outcomes[msg_id].reply = reply
    return [outcomes[msg_id] for msg_id in ids]


def check(cell: Cell, outcome: Outcome, execution_count: int) -> None:
    """Everything ``cell`` must have produced, and nothing else."""
    where = f"kernel {cell.kernel} cell {cell.index} ({cell.kind}): "
    types = [m["msg_type"] for m in outcome.messages]
    assert types[0] == "status" and outcome.messages[0]["content"]["execution_state"] == "busy", (
        where + str(types)
    )
    assert types[1] == "execute_input", where + str(types)
    assert types[-1] == "status", where + str(types)
    assert types.count("status") == 2, where + str(types)
    assert outcome.messages[1]["content"]["code"] == cell.code, where + "execute_input"
    assert outcome.messages[1]["content"]["execution_count"] == execution_count, (
        where + "execute_input count"
    )

    body = outcome.messages[2:-1]
    # Streams of one name may arrive in several chunks: merge consecutive ones to compare.
    merged: list[tuple[str, Any]] = []
    for msg in body:
        content = msg["content"]
        if msg["msg_type"] == "stream":
            if merged and merged[-1][0] == "stream" and merged[-1][1][0] == content["name"]:
                merged[-1] = ("stream", (content["name"], merged[-1][1][1] + content["text"]))
            else:
                merged.append(("stream", (content["name"], content["text"])))
        else:
            merged.append((msg["msg_type"], content))
    # IPython's output history holds 1000 results; past that it warns once per flush, on
    # stderr, as under ipykernel: that warning is no output of the cell.
    merged = [
        (kind, (value[0], CACHE_NOTICE.sub("", value[1])) if kind == "stream" else value)
        for kind, value in merged
    ]
    merged = [(kind, value) for kind, value in merged if kind != "stream" or value[1]]

    # No output carries another cell's (or another kernel's) token. Streams are checked merged:
    # a chunk may end inside a token ("o-1-87|" split as "o-1-8" + "7|"). That each output
    # carries this cell's token is checked below; the exceptions are the kernel's own
    # FuelExhausted error and output-limit notice.
    edges = outcome.messages[:2] + outcome.messages[-1:]  # status, execute_input, status
    for kind, content in [(m["msg_type"], m["content"]) for m in edges] + merged:
        found = tokens_in({"content": content})
        assert found <= {cell.token}, where + f"foreign token(s) {found - {cell.token}} in {kind}"

    expected = cell.outputs
    if expected == [("flood", f"{cell.kernel}-{cell.index}")]:
        streams = dict(value for kind, value in merged if kind == "stream")
        assert set(streams) == {"stdout", "stderr"}, where + str(merged)[:500]
        assert [kind for kind, _ in merged] == ["stream"] * len(merged), where + str(merged)[:500]
        out = streams.get("stdout", "")
        assert out.startswith(f"o-{cell.kernel}-{cell.index}|"), where + out[:200]
        assert len(out.encode()) <= OUTPUT_LIMIT, where + f"{len(out.encode())} bytes shown"
        assert streams.get("stderr", "").count(LIMIT_NOTICE) == 1, (
            where + repr(streams.get("stderr"))[:300]
        )
    else:
        assert [kind for kind, _ in merged] == [kind for kind, _ in expected], (
            where + str(merged)[:800]
        )
        for (kind, got), (_, want) in zip(merged, expected, strict=False):
            if not (kind == "error" and cell.kind == "fuel"):
                assert cell.token in tokens_in({"content": got}), (
                    where + f"{kind} without the token: {got!r}"
                )
            if kind == "stream":
                assert got == want, where + f"stream {got!r} != {want!r}"
            elif kind == "execute_result":
                assert got["data"]["text/plain"] == want, where + f"{got['data']!r} != {want!r}"
                assert got["execution_count"] == execution_count, where + "execute_result count"
            elif kind == "display_data":
                assert got["data"] == want, where + f"{got['data']!r} != {want!r}"
            elif kind == "error":
                assert got["ename"] == cell.ename, where + f"{got['ename']}: {got['evalue']}"
                assert cell.evalue_part in got["evalue"], where + got["evalue"]

    reply = outcome.reply["content"]
    assert reply["status"] == cell.status, where + f"reply {reply!r}"[:800]
    assert reply["execution_count"] == execution_count, (
        where + f"reply count {reply['execution_count']}"
    )
    if cell.status == "error":
        assert reply["ename"] == cell.ename, where + f"reply {reply['ename']}: {reply['evalue']}"
        assert cell.evalue_part in reply["evalue"], where + reply["evalue"]


def setup_kernel(kernel: Kernel) -> int:
    """Drain start-up traffic and define the cells' state (one cell, the kernel's first);
    returns the next execution count."""
    # wait_for_ready may have sent several kernel_info requests (it repeats them when a
    # reply is slow, as it is with six kernels starting at once): drop their late traffic.
    time.sleep(1)
    for channel in (kernel.client.shell_channel, kernel.client.iopub_channel):
        while channel.msg_ready():
            msg = channel.get_msg(timeout=1)
            assert msg["parent_header"].get("msg_type") == "kernel_info_request", msg
    setup = Cell(-1, 0, "setup", "import sys\nn = 0\nkeep = {}", "ok", [])
    (outcome,) = send(kernel, [setup])
    check(setup, outcome, SETUP_CELLS)
    return SETUP_CELLS + 1


def rss_bytes(kernel: Kernel) -> int:
    pid = kernel.manager.provisioner.process.pid
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def assert_answers(kernel: Kernel) -> None:
    run = kernel.execute("1 + 1", timeout=TIMEOUT)
    assert run.content["status"] == "ok", run.content
    assert run.result_text() == "2"


# -- load ------------------------------------------------------------------------------------------


def drive(kernel: Kernel, number: int, errors: list[BaseException], counts: dict[int, int]) -> None:
    try:
        count = setup_kernel(kernel)
        counter = [0]
        cells = [make_cell(number, i, counter) for i in range(CELLS_PER_KERNEL)]
        for start in range(0, len(cells), BATCH):
            batch = cells[start : start + BATCH]
            for cell, outcome in zip(batch, send(kernel, batch), strict=True):
                check(cell, outcome, count)
                count += 1
        # The counter saw every ordinary cell and none of the rolled-back ones.
        run = kernel.execute("n", timeout=TIMEOUT)
        assert run.result_text() == str(counter[0]), (
            f"kernel {number}: n = {run.result_text()}, want {counter[0]}"
        )
        counts[number] = count
    except BaseException as exc:
        errors.append(exc)


def test_six_kernels_in_parallel_lose_and_misroute_nothing(start_kernel: Any) -> None:
    started = time.monotonic()
    kernels = [
        start_kernel(
            [f"--WasmKernel.fuel={SMALL_FUEL}", f"--WasmKernel.output_limit={OUTPUT_LIMIT}"]
        )
        for _ in range(KERNELS)
    ]
    pids = [k.manager.provisioner.process.pid for k in kernels]
    assert len(set(pids)) == KERNELS
    errors: list[BaseException] = []
    counts: dict[int, int] = {}
    threads = [
        threading.Thread(target=drive, args=(k, number, errors, counts), name=f"load-{number}")
        for number, k in enumerate(kernels)
    ]
    for thread in threads:
        thread.daemon = True  # a hung driver must not keep pytest from exiting
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=900)
    assert not any(thread.is_alive() for thread in threads), "a driver thread hung"
    if errors:
        raise errors[0]
    assert sorted(counts) == list(range(KERNELS))
    for number, k in enumerate(kernels):
        assert k.manager.is_alive(), f"kernel {number} died"
        assert k.manager.provisioner.process.pid == pids[number], f"kernel {number} was restarted"
        assert_answers(k)
    elapsed = time.monotonic() - started
    print(f"\nload: {KERNELS} kernels x {CELLS_PER_KERNEL} cells in {elapsed:.1f} s")


# -- soak ------------------------------------------------------------------------------------------


def test_soak_3000_cells_rss_bounded(start_kernel: Any) -> None:
    started = time.monotonic()
    kernel = start_kernel([f"--WasmKernel.fuel={SMALL_FUEL}"])
    pid = kernel.manager.provisioner.process.pid
    count = setup_kernel(kernel)
    counter = [0]
    kinds = ("print", "expr", "alloc", "display", "count", "error", "mixed", "alloc")
    samples: list[tuple[int, int]] = []
    baseline = None
    for i in range(SOAK_CELLS):
        kind = "fuel" if i % 100 == 99 else kinds[i % len(kinds)]
        cell = make_cell(0, i, counter, kind)
        (outcome,) = send(kernel, [cell])
        check(cell, outcome, count)
        count += 1
        if i + 1 == SOAK_BASELINE_AT:
            baseline = rss_bytes(kernel)
            samples.append((i + 1, baseline))
        elif (i + 1) % 500 == 0:
            samples.append((i + 1, rss_bytes(kernel)))
    end = rss_bytes(kernel)
    assert baseline is not None
    print(
        f"\nsoak: {SOAK_CELLS} cells in {time.monotonic() - started:.1f} s; RSS (MiB) "
        + ", ".join(f"after {n}: {rss / (1 << 20):.1f}" for n, rss in samples)
        + f"; end: {end / (1 << 20):.1f}; growth since cell {SOAK_BASELINE_AT}:"
        f" {(end - baseline) / (1 << 20):+.1f} MiB (allowed {RSS_MARGIN >> 20})"
    )

    # check() compared every reply's execution_count; the last one was:
    assert outcome.reply["content"]["execution_count"] == SOAK_CELLS + SETUP_CELLS
    run = kernel.execute("n", timeout=TIMEOUT)
    assert run.content["execution_count"] == SOAK_CELLS + SETUP_CELLS + 1
    assert run.result_text() == str(counter[0])
    assert kernel.manager.is_alive() and kernel.manager.provisioner.process.pid == pid
    assert end <= baseline + RSS_MARGIN, (
        f"RSS grew from {baseline / (1 << 20):.1f} MiB after cell {SOAK_BASELINE_AT} to"
        f" {end / (1 << 20):.1f} MiB after {SOAK_CELLS}"
    )
