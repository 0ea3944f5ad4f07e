"""A notebook's session survives the ways its Jupyter Server is stopped.

A real ``jupyter server`` is driven as JupyterLab drives it (a session for a notebook over
REST, a cell over the kernel's websocket), then stopped as a hub or an operator stops it:
SIGINT (JupyterHub's LocalProcessSpawner, with no terminal: the server exits without shutting
its kernels down), SIGTERM (the server shuts them down), SIGKILL (the kernel is left without
its launcher). A new server opens the same notebook: its variables are back. Both ways a
kernel is launched are covered: forked by the kernel server (which watches its launcher through
the lifeline) and launched the ordinary way (ipykernel's parent poller watches it).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest
from conftest import ok, plain
from lab_server import free_port
from notebook_server import NotebookServer, kernel_processes, wait_gone
from served_kernels import server_answering, server_pid

from wasm_kernel.images.image_folder import ImageFolder
from wasm_kernel.images.names import SUFFIX

STOPPED_SECONDS = 30.0  # LocalProcessSpawner's interrupt_timeout: the hub's SIGINT grace
HIBERNATED_SECONDS = 10.0  # a stopped server's kernel ends this soon, having hibernated


class JupyterServer:
    """``jupyter server`` serving ``root``, as a spawner starts it (no terminal)."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.port = free_port()
        token = secrets.token_hex(16)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter_server",
                "--no-browser",
                f"--port={self.port}",
                "--ip=127.0.0.1",
                f"--ServerApp.root_dir={root}",
                f"--IdentityProvider.token={token}",
                "--ServerApp.port_retries=0",
                "--allow-root",  # CI runs as root
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(root / "server.log", "ab"),  # noqa: SIM115  (the child keeps it)
        )
        self.client = NotebookServer(f"http://127.0.0.1:{self.port}/", token)
        self.client.wait_ready(60)

    def stop(self, signum: int) -> None:
        self.process.send_signal(signum)
        self.process.wait(STOPPED_SECONDS)


@pytest.fixture
def server_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {**os.environ, "WASM_KERNEL_SNAPSHOT_DIR": str(tmp_path / "snapshots")}
    (tmp_path / "notes").mkdir()
    yield env


CASES = [
    ("SIGINT", "served", signal.SIGINT),
    ("SIGINT", "launched", signal.SIGINT),
    ("SIGKILL", "served", signal.SIGKILL),
    ("SIGTERM", "served", signal.SIGTERM),
]


@pytest.mark.parametrize(
    ("stop", "launch", "signum"), CASES, ids=[f"{stop}-{launch}" for stop, launch, _ in CASES]
)
def test_the_session_comes_back_after_the_server_is_stopped(
    server_env: dict[str, str], tmp_path: Path, stop: str, launch: str, signum: int
) -> None:
    if launch == "launched":
        server_env["WASM_KERNEL_SERVER"] = "off"
    else:
        server_answering()  # so that the notebook's kernel is forked by it
    root = tmp_path / "notes"
    server = JupyterServer(root, server_env)
    try:
        kernel_id = server.client.open_notebook("analysis.ipynb")
        cell = server.client.execute(kernel_id, f"kept = {stop!r} + ' kept'")
        assert cell.status == "ok", cell.reply
        kernels = kernel_processes(kernel_id)
        assert len(kernels) == 1, "the kernel's process was not found"
        assert (kernels[0].ppid() == server_pid()) == (launch == "served")
    finally:
        server.stop(signum)
    left = wait_gone(kernels, HIBERNATED_SECONDS)
    assert not left, f"the kernel outlived its server by {HIBERNATED_SECONDS} s: {left}"

    again = JupyterServer(root, server_env)
    try:
        kernel_id = again.client.open_notebook("analysis.ipynb")
        cell = again.client.execute(kernel_id, "print(kept)")
        assert cell.status == "ok", (cell.reply["content"], (root / "server.log").read_text())
        note, printed = cell.text().splitlines()
        assert "resumed this notebook's session" in note
        assert printed == f"{stop} kept"
    finally:
        again.stop(signal.SIGTERM)


def test_a_notebook_reopened_while_its_last_kernel_hibernates_resumes_it(
    start_kernel, tmp_path: Path
) -> None:
    """A hub respawns a server at once: the new kernel waits for the save in progress. The
    save is the first kernel's own image, written again by the test, which holds it open
    until the second kernel has started."""
    env = {"WASM_KERNEL_SNAPSHOT_DIR": str(tmp_path), "JPY_SESSION_NAME": "big.ipynb"}
    first = start_kernel(env=env)
    mark = plain(ok(first.execute("import os\nmark = os.urandom(8).hex()\nmark")))
    first.shutdown()
    [image] = tmp_path.glob(f"{ImageFolder.HIBERNATED}*{SUFFIX}")
    saved, name = image.read_bytes(), image.name.removesuffix(SUFFIX)
    image.unlink()
    folder, writing, release = ImageFolder(tmp_path, 0), threading.Event(), threading.Event()

    def write(out: BinaryIO) -> None:
        out.write(saved)
        writing.set()
        release.wait(60)

    saver = threading.Thread(target=folder.store, args=(name, write))
    saver.start()
    try:
        assert writing.wait(30)
        server_answering()
        second = start_kernel(env=env)
        assert folder.saving(name)
    finally:
        release.set()
        saver.join()
    assert plain(ok(second.execute("mark"))) == mark
