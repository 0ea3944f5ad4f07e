"""The memory fork images keep alive is bounded (``fork_memory_limit``): each %snapshot fork
freezes the session's memory for the forked kernel to map, and holds it while the image
exists, though the image on disk is about 1 MiB; snapshot_quota never sees it."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import ok

from wasm_kernel.images.names import SUFFIX

FORK = "x = os.urandom(16 << 20)\n%snapshot fork f{n}"


def test_forks_past_the_limit_are_refused_and_deleting_frees_them(
    start_kernel, tmp_path: Path
) -> None:
    kernel = start_kernel(
        ["--WasmKernel.fork_memory_limit=134217728"],  # 128 MiB
        env={"WASM_KERNEL_SNAPSHOT_DIR": str(tmp_path)},
    )
    ok(kernel.execute("import os\nkept = 'still here'"))
    made = 0
    while True:
        run = kernel.execute(FORK.format(n=made), timeout=120)
        if run.content["status"] != "ok":
            break
        made += 1
        assert made < 12, "every fork was accepted"
    assert run.content["ename"] == "SnapshotError", run.content
    assert "fork_memory_limit" in run.content["evalue"]
    assert made >= 2
    assert not (tmp_path / f"f{made}{SUFFIX}").exists()
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("f")) == sorted(
        f"f{n}{SUFFIX}" for n in range(made)
    )
    assert kernel.execute("kept").result_text() == "'still here'"
    # the memory of deleted images is let go (what the session itself still maps stays)
    held = memfds(kernel.manager.provisioner.process.pid)
    for n in range(made):
        ok(kernel.execute(f"%snapshot delete f{n}"))
    assert memfds(kernel.manager.provisioner.process.pid) < held


def memfds(pid: int) -> int:
    """The descriptors process ``pid`` holds on memfds."""
    folder = Path(f"/proc/{pid}/fd")
    count = 0
    for entry in folder.iterdir():
        try:
            count += os.readlink(entry).startswith("/memfd:")
        except OSError:
            continue  # closed meanwhile
    return count
