"""Deployment paths: a pre-baked read-only runtime cache, a read-only HOME, and launch through
gateway_provisioners (the engine behind Jupyter Enterprise Gateway).

Kernels here are real: started by jupyter_client over ZMQ with the installed kernelspec's
command line, running the real runtime. "Nothing was written" is enforced by the OS where
possible and checked by before/after snapshots (names, modes, inodes, mtimes, content hashes)
either way: as root, permissions do not stop writes, so the kernel runs in a user namespace
as a non-root user mapped onto root (``unshare --user --map-user``), where the owner's
missing write bits really refuse writes. Without that (and as root) the tests that need it
are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import KERNEL_NAME
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager, KernelManager

from wasm_kernel.jupyter.history import History
from wasm_kernel.runtime.cache import RuntimeCache
from wasm_kernel.runtime.runtime import load_runtime

INNER_UID = 1000  # the unprivileged user a root test run maps itself to in a user namespace
PRECOMPILE_HINT = "python -m wasm_kernel precompile --cache-dir"
XDG_DIRS = ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME")


# -- sealed folders and snapshots -------------------------------------------------------------


def seal(root: Path) -> None:
    """chmod -R a-w: nobody may write (the OS enforces it for every user but root)."""
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o222)


def unseal(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            with contextlib.suppress(OSError):
                path.chmod(path.stat().st_mode | 0o200)


def snapshot(root: Path) -> list[tuple[str, int, int, int, str]]:
    """Every path under ``root``: name, mode, inode, mtime and a digest of its content."""
    rows = []
    for path in sorted([root, *root.rglob("*")]):
        stat = path.lstat()
        digest = ""
        if path.is_file() and not path.is_symlink():
            sha = hashlib.sha256()
            with path.open("rb") as file:
                for chunk in iter(lambda: file.read(8 << 20), b""):
                    sha.update(chunk)
            digest = sha.hexdigest()
        rows.append(
            (str(path.relative_to(root)), stat.st_mode, stat.st_ino, stat.st_mtime_ns, digest)
        )
    return rows


def _writes_refused(prefix: list[str]) -> bool:
    """Whether a process started with ``prefix`` really cannot write into a chmod a-w folder."""
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"wasm-kernel-probe-{uuid.uuid4().hex}"
    probe.mkdir()
    try:
        seal(probe)
        code = "import sys; open(sys.argv[1] + '/x', 'w')"
        result = subprocess.run(
            [*prefix, sys.executable, "-c", code, str(probe)],
            capture_output=True,
            timeout=60,
            check=False,
        )
        return result.returncode != 0 and b"PermissionError" in result.stderr
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        unseal(probe)
        shutil.rmtree(probe, ignore_errors=True)


@pytest.fixture(scope="module")
def confinement() -> list[str]:
    """Command prefix under which the kernel's writes to sealed folders are refused by the OS."""
    if os.geteuid() != 0:
        prefix: list[str] = []
    else:
        prefix = ["unshare", "--user", f"--map-user={INNER_UID}", f"--map-group={INNER_UID}", "--"]
    if not _writes_refused(prefix):
        pytest.skip(
            "cannot run the kernel so that the OS refuses its writes (root without user namespaces)"
        )
    return prefix


