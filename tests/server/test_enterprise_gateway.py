"""Tenants behind a released Jupyter Enterprise Gateway (3.x, in its own environment).

The kernelspecs are the ones ``python -m wasm_kernel install --gateway`` writes, run by EG
as they are. EG runs every tenant's kernels as its one service account and names the tenant
in KERNEL_USERNAME: one tenant must not list, restore or resume another's snapshots or
hibernated session, and the notebook profile must mount the tenant's working folder
(KERNEL_WORKING_DIR) or nothing, never EG's own folder, which holds a secret here. Cells run
through EG's REST and websocket API, and through ``jupyter server --gateway-url``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from gateway_servers import HttpServer, enterprise_gateway, gateway_venv, jupyter_server_before

from wasm_kernel.files import tenancy
from wasm_kernel.runtime.cache import default_cache_dir

GATEWAY_SECRET = "eg-auth-token-5d41402abc4b2a76"
CARD = "4111 1111 1111 1111"
PORTS = (42000, 43000)  # EG's port range for kernels
SESSION = "/srv/notebooks/shared-name.ipynb"  # both tenants' notebooks have this path

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="EG's local kernels, on Linux")


class Site:
    """The gateway's host: EG's folder, the tenants' folders, the kernels' data."""

    def __init__(self, root: Path):
        self.root = root
        self.gateway_folder = root / "gateway"
        self.gateway_folder.mkdir()
        (self.gateway_folder / "eg-token.txt").write_text(GATEWAY_SECRET)
        self.data = root / "xdg-data"  # the service account's per-user data
        self.kernels = root / "prefix"
        self.notebooks = root / "notebooks"

    def working_dir(self, tenant: str) -> Path:
        folder = self.notebooks / tenant
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{tenant}-data.txt").write_text(f"{tenant}'s data")
        return folder

    def tenant_folders(self) -> list[Path]:
        return sorted(self.data.rglob(f"{tenancy.TENANTS}/*"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    here = Site(tmp_path_factory.mktemp("gateway-site"))
    env = {
        "XDG_DATA_HOME": str(here.data),
        "XDG_CACHE_HOME": str(here.root / "xdg-cache"),
    }
    pairs = [arg for name, value in env.items() for arg in ("--env", name, value)]
    subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "install", "--gateway", "--no-precompile"]
        # the runtime the test setup built, named in the kernelspecs as an operator names one
        # compiled elsewhere (a --prefix that is not this Python's would have its own)
        + ["--cache-dir", str(default_cache_dir()), "--prefix", str(here.kernels), *pairs],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return here


@pytest.fixture(scope="module")
def gateway(site: Site) -> Iterator[HttpServer]:
    env = {
        "EG_CLIENT_ENVS": "JPY_SESSION_NAME",  # lets the notebook's name through
        "EG_PORT_RANGE": f"{PORTS[0]}..{PORTS[1]}",
        "EG_ALLOWED_KERNELS": "wasm-python,wasm-python-strict",
        "EG_LIST_KERNELS": "True",  # a Jupyter server in front lists them
    }
    kernels = site.kernels / "share" / "jupyter"
    with enterprise_gateway(gateway_venv(), kernels, site.gateway_folder, env) as server:
        yield server


def start_kernel(gateway: HttpServer, env: dict[str, str]) -> str:
    kernel = gateway.request("POST", "/api/kernels", {"name": "wasm-python", "env": env})
    return str(kernel["id"])


def for_tenant(site: Site, tenant: str) -> dict[str, str]:
    return {
        "KERNEL_USERNAME": tenant,
        "KERNEL_WORKING_DIR": str(site.working_dir(tenant)),
        "JPY_SESSION_NAME": SESSION,
    }


def ok(run: tuple[dict, str, str]) -> str:
    reply, stdout, stderr = run
    assert reply["status"] == "ok", (reply, stderr)
    return stdout


def kernel_process(kernel_id: str) -> psutil.Process:
    for process in psutil.process_iter(["cmdline"]):
        if any(f"kernel-{kernel_id}.json" in arg for arg in process.info["cmdline"] or []):
            return process
    raise AssertionError(f"no process for kernel {kernel_id}")


SEES = (
    "import os\n"
    "seen = [(root, sorted(files)) for top in ('/notebook', '/tmp')"
    " for root, _, files in os.walk(top)]\n"
    "print(os.getcwd(), sorted(os.listdir('.')), seen)"
)


def test_tenants_keep_their_sessions_and_folders_apart(site: Site, gateway: HttpServer) -> None:
    alice = start_kernel(gateway, for_tenant(site, "alice"))
    seen = ok(gateway.run_cell(alice, SEES))  # once it answers, its ports are open
    assert seen.startswith("/notebook ['alice-data.txt']"), seen
    assert "eg-token.txt" not in seen
    process = kernel_process(alice)
    listening = [c.laddr for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    assert {address.ip for address in listening} == {"127.0.0.1"}, listening  # EG's address
    asked = json.loads(Path(process.cmdline()[process.cmdline().index("-f") + 1]).read_text())
    ports = {asked[f"{channel}_port"] for channel in ("shell", "iopub", "stdin", "control", "hb")}
    assert ports <= {address.port for address in listening}, (asked, listening)
    assert all(PORTS[0] <= port <= PORTS[1] for port in ports), ports  # EG's port range
    ok(gateway.run_cell(alice, f"card = {CARD!r}"))
    assert "Saved snapshot 'cards'" in ok(gateway.run_cell(alice, "%snapshot save cards"))
    gateway.request("DELETE", f"/api/kernels/{alice}")  # closing the notebook: it hibernates

    bob = start_kernel(gateway, for_tenant(site, "bob"))  # a notebook of the same name
    reply, stdout, stderr = gateway.run_cell(bob, "print('card' in globals())")
    assert (reply["status"], stdout) == ("ok", "False\n"), (reply, stderr)
    assert "resumed" not in stderr
    listed = ok(gateway.run_cell(bob, "%snapshot list"))
    assert "cards" not in listed and "No snapshots" in listed
    reply, _, _ = gateway.run_cell(bob, "%snapshot restore cards")
    assert reply["status"] == "error" and "no snapshot named 'cards'" in reply["evalue"]
    seen = ok(gateway.run_cell(bob, SEES))
    assert seen.startswith("/notebook ['bob-data.txt']") and "alice" not in seen, seen
    gateway.request("DELETE", f"/api/kernels/{bob}")

    alice = start_kernel(gateway, for_tenant(site, "alice"))  # her session comes back
    assert ok(gateway.run_cell(alice, "print(card)")) == CARD + "\n"
    gateway.request("DELETE", f"/api/kernels/{alice}")

    names = [path.name for path in site.tenant_folders()]
    assert {name.split("-")[0] for name in names} == {"alice", "bob"}
    for folder in site.tenant_folders():
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    outside = [p for p in site.data.rglob("*.wkimg") if tenancy.TENANTS not in p.parts]
    assert outside == [], "an image was kept outside the tenants' folders"


@pytest.mark.parametrize("named", ["none", "gateway's folder"])
def test_no_notebook_folder_mounts_nothing(site: Site, gateway: HttpServer, named: str) -> None:
    """Without a working folder of the tenant's, nothing is mounted: not EG's folder (where
    the kernel runs), not one holding it."""
    env = {"KERNEL_USERNAME": "carol"}
    if named != "none":
        env["KERNEL_WORKING_DIR"] = str(site.gateway_folder.parent)
    kernel = start_kernel(gateway, env)
    try:
        reply, stdout, stderr = gateway.run_cell(
            kernel, "import os\nprint(os.getcwd(), os.path.exists('/notebook'))"
        )
        assert (reply["status"], stdout) == ("ok", "/tmp False\n"), (reply, stderr)
        assert "no folder is mounted" in stderr
        reply, _, _ = gateway.run_cell(kernel, "open('eg-token.txt').read()")
        assert reply["status"] == "error"
    finally:
        gateway.request("DELETE", f"/api/kernels/{kernel}")


def test_jupyter_server_in_front_of_the_gateway(site: Site, gateway: HttpServer) -> None:
    """`jupyter server --gateway-url`: it names the tenant (KERNEL_USERNAME from its own
    environment), the notebook's folder and, allowed through, the notebook (JPY_SESSION_NAME),
    so the notebook's folder is mounted and its session hibernates and comes back."""
    site.working_dir("dave")
    log = site.root / "jupyter-server.log"
    env = {"KERNEL_USERNAME": "dave"}
    with jupyter_server_before(gateway, site.notebooks, env, log) as server:
        body = {"path": "dave/work.ipynb", "type": "notebook", "kernel": {"name": "wasm-python"}}
        session = server.request("POST", "/api/sessions", body)
        kernel = session["kernel"]["id"]
        seen = ok(server.run_cell(kernel, SEES))
        assert seen.startswith("/notebook ['dave-data.txt']") and "eg-token" not in seen, seen
        described = ok(server.run_cell(kernel, "%sandbox"))
        assert f"/notebook <- {site.notebooks / 'dave'} (read-only)" in described
        assert "Hibernation: on" in described and "/tenants/dave-" in described, described
        ok(server.run_cell(kernel, "kept = 42"))
        server.request("DELETE", f"/api/sessions/{session['id']}")
        session = server.request("POST", "/api/sessions", body)
        reply, stdout, stderr = server.run_cell(session["kernel"]["id"], "print(kept)")
        assert (reply["status"], stdout) == ("ok", "42\n"), (reply, stderr)
        assert "resumed this notebook's session" in stderr
        server.request("DELETE", f"/api/sessions/{session['id']}")


