"""What graders and agents need from the kernel beyond the limits (issue 12, point 4).

The strict profile keeps no input history on disk, the private scratch folder does not
outlive its kernel (SIGTERM removes it; after SIGKILL the next kernel sweeps it), and a
strict kernel asked for a host file says that nothing is mounted. The time limit and the
first cell's trap are in test_limits.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import Kernel, ok, plain

from wasm_kernel.files import kernel_folders

STRICT = "wasm-python-strict"


def scratch_folder_of(kernel: Kernel) -> Path:
    """The host folder behind the kernel's /tmp, found by the file a cell leaves in it."""
    pid = kernel.manager.provisioner.process.pid
    marker = f"marker-{pid}-{time.monotonic_ns()}"
    ok(kernel.execute(f"open('/tmp/{marker}', 'w').write('guest data')"))
    found = [
        folder
        for folder in Path(tempfile.gettempdir()).glob(f"{kernel_folders.PREFIX}{pid}-*")
        if (folder / marker).exists()
    ]
    assert len(found) == 1, f"no scratch folder named after kernel {pid}"
    return found[0]


@pytest.mark.parametrize("kernel_name, on_disk", [(STRICT, False), ("wasm-python", True)])
def test_only_the_notebook_profile_keeps_history_on_disk(
    start_kernel, tmp_path: Path, kernel_name: str, on_disk: bool
) -> None:
    kernel = start_kernel(env={"XDG_DATA_HOME": str(tmp_path)}, kernel_name=kernel_name)
    ok(kernel.execute("hidden_test = 'assert answer == 42'"))
    reply = kernel.client.history(hist_access_type="tail", n=5, reply=True, timeout=30)
    assert any("hidden_test" in entry[2] for entry in reply["content"]["history"])
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert bool(files) == on_disk, files


def test_sigterm_removes_the_scratch_folder(start_kernel) -> None:
    kernel = start_kernel(kernel_name=STRICT)
    folder = scratch_folder_of(kernel)
    kernel.manager.signal_kernel(signal.SIGTERM)
    kernel.manager.provisioner.process.wait(timeout=30)
    assert not folder.exists(), f"{folder} outlived its kernel"


@pytest.mark.slow
def test_folders_of_killed_kernels_are_swept_at_the_next_start(start_kernel) -> None:
    killed = start_kernel(kernel_name=STRICT)
    folder = scratch_folder_of(killed)
    killed.manager.signal_kernel(signal.SIGKILL)
    killed.manager.provisioner.process.wait(timeout=30)
    assert folder.exists()  # nothing can clean up after SIGKILL
    alive = start_kernel(kernel_name=STRICT)
    alive_folder = scratch_folder_of(alive)
    deadline = time.monotonic() + 30  # the sweep runs 2 s after the start, not before it
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not folder.exists(), f"{folder} was not swept"
    # a live kernel's folder is never swept, by a sweep from any process
    assert kernel_folders.sweep() == []
    assert alive_folder.exists()


def test_sweep_leaves_folders_it_did_not_make(tmp_path: Path) -> None:
    me = os.getpid()
    started = int(psutil.Process(me).create_time())
    dead = psutil.Process(me).ppid() + 10**6  # beyond pid_max: no such process
    mine_alive = tmp_path / f"{kernel_folders.PREFIX}{me}-{started}-x"
    reused_pid = tmp_path / f"{kernel_folders.PREFIX}{me}-{started - 3600}-x"
    orphan = tmp_path / f"{kernel_folders.PREFIX}{dead}-{started}-x"
    old_style = tmp_path / f"{kernel_folders.PREFIX}abc123"
    for folder in (mine_alive, reused_pid, orphan, old_style):
        folder.mkdir()
        (folder / "data").write_text("x")
    link = tmp_path / f"{kernel_folders.PREFIX}{dead}-{started}-link"
    link.symlink_to(old_style)
    removed = kernel_folders.sweep(str(tmp_path))
    assert sorted(removed) == sorted([reused_pid, orphan])
    assert mine_alive.exists() and old_style.exists() and (old_style / "data").exists()
    assert link.is_symlink()


@pytest.mark.slow
def test_a_strict_kernel_says_nothing_is_mounted(start_kernel) -> None:
    secret = Path("/etc/passwd")  # a host file outside /tmp (wherever the tests are cloned)
    assert secret.is_file()
    kernel = start_kernel(kernel_name=STRICT)
    run = kernel.execute(f"open({str(secret)!r}).read()")
    content = run.content
    assert content["ename"] == "FileNotFoundError"
    assert "no host folder is mounted" in content["evalue"]
    assert "no host folder is mounted" in "\n".join(content["traceback"])
    inside = kernel.execute("open('/tmp/missing.txt').read()").content
    assert inside["ename"] == "FileNotFoundError"
    assert "mounted" not in inside["evalue"]  # a missing scratch file is just missing