@pytest.fixture(scope="module")
def baked_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache folder as an image would carry it: built by precompile, then sealed.

    The entry and the runtime's files are copied (mtimes kept) from the default cache, where
    the test setup made them, and `precompile --cache-dir` then checks them in place: a cold
    compile takes minutes, fetching the libraries' sources most of one.
    """
    folder = tmp_path_factory.mktemp("baked") / "wasm-kernel-cache"
    folder.mkdir()
    runtime = load_runtime()
    source = RuntimeCache().entry_dir(runtime)
    if (source / RuntimeCache.RECORD).is_file():
        shutil.copytree(source, RuntimeCache(folder).entry_dir(runtime), copy_function=shutil.copy2)
    files = runtime.module.path.parent
    if files.is_dir():
        shutil.copytree(files, folder / files.name, copy_function=shutil.copy2)
    result = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "precompile", "--cache-dir", str(folder)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert str(RuntimeCache(folder).entry_dir(runtime)) in result.stderr
    seal(folder)
    yield folder
    unseal(folder)
    shutil.rmtree(folder)  # some 400 MB: not worth keeping with pytest's old temp folders


@pytest.fixture
def sealed_home(tmp_path: Path) -> Iterator[Path]:
    """A HOME (with empty XDG folders inside) that nobody may write to."""
    home = tmp_path / "home"
    for name in XDG_DIRS:
        (home / name.lower()).mkdir(parents=True)
    seal(home)
    yield home
    unseal(home)


# -- a kernel from the installed kernelspec, confined -----------------------------------------


class ConfinedKernel:
    """The installed kernelspec's command, run under ``prefix`` with a sealed HOME.

    Only TMPDIR and the Jupyter runtime folder (the connection file) are writable.
    """

    def __init__(self, tmp_path: Path, prefix: list[str], home: Path, env: dict[str, str]):
        installed = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
        spec_dir = tmp_path / "kernels" / "wasm-confined"
        spec_dir.mkdir(parents=True)
        spec = installed.to_dict()
        spec["argv"] = [*prefix, *installed.argv]
        (spec_dir / "kernel.json").write_text(json.dumps(spec))
        self.scratch = tmp_path / "scratch"
        runtime_dir = tmp_path / "runtime"
        workdir = tmp_path / "work"
        for folder in (self.scratch, runtime_dir, workdir):
            folder.mkdir()
        self.log_path = tmp_path / "kernel.log"
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("WASM_KERNEL_", "JUPYTER_", "XDG_", "IPYTHON"))
        }
        self.env = {
            **base,
            "HOME": str(home),
            **{name: str(home / name.lower()) for name in XDG_DIRS},
            "TMPDIR": str(self.scratch),
            "JUPYTER_RUNTIME_DIR": str(runtime_dir),
            "PYTHONDONTWRITEBYTECODE": "1",
            **env,
        }
        self.manager = KernelManager(
            kernel_name="wasm-confined",
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec_dir.parent)]),
            connection_file=str(runtime_dir / f"kernel-{uuid.uuid4()}.json"),
        )
        with self.log_path.open("w") as log:
            self.manager.start_kernel(env=self.env, cwd=str(workdir), stdout=log, stderr=log)
        self.client: BlockingKernelClient = self.manager.client()
        try:
            self.client.start_channels()
            self.client.wait_for_ready(timeout=60)
        except BaseException:
            self.client.stop_channels()
            self.manager.shutdown_kernel(now=True)
            raise

    def execute(self, code: str, timeout: float = 60) -> tuple[dict, list[dict]]:
        """The execute_reply's content and the iopub messages the request produced."""
        messages: list[dict] = []
        reply = self.client.execute_interactive(
            code, timeout=timeout, allow_stdin=False, output_hook=messages.append
        )
        return reply["content"], messages

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def stream_text(messages: list[dict], name: str) -> str:
    return "".join(
        m["content"]["text"]
        for m in messages
        if m["msg_type"] == "stream" and m["content"]["name"] == name
    )


def user_namespace_of(pid: int) -> str:
    return Path(f"/proc/{pid}/uid_map").read_text().split("\n")[0].split()[0]


# -- read-only deployment --------------------------------------------------------------------


def point_at_cache(route: str, cache_dir: Path, tmp_path: Path) -> dict[str, str]:
    """Environment that points the kernel at ``cache_dir`` by the given configuration route."""
    if route == "env":
        return {"WASM_KERNEL_CACHE_DIR": str(cache_dir)}
    config_dir = tmp_path / "etc-jupyter"  # stands for PREFIX/etc/jupyter or /etc/jupyter
    config_dir.mkdir()
    (config_dir / "jupyter_wasm_kernel_config.py").write_text(
        f"c.WasmKernel.cache_dir = {str(cache_dir)!r}\n"
    )
    seal(config_dir)
    return {"JUPYTER_CONFIG_PATH": str(config_dir)}