def test_hibernation_says_why_it_is_off_without_the_notebooks_name(
    site: Site, gateway: HttpServer
) -> None:
    env = {"KERNEL_USERNAME": "erin", "KERNEL_WORKING_DIR": str(site.working_dir("erin"))}
    kernel = start_kernel(gateway, env)
    try:
        described = ok(gateway.run_cell(kernel, "%sandbox"))
    finally:
        gateway.request("DELETE", f"/api/kernels/{kernel}")
    line = next(line for line in described.splitlines() if line.startswith("Hibernation:"))
    assert "off" in line and "EG_CLIENT_ENVS=JPY_SESSION_NAME" in line, line
    assert "GatewayClient.allowed_envs=JPY_SESSION_NAME" in line, line


def test_gateway_kernelspec_is_what_eg_runs(site: Site) -> None:
    """What EG 3.x needs: its process proxy named, the connection file it writes, no
    provisioner (jupyter_client 6 has none) and nothing it would leave unsubstituted."""
    spec = json.loads((site.kernels / "share/jupyter/kernels/wasm-python/kernel.json").read_text())
    proxy = spec["metadata"]["process_proxy"]["class_name"]
    assert proxy == "enterprise_gateway.services.processproxies.processproxy.LocalProcessProxy"
    assert "kernel_provisioner" not in spec["metadata"]
    assert spec["argv"][0] == sys.executable and "{connection_file}" in spec["argv"]
    assert [arg for arg in spec["argv"] if "{" in arg] == ["{connection_file}"]
    assert os.access(spec["argv"][0], os.X_OK)


