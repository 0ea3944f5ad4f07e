"""wasm-kernel under a real JupyterHub, as a class uses it: LocalProcessSpawner, two real local
users, the kernel installed once by root for every user (``install --sys-prefix``).

The hub (pip ``jupyterhub``, npm ``configurable-http-proxy``) is driven through its REST API
with a service token: both users' servers are spawned, a notebook's cells run for each over
the kernel's websocket through the proxy, each user's own token reaches their server and not
the other's, and a server stopped through the hub's API (as jupyterhub-idle-culler stops one:
LocalProcessSpawner sends SIGINT), and one jupyterhub-idle-culler stops, gives the notebooks'
variables back once respawned; the user's kernel server ends within its idle time. Needs
root (useradd); skipped elsewhere, saying why.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import websocket
from lab_server import free_port
from local_users import LocalUser, local_users
from notebook_server import NotebookServer, RefusedRequest, kernel_processes, wait_gone

KERNEL_SERVER = "wasm_kernel.server.kernel_server"  # on a kernel server's command line
SPAWN_SECONDS = 120.0
STOP_SECONDS = 60.0  # LocalProcessSpawner: up to interrupt_timeout (30 s) for SIGINT to work
HIBERNATED_SECONDS = 10.0
SERVER_IDLE = 8  # seconds a user's kernel server lasts without kernels (600 by default)
SERVER_POLL = 5  # seconds: the kernel server looks at its idle time at least this often
HUB_CONFIG = """
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.db_url = "sqlite:///{folder}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{folder}/cookie_secret"
c.JupyterHub.pid_file = "{folder}/jupyterhub.pid"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = set({users!r})
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.notebook_dir = "~/project"
c.Spawner.environment = {{"WASM_KERNEL_SERVER_IDLE": "{idle}"}}
c.Spawner.http_timeout = {spawn}
c.Spawner.start_timeout = {spawn}
c.JupyterHub.services = [{{"name": "operator", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [
    {{
        "name": "operator",
        "scopes": ["admin:users", "admin:servers", "tokens", "access:servers"],
        "services": ["operator"],
    }}
]
"""


class Hub:
    """A JupyterHub in ``folder``, and its REST API under the operator's token."""

    def __init__(self, folder: Path, users: list[LocalUser]):
        proxy = shutil.which("configurable-http-proxy")
        if proxy is None:
            pytest.skip(
                "configurable-http-proxy (npm) is missing: .ci/install-system-deps installs it"
            )
        self.token = secrets.token_hex(32)
        port = free_port()
        config = HUB_CONFIG.format(
            port=port,
            hub_port=free_port(),
            proxy_port=free_port(),
            proxy=proxy,
            folder=folder,
            users=[user.name for user in users],
            singleuser=str(Path(sys.executable).parent / "jupyterhub-singleuser"),
            spawn=int(SPAWN_SECONDS),
            token=self.token,
            idle=SERVER_IDLE,
        )
        (folder / "jupyterhub_config.py").write_text(config)
        self.url = f"http://127.0.0.1:{port}/"
        self.log = folder / "jupyterhub.log"
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(folder / "jupyterhub_config.py")],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "ab"),  # noqa: SIM115  (the hub keeps it)
        )
        self.api = NotebookServer(self.url + "hub/", self.token)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.api.request("GET", "api/")
                break
            except (OSError, RefusedRequest):
                assert self.process.poll() is None, self.log.read_text()[-3000:]
                assert time.monotonic() < deadline, self.log.read_text()[-3000:]
                time.sleep(0.3)

    def call(self, method: str, path: str, body: object = None) -> Any:
        """The hub's REST API; a refusal shows the hub's log."""
        try:
            return self.api.request(method, path, body)
        except RefusedRequest as exc:
            raise AssertionError(
                f"{method} {path}: {exc}\n{self.log.read_text()[-4000:]}"
            ) from None

    def user(self, name: str) -> dict:
        return dict(self.call("GET", f"api/users/{name}"))

    def spawn(self, name: str) -> None:
        self.call("POST", f"api/users/{name}/server")
        self.wait_for(name, lambda server: bool(server and server.get("ready")), "ready")

    def stop(self, name: str) -> None:
        self.call("DELETE", f"api/users/{name}/server")
        self.wait_for(name, lambda server: server is None, "stopped")

    def wait_for(self, name: str, done, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + SPAWN_SECONDS
        while not done(self.user(name)["servers"].get("")):
            assert time.monotonic() < deadline, (what, self.log.read_text()[-3000:])
            time.sleep(0.2)

    def user_token(self, name: str) -> str:
        """A token of the user's own, with the scopes a user has by default."""
        answer = self.call("POST", f"api/users/{name}/tokens", {"note": "test"})
        return str(answer["token"])

    def server_of(self, name: str, token: str) -> NotebookServer:
        """The user's server through the proxy, as that token's holder reaches it."""
        return NotebookServer(f"{self.url}user/{name}/", token)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def installed_for_everybody() -> None:
    """What an operator does once, as root: the kernelspecs and runtime in the environment's
    prefix, where every user's Jupyter finds them."""
    done = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "install", "--sys-prefix"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture
def hub(tmp_path_factory: pytest.TempPathFactory, installed_for_everybody: None) -> Iterator:
    with local_users(2) as users:
        folder = tmp_path_factory.mktemp("hub")
        hub = Hub(folder, users)
        try:
            yield hub, users
        finally:
            hub.close()


def kernel_server_of(user: LocalUser) -> psutil.Process:
    """The user's kernel server, once it answers (its socket is bound)."""
    deadline = time.monotonic() + SPAWN_SECONDS
    while True:
        for process in psutil.process_iter(["uids", "cmdline"]):
            cmdline = process.info["cmdline"] or []
            mine = process.info["uids"].real == user.uid and KERNEL_SERVER in cmdline
            if mine and Path(cmdline[-1]).exists():  # its socket, bound once it serves
                return process
        logs = [log.read_text() for log in user.home.glob(".local/share/jupyter/runtime/*/*.log")]
        assert time.monotonic() < deadline, f"no kernel server answers for {user.name}: {logs}"
        time.sleep(0.2)


def open_and_run(server: NotebookServer, path: str, code: str) -> tuple[str, list[float]]:
    """Open ``path`` and run its first cell: the kernel's id, and the seconds the session's
    start and the first cell took."""
    started = time.monotonic()
    kernel = server.open_notebook(path)
    opened = time.monotonic()
    cell = server.execute(kernel, code)
    assert cell.status == "ok", cell.reply["content"]
    return kernel, [round(opened - started, 3), round(time.monotonic() - opened, 3)]


def test_two_users_run_their_notebooks_apart_and_a_stopped_server_gives_the_session_back(
    hub,  # type: ignore[no-untyped-def]
) -> None:
    hub, (alice, bob) = hub
    timings: dict[str, list[float]] = {}
    tokens = {user.name: hub.user_token(user.name) for user in (alice, bob)}
    kernels: dict[str, str] = {}
    for user in (alice, bob):
        hub.spawn(user.name)
        server = hub.server_of(user.name, tokens[user.name])
        code = f"secret = 'of {user.name}'"
        kernels[user.name], timings[f"{user.name} launched"] = open_and_run(
            server, "course.ipynb", code
        )
        [process] = kernel_processes(kernels[user.name])
        assert process.uids().real == user.uid  # the kernel's process is its user's
        if user is alice:  # her second notebook: a kernel forked by her kernel server
            kernel_server = kernel_server_of(alice)
            served, timings[f"{alice.name} served"] = open_and_run(server, "lab.ipynb", "lab = 1")
            [served_process] = kernel_processes(served)
            assert served_process.ppid() == kernel_server.pid

    # each user's token reaches their own server and kernel only
    intruder = hub.server_of(bob.name, tokens[alice.name])
    with pytest.raises(RefusedRequest) as refused:
        intruder.request("GET", "api/kernels")
    assert refused.value.status in (302, 403), refused.value
    with pytest.raises(websocket.WebSocketException) as refused_socket:
        intruder.execute(kernels[bob.name], "secret")
    assert "403" in str(refused_socket.value) or "302" in str(refused_socket.value)
    mine = hub.server_of(alice.name, tokens[alice.name])
    assert mine.execute(kernels[alice.name], "print(secret)").text() == f"of {alice.name}\n"

    # stopped through the hub's API (LocalProcessSpawner: SIGINT), both sessions hibernate,
    # and her kernel server ends after its idle time
    ended = kernel_processes(kernels[alice.name]) + [served_process]
    hub.stop(alice.name)
    left = wait_gone(ended, HIBERNATED_SECONDS)
    assert not left, f"alice's kernels outlived her server by {HIBERNATED_SECONDS} s"
    left = wait_gone([kernel_server], SERVER_IDLE + SERVER_POLL + 5)
    assert not left, "alice's kernel server outlived her last server by more than its idle time"

    hub.spawn(alice.name)
    again = hub.server_of(alice.name, tokens[alice.name])
    for path, code, expected in [
        ("course.ipynb", "print(secret)", f"of {alice.name}"),
        ("lab.ipynb", "print(lab)", "1"),
    ]:
        cell = again.execute(again.open_notebook(path), code)
        assert cell.status == "ok", (path, cell.reply["content"])
        note, printed = cell.text().splitlines()
        assert "resumed this notebook's session" in note
        assert printed == expected
    # bob's server and kernel were untouched
    bobs = hub.server_of(bob.name, tokens[bob.name])
    assert bobs.execute(kernels[bob.name], "print(secret)").text() == f"of {bob.name}\n"

    # jupyterhub-idle-culler stops bob's idle server through the same API: his session too
    [bobs_process] = kernel_processes(kernels[bob.name])
    with open(hub.log.with_name("culler.log"), "ab") as log:
        culler = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub_idle_culler", f"--url={hub.url}hub/api"]
            + ["--timeout=1", "--cull-every=1"],
            env={**os.environ, "JUPYTERHUB_API_TOKEN": hub.token},
            stdout=log,
            stderr=log,
        )
    try:
        hub.wait_for(bob.name, lambda server: server is None, "culled")
    finally:
        culler.terminate()
        culler.wait(30)
    assert not wait_gone([bobs_process], HIBERNATED_SECONDS), "bob's kernel outlived his server"
    hub.spawn(bob.name)
    bobs = hub.server_of(bob.name, tokens[bob.name])
    cell = bobs.execute(bobs.open_notebook("course.ipynb"), "print(secret)")
    assert cell.text().splitlines()[-1] == f"of {bob.name}", cell.reply["content"]
    print("session start and first cell (s):", json.dumps(timings))
