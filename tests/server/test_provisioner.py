"""Kernels handed out by the kernel server through our provisioner, as Jupyter starts them.

Every test here starts kernels through jupyter_client's KernelManager with the kernelspec
``install`` wrote (it names the provisioner), so the kernels are forked by the per-user server
(``kernel_server``) once it runs; the first start of a session launches the ordinary way while
the server loads. Checked: what a launched kernel does (interrupts in both modes, restart,
shutdown, kill), that each request binds its own folder and profile, that the server outlives
nothing it should (kill -9 of it leaves kernels serving) and answers only its own user.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import Kernel, ok, plain
from jupyter_client.kernelspec import KernelSpecManager
from served_kernels import HANDED_OUT, served, server_answering, server_folder, server_pid

from wasm_kernel.runtime.runtime import CACHE_DIR_ENV, default_cache_dir
from wasm_kernel.server import kernel_server
from wasm_kernel.server.provisioner import ServedKernel

STRICT = "wasm-python-strict"


@pytest.fixture
def kernels() -> Iterator[list[Kernel]]:
    started: list[Kernel] = []
    yield started
    for kernel in started:
        kernel.shutdown()


def pid_of(kernel: Kernel) -> int:
    return kernel.manager.provisioner.process.pid


def test_a_served_kernel_runs_cells_and_is_the_servers_child(kernels) -> None:
    kernels.append(served())
    kernel = kernels[0]
    assert plain(kernel.execute("6 * 7")) == 42
    assert psutil.Process(pid_of(kernel)).ppid() == server_pid()
    shown = " ".join(psutil.Process(pid_of(kernel)).cmdline())  # ps shows the kernel it is
    assert "-m wasm_kernel -f " in shown and "kernel_server" not in shown, shown
    assert "Interpreter: from the boot image" in kernel.execute("%sandbox").stream_text()
    # the provisioner returned once the kernel said its ports were bound (else the client's
    # first connection fails and waits out ZMQ's reconnect interval)
    assert kernel.manager.provisioner.process.started


@pytest.mark.parametrize("mode", ["signal", "message"])
def test_interrupts_reach_a_served_kernel(kernels, mode: str) -> None:
    kernels.append(served())
    kernel = kernels[0]
    kernel.manager.kernel_spec.interrupt_mode = mode
    msg_id = kernel.client.execute("while True: pass")
    time.sleep(1.0)
    kernel.manager.interrupt_kernel()
    run = kernel.collect(msg_id, timeout=60)
    assert run.content["status"] == "error" and run.content["ename"] == "KeyboardInterrupt"
    assert plain(kernel.execute("1 + 1")) == 2


def test_restart_hands_out_a_new_kernel(kernels) -> None:
    kernels.append(served())
    kernel = kernels[0]
    ok(kernel.execute("kept = 1"))
    before = pid_of(kernel)
    kernel.manager.restart_kernel(now=False)
    kernel.client.wait_for_ready(timeout=60)
    assert isinstance(kernel.manager.provisioner.process, ServedKernel)
    assert pid_of(kernel) != before and not psutil.pid_exists(before)
    run = kernel.execute("kept")
    assert run.content["ename"] == "NameError"


def test_shutdown_ends_the_kernel_with_status_0(kernels) -> None:
    kernel = served()
    process = kernel.manager.provisioner.process
    kernel.shutdown()
    assert process.wait(timeout=30) == 0


def test_kill_of_a_kernel_is_seen(kernels) -> None:
    kernels.append(served())
    kernel = kernels[0]
    os.kill(pid_of(kernel), signal.SIGKILL)
    assert kernel.manager.provisioner.process.wait(timeout=30) == -signal.SIGKILL
    assert not kernel.manager.is_alive()


def test_kill_of_the_server_leaves_its_kernels_serving(kernels) -> None:
    kernels.append(served())
    running = kernels[0]
    ok(running.execute("x = 5"))
    os.kill(server_pid() or 0, signal.SIGKILL)
    time.sleep(0.5)
    assert plain(running.execute("x * 2")) == 10
    assert running.manager.is_alive()
    kernels.append(served())  # a new server is started, and serves
    assert plain(kernels[1].execute("x = 3; x")) == 3


def test_each_kernel_binds_its_own_folder_and_profile(kernels, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
        (folder / f"only-in-{folder.name}.txt").write_text(folder.name)
    kernels.append(served(cwd=first))
    kernels.append(served(cwd=second, kernel_name=STRICT))
    listing = "import os; (os.getcwd(), sorted(os.listdir()))"
    seen_first = plain(kernels[0].execute(listing))
    assert seen_first[1] == ["only-in-first.txt"], seen_first
    assert "Profile: notebook" in kernels[0].execute("%sandbox").stream_text()
    described = kernels[1].execute("%sandbox").stream_text()
    assert "Profile: strict" in described, described
    seen_second = plain(kernels[1].execute(listing))
    assert "only-in-first.txt" not in seen_second[1], seen_second  # strict mounts nothing


def test_a_kernel_ends_with_the_process_that_launched_it(tmp_path: Path) -> None:
    """As ipykernel's parent poller does: the launcher dies, its kernels end (the lifeline),
    and the kernel's stderr went to the launcher's stderr (the Jupyter server's log)."""
    served().shutdown()  # the server is up
    script = textwrap.dedent(
        """
        import os, sys, time
        from jupyter_client.manager import KernelManager
        for _ in range(60):
            manager = KernelManager(kernel_name="wasm-python")
            manager.start_kernel(extra_arguments=["--debug"])
            if type(manager.provisioner.process).__name__ == "ServedKernel":
                break
            manager.shutdown_kernel(now=True)
            time.sleep(0.5)
        client = manager.client()
        client.start_channels()
        client.wait_for_ready(timeout=60)
        print(manager.provisioner.process.pid, flush=True)
        os._exit(0)
        """
    )
    launcher = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    pid = int(launcher.stdout.split()[-1])
    assert "Heartbeat REP Channel" in launcher.stderr  # the kernel's own debug log
    deadline = time.monotonic() + 15
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the kernel outlived its launcher"
        time.sleep(0.2)


@pytest.mark.nokernel
def test_a_change_in_any_subpackage_gives_a_new_server(tmp_path: Path) -> None:
    """The server's folder is named by all of the package's code: a server started before a
    change to, say, the comms never hands out kernels of the old code."""
    package = Path(kernel_server.__file__).parents[1]
    copy = tmp_path / package.name
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    probe = "import sys; from wasm_kernel.server import kernel_server as k; print(k.__file__)"
    probe += "; print(k.code_fingerprint(sys.executable))"

    def fingerprint() -> str:
        # -S: no site, so no editable install's finder ahead of the copy; its packages by path
        path = os.pathsep.join([str(tmp_path), *sysconfig.get_paths()["purelib"].split()])
        shown = subprocess.run(
            [sys.executable, "-S", "-c", probe],
            env={**os.environ, "PYTHONPATH": path},
            cwd=tmp_path,  # -c puts the working folder first on sys.path
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert shown[0].startswith(str(copy)), shown  # the copy's code, not the installed one
        return shown[1]

    before = fingerprint()
    with (copy / "jupyter" / "comms.py").open("a") as source:
        source.write("# changed\n")
    assert fingerprint() != before


def test_an_idle_connection_does_not_hold_kernel_starts_back(kernels) -> None:
    """A connection that sends no request waits beside the others, not in front of them: a
    kernel asked for after it is handed out first; it is dropped at its deadline, saying why,
    with a line in the server's log."""
    served().shutdown()  # the server runs
    log = server_folder() / kernel_server.LOG_NAME
    with socket.socket(socket.AF_UNIX) as idle:
        idle.connect(str(kernel_server.socket_path(server_folder())))
        kernels.append(served())
        assert ok(kernels[-1].execute("1 + 1")).result_text() == "2"
        idle.settimeout(60)
        answer = idle.recv(4096).decode()
    assert "sent no request within" in answer, answer
    lines = log.read_text().splitlines()
    handed = lines.index(f"{HANDED_OUT}{pid_of(kernels[-1])} handed out")
    dropped = max(i for i, line in enumerate(lines) if "sent no request within" in line)
    assert handed < dropped  # the kernel did not wait for the idle connection's deadline


@pytest.mark.skipif(os.getuid() != 0, reason="needs a second uid (run as root to check)")
def test_the_server_answers_only_its_own_user() -> None:
    """Another user is kept out by the folder's mode; with the folder opened up for the
    test, by the server's check of the peer's credentials."""
    served().shutdown()
    socket_path = kernel_server.socket_path(server_folder())
    folder = socket_path.parent
    # The folder is opened while still root: with the folder opened up for the test, the
    # probe reaches the socket through that descriptor without searching root's home.
    probe = textwrap.dedent(
        f"""
        import os, socket
        folder = os.open({str(folder)!r}, os.O_PATH)
        os.setgid(65534); os.setuid(65534)
        connection = socket.socket(socket.AF_UNIX)
        try:
            connection.connect(f"/proc/self/fd/{{folder}}/{socket_path.name}")
        except PermissionError:
            print("kept out by the folder")
        else:
            print(connection.recv(4096).decode().strip())
        """
    )

    def as_nobody() -> str:
        return subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()

    assert as_nobody() == "kept out by the folder"
    mode = folder.stat().st_mode
    folder.chmod(0o777)
    socket_path.chmod(0o777)
    try:
        answer = as_nobody()
    finally:
        folder.chmod(mode)
        socket_path.chmod(0o755)
    assert "answers its own user only" in answer


def test_a_long_runtime_folder_still_gets_served_kernels(
    kernels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's socket is not in the Jupyter runtime folder, whose path may be longer
    than a Unix socket's 107 bytes: a kernel is served all the same."""
    runtime = tmp_path / "runtime-folder-with-a-long-name".ljust(150 - len(str(tmp_path)), "x")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("WASM_KERNEL_SERVER_IDLE", "5")  # this test's own server ends soon
    assert len(str(runtime)) >= 150
    kernels.append(served())
    assert plain(kernels[0].execute("6 * 7")) == 42
    assert psutil.Process(pid_of(kernels[0])).ppid() == server_pid()
    assert str(server_folder()).startswith(str(runtime))


def a_socket_folder_that_is(kind: str, place: Path) -> None:
    """Make the per-user socket folder ``place`` as another user's, or one others can
    enter, or a link to a private folder of ours (which a follower would accept)."""
    if kind == "open to others":
        place.mkdir()
        place.chmod(0o755)
    elif kind == "another user's":
        place.mkdir(mode=0o700)
        os.chown(place, 65534, 65534)
    else:
        target = place.with_name("elsewhere")
        target.mkdir(mode=0o700)
        place.symlink_to(target)


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("open to others", "is not private to this user"),
        ("another user's", "is not private to this user"),
        ("a link", "is a link or not a folder"),
    ],
)
def test_a_socket_folder_not_private_to_this_user_is_refused(
    kernels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog, kind: str, reason: str
) -> None:
    """Nothing is bound or followed there: the kernel is launched, and the log says why."""
    if kind == "another user's" and os.getuid() != 0:
        pytest.skip("making a folder of another user needs root")
    place = tmp_path / f"wasm-kernel-{os.getuid()}"
    a_socket_folder_that_is(kind, place)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    caplog.set_level("DEBUG")
    kernels.append(Kernel())
    assert not isinstance(kernels[0].manager.provisioner.process, ServedKernel)
    assert plain(kernels[0].execute("1 + 1")) == 2
    said = [r.getMessage() for r in caplog.records if "without the kernel server" in r.getMessage()]
    assert said and f"{place} {reason}" in said[0], said
    if kind == "a link":
        assert list(place.resolve().iterdir()) == []  # no socket was made through the link


def test_a_socket_path_still_too_long_is_refused_with_the_reason(
    kernels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """Where even the per-user socket folder's path is too long, the log line says so."""
    base = tmp_path / ("x" * (110 - len(str(tmp_path))))
    base.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    caplog.set_level("DEBUG")
    kernels.append(Kernel())
    assert not isinstance(kernels[0].manager.provisioner.process, ServedKernel)
    said = [r.getMessage() for r in caplog.records if "without the kernel server" in r.getMessage()]
    assert said and "more than the 107 a Unix socket's path may have" in said[0], said


def test_a_shutdown_request_meant_for_the_kernel_it_replaces_is_ignored(kernels) -> None:
    """jupyter_client asks a dead kernel to shut down before restarting it, and that request
    stays queued for the port the new kernel binds: a kernel that starts fast receives it.
    One dated before the kernel began is ignored; the kernel stays up and answers."""
    kernels.append(served())
    kernel = kernels[0]
    stale = kernel.client.session.msg("shutdown_request", {"restart": False})
    stale["header"]["date"] = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
    kernel.client.control_channel.send(stale)
    time.sleep(1.0)
    assert kernel.manager.is_alive()
    assert plain(kernel.execute("1 + 1")) == 2


def other_environment(root: Path) -> Path:
    """A second virtual environment over the same base interpreter, importing this one's
    packages (the same kernel code): its ``python`` resolves to the same file as ours."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    ours = sysconfig.get_paths()["purelib"]
    theirs = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # site.addsitedir, not a plain path: an editable install is itself a .pth file there
    Path(theirs, "ours.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


def test_another_environment_of_the_same_interpreter_gets_its_own_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two virtual environments link the same interpreter; with the same kernel code, each
    still has its own server, so a kernel runs with its own environment's packages."""
    python = other_environment(tmp_path / "other")
    assert os.path.realpath(python) == os.path.realpath(sys.executable)
    theirs = kernel_server.code_fingerprint(str(python))
    assert theirs != kernel_server.code_fingerprint(sys.executable)
    spec = KernelSpecManager().get_kernel_spec("wasm-python").to_dict()
    spec["argv"] = [str(python), *spec["argv"][1:]]
    folder = tmp_path / "kernels" / "kernels" / "wasm-python-other"
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "kernels"))
    # the other environment's kernels use our compiled runtime instead of compiling their own
    monkeypatch.setenv(CACHE_DIR_ENV, str(default_cache_dir()))
    server_answering()  # our server runs: with one name for both, it would serve theirs
    their_server = kernel_server.runtime_folder(theirs)
    try:
        kernel = served(kernel_name="wasm-python-other")
        try:
            assert plain(kernel.execute("6 * 7")) == 42
            server = psutil.Process(psutil.Process(pid_of(kernel)).ppid())
            assert server.cmdline()[0] == str(python)  # not our environment's server
            assert str(their_server) in server.cmdline()
        finally:
            kernel.shutdown()
    finally:
        for process in psutil.process_iter(["cmdline"]):
            if str(their_server) in (process.info["cmdline"] or []):
                process.terminate()