@pytest.mark.parametrize("route", ["env", "config-file"])
@pytest.mark.slow
def test_kernel_runs_from_sealed_cache_with_sealed_home(
    tmp_path: Path, confinement: list[str], baked_cache: Path, sealed_home: Path, route: str
) -> None:
    """The image scenario: runtime cache baked and read-only, HOME read-only, no user cache.

    The cache is named by WASM_KERNEL_CACHE_DIR or by the config file. Cells run with no
    compile message, history works (in memory, with a warning in the kernel log), and neither
    the cache nor HOME changes, down to inodes and mtimes.
    """
    cache_before, home_before = snapshot(baked_cache), snapshot(sealed_home)
    kernel = ConfinedKernel(
        tmp_path, confinement, sealed_home, point_at_cache(route, baked_cache, tmp_path)
    )
    try:
        if confinement:
            assert user_namespace_of(kernel.manager.provisioner.process.pid) == str(INNER_UID)
        outputs = []
        reply, messages = kernel.execute("print('hello from the sandbox')")
        outputs += messages
        assert reply["status"] == "ok", reply
        assert stream_text(messages, "stdout") == "hello from the sandbox\n"
        reply, messages = kernel.execute(
            "import numpy as np\n"
            "open('/tmp/scratch.txt', 'w').write('scratch')\n"
            "print(int(np.arange(10).sum()), open('/tmp/scratch.txt').read())"
        )
        outputs += messages
        assert reply["status"] == "ok", reply
        assert stream_text(messages, "stdout") == "45 scratch\n"
        reply, messages = kernel.execute(
            "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"
        )
        outputs += messages
        assert reply["status"] == "ok", reply
        assert any("image/png" in m["content"].get("data", {}) for m in messages)
        assert "compil" not in stream_text(outputs, "stderr")
        history = kernel.client.history(hist_access_type="tail", n=3, reply=True, timeout=30)
        assert history["content"]["history"][0][2] == "print('hello from the sandbox')"
    finally:
        kernel.shutdown()
    log = kernel.log()
    assert "keeping history in memory" in log
    assert "compil" not in log
    assert "Traceback" not in log
    assert snapshot(baked_cache) == cache_before
    assert snapshot(sealed_home) == home_before
    assert not list(kernel.scratch.glob("wasm-kernel-tmp-*")), "the private /tmp outlived it"
    assert not list(kernel.scratch.rglob("profile_default")), (
        "the kernel keeps no IPython profile (IPython would leave one in TMPDIR per start)"
    )


def test_missing_entry_in_sealed_cache_is_a_clear_cell_error(
    tmp_path: Path, confinement: list[str], sealed_home: Path
) -> None:
    """A read-only cache without the entry: every cell says where and how to build it.

    The kernel must neither compile (it cannot write) nor hang nor die; it keeps answering.
    """
    empty_cache = tmp_path / "empty-cache"
    empty_cache.mkdir()
    seal(empty_cache)
    before = snapshot(empty_cache)
    try:
        kernel = ConfinedKernel(
            tmp_path, confinement, sealed_home, {"WASM_KERNEL_CACHE_DIR": str(empty_cache)}
        )
        try:
            for _ in range(2):
                reply, messages = kernel.execute("1 + 1", timeout=30)
                assert reply["status"] == "error"
                assert reply["ename"] == "SandboxUnavailable"
                assert str(empty_cache) in reply["evalue"]
                assert f"{PRECOMPILE_HINT} {empty_cache}" in reply["evalue"]
                assert any(m["msg_type"] == "error" for m in messages)
                assert "compil" not in stream_text(messages, "stderr")
            info = kernel.client.kernel_info(reply=True, timeout=30)
            assert info["content"]["status"] == "ok"
        finally:
            kernel.shutdown()
        assert snapshot(empty_cache) == before
    finally:
        unseal(empty_cache)


HISTORY_PROBE = """
import json, sys
from wasm_kernel.jupyter.history import History
history = History(sys.argv[1])
history.store(1, "x = 1")
print(json.dumps([history.session, history.tail(5)]))
"""


