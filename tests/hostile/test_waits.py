"""Every wait of the guest ends: on an interrupt, at the hard stop after ``interrupt_grace``,
and at the time limit. Each test builds the thing a cell could wait on (a FIFO with no
writer, an image that never appears) and checks that the kernel answers anyway."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from conftest import Kernel, ok


@pytest.fixture
def fifo_folder(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "fifo")  # no process ever opens it for writing
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / "socket"))
    (tmp_path / "data.txt").write_text("regular")
    return tmp_path


@pytest.mark.parametrize("name", ["fifo", "socket"])
def test_a_fifo_or_socket_beside_the_notebook_is_refused_not_waited_on(
    start_kernel, fifo_folder: Path, name: str
) -> None:
    """Opening a FIFO blocks until a writer appears, inside wasmtime, where no interrupt or
    hard stop reaches; the kernel refuses to open it instead."""
    kernel: Kernel = start_kernel(["--WasmKernel.time_limit=6"], cwd=fifo_folder)
    run = kernel.execute(f"open('/notebook/{name}').read(1)", timeout=60)
    assert run.content["ename"] == "OSError", run.content
    assert run.content["evalue"].startswith("[Errno 60]"), run.content
    assert "only regular files and folders" in "\n".join(run.content["traceback"])
    # through os.open too, non-blocking or not, and the folder's regular files still open
    run = kernel.execute(f"import os\nos.open('/notebook/{name}', os.O_RDONLY | os.O_NONBLOCK)")
    assert run.content["evalue"].startswith("[Errno 60]"), run.content
    assert ok(kernel.execute("open('/notebook/data.txt').read()")).result_text() == "'regular'"
    assert ok(kernel.execute("sorted(os.listdir('/notebook'))")).result_text() == (
        "['data.txt', 'fifo', 'socket']"
    )


def waiting_for_an_image(start_kernel, folder: Path) -> Kernel:
    """A kernel told to wait 600 s for an image no one will write."""
    return start_kernel(
        [
            "--WasmKernel.resume_from=never-written",
            "--WasmKernel.resume_wait=600",
            "--WasmKernel.time_limit=8",
        ],
        env={"WASM_KERNEL_SNAPSHOT_DIR": str(folder)},
    )


def test_a_cell_waiting_for_an_image_is_interrupted(start_kernel, tmp_path: Path) -> None:
    kernel = waiting_for_an_image(start_kernel, tmp_path)
    msg_id = kernel.client.execute("x = 1")
    kernel.manager.interrupt_kernel()
    run = kernel.collect(msg_id, timeout=60)
    assert run.content["ename"] == "KeyboardInterrupt", run.content
    assert "never-written" in run.content["evalue"]
    # the kernel then goes on from a fresh interpreter: the interrupted cell did not run
    assert ok(kernel.execute("globals().get('x', 'fresh')")).result_text() == "'fresh'"


def test_a_cell_waiting_for_an_image_ends_at_its_time_limit(start_kernel, tmp_path: Path) -> None:
    kernel = waiting_for_an_image(start_kernel, tmp_path)
    run = kernel.execute("x = 1", timeout=60)
    assert run.content["ename"] == "TimeLimitExceeded", run.content
    assert "time limit of 8 s" in run.content["evalue"]
    assert ok(kernel.execute("globals().get('x', 'fresh')")).result_text() == "'fresh'"


def test_a_held_file_turned_fifo_before_a_restore_is_lost_not_waited_on(
    start_kernel, tmp_path: Path
) -> None:
    """An image's open files are opened again at a restore, before the guest runs: one the
    host has since replaced by a FIFO is refused as a cell's open is, not waited on; a
    folder held open comes back under the same guard."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "swapped.txt").write_text("regular")
    (data / "sub").mkdir()
    kernel: Kernel = start_kernel(
        [f"--WasmKernel.mounts=['{data}:/data:rw']", "--WasmKernel.time_limit=20"],
        env={"WASM_KERNEL_SNAPSHOT_DIR": str(tmp_path / "images")},
    )
    held = "import os\nheld = open('/data/swapped.txt')\n"
    ok(kernel.execute(held + "folder = os.open('/data/sub', os.O_RDONLY | os.O_DIRECTORY)"))
    ok(kernel.execute("%snapshot save before"))
    (data / "swapped.txt").unlink()
    os.mkfifo(data / "swapped.txt")
    os.mkfifo(data / "sub" / "fifo")
    ok(kernel.execute("%snapshot restore before", timeout=60))
    run = kernel.execute("held.read()", timeout=60)
    assert run.content["status"] == "error", run.content
    assert "(/data/swapped.txt)" in run.stream_text("stderr"), run.stream_text("stderr")
    run = kernel.execute("os.open('fifo', os.O_RDONLY, dir_fd=folder)", timeout=60)
    assert run.content["evalue"].startswith("[Errno 60]"), run.content


def test_a_folder_held_open_and_renamed_still_meets_the_guard(start_kernel, tmp_path: Path) -> None:
    """The guard places a folder's descriptor by the folder's host path: after a rename it
    must look in the folder the descriptor now names, not in a new one under the old name."""
    data = tmp_path / "data"
    (data / "x").mkdir(parents=True)
    os.mkfifo(data / "x" / "fifo")
    kernel: Kernel = start_kernel([f"--WasmKernel.mounts=['{data}:/data:rw']"])
    cell = (
        "import os\nfolder = os.open('/data/x', os.O_RDONLY | os.O_DIRECTORY)\n"
        "os.rename('/data/x', '/data/z')\nos.mkdir('/data/x')\n"
        "os.open('fifo', os.O_RDONLY, dir_fd=folder)"
    )
    run = kernel.execute(cell, timeout=60)
    assert run.content["evalue"].startswith("[Errno 60]"), run.content
    assert sorted(os.listdir(data)) == ["x", "z"]
