"""Hibernation as users meet it: the banner and ``%sandbox`` say what closing a notebook does,
hibernated sessions are bounded (by age, removed when a kernel starts, and by a quota of their
own, the least recently saved removed first), and a notebook's or every one can be forgotten.

Kernels are real (jupyter_client), each with a snapshot folder of the test's own. Other
notebooks' hibernated sessions are stood in for by files of the size an image has: only their
names, sizes and ages count, as nothing resumes them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Kernel, ok, plain

from wasm_kernel.images import images
from wasm_kernel.images.image_folder import ImageFolder

DAY = 86400


def environment(folder: Path, notebook: str) -> dict[str, str]:
    return {"WASM_KERNEL_SNAPSHOT_DIR": str(folder), "JPY_SESSION_NAME": notebook}


def hibernated_path(folder: Path, notebook: str) -> Path:
    return ImageFolder(folder, 0).path(ImageFolder(folder, 0).hibernation_name(notebook))


def stand_in(folder: Path, notebook: str, size: int, age: float) -> Path:
    """Another notebook's hibernated session: a file of ``size`` bytes saved ``age`` s ago."""
    path = hibernated_path(folder, notebook)
    path.write_bytes(os.urandom(size))
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def hibernate(folder: Path, notebook: str, code: str, *arguments: str) -> None:
    """Run ``code`` in a kernel for ``notebook``, then close it as a notebook is closed."""
    kernel = Kernel(list(arguments), env=environment(folder, notebook))
    try:
        ok(kernel.execute(code))
    finally:
        kernel.shutdown()


def test_the_banner_and_sandbox_say_what_closing_the_notebook_does(start_kernel, tmp_path):
    kernel = start_kernel(env=environment(tmp_path, "notes.ipynb"))
    banner = kernel.banner()
    [line] = [line for line in banner.splitlines() if line.startswith("Hibernation:")]
    for words in (
        "Hibernation: on",
        "closing the notebook",
        str(tmp_path),
        "reopening the notebook resumes it",
        "kept 14 days",
        "512 MiB for all notebooks",
        "`%snapshot forget`",
    ):
        assert words in banner, (words, banner)
    assert line in ok(kernel.execute("%sandbox")).stream_text()
    strict = start_kernel(kernel_name="wasm-python-strict", env=environment(tmp_path, "s.ipynb"))
    assert "Hibernation" not in strict.banner()  # the banner says only what closing does
    assert "Hibernation: off\n" in ok(strict.execute("%sandbox")).stream_text()


def test_a_resumed_session_says_so_and_expired_ones_are_removed(tmp_path):
    hibernate(tmp_path, "notes.ipynb", "kept = 'from before'")
    own = hibernated_path(tmp_path, "notes.ipynb")
    assert own.exists()
    young = stand_in(tmp_path, "young.ipynb", 1 << 20, 1 * DAY)
    old = stand_in(tmp_path, "old.ipynb", 1 << 20, 20 * DAY)
    snapshot = tmp_path / ("mine" + images.SUFFIX)  # a snapshot, not a hibernated session
    snapshot.write_bytes(b"kept")
    os.utime(snapshot, (time.time() - 400 * DAY, time.time() - 400 * DAY))
    kernel = Kernel(env=environment(tmp_path, "notes.ipynb"))
    try:
        first = ok(kernel.execute("kept"))
        assert plain(first) == "from before"
        told = first.stream_text("stderr")
        assert "resumed this notebook's session as it was when its kernel shut down" in told
        assert "Restart the kernel for a fresh interpreter" in told
        assert "this notebook's hibernated session, saved" in kernel.banner()
    finally:
        kernel.shutdown()
    # the kernel's start removed the session older than 14 days, and only that
    assert young.exists() and snapshot.exists() and not old.exists()
    # this notebook's own, once older than the limit, is removed rather than resumed
    assert own.exists()  # hibernated again at that shutdown
    os.utime(own, (time.time() - 15 * DAY, time.time() - 15 * DAY))
    kernel = Kernel(env=environment(tmp_path, "notes.ipynb"))
    try:
        first = kernel.execute("'kept' in dir()")
        assert plain(first) is False
        assert "older than 14 days" in first.stream_text("stderr")
    finally:
        kernel.shutdown()


def test_hibernated_sessions_keep_to_their_quota(tmp_path):
    hibernate(tmp_path, "notes.ipynb", "x = 1")
    size = hibernated_path(tmp_path, "notes.ipynb").stat().st_size  # this session's image
    quota = max(16 << 20, 4 * size)
    # three other notebooks' sessions that fit beside it two at a time, not three
    other = (quota - size) * 9 // 20
    others = [
        stand_in(tmp_path, f"other-{index}.ipynb", other, (3 - index) * 3600) for index in range(3)
    ]  # other-0 the least recently saved
    hibernate(tmp_path, "notes.ipynb", "y = 2", f"--WasmKernel.hibernation_quota={quota}")
    assert hibernated_path(tmp_path, "notes.ipynb").exists()
    # the least recently saved went to make room, and only it
    assert [path.exists() for path in others] == [False, True, True]
    total = sum(path.stat().st_size for path in tmp_path.glob("hibernated-*"))
    assert total <= quota


def test_snapshot_forget_keeps_the_notebook_from_hibernating(tmp_path):
    kernel = Kernel(env=environment(tmp_path, "notes.ipynb"))
    try:
        told = ok(kernel.execute("%snapshot forget")).stream_text()
        assert "will not hibernate when it shuts down" in told
        assert "opens with a fresh interpreter next time" in told
        assert "Hibernation: off for this kernel (%snapshot forget)" in kernel.banner()
    finally:
        kernel.shutdown()
    assert not list(tmp_path.glob("hibernated-*"))
    strict = Kernel(kernel_name="wasm-python-strict", env=environment(tmp_path, "s.ipynb"))
    try:
        told = ok(strict.execute("%snapshot forget")).stream_text()
        assert "does not hibernate" in told
    finally:
        strict.shutdown()


@pytest.mark.nokernel
def test_the_snapshot_command_forgets_every_hibernated_session(tmp_path):
    sessions = [stand_in(tmp_path, name, 1 << 20, 0) for name in ("a.ipynb", "b.ipynb")]
    snapshot = tmp_path / ("mine" + images.SUFFIX)
    snapshot.write_bytes(b"kept")
    done = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "snapshot", "forget", "--snapshot-dir", tmp_path],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "Forgot 2 hibernated session(s), 2.0 MiB" in done.stdout
    assert not any(path.exists() for path in sessions) and snapshot.exists()
