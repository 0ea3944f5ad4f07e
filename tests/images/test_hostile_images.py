"""Hostile images and snapshot folders: what others can place where a kernel reads and
writes images (issue 24).

A snapshot folder can hold names planted by someone else (links, devices, FIFOs), an image
can be crafted, kernels can be killed while they write one and can share a folder. Each
test drives real kernels through jupyter_client, with files, images and archives the test
makes itself; a kernel that starts to balloon is killed by a guard, so that the old
behaviour fails a test without taking the machine's memory.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from conftest import Kernel, ok, plain
from test_images import _with_archive, environment, error_of

from wasm_kernel.images import image_archive, images

GUARD = 1536 << 20  # a kernel past this resident size is killed: a refusal takes nothing


def kernel_pid(kernel: Kernel) -> int:
    return kernel.manager.provisioner.process.pid  # type: ignore[union-attr]


def status_bytes(pid: int, field: str) -> int:
    """A size from /proc/PID/status (VmRSS, VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10
    raise KeyError(field)


class MemoryGuard:
    """Kills the kernel process if its resident memory passes GUARD (the old code read
    /dev/zero without end); ``tripped`` says it did."""

    def __init__(self, pid: int):
        self.pid, self.tripped = pid, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            try:
                if status_bytes(self.pid, "VmRSS") > GUARD:
                    self.tripped = True
                    os.kill(self.pid, signal.SIGKILL)
                    return
            except (OSError, KeyError):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def staged(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.partial"))


def staged_sizes(folder: Path) -> list[int]:
    sizes = []
    for path in staged(folder):
        try:
            sizes.append(path.stat().st_size)
        except FileNotFoundError:  # renamed into place meanwhile
            pass
    return sizes


# -- finding 1: a link planted as the staging file -------------------------------------------


def test_save_does_not_follow_links_planted_in_the_folder(start_kernel, tmp_path):
    folder, outside = tmp_path / "snapshots", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    victims = {name: outside / f"{name}.txt" for name in ("staging", "target")}
    for victim in victims.values():
        victim.write_text("the user's own file")
        victim.chmod(0o644)
    # the staging name the kernel used to write through, and the image's own name
    (folder / ".victim.wkimg.partial").symlink_to(victims["staging"])
    (folder / "victim.wkimg").symlink_to(victims["target"])
    kernel = start_kernel(env=environment(folder))
    ok(kernel.execute("x = 'saved'"))
    ok(kernel.execute("%snapshot save victim"))
    for victim in victims.values():
        assert victim.read_bytes() == b"the user's own file", victim
        assert victim.stat().st_mode & 0o777 == 0o644, victim
    image = folder / "victim.wkimg"
    assert not image.is_symlink() and image.stat().st_mode & 0o777 == 0o600
    # no staging file of its own left behind; the planted link is left alone, not followed
    assert staged(folder) == [folder / ".victim.wkimg.partial"]
    ok(kernel.execute("x = 'changed'"))
    ok(kernel.execute("%snapshot restore victim"))
    assert plain(kernel.execute("x")) == "saved"


# -- finding 2: links, devices and FIFOs read as images ------------------------------------


def test_links_devices_and_fifos_are_refused_without_reading(start_kernel, tmp_path):
    folder = tmp_path / "snapshots"
    kernel = start_kernel(env=environment(folder))
    ok(kernel.execute("state = 'mine'"))
    ok(kernel.execute("%snapshot save good"))
    (folder / "zero.wkimg").symlink_to("/dev/zero")
    (folder / "linked.wkimg").symlink_to(folder / "good.wkimg")  # even a sound image
    os.mkfifo(folder / "fifo.wkimg")
    pid = kernel_pid(kernel)
    before = status_bytes(pid, "VmHWM")
    guard = MemoryGuard(pid)
    try:
        refused = {}
        for name in ("zero", "linked", "fifo"):
            ename, evalue = error_of(kernel.execute(f"%snapshot restore {name}", timeout=60))
            assert ename == "SnapshotError", (name, evalue)
            refused[name] = evalue
        listed = ok(kernel.execute("%snapshot list")).stream_text()
        assert plain(kernel.execute("state")) == "mine"
        growth = status_bytes(pid, "VmHWM") - before
    finally:
        guard.stop()
    assert not guard.tripped
    assert "is a symbolic link" in refused["zero"] and "is a symbolic link" in refused["linked"]
    assert "is a FIFO (named pipe), not a regular file" in refused["fifo"]
    assert [line.split()[0] for line in listed.splitlines()[:-1]] == ["good"], listed
    print(f"peak resident memory grew by {growth / (1 << 20):.1f} MiB while refusing them")
    assert growth < 64 << 20


@pytest.mark.parametrize("source", ["/dev/zero", "fifo"])
def test_resuming_a_device_or_fifo_starts_fresh_and_says_why(start_kernel, tmp_path, source):
    if source == "fifo":
        os.mkfifo(tmp_path / "fifo")
        source = str(tmp_path / "fifo")
    kernel = start_kernel([f"--WasmKernel.resume_from={source}"], env=environment(tmp_path))
    guard = MemoryGuard(kernel_pid(kernel))
    try:
        first = ok(kernel.execute("6 * 7", timeout=60))
        peak = status_bytes(kernel_pid(kernel), "VmHWM")
    finally:
        guard.stop()
    assert not guard.tripped
    assert plain(first) == 42
    told = first.stream_text("stderr")
    assert f"could not resume from {source}" in told and "not a regular file" in told, told
    print(f"peak resident memory of the kernel: {peak / (1 << 20):.0f} MiB")


def test_snapshot_info_refuses_a_fifo(tmp_path):
    fifo = tmp_path / "info.wkimg"
    os.mkfifo(fifo)
    done = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "snapshot", "info", str(fifo)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "not a regular file" in done.stderr, done.stderr


# -- finding 3: a crafted /tmp archive ---------------------------------------------------------


def _crafted_archive(members: list[tuple[str, int]]) -> bytes:
    """A /tmp archive of ``(kind, size)`` members: a folder whose PAX header declares
    ``-size`` bytes ("cancel"), a file of zeros (stored, compressed to almost nothing in the
    image), a sparse file that stores none of its zeros, or ``size // 4096`` empty files."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, size in members:
            member = tarfile.TarInfo(kind)
            if kind == "cancel":
                member.type = tarfile.DIRTYPE
                member.size = -size  # written as a PAX "size" record
                tar.addfile(member)
            elif kind == "sparse":
                member.pax_headers = {"GNU.sparse.map": "0,0", "GNU.sparse.size": str(size)}
                tar.addfile(member)
            elif kind == "zeros":
                member.size = size
                tar.addfile(member, io.BytesIO(bytes(size)))
            else:
                for index in range(size // 4096):
                    tar.addfile(tarfile.TarInfo(f"empty-{index}"), io.BytesIO())
    return out.getvalue()


LIMIT = 16 << 20  # the kernel's /tmp limit in these tests
BIG = 24 << 20  # past that limit, within what an image may inflate to (the limit + 16 MiB)
# the archive's members, and what the refusal says
CRAFTED = {
    # the sizes sum to nothing: the old check let 24 MiB be written
    "cancelled-zeros": ([("cancel", BIG), ("zeros", BIG)], "'cancel' declares a size of -"),
    "cancelled-sparse": ([("cancel", BIG), ("sparse", BIG)], "'cancel' declares a size of -"),
    # within the limit by its size, but not what an image's /tmp holds
    "sparse": ([("sparse", 8 << 20)], "'sparse' is not a plain file or folder"),
    # each file takes a block on disk, whatever its size
    "empties": ([("empties", BIG)], "more than this kernel's /tmp limit of 16 MiB"),
}


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_a_crafted_archive_cannot_pass_the_scratch_limit(start_kernel, tmp_path, kind):
    members, reason = CRAFTED[kind]
    folder = tmp_path / "snapshots"
    kernel = start_kernel([f"--WasmKernel.scratch_limit={LIMIT}"], env=environment(folder))
    ok(kernel.execute("state = 'mine'; open('/tmp/own.txt', 'w').write('kept')"))
    ok(kernel.execute("%snapshot save good"))
    crafted = _with_archive((folder / "good.wkimg").read_bytes(), _crafted_archive(members))
    (folder / "crafted.wkimg").write_bytes(crafted)
    ename, evalue = error_of(kernel.execute("%snapshot restore crafted"))
    assert ename == "SnapshotError" and reason in evalue, evalue
    ok(kernel.execute("import os"))
    assert plain(kernel.execute("sorted(os.listdir('/tmp')), state")) == (["own.txt"], "mine")
    print(f"crafted image ({kind}): {len(crafted) >> 10} KiB")


@pytest.mark.nokernel
def test_the_unpack_stops_at_the_limit_whatever_the_check_said(tmp_path):
    """The unpack counts what it writes itself: an archive past the limit (which the check
    would have refused) stops before its first byte past it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for index in range(4):
            member = tarfile.TarInfo(f"deep/er/part-{index}")
            member.size = 1 << 20
            tar.addfile(member, io.BytesIO(bytes(1 << 20)))
    target = tmp_path / "scratch"
    target.mkdir()
    with pytest.raises(images.ImageError, match="more than this kernel's /tmp limit of 3 MiB"):
        image_archive.unpack_checked(out.getvalue(), target, 3 << 20)
    written = sum(path.stat().st_size for path in target.rglob("*") if path.is_file())
    assert written == 2 << 20  # two whole files and two folders fit; the third would not


# -- finding 4: staging files of killed or stopped kernels ------------------------------------


def test_unfinished_saves_count_and_a_killed_kernels_are_removed(start_kernel, tmp_path):
    """A kernel stopped in the middle of a save holds its staging file: it counts in the
    quota of the other kernels. Killed, it leaves the file unlocked: the next kernel start
    removes it."""
    folder = tmp_path / "snapshots"
    writer = Kernel(env=environment(folder, WASM_KERNEL_SNAPSHOT_QUOTA="0"))
    try:
        ok(writer.execute("import os; noise = os.urandom(128 << 20)"))
        pid = kernel_pid(writer)
        writer.client.execute("%snapshot save big", allow_stdin=False)
        deadline = time.monotonic() + 120
        # stopped once its staging file alone fills the other kernel's quota (64 MiB)
        while not any(size >= 64 << 20 for size in staged_sizes(folder)):
            assert time.monotonic() < deadline, "no staging file was written"
            time.sleep(0.001)
        os.kill(pid, signal.SIGSTOP)  # stopped before it renames its staging file
        [partial] = staged(folder)
        print(f"staging file of the stopped save: {partial.stat().st_size / (1 << 20):.0f} MiB")
        assert not (folder / "big.wkimg").exists()
        other = start_kernel(env=environment(folder, WASM_KERNEL_SNAPSHOT_QUOTA=str(64 << 20)))
        ok(other.execute("y = 1"))
        ename, evalue = error_of(other.execute("%snapshot save small"))
        assert ename == "SnapshotError" and "would pass the snapshot quota of 64 MiB" in evalue
        assert "of it saves in progress" in evalue, evalue
        listed = ok(other.execute("%snapshot list")).stream_text()
        assert "1 unfinished" in listed, listed
        os.kill(pid, signal.SIGKILL)
    finally:
        writer.manager.shutdown_kernel(now=True)
    assert staged(folder) == [partial], "a killed kernel's staging file stays until a sweep"
    later = start_kernel(env=environment(folder))
    ok(later.execute("z = 1"))
    assert staged(folder) == [], "the next kernel's start removed it"
    ok(other.execute("%snapshot save small"))
    assert sorted(path.name for path in folder.glob("*.wkimg")) == ["small.wkimg"]


# -- finding 5: two kernels saving into one quota at once -------------------------------------


def test_two_kernels_saving_at_once_cannot_both_pass_the_quota(tmp_path):
    """Round after round, two kernels save at the same moment into a quota that holds one
    of their images: one save passes, the other is refused with the quota's error (the
    check and the rename are one step under the folder's lock)."""
    folder = tmp_path / "snapshots"
    quota = 100 << 20  # one image of ~64 MiB fits, two do not
    env = environment(folder, WASM_KERNEL_SNAPSHOT_QUOTA=str(quota))
    kernels = [Kernel(env=env) for _ in range(2)]
    outcomes = []
    try:
        for kernel in kernels:
            ok(kernel.execute("import os; noise = os.urandom(48 << 20)"))
        for round_ in range(ROUNDS):
            asked = [
                kernel.client.execute(f"%snapshot save k{index}", allow_stdin=False)
                for index, kernel in enumerate(kernels)
            ]
            runs = [kernel.collect(msg_id) for kernel, msg_id in zip(kernels, asked, strict=True)]
            saved = sorted(path.name for path in folder.glob("*.wkimg"))
            outcomes.append((round_, [run.content.get("evalue", "ok") for run in runs], saved))
            for path in folder.glob("*.wkimg"):
                path.unlink()
    finally:
        for kernel in kernels:
            kernel.shutdown()
    for round_, replies, saved in outcomes:
        assert len(saved) == 1, (round_, replies, saved)
        [refusal] = [reply for reply in replies if reply != "ok"]
        assert "would pass the snapshot quota of 100 MiB" in refusal, refusal
    assert staged(folder) == []


ROUNDS = 4


# -- finding 6: snapshot_dir empty or relative ---------------------------------------------------


@pytest.mark.parametrize(
    ("source", "value"),
    [("argv", ""), ("argv", "snaps"), ("env", ""), ("env", "snaps"), ("config", "")],
)
def test_an_empty_or_relative_snapshot_dir_is_refused(start_kernel, tmp_path, source, value):
    """Taken from the kernel's working folder (the notebook's), the folder would put other
    notebooks' hibernated sessions where this notebook's cells read files."""
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    env = {"JPY_SESSION_NAME": str(notebook / "work.ipynb")}
    argv = []
    if source == "argv":
        argv = [f"--WasmKernel.snapshot_dir={value}"]
    elif source == "env":
        env["WASM_KERNEL_SNAPSHOT_DIR"] = value
    else:
        (tmp_path / "config").mkdir()
        (tmp_path / "config" / "jupyter_wasm_kernel_config.py").write_text(
            f"c.WasmKernel.snapshot_dir = {value!r}\n"
        )
        env["JUPYTER_CONFIG_DIR"] = str(tmp_path / "config")
    kernel = start_kernel(argv, env, cwd=notebook)
    ename, evalue = error_of(kernel.execute("x = 1"))
    assert ename == "InvalidSetting" and "WasmKernel.snapshot_dir = " in evalue, evalue
    assert "must be an absolute folder path" in evalue
    kernel.shutdown()
    assert list(notebook.rglob("*")) == [], "nothing landed in the notebook's folder"


@pytest.mark.nokernel
def test_a_streamed_save_is_checked_after_it_is_written(tmp_path):
    """A save that streams its image (a function given the staging file, which it may seek
    in) is held to the quota by the size it wrote; ``admit`` sees that size first."""
    from wasm_kernel.images.image_folder import ImageFolder

    folder = ImageFolder(tmp_path, 20 << 20)
    admitted = []

    def write(out) -> None:
        out.write(bytes(16))
        out.write(os.urandom(12 << 20))
        out.seek(0)
        out.write(b"header, at last.")

    saved = folder.store("streamed", write, admit=admitted.append)
    assert saved.read_bytes()[:16] == b"header, at last." and admitted == [(12 << 20) + 16]
    with pytest.raises(images.ImageError, match="would pass the snapshot quota of 20 MiB"):
        folder.store("second", write)
    assert [entry.name for entry in folder.entries()] == ["streamed"] and staged(tmp_path) == []


@pytest.mark.nokernel
def test_an_awaited_image_is_found_when_it_is_renamed_into_place(tmp_path):
    """``resume_wait``'s wait: woken when a staging file is renamed to the image's name (how
    images appear), not by other files; bounded, and bounded where the folder is missing."""
    import threading

    from wasm_kernel.images.image_folder import wait_for

    image = tmp_path / "later.wkimg"

    def write_later() -> None:
        (tmp_path / "other.wkimg").write_bytes(b"not this one")
        staging = tmp_path / ".later.wkimg.x.partial"
        staging.write_bytes(b"image")
        staging.rename(image)

    writer = threading.Timer(0.2, write_later)
    writer.start()
    try:
        assert wait_for(image, 60)
    finally:
        writer.join()
    assert image.read_bytes() == b"image"
    assert not wait_for(tmp_path / "never.wkimg", 0.3)
    assert not wait_for(tmp_path / "no-folder" / "never.wkimg", 0.3)
