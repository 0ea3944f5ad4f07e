"""A released Jupyter Enterprise Gateway, and a Jupyter server in front of it, for the tests.

EG 3.x requires jupyter_client < 7, so it cannot share the test environment: it gets a
virtual environment of its own, made once per EG version in a cache folder and reused (a
marker file says it is complete). Kernels still run the test environment's Python: the
kernelspecs `install --gateway` writes name it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import platformdirs
from lab_server import free_port
from notebook_server import NotebookServer

EG_VERSION = "3.3.0"
READY_MARK = ".complete"
START_SECONDS = 60


def gateway_venv() -> Path:
    """EG's own environment, built on first use (about a minute) and reused afterwards."""
    folder = Path(platformdirs.user_cache_dir("wasm-kernel-tests")) / (
        f"enterprise-gateway-{EG_VERSION}-py{sys.version_info[0]}{sys.version_info[1]}"
    )
    if (folder / READY_MARK).is_file():
        return folder
    shutil.rmtree(folder, ignore_errors=True)  # an interrupted build
    folder.parent.mkdir(parents=True, exist_ok=True)
    python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([python, "-m", "venv", str(folder)], check=True, timeout=300)
    result = subprocess.run(
        [folder / "bin" / "pip", "install", "-q", f"jupyter_enterprise_gateway=={EG_VERSION}"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, f"pip could not install Enterprise Gateway:\n{result.stderr}"
    (folder / READY_MARK).write_text(EG_VERSION)
    return folder


class HttpServer:
    """A server process answering at ``url``, with the token its REST API wants."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path, probe: str):
        self.port = free_port()
        self.token = uuid.uuid4().hex
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = NotebookServer(f"{self.url}/", self.token)
        self.log = log
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [arg.format(port=self.port, token=self.token) for arg in argv],
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                self.request("GET", probe)
                return
            except (urllib.error.URLError, ConnectionError):
                assert self.process.poll() is None, f"the server exited:\n{self.log_text()}"
                assert time.monotonic() < deadline, f"no answer:\n{self.log_text()}"
                time.sleep(0.25)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        return self.client.request(method, path.lstrip("/"), body)

    def run_cell(self, kernel_id: str, code: str, timeout: float = 120) -> tuple[dict, str, str]:
        """One cell over the kernel's websocket: its reply, stdout and stderr."""
        cell = self.client.execute(kernel_id, code, timeout)
        streams = {"stdout": "", "stderr": ""}
        for message in cell.outputs:
            if message["msg_type"] == "stream":
                streams[message["content"]["name"]] += message["content"]["text"]
        return cell.reply["content"], streams["stdout"], streams["stderr"]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, as a service manager stops it; its process group after it."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


@contextlib.contextmanager
def enterprise_gateway(
    venv: Path, kernels: Path, folder: Path, env: dict[str, str]
) -> Iterator[HttpServer]:
    """EG on a free port, working in ``folder``, serving the kernelspecs under ``kernels``
    (a share/jupyter folder), with ``env`` for its own process."""
    argv = [
        str(venv / "bin" / "jupyter-enterprisegateway"),
        "--ip=127.0.0.1",
        "--port={port}",
        "--port_retries=0",
        "--EnterpriseGatewayApp.auth_token={token}",
    ]
    server = HttpServer(
        argv,
        {**os.environ, "JUPYTER_PATH": str(kernels), **env},
        folder,
        folder.parent / "enterprise-gateway.log",
        "/api/kernelspecs",
    )
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def jupyter_server_before(
    gateway: HttpServer, root: Path, env: dict[str, str], log: Path
) -> Iterator[HttpServer]:
    """`jupyter server --gateway-url`, serving notebooks in ``root``: its kernels are the
    gateway's."""
    argv = [
        sys.executable,
        "-m",
        "jupyter_server",
        "--no-browser",
        "--ip=127.0.0.1",
        "--port={port}",
        "--port-retries=0",
        "--IdentityProvider.token={token}",
        f"--gateway-url={gateway.url}",
        f"--GatewayClient.auth_token={gateway.token}",
        "--GatewayClient.allowed_envs=JPY_SESSION_NAME",
        f"--ServerApp.root_dir={root}",
        "--allow-root",
    ]
    server = HttpServer(argv, {**os.environ, **env}, root, log, "/api/status")
    try:
        yield server
    finally:
        server.stop()
