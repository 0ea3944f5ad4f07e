"""One install for every user of a machine: root installs, other (real, local) users see the
kernelspecs, their kernels find the compiled runtime with no step of theirs, and nobody but
root can change it, whatever root's umask was.

The runtime taken from the installing user's cache keeps an install here to seconds; the
kernels are started as the other user through jupyter_client.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_users import LocalUser, local_users, run_cells

from wasm_kernel.runtime.cache import RuntimeCache
from wasm_kernel.runtime.runtime import load_runtime

KERNEL = "wasm-python"


def shared_cache_dir(prefix: str | Path) -> Path:
    """Where the docs say an install for every user of ``prefix`` puts the runtime."""
    return Path(prefix) / "share" / "wasm-kernel" / "cache"


@pytest.fixture(scope="module")
def other_user() -> Iterator[LocalUser]:
    with local_users(1) as users:
        yield users[0]


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder every user may enter, for a prefix (pytest's own are root's only)."""
    folder = Path(tempfile.mkdtemp(prefix="wasm-kernel-prefix-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def install(*options: str, umask: int = 0o022) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "install", *options],
        capture_output=True,
        text=True,
        timeout=600,
        umask=umask,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def kernelspecs_seen_by(user: LocalUser, **env: str) -> dict:
    listed = user.run([sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"], **env)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)["kernelspecs"]


def test_an_install_into_this_python_serves_every_user(other_user: LocalUser) -> None:
    """`install --sys-prefix` as root (what CI's install does in its venv): another user
    lists the kernelspec, runs a cell in a fresh home with no cache of theirs, and cannot
    change the runtime their kernel loaded."""
    install("--sys-prefix")
    assert KERNEL in kernelspecs_seen_by(other_user)
    assert run_cells(other_user, KERNEL, ["6 * 7"]) == [("ok", "42")]
    assert not (other_user.home / ".cache" / "wasm-kernel").exists()  # nothing compiled

    shared = shared_cache_dir(sys.prefix)
    entry = RuntimeCache(shared).entry_dir(load_runtime(cache_dir=shared))
    assert entry.stat().st_uid == 0
    tried = other_user.python(
        f"""
        import sys
        for attempt in (lambda: open({str(entry / "module.cwasm")!r}, "r+b"),
                        lambda: open({str(entry / "planted")!r}, "xb"),
                        lambda: open({str(shared / "planted")!r}, "xb")):
            try:
                attempt()
            except PermissionError:
                continue
            sys.exit("written")
        """
    )
    assert tried.returncode == 0, tried.stdout + tried.stderr


@pytest.mark.parametrize("umask", [0o000, 0o077], ids=["umask-000", "umask-077"])
def test_an_install_into_a_prefix_is_readable_by_all_whatever_the_umask(
    other_user: LocalUser, place: Path, umask: int
) -> None:
    """`install --prefix` as root under a permissive and a private umask: every folder
    0755 and file 0644, root's, and the other user's kernel runs from it."""
    prefix = place / "prefix"
    install("--prefix", str(prefix), umask=umask)
    for path in [prefix, *prefix.rglob("*")]:
        status = path.lstat()
        assert status.st_uid == 0, path
        wanted = 0o755 if stat.S_ISDIR(status.st_mode) else 0o644
        assert stat.S_ISDIR(status.st_mode) or stat.S_ISREG(status.st_mode), path
        assert stat.S_IMODE(status.st_mode) == wanted, f"{path}: {status.st_mode:o}"
    assert (shared_cache_dir(prefix)).is_dir()
    jupyter_path = str(prefix / "share" / "jupyter")
    assert KERNEL in kernelspecs_seen_by(other_user, JUPYTER_PATH=jupyter_path)
    ran = run_cells(other_user, KERNEL, ["print('from', 'the prefix')"], JUPYTER_PATH=jupyter_path)
    assert ran == [("ok", "from the prefix\n")]


def test_a_shared_runtime_that_others_can_change_is_refused(
    other_user: LocalUser, place: Path
) -> None:
    """Native code anyone could have replaced is never loaded: the cell says why."""
    prefix = place / "prefix"
    install("--prefix", str(prefix), "--sandbox-profile", "notebook")
    shared = shared_cache_dir(prefix)
    entry = RuntimeCache(shared).entry_dir(load_runtime(cache_dir=shared))
    entry.chmod(0o777)
    jupyter_path = str(prefix / "share" / "jupyter")
    [(status, said)] = run_cells(other_user, KERNEL, ["6 * 7"], JUPYTER_PATH=jupyter_path)
    assert status == "error"
    assert "SandboxUnavailable" in said and "not safe to load" in said, said
    assert f"{entry} is writable by group or others" in said, said
    assert os.stat(entry).st_mode & 0o777 == 0o777  # another user's: left for its owner
