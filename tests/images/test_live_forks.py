"""Forks that map their parent's memory (``%snapshot fork``, ``Session.fork()``).

A fork image names where the session's memory is, in the kernel that forked: the forked
kernel maps those pages copy-on-write. Checked here through real kernels: the two sessions
share the pages neither wrote (proportional set size), diverge where they write, the parent's
rollback still returns to its own last cell; and what a forked kernel refuses: an image whose
forking kernel has ended, and crafted images naming a file that is not a sealed checkpoint.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import Kernel, ok, plain

from wasm_kernel.client import Session, SessionError
from wasm_kernel.images import images

pytestmark = pytest.mark.slow

ARRAY = "import numpy as np\ndata = np.ones(64 * 2**20 // 8)\nfloat(data.sum())"


def pss_and_rss(pid: int) -> tuple[int, int]:
    """Proportional and resident set sizes of a process, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value) * 1024
    return fields["Pss"], fields["Rss"]


def test_a_fork_shares_its_parents_pages_and_the_two_diverge(tmp_path: Path) -> None:
    with Session(snapshots=True, snapshot_dir=str(tmp_path)) as parent:
        assert parent.run(ARRAY).text == str(float(8 * 2**20))
        with parent.fork() as child:
            assert child.run("float(data.sum())").text == str(float(8 * 2**20))
            # both have read every page of the array: each holds about half of them
            pss, rss = pss_and_rss(child.manager.provisioner.process.pid)
            assert rss - pss > 24 << 20, (pss, rss)
            child.run("data[:10] = 5")
            parent.run("data[10:20] = 7")
            shown = "print(data[:21].tolist())"
            assert child.run(shown).stdout == f"{[5.0] * 10 + [1.0] * 11}\n"
            assert parent.run(shown).stdout == f"{[1.0] * 10 + [7.0] * 10 + [1.0]}\n"
        # the fork image went with the fork's start; the parent's checkpoints go on
        assert [p.name for p in tmp_path.iterdir() if "fork" in p.name] == []
        parent.run("after = data[:21].sum()")
        crashed = parent.run("data[:] = 3\nimport os\nos.abort()")
        assert crashed.error is not None and crashed.error.name == "GuestCrashed"
        assert parent.run("float(after), float(data[:21].sum()), float(data.sum())").text == (
            f"({1.0 * 11 + 70.0}, {1.0 * 11 + 70.0}, {float(8 * 2**20 + 60)})"
        )


@pytest.fixture
def forked(tmp_path: Path) -> Iterator[tuple[Kernel, Path]]:
    """A kernel that has written the fork image ``fx`` (in its own snapshot folder)."""
    folder = tmp_path / "images"
    kernel = Kernel(env={"WASM_KERNEL_SNAPSHOT_DIR": str(folder)})
    run = ok(kernel.execute("secret = 'parent'\n%snapshot fork fx"))
    assert "sharing this session's memory" in run.stream_text()
    yield kernel, folder
    kernel.shutdown()


def resumed(folder: Path, name: str) -> tuple[str, str | None]:
    """What a kernel started from image ``name`` says first, and what it then has."""
    kernel = Kernel(
        [f"--WasmKernel.resume_from={name}"], env={"WASM_KERNEL_SNAPSHOT_DIR": str(folder)}
    )
    try:
        run = kernel.execute("globals().get('secret')")
        return run.stream_text("stderr"), run.result_text()
    finally:
        kernel.shutdown()


def test_a_fork_image_resumes_while_its_kernel_runs(forked) -> None:
    kernel, folder = forked
    told, seen = resumed(folder, "fx")
    assert (told, seen) == ("", "'parent'")
    kernel.execute("secret = 'changed later'")
    assert resumed(folder, "fx")[1] == "'parent'"  # frozen: the parent's later cells are not in it


def test_a_fork_image_whose_kernel_ended_starts_fresh_and_says_why(forked) -> None:
    kernel, folder = forked
    kernel.shutdown()
    told, seen = resumed(folder, "fx")
    assert "the kernel that forked it has ended" in told and "fresh interpreter" in told
    assert seen is None