def test_history_falls_back_to_memory_when_its_file_refuses_writes(
    tmp_path: Path, confinement: list[str]
) -> None:
    """A history file left read-only (baked into an image, say): memory history, no writes."""
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "history.sqlite"
    History(str(path)).close()  # the file and its tables, as an earlier kernel left them
    seal(folder)
    before = snapshot(folder)
    try:
        result = subprocess.run(
            [*confinement, sys.executable, "-c", HISTORY_PROBE, str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert snapshot(folder) == before
    finally:
        unseal(folder)
    assert result.returncode == 0, result.stderr
    session, tail = json.loads(result.stdout)
    assert tail == [[session, 1, "x = 1"]]
    assert "keeping history in memory" in result.stderr


# -- gateway_provisioners (Jupyter Enterprise Gateway) ---------------------------------------


def gateway_kernelspec(target: Path, cache_dir: Path) -> Path:
    """A kernelspec made by gateway_provisioners' own installer, pointed at our kernel class.

    ``jupyter-ssh-spec install`` (local or SSH hosts, DistributedProvisioner) copies the
    launcher scripts next to kernel.json. Its ``--ipykernel-subclass-name`` accepts only
    IPythonKernel subclasses, so the class name is set afterwards, as docs/deployment.md says.
    """
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway_provisioners.cli.ssh_specapp",
            "install",
            f"--prefix={target}",
            "--kernel-name=wasm_python_gateway",
            "--display-name=Python 3 (WASM sandbox, gateway)",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    spec_dir = target / "share" / "jupyter" / "kernels" / "wasm_python_gateway"
    spec = json.loads((spec_dir / "kernel.json").read_text())
    argv = spec["argv"]
    argv[0] = sys.executable
    argv[argv.index("--kernel-class-name") + 1] = "wasm_kernel.jupyter.kernel.WasmKernel"
    spec["metadata"]["debugger"] = False
    spec["env"] = {"WASM_KERNEL_CACHE_DIR": str(cache_dir), "WASM_KERNEL_FUEL": "123456789000"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    return spec_dir


def _curve_available() -> bool:
    import zmq

    return bool(zmq.has("curve")) and "transport_encryption" in AsyncKernelManager.class_traits()


@pytest.mark.slow
def test_gateway_provisioner_launches_the_kernel(
    tmp_path: Path, baked_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DistributedProvisioner path, as Enterprise Gateway runs it for a local host.

    gateway_provisioners substitutes the response address and its public key into the argv,
    launch_ipykernel.py starts WasmKernel, sends the connection info back encrypted, and the
    provisioner's ResponseManager decrypts it; a client then runs cells over ZMQ (with
    CurveZMQ transport encryption when available) and interrupts one, which the provisioner
    relays as a signal through the launcher's listener. The launcher builds ipykernel's own
    IPKernelApp, so our config file and command line do not apply; settings arrive through
    the kernelspec's env and the IPython profile's ipython_kernel_config.py.
    """
    pytest.importorskip("gateway_provisioners")
    from gateway_provisioners import distributed, response_manager

    # GP_KERNEL_LOG_DIR and GP_RESPONSE_IP, which the modules read when imported
    monkeypatch.setattr(distributed, "kernel_log_dir", str(tmp_path))
    monkeypatch.setattr(response_manager, "response_ip", "127.0.0.1")
    spec_dir = gateway_kernelspec(tmp_path / "prefix", baked_cache)
    encryption = "required" if _curve_available() else "disabled"
    ipython_dir = tmp_path / "ipython"  # the launcher's IPKernelApp reads this profile's config
    (ipython_dir / "profile_default").mkdir(parents=True)
    (ipython_dir / "profile_default" / "ipython_kernel_config.py").write_text(
        "c.WasmKernel.time_limit = 77.0\n"
    )
    scratch = tmp_path / "scratch"  # the launcher's connection file, the guest's /tmp
    scratch.mkdir()
    cache_before = snapshot(baked_cache)

    async def scenario() -> tuple[dict, dict, str, str, dict, dict]:
        manager = AsyncKernelManager(
            kernel_name=spec_dir.name,
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec_dir.parent)]),
            transport_encryption=encryption,
        )
        env = {
            **os.environ,
            "KERNEL_USERNAME": "wasm-kernel-test",  # a tenant: its own folders under these
            "XDG_DATA_HOME": str(tmp_path / "data"),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "IPYTHONDIR": str(ipython_dir),
            "TMPDIR": str(scratch),
        }
        await manager.start_kernel(env=env, cwd=str(tmp_path))
        try:
            provisioner: Any = manager.provisioner
            assert type(provisioner).__name__ == "DistributedProvisioner"
            info = manager.get_connection_info()
            client = manager.client()
            client.start_channels()
            try:
                await client.wait_for_ready(timeout=60)
                banner_reply = await client.kernel_info(reply=True, timeout=30)
                outputs: list[dict] = []
                reply = await client.execute_interactive(
                    "import numpy as np\nprint('gateway', int(np.ones(4).sum()))",
                    timeout=60,
                    output_hook=outputs.append,
                )
                # an interrupt travels as a signal request to the launcher's listener
                sleeper = asyncio.ensure_future(
                    client.execute_interactive("import time\ntime.sleep(60)", timeout=30)
                )
                await asyncio.sleep(1.5)
                await manager.interrupt_kernel()
                interrupted = (await sleeper)["content"]
            finally:
                client.stop_channels()
        finally:
            await manager.shutdown_kernel()
        return (
            info,
            banner_reply["content"],
            stream_text(outputs, "stdout"),
            manager.kernel_id,
            reply,
            interrupted,
        )

    try:
        info, kernel_info, stdout, kernel_id, reply, interrupted = asyncio.run(scenario())
    finally:
        from gateway_provisioners.response_manager import ResponseManager

        if ResponseManager.initialized():
            ResponseManager.instance().stop_response_manager()
            ResponseManager.clear_instance()
    assert reply["content"]["status"] == "ok", reply["content"]
    assert stdout == "gateway 4\n"
    assert (interrupted["status"], interrupted["ename"]) == ("error", "KeyboardInterrupt")
    assert kernel_info["implementation"] == "wasm-kernel"
    assert "fuel 123,456,789,000" in kernel_info["banner"]  # from the kernelspec's env
    assert "time 77 s" in kernel_info["banner"]  # from the IPython profile's config
    if encryption == "required":  # the launcher made CurveZMQ keys and the client used them
        assert info.get("curve_publickey") and info.get("curve_secretkey")
    assert _processes_naming(kernel_id) == []  # neither the kernel nor its forked listener
    log = next(tmp_path.glob("kernel-*.log")).read_text(errors="replace")
    assert "compil" not in log and "Traceback" not in log, log
    assert sorted(p.name for p in scratch.iterdir()) == []  # connection file and /tmp removed
    assert snapshot(baked_cache) == cache_before
    history = list((tmp_path / "data").rglob("history.sqlite"))
    assert [path.parent.parent.name for path in history] == ["tenants"], history


def _processes_naming(word: str) -> list[int]:
    """Live (not zombie) processes whose command line contains ``word``."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if (
                proc.name.isdigit()
                and word.encode() in (proc / "cmdline").read_bytes()
                and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            ):
                found.append(int(proc.name))
    return found


@pytest.mark.slow
def test_history_falls_back_to_memory_when_its_file_stays_locked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A history file another process keeps locked: the kernel starts with memory history.

    The file opens and its tables exist, so only writing this kernel's session row fails
    (after SQLite's 2 s busy timeout); that must not escape into the kernel's start-up.
    """
    path = tmp_path / "history.sqlite"
    History(str(path)).close()
    holder = sqlite3.connect(path)
    holder.execute("BEGIN IMMEDIATE")  # a writer that does not finish
    try:
        with caplog.at_level(logging.WARNING, logger="wasm_kernel.jupyter.history"):
            history = History(str(path))
        history.store(1, "x = 1")
        assert history.tail(5) == [(history.session, 1, "x = 1")]
        assert "keeping history in memory" in caplog.text
        history.close()
    finally:
        holder.rollback()
        holder.close()