def test_a_notebook_kernel_says_what_it_sees_instead(start_kernel, tmp_path: Path) -> None:
    """A host path the notebook profile does not mount: the error says which folders it has,
    as the strict profile says it has none; a missing file in a mounted folder is just
    missing."""
    (tmp_path / "data.csv").write_text("x\n")
    kernel = start_kernel(cwd=tmp_path)
    content = kernel.execute("open('/etc/passwd').read()").content
    assert content["ename"] == "FileNotFoundError"
    assert "no host folder is mounted" not in content["evalue"]
    assert "sees only the host folders mounted at /notebook" in content["evalue"]
    assert "WasmKernel.mounts" in "\n".join(content["traceback"])
    inside = kernel.execute("open('/notebook/missing.csv').read()").content
    assert inside["ename"] == "FileNotFoundError"
    assert "mounted" not in inside["evalue"]


def what_exit_does(kernel_name: str, cell: str) -> tuple:
    """What a client sees when ``cell`` ends a session: the reply, whether the kernel
    process ends, and (if it lives on) whether the variables do."""
    kernel = Kernel(kernel_name=kernel_name)
    try:
        ok(kernel.execute("x = 41"))
        run = kernel.execute(cell)
        process = kernel.manager.provisioner.process
        try:
            process.wait(timeout=20)
            ended = True
        except subprocess.TimeoutExpired:
            ended = False
        state = None if ended else plain(ok(kernel.execute("x + 1")))
        content = run.content
        return content["status"], content.get("payload"), ended, state
    finally:
        kernel.shutdown()


@pytest.mark.parametrize("cell", ["exit()", "quit()", "exit", "exit(keep_kernel=True)"])
def test_exit_does_what_it_does_under_ipykernel(cell: str) -> None:
    ours = what_exit_does(STRICT, cell)
    native = what_exit_does("python3", cell)
    assert ours == native


@pytest.fixture(scope="module")
def timed_kernel() -> Iterator[Kernel]:
    kernel = Kernel(["--WasmKernel.time_limit=2"], kernel_name=STRICT)
    yield kernel
    kernel.shutdown()


@pytest.mark.slow
def test_time_limit_raises_time_limit_exceeded_past_except_exception(
    timed_kernel: Kernel,
) -> None:
    """The guest raises the real class: ``except Exception`` does not swallow it, and the
    traceback the client sees ends in it."""
    run = timed_kernel.execute(
        "try:\n    while True:\n        pass\nexcept Exception:\n    print('swallowed')",
        timeout=60,
    )
    content = run.content
    assert content["ename"] == "TimeLimitExceeded"
    assert run.stream_text() == ""
    assert [e["ename"] for e in run.of_type("error")] == ["TimeLimitExceeded"]
    last_line = re.sub(r"\x1b\[[0-9;]*m", "", content["traceback"][-1])
    assert last_line.startswith("TimeLimitExceeded: the cell ran longer"), last_line


@pytest.mark.slow
@pytest.mark.parametrize("wait", ["while True:\n        pass", "time.sleep(30)"])
def test_a_cell_can_catch_time_limit_exceeded_by_name(timed_kernel: Kernel, wait: str) -> None:
    """Importable by users; a KeyboardInterrupt; caught, the cell's cleanup runs and the cell
    still fails the limit, its effects kept."""
    run = timed_kernel.execute(
        "import time\nfrom _wasm_kernel_sandbox import TimeLimitExceeded\n"
        f"try:\n    {wait}\nexcept TimeLimitExceeded as exc:\n"
        "    caught = (type(exc).__name__, isinstance(exc, KeyboardInterrupt), str(exc))",
        timeout=60,
    )
    assert run.content["ename"] == "TimeLimitExceeded"
    name, is_interrupt, text = plain(ok(timed_kernel.execute("caught")))
    assert (name, is_interrupt) == ("TimeLimitExceeded", True)
    assert "wall-clock limit of 2 s" in text


@pytest.mark.slow
def test_a_cell_that_disarms_the_interrupt_is_still_stopped_by_the_limit(
    timed_kernel: Kernel,
) -> None:
    """The guest's SIGINT handler is the guest's to replace; the limit does not depend on
    it: ignored, the cell is stopped hard and rolled back, and its handler with it."""
    run = timed_kernel.execute(
        "import signal\nsignal.signal(signal.SIGINT, lambda *args: None)\n"
        "disarmed = True\nwhile True:\n    pass",
        timeout=60,
    )
    assert run.content["ename"] == "TimeLimitExceeded"
    assert "did not stop within" in run.content["evalue"]
    assert "NameError" in timed_kernel.execute("disarmed").content["ename"]
    again = timed_kernel.execute("while True:\n    pass", timeout=60)
    assert "did not stop within" not in again.content["evalue"]
    assert again.content["ename"] == "TimeLimitExceeded"


def test_a_forged_interruption_request_learns_nothing(timed_kernel: Kernel) -> None:
    """Outside a time limit the host's answer is empty, whatever the request carries."""
    run = timed_kernel.execute(
        "import _host, json\n"
        "[json.loads(_host.call(raw) or b'{}') for raw in"
        ' (b\'{"op": "interruption"}\', b\'{"op": "interruption", "time_limit": 1}\')]'
    )
    assert plain(ok(run)) == [{}, {}]
    assert plain(ok(timed_kernel.execute("'still here'"))) == "still here"
