"""A Jupyter server of the test's own (JupyterLab's, which serves the REST and websocket APIs
every front end uses), on a free localhost port, with fresh config, data and runtime folders:
the browser tests drive it with Chromium, others through its API as JupyterLab does."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from notebook_server import NotebookServer, RefusedRequest

STARTUP_TIMEOUT = 120  # seconds for JupyterLab to answer


class JupyterLab:
    """A JupyterLab server on a free localhost port serving ``root``, its log in ``log_path``."""

    def __init__(self, root: Path, log_path: Path):
        self.root = root
        self.log_path = log_path
        self.token = secrets.token_hex(24)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = NotebookServer(f"{self.url}/", self.token)
        state = root.parent / "jupyter-state"
        self.runtime_dir = state / "runtime"
        self.leftover_kernels: list[int] = []
        # The server's config, data (notebook-signing key), runtime files (kernel connection
        # files), Lab settings and workspaces go to fresh folders, so the test neither depends on
        # nor writes to the user's. Kernelspecs are still found where the other tests find them:
        # the user's data folder stays on the read-only search path.
        search_path = [jupyter_data_dir(), *filter(None, [os.environ.get("JUPYTER_PATH")])]
        env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(state / "config"),
            "JUPYTER_DATA_DIR": str(state / "data"),
            "JUPYTER_PATH": os.pathsep.join(search_path),
            "JUPYTER_RUNTIME_DIR": str(self.runtime_dir),
            "JUPYTERLAB_SETTINGS_DIR": str(state / "lab-settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(state / "lab-workspaces"),
        }
        # No "Would you like to get notified about official Jupyter news?" toast over the page.
        notification = state / "lab-settings/@jupyterlab/apputils-extension"
        notification.mkdir(parents=True)
        (notification / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
        self.log = open(log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--allow-root",  # CI runs as root; harmless otherwise
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0",
                f"--ServerApp.root_dir={root}",
                f"--IdentityProvider.token={self.token}",
                "--PasswordIdentityProvider.hashed_password=",
                "--LabApp.news_url=",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly",
                "--ServerApp.log_level=INFO",
            ],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def api(self, path: str, method: str = "GET", body: dict | None = None) -> Any:
        """One REST call of the server's API, as a front end makes it; its JSON answer."""
        return self.client.request(method, f"api/{path}", body)

    def wait_until_up(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            assert self.process.poll() is None, f"JupyterLab exited early\n{self.log_tail()}"
            try:
                self.api("status")
                return
            except (urllib.error.URLError, RefusedRequest, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline, f"JupyterLab did not answer\n{self.log_tail()}"
                time.sleep(0.25)

    def log_tail(self, lines: int = 60) -> str:
        if not self.log.closed:
            self.log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "--- JupyterLab log (tail) ---\n" + "\n".join(text[-lines:])

    def stop(self) -> None:
        """Shut kernels down through the API, then the server; kill whatever is left."""
        if self.process.poll() is None:
            try:
                for kernel in self.api("kernels"):  # type: ignore[union-attr]
                    self.api(f"kernels/{kernel['id']}", method="DELETE")
            except (RefusedRequest, OSError, ValueError):
                pass
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        # Kernels run in sessions of their own; any still alive are found by the connection
        # files under this server's private runtime folder. The kernel server this JupyterLab
        # started there outlives it by design (until idle): not a leftover kernel, but stopped.
        found = pids_mentioning(str(self.runtime_dir))
        servers = [
            pid for pid in found if pid in pids_mentioning("wasm_kernel.server.kernel_server")
        ]
        self.leftover_kernels = [pid for pid in found if pid not in servers]
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


@contextmanager
def running_jupyterlab(root: Path, log_path: Path) -> Iterator[JupyterLab]:
    """A JupyterLab that answers; it and its kernels are stopped whatever happens in the block."""
    server = JupyterLab(root, log_path)
    try:
        server.wait_until_up()
        yield server
    finally:
        server.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pids_mentioning(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (Linux; elsewhere none are found)."""
    found: list[int] = []
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def execute(server: JupyterLab, kernel_id: str, code: str, timeout: float = 120) -> dict:
    """Run ``code`` in a kernel over the server's websocket, as JupyterLab does; the reply's
    content, with the text of its streams and results gathered under ``"output"``."""
    cell = server.client.execute(kernel_id, code, timeout)
    return {**cell.reply["content"], "output": cell.text()}
