"""A kernel's memory as the benchmark counts it: Rss and Pss from ``/proc/PID/smaps_rollup``,
plus a wasm kernel's copy-on-write checkpoint pages that no mapping shows."""

from __future__ import annotations

import os
from pathlib import Path


def process_tree(pid: int) -> list[int]:
    pids, queue = [], [pid]
    while queue:
        current = queue.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                queue.extend(int(child) for child in (task / "children").read_text().split())
            except OSError:
                pass
    return pids


CHECKPOINT_FILE = "/memfd:wasm-kernel-checkpoint"


def unmapped_checkpoint_kib(pid: int) -> int:
    """KiB of a wasm kernel's copy-on-write checkpoint file that no mapping shows: it holds
    them in memory all the same, but Rss and Pss count only the pages mapped."""
    allocated = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd).startswith(CHECKPOINT_FILE):
                allocated += fd.stat().st_blocks // 2
        except OSError:
            pass
    mapped, in_file = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if "-" in line.split(" ", 1)[0]:  # a mapping's header line
            in_file = CHECKPOINT_FILE in line
        elif in_file and line.startswith("Rss:"):
            mapped += int(line.split()[1])
    return max(allocated - mapped, 0)


def process_kib(pid: int) -> dict[str, int]:
    """Rss and Pss in KiB of one process, from smaps_rollup, plus the checkpoint file's pages
    that are not mapped."""
    totals = {"Rss": 0, "Pss": 0}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in totals:
            totals[key] += int(value.split()[0])
    hidden = unmapped_checkpoint_kib(pid)
    return {key: value + hidden for key, value in totals.items()}


def memory_kib(pid: int) -> dict[str, int]:
    """``process_kib`` of a process and its descendants, summed."""
    totals = {"Rss": 0, "Pss": 0}
    for member in process_tree(pid):
        for key, value in process_kib(member).items():
            totals[key] += value
    return totals
