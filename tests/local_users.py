"""Real local users for tests of what users of one machine see of each other's kernels.

Made with useradd (a fresh home, 0755 as Debian's default makes homes readable by all) and
removed after, with their processes and home. Only root can: elsewhere the tests that need
them are skipped, saying so. A user runs commands through setpriv with a clean environment,
as a login would give them: nothing of the test's own (HOME, caches, JUPYTER_*) leaks in.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

PYTHON_BIN = str(Path(sys.executable).parent)


@dataclass(frozen=True)
class LocalUser:
    name: str
    uid: int
    gid: int
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "PATH": f"{PYTHON_BIN}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            **extra,
        }

    def run(
        self, argv: list[str], umask: int = 0o022, timeout: float = 120, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` run as this user (uid, gid, groups), in their project folder."""
        command = [
            "setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--",
            "env", "-i", *(f"{k}={v}" for k, v in self.env(**env).items()), *argv,
        ]  # fmt: skip
        return subprocess.run(
            command,
            cwd=self.home / "project",
            umask=umask,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def python(self, code: str, umask: int = 0o022, **env: str) -> subprocess.CompletedProcess[str]:
        """The test's Python running ``code`` as this user."""
        return self.run([sys.executable, "-c", textwrap.dedent(code)], umask=umask, **env)


def make_user() -> LocalUser:
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("needs root with useradd and setpriv, to make real users (CI runs as root)")
    name = f"wk{secrets.token_hex(4)}"
    subprocess.run(
        ["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name],
        check=True,
        capture_output=True,
    )
    entry = pwd.getpwnam(name)
    home = Path(entry.pw_dir)
    home.chmod(0o755)  # Debian's default for homes: every user may enter and list it
    project = home / "project"  # where their notebooks are (the home itself is never mounted)
    project.mkdir()
    os.chown(project, entry.pw_uid, entry.pw_gid)
    return LocalUser(name, entry.pw_uid, entry.pw_gid, home)


def remove_user(user: LocalUser) -> None:
    """The user's processes ended (a kernel server outlives its kernels), then the user
    and their home."""
    for _ in range(50):
        left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"].real == user.uid]
        if not left:
            break
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.kill()
        time.sleep(0.1)
    subprocess.run(["userdel", "--remove", user.name], capture_output=True, check=False)
    shutil.rmtree(user.home, ignore_errors=True)


@contextlib.contextmanager
def python_reachable() -> Iterator[None]:
    """Let every user reach the test's Python, for the test's duration: a folder on the
    way to its interpreter, standard library or packages that others may not enter (a
    root's 0700 home holding pyenv's Pythons) gets the others' search bit only (no
    listing), and its mode back after."""
    import wasm_kernel

    needed = [Path(os.path.realpath(sys.executable)), Path(wasm_kernel.__file__).resolve()]
    needed += [Path(p).resolve() for p in sys.path if p and os.path.isdir(p)]
    closed: dict[Path, int] = {}
    for path in needed:
        for folder in path.parents:
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH and folder not in closed:
                closed[folder] = stat.S_IMODE(mode)
    try:
        for folder, mode in closed.items():
            folder.chmod(mode | stat.S_IXOTH)
        yield
    finally:
        for folder, mode in closed.items():
            folder.chmod(mode)


@contextlib.contextmanager
def local_users(count: int) -> Iterator[list[LocalUser]]:
    users: list[LocalUser] = []
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: [remove_user(user) for user in users])
        for _ in range(count):
            users.append(make_user())
        stack.enter_context(python_reachable())
        reach = users[0].python("import wasm_kernel")
        if reach.returncode != 0:
            pytest.skip(
                f"other users cannot run this test's Python ({sys.executable}), even with"
                f" its folders open to them: {reach.stderr.strip()[-300:]}"
            )
        yield users


_RUN_CELLS = """
import json, sys
from jupyter_client.manager import start_new_kernel

manager, client = start_new_kernel(kernel_name=sys.argv[1], startup_timeout=120)
results = []
try:
    for code in sys.argv[2:]:
        said = []

        def keep(message):
            content = message["content"]
            if message["msg_type"] == "stream":
                said.append(content["text"])
            elif message["msg_type"] in ("execute_result", "display_data"):
                said.append(content["data"].get("text/plain", ""))
            elif message["msg_type"] == "error":
                said.append(content["ename"] + ": " + content["evalue"])

        reply = client.execute_interactive(code, timeout=120, output_hook=keep)
        results.append([reply["content"]["status"], "".join(said)])
finally:
    client.stop_channels()
    manager.shutdown_kernel(now=False)
print(json.dumps(results))
"""


def run_cells(
    user: LocalUser, kernel: str, cells: list[str], umask: int = 0o022, **env: str
) -> list[tuple[str, str]]:
    """Start ``kernel`` as ``user`` through jupyter_client, run ``cells``, shut it down:
    each cell's status and what it showed (streams, results, error)."""
    done = user.run(
        [sys.executable, "-c", _RUN_CELLS, kernel, *cells],
        umask=umask,
        WASM_KERNEL_SERVER_IDLE="5",  # a kernel server the test started ends soon after
        **env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [(status, text) for status, text in json.loads(done.stdout.splitlines()[-1])]