def test_the_reason_a_fork_could_not_resume_waits_for_a_cell_that_shows_output(forked) -> None:
    kernel, folder = forked
    kernel.shutdown()
    fresh = Kernel(["--WasmKernel.resume_from=fx"], env={"WASM_KERNEL_SNAPSHOT_DIR": str(folder)})
    try:
        ok(fresh.execute("", silent=True, store_history=False))  # a client's probe shows nothing
        told = ok(fresh.execute("1")).stream_text("stderr")
        assert "could not resume from" in told and "fresh interpreter" in told
        described = ok(fresh.execute("%sandbox")).stream_text()  # as the banner says
        assert "Interpreter: from a fresh boot (could not resume from" in described
    finally:
        fresh.shutdown()


def test_a_session_asked_to_resume_what_it_cannot_fails_and_says_why(forked) -> None:
    kernel, folder = forked
    kernel.shutdown()
    with (
        pytest.raises(SessionError, match=r"could not resume from .*the kernel that forked it"),
        Session(snapshots=True, snapshot_dir=str(folder), resume_from="fx"),
    ):
        pass


def header_of(data: bytes) -> tuple[int, dict]:
    """An image's header and the room kept for it."""
    room = struct.unpack("<II", data[len(images.MAGIC) : images.PREFIX])[1]
    return room, json.loads(data[images.PREFIX : images.PREFIX + room])


def live_header(path: Path) -> dict:
    return header_of(path.read_bytes())[1]["memory"]["live"]


def test_a_later_fork_maps_an_earlier_forks_pages_rather_than_copying_them(forked) -> None:
    kernel, folder = forked
    ok(kernel.execute(ARRAY))
    ok(kernel.execute("%snapshot fork first"))
    ok(kernel.execute("data[:5] = 9\n%snapshot fork second"))
    # the array's untouched pages are still the first fork's file: named, not copied
    assert len(live_header(folder / "first.wkimg")["fds"]) >= 1
    assert len(live_header(folder / "second.wkimg")["fds"]) >= 2
    kernel_b = Kernel(
        ["--WasmKernel.resume_from=second"], env={"WASM_KERNEL_SNAPSHOT_DIR": str(folder)}
    )
    try:
        assert plain(kernel_b.execute("float(data[:6].sum()), float(data.sum())")) == (
            46.0,
            float(8 * 2**20 + 40),
        )
    finally:
        kernel_b.shutdown()


def rewritten(path: Path, change) -> None:
    """Change an image's header as a forger would, checksum and all."""
    data = path.read_bytes()
    room, header = header_of(data)
    change(header["memory"]["live"])
    encoded = json.dumps(header, separators=(",", ":")).encode()
    assert len(encoded) <= room
    body = data[: images.PREFIX] + encoded.ljust(room) + data[images.PREFIX + room : -32]
    path.write_bytes(body + hashlib.sha256(body).digest())


def test_a_fork_image_names_the_very_files_it_froze(forked, tmp_path) -> None:
    """A sealed checkpoint of ours at the named descriptor, but not the one the image was
    written with (as if another kernel had taken the forking kernel's pid): refused."""
    _, folder = forked
    fd = os.memfd_create("wasm-kernel-checkpoint", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 256 << 20)
        seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)

        def another_checkpoint(live: dict) -> None:
            live["pid"], live["fds"] = os.getpid(), [fd]

        rewritten(folder / "fx.wkimg", another_checkpoint)
        told, seen = resumed(folder, "fx")
        assert "not the file the forking kernel froze" in told, told
        assert seen is None
    finally:
        os.close(fd)


def test_a_fork_image_may_name_only_the_memory_of_the_session_that_wrote_it(
    forked, tmp_path
) -> None:
    """Another session of the same user has forked too: the image rewritten to name that
    session's frozen memory (its pid, descriptor, device and inode, as a forger can learn
    them) is refused, since the image's secret is not the one that memory was frozen with;
    the other session's variables never reach this kernel."""
    _, folder = forked
    other_folder = tmp_path / "other"
    other = Kernel(env={"WASM_KERNEL_SNAPSHOT_DIR": str(other_folder)})
    try:
        ok(other.execute("secret = 'the other session'\n%snapshot fork theirs"))
        theirs = live_header(other_folder / "theirs.wkimg")

        def point_at_theirs(live: dict) -> None:
            for key in ("pid", "fds", "files", "parts", "boot"):
                live[key] = theirs[key]

        rewritten(folder / "fx.wkimg", point_at_theirs)
        told, seen = resumed(folder, "fx")
        assert "frozen by another session" in told and "fresh interpreter" in told, told
        assert seen is None
    finally:
        other.shutdown()


