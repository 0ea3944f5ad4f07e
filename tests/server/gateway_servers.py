"""A released Jupyter Enterprise Gateway, and a Jupyter server in front of it, for the tests.

EG 3.x requires jupyter_client < 7, so it cannot share the test environment: it gets a
virtual environment of its own, made once per EG version in a cache folder and reused (a
marker file says it is complete). Kernels still run the test environment's Python: the
kernelspecs `install --gateway` writes name it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
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
import websocket

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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class HttpServer:
    """A server process answering at ``url``, with the token its REST API wants."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path, probe: str):
        self.port = free_port()
        self.token = uuid.uuid4().hex
        self.url = f"http://127.0.0.1:{self.port}"
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
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            text = response.read()
        return json.loads(text) if text else None

    def run_cell(self, kernel_id: str, code: str, timeout: float = 120) -> tuple[dict, str, str]:
        """One cell over the kernel's websocket: its reply, stdout and stderr."""
        ws = websocket.create_connection(
            f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels",
            header=[f"Authorization: token {self.token}"],
            timeout=timeout,
        )
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "test"}
        header |= {"session": uuid.uuid4().hex, "version": "5.3", "date": ""}
        content = {"code": code, "silent": False, "store_history": True}
        content |= {"user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
        ws.send(
            json.dumps(
                {"header": header, "parent_header": {}, "metadata": {}, "channel": "shell"}
                | {"content": content, "buffers": []}
            )
        )
        reply: dict | None = None
        idle = False
        streams = {"stdout": "", "stderr": ""}
        try:
            while reply is None or not idle:
                message = json.loads(ws.recv())
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = message["msg_type"]
                if message["channel"] == "shell":
                    reply = message["content"]
                elif kind == "stream":
                    streams[message["content"]["name"]] += message["content"]["text"]
                elif kind == "status":
                    idle = message["content"]["execution_state"] == "idle"
        finally:
            ws.close()
        return reply, streams["stdout"], streams["stderr"]

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
