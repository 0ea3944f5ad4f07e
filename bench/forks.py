"""Forks of a live session (bench/run.py, section images).

``Session.fork()`` of a session holding numpy, pandas and 100 MiB of data: the parent writes a
fork image that names its frozen memory (``%snapshot fork``), a kernel starts from it mapping
that memory, and the fork answers a first cell ``1``. Measured to that reply, and the parent's
``%snapshot fork`` cell alone; beside a native kernel's plain start in the same run (there is
no native fork to compare with).
"""

from __future__ import annotations

import tempfile
import time

import startup_roundtrip
from rows import row

from wasm_kernel.client import Session

NATIVE = startup_roundtrip.KERNELS["native"]
STATE = (
    "import numpy as np, pandas as pd\n"
    "_bench_data = np.random.default_rng(1).random(100 * 2**20 // 8)\n"  # 100 MiB of float64
    "_bench_frame = pd.DataFrame({'a': np.arange(1000)})"
)
LABEL = "numpy+pandas, 100 MiB of data"


def fork_rows(cfg: dict) -> list[dict]:
    reps = cfg["image_reps"]
    native_starts = [startup_roundtrip.time_start(NATIVE) * 1e3 for _ in range(reps)]
    forks, cells = [], []
    with (
        tempfile.TemporaryDirectory(prefix="bench-forks-") as folder,
        Session(snapshots=True, snapshot_dir=folder) as parent,
    ):
        parent.run(STATE, timeout=300)
        for _ in range(reps):
            began = time.perf_counter()
            parent.run("%snapshot fork _bench_fork")
            cells.append((time.perf_counter() - began) * 1e3)
            parent.run("%snapshot delete _bench_fork")
            began = time.perf_counter()
            with parent.fork() as child:
                child.run("1")
                forks.append((time.perf_counter() - began) * 1e3)
    return [
        row(
            "images",
            f"`Session.fork()` to the fork's first execute_reply, {LABEL}",
            "ms",
            native_starts,
            forks,
            "native: a plain start; the fork maps its parent's memory",
        ),
        row("images", f"`%snapshot fork` in the parent, {LABEL}", "ms", None, cells),
    ]