def test_the_debugger_panel_through_the_gateway(site: Site, gateway: HttpServer) -> None:
    """JupyterLab's debugger panel, behind EG: the kernelspec offers it, and the debug
    requests the panel sends on the control channel reach the kernel and are answered."""
    spec = json.loads((site.kernels / "share/jupyter/kernels/wasm-python/kernel.json").read_text())
    assert spec["metadata"]["debugger"] is True
    env = {"KERNEL_USERNAME": "frank", "KERNEL_WORKING_DIR": str(site.working_dir("frank"))}
    kernel = start_kernel(gateway, env)
    try:
        ok(gateway.run_cell(kernel, "seen_by_the_panel = 41 + 1"))
        answers = gateway.client.debug(kernel, ["debugInfo", "initialize", "attach", "debugInfo"])
        before, initialized, attached, after = answers
        assert before["body"]["isStarted"] is False, before
        assert initialized["success"] and attached["success"], answers
        assert after["body"]["isStarted"] is True, after
        (shown,) = gateway.client.debug(kernel, ["inspectVariables"])
        named = {v["name"]: v["value"] for v in shown["body"]["variables"]}
        assert named.get("seen_by_the_panel") == "42", shown
    finally:
        gateway.request("DELETE", f"/api/kernels/{kernel}")