@pytest.mark.parametrize(
    ("what", "refusal"),
    [
        ("a regular file", "not a wasm-kernel checkpoint"),
        ("an unsealed memfd of our name", "not sealed against writes"),
    ],
)
def test_a_crafted_fork_image_never_maps_a_foreign_file(forked, tmp_path, what, refusal) -> None:
    """The image names a descriptor of this test's process instead: the kernel checks what it
    opened and starts fresh; the file's bytes never reach its guest."""
    _, folder = forked
    if what == "a regular file":
        planted = tmp_path / "planted"
        planted.write_bytes(b"secret bytes " * 100_000)
        fd = os.open(planted, os.O_RDONLY)
    else:
        fd = os.memfd_create("wasm-kernel-checkpoint")
        os.write(fd, b"secret bytes " * 100_000)
    try:
        path = folder / "fx.wkimg"

        def point_at_us(live: dict) -> None:
            status = os.fstat(fd)  # a forger knows the file it points at
            live["pid"], live["fds"] = os.getpid(), [fd]
            live["files"] = [[status.st_dev, status.st_ino]]

        rewritten(path, point_at_us)
        told, seen = resumed(folder, "fx")
        assert refusal in told and "fresh interpreter" in told, told
        assert seen is None
    finally:
        os.close(fd)


def test_the_parent_lets_go_of_a_fork_images_memory_when_it_is_deleted(forked) -> None:
    kernel, _ = forked
    pid = kernel.manager.provisioner.process.pid

    def frozen() -> int:
        return sum(
            "wasm-kernel-checkpoint" in os.readlink(f"/proc/{pid}/fd/{fd}")
            for fd in os.listdir(f"/proc/{pid}/fd")
        )

    before = frozen()
    ok(kernel.execute("%snapshot delete fx"))
    assert frozen() == before - 1
    assert plain(kernel.execute("len(secret)")) == 6
    assert psutil.pid_exists(pid)


def test_a_kernel_waits_for_the_image_its_parent_is_still_writing(forked) -> None:
    """``resume_wait``: the kernel is up and answering before the image exists (its banner
    says the interpreter is still starting), and resumes the image once it appears."""
    kernel, folder = forked
    waiting = Kernel(
        ["--WasmKernel.resume_from=later", "--WasmKernel.resume_wait=120"],
        env={"WASM_KERNEL_SNAPSHOT_DIR": str(folder)},
    )
    try:
        assert "Interpreter: still starting" in waiting.banner().splitlines()
        ok(kernel.execute("secret = 'written later'\n%snapshot fork later"))
        assert plain(waiting.execute("secret")) == "written later"
        assert "Interpreter: from image later.wkimg" in waiting.banner().splitlines()
    finally:
        waiting.shutdown()


def test_a_kernel_waits_for_a_missing_image_only_as_long_as_it_was_told(forked) -> None:
    _, folder = forked
    fresh = Kernel(
        ["--WasmKernel.resume_from=never", "--WasmKernel.resume_wait=0.5"],
        env={"WASM_KERNEL_SNAPSHOT_DIR": str(folder)},
    )
    try:
        told = ok(fresh.execute("globals().get('secret')")).stream_text("stderr")
        assert "could not resume from" in told and "fresh interpreter" in told, told
    finally:
        fresh.shutdown()


def test_a_fork_whose_image_fails_leaves_no_kernel_behind(tmp_path: Path) -> None:
    """The fork's kernel starts while its parent writes the image: when the parent refuses
    (a quota too small for the image), that kernel, waiting in vain, is killed at once."""
    started = time.time()
    quota = {"snapshots": True, "snapshot_dir": str(tmp_path), "snapshot_quota": 16 << 20}
    with Session(rollback=False, **quota) as parent:  # rollback off: a fork writes it whole
        parent.run(ARRAY)
        with pytest.raises(SessionError, match=r"fork failed: SnapshotError: .*quota"):
            parent.fork()
        waiting = [
            process
            for process in psutil.process_iter(["cmdline", "create_time"])
            if process.info["create_time"] >= started
            and any("resume_wait" in word for word in process.info["cmdline"] or ())
        ]
        assert waiting == [], [process.info["cmdline"] for process in waiting]
        assert parent.run("float(data.sum())").text == str(float(8 * 2**20))
