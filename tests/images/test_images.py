"""Interpreter images: save, restore, resume in another kernel process, fork, hibernate.

Every test drives real kernels through jupyter_client. Images live in a folder of the test's
own (WASM_KERNEL_SNAPSHOT_DIR). Bad images are made from a good one, the way a damaged disk, a
cut copy, another installation or another format would make them, and each must be refused
with its own reason while the kernel keeps its state and answers the next cell.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import struct
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
import zstandard
from conftest import Kernel, ok, plain
from interrupting import MARKER, run_and_interrupt

from wasm_kernel.images import image_fields, images

SETUP = """
import numpy as np, pandas as pd, random, time
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return self.x ** 2 + self.y ** 2
array = np.arange(12, dtype=np.int64).reshape(3, 4) * 7
frame = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
point = Point(3, 4)
open("/tmp/kept.txt", "w").write("scratch survives")
spent = time.process_time()
held = open("/tmp/kept.txt")
"""
CHECK = (
    "(int(array.sum()), frame.to_dict('list'), point.norm2(), type(point).__name__,"
    " open('/tmp/kept.txt').read())"
)


def environment(folder: Path, **more: str) -> dict[str, str]:
    return {"WASM_KERNEL_SNAPSHOT_DIR": str(folder), **more}


def error_of(run) -> tuple[str, str]:
    content = run.content
    assert content["status"] == "error", content
    return content["ename"], content["evalue"]


@dataclass
class Prepared:
    folder: Path  # holds 'base': the state SETUP makes, saved by the third cell
    check: object  # what CHECK gave in the kernel that saved it


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Prepared:
    folder = tmp_path_factory.mktemp("snapshots")
    kernel = Kernel(env=environment(folder))
    try:
        ok(kernel.execute(SETUP))
        check = plain(kernel.execute("marker = 'second cell'\n" + CHECK))
        saved = ok(kernel.execute("%snapshot save base"))
        assert "Saved snapshot 'base'" in saved.stream_text()
        assert saved.content["execution_count"] == 3
    finally:
        kernel.shutdown()
    return Prepared(folder, check)


def copy_folder(source: Path, target: Path) -> Path:
    target.mkdir(exist_ok=True)
    for path in source.glob("*" + images.SUFFIX):
        (target / path.name).write_bytes(path.read_bytes())
    return target


# -- in one kernel ----------------------------------------------------------------------------


def test_save_change_restore(start_kernel, tmp_path):
    kernel = start_kernel(env=environment(tmp_path))
    ok(kernel.execute("x = [1, 2, 3]; open('/tmp/a.txt', 'w').write('before')"))
    ok(kernel.execute("%snapshot save first"))
    ok(kernel.execute("x.append(4); y = 'later'; open('/tmp/a.txt', 'w').write('after')"))
    ok(kernel.execute("open('/tmp/b.txt', 'w').write('new')"))
    restored = ok(kernel.execute("%snapshot restore first"))
    assert "Restored snapshot 'first'" in restored.stream_text()
    assert plain(kernel.execute("x, 'y' in dir(), open('/tmp/a.txt').read()")) == (
        [1, 2, 3],
        False,
        "before",
    )
    assert plain(kernel.execute("import os; os.path.exists('/tmp/b.txt')")) is False
    listed = ok(kernel.execute("%snapshot list")).stream_text()
    assert "first" in listed and "MiB" in listed
    ok(kernel.execute("%snapshot delete first"))
    assert "first" not in ok(kernel.execute("%snapshot list")).stream_text()
    assert error_of(kernel.execute("%snapshot restore first"))[1].startswith(
        "there is no snapshot named 'first'"
    )


def test_bad_names_and_actions_are_refused(start_kernel, tmp_path):
    kernel = start_kernel(env=environment(tmp_path))
    for line in ("save ../escape", "save /etc/x", "save a/b", "save ..", "frobnicate x"):
        ename, evalue = error_of(kernel.execute(f"%snapshot {line}"))
        assert ename == "UsageError", (line, evalue)
    assert not any(tmp_path.iterdir()) and not (tmp_path.parent / "escape.wkimg").exists()
    # another notebook's hibernated session is not for this one to take or destroy
    for action in ("save", "restore", "delete"):
        ename, evalue = error_of(kernel.execute(f"%snapshot {action} hibernated-0123abcd"))
        assert ename == "UsageError" and "belong to their own notebooks" in evalue
    assert plain(kernel.execute("1 + 1")) == 2


@pytest.mark.slow
def test_strict_profile_has_no_snapshots(start_kernel, prepared):
    kernel = start_kernel(kernel_name="wasm-python-strict", env=environment(prepared.folder))
    for line in ("list", "restore base", "save mine"):
        ename, evalue = error_of(kernel.execute(f"%snapshot {line}"))
        assert ename == "UsageError" and "%snapshot is off" in evalue
    listed = [path.name for path in prepared.folder.iterdir() if not path.name.startswith(".")]
    assert listed == ["base" + images.SUFFIX]  # beside the folder's lock file


def test_a_quota_below_any_image_is_a_refused_setting(start_kernel, tmp_path):
    kernel = start_kernel(["--WasmKernel.snapshot_quota=5"], env=environment(tmp_path))
    ename, evalue = error_of(kernel.execute("1"))
    assert ename == "InvalidSetting" and "WasmKernel.snapshot_quota = '5'" in evalue


def test_quota_exceeded_is_a_clear_error(start_kernel, tmp_path):
    kernel = start_kernel(env=environment(tmp_path, WASM_KERNEL_SNAPSHOT_QUOTA=str(16 << 20)))
    ok(kernel.execute("import os; noise = os.urandom(24 << 20)"))  # does not compress
    ename, evalue = error_of(kernel.execute("%snapshot save big"))
    assert ename == "SnapshotError"
    assert "would pass the snapshot quota of 16 MiB" in evalue
    assert [p.name for p in tmp_path.iterdir()] == [".lock"]  # the folder's lock, nothing else
    assert plain(kernel.execute("len(noise)")) == 24 << 20


# -- in other kernel processes -------------------------------------------------------------------


def test_resume_in_a_new_process(start_kernel, prepared):
    kernel = start_kernel(["--WasmKernel.resume_from=base"], env=environment(prepared.folder))
    first = ok(kernel.execute(CHECK))
    assert plain(first) == prepared.check
    assert first.content["execution_count"] == 4  # numbered after the image's three cells
    assert plain(kernel.execute("marker")) == "second cell"
    history = kernel.client.history(
        hist_access_type="range", session=0, start=1, stop=100, reply=True
    )["content"]["history"]
    assert [(line, source) for _, line, source in history] == [
        (1, SETUP),
        (2, "marker = 'second cell'\n" + CHECK),
        (3, "%snapshot save base"),
        (4, CHECK),
        (5, "marker"),
    ]
    # the guest's clocks do not run backwards in the new process
    assert plain(kernel.execute("time.process_time() >= spent")) is True
    # a file open when the image was taken is open again, where it stood (test_open_files)
    assert plain(kernel.execute("held.closed, held.read()")) == (False, "scratch survives")


def test_resume_by_path_with_other_mounts(start_kernel, prepared, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "fresh.csv").write_text("a,b\n1,2\n")
    kernel = start_kernel(
        [
            f"--WasmKernel.resume_from={prepared.folder / ('base' + images.SUFFIX)}",
            f"--WasmKernel.mounts=['{data}:/granted-now:ro']",
        ],
        env=environment(tmp_path / "empty"),
    )
    assert plain(kernel.execute("int(array.sum())")) == 462
    # the resuming kernel's mount is what the guest sees, not the image's
    ok(kernel.execute("import os"))
    assert plain(kernel.execute("sorted(os.listdir('/granted-now'))")) == ["fresh.csv"]
    assert plain(kernel.execute("os.getcwd()")) in ("/granted-now", "/tmp")


@pytest.mark.slow
def test_fork_two_kernels_from_one_image(start_kernel, prepared):
    forks = [
        start_kernel(["--WasmKernel.resume_from=base"], env=environment(prepared.folder))
        for _ in range(2)
    ]
    for index, kernel in enumerate(forks):
        ok(kernel.execute(f"array += {index + 1}; frame['c'] = {index}"))
        ok(kernel.execute(f"open('/tmp/kept.txt', 'a').write(' fork {index}')"))
    for index, kernel in enumerate(forks):
        assert plain(kernel.execute("int(array.sum()), list(frame['c'])")) == (
            462 + 12 * (index + 1),
            [index] * 3,
        )
        assert plain(kernel.execute("open('/tmp/kept.txt').read()")) == (
            f"scratch survives fork {index}"
        )
    # each resume reseeds random: the forks do not draw the same numbers
    draws = [plain(kernel.execute("random.random()")) for kernel in forks]
    assert draws[0] != draws[1]


@pytest.mark.slow
def test_rollback_and_interrupts_hold_after_resume(start_kernel, prepared):
    kernel = start_kernel(
        ["--WasmKernel.resume_from=base", "--WasmKernel.fuel=5e9"], env=environment(prepared.folder)
    )
    ok(kernel.execute("kept = 'before traps'"))
    ename, evalue = error_of(kernel.execute("array[0, 0] = -1; kept = 'lost'\nwhile True: pass"))
    assert ename == "FuelExhausted" and "rolled back" in evalue
    assert plain(kernel.execute("kept, int(array[0, 0])")) == ("before traps", 0)
    interrupted = run_and_interrupt(
        kernel,
        f"print({MARKER!r}, flush=True)\nimport time\nwhile True: time.sleep(0.01)",
        lambda: kernel.manager.signal_kernel(signal.SIGINT),
    )
    assert interrupted.reply["content"]["ename"] == "KeyboardInterrupt"
    assert plain(kernel.execute(CHECK)) == prepared.check


@pytest.mark.slow
def test_hibernated_session_comes_back(start_kernel, tmp_path):
    session = {"JPY_SESSION_NAME": str(tmp_path / "notes.ipynb")}
    first = Kernel(env=environment(tmp_path, **session))
    try:
        ok(first.execute("kept = {'answer': 42}"))
    finally:
        first.shutdown()  # a shutdown, as the idle culler does: the session hibernates
    assert [p.name for p in tmp_path.glob("hibernated-*")], "no hibernation image written"
    second = start_kernel(env=environment(tmp_path, **session))
    assert plain(second.execute("kept")) == {"answer": 42}
    # the image was used up: a kernel started after this one starts afresh unless it hibernates
    assert not list(tmp_path.glob("hibernated-*"))
    # a restart is not a hibernation: the user asked for a fresh interpreter
    second.manager.restart_kernel(now=False)
    second.client.wait_for_ready(timeout=120)
    assert plain(second.execute("'kept' in dir()")) is False
    assert not list(tmp_path.glob("hibernated-*"))
    other = start_kernel(env=environment(tmp_path, JPY_SESSION_NAME=str(tmp_path / "other.ipynb")))
    assert plain(other.execute("'kept' in dir()")) is False


def test_strict_profile_does_not_hibernate(tmp_path):
    session = {"JPY_SESSION_NAME": str(tmp_path / "strict.ipynb")}
    kernel = Kernel(kernel_name="wasm-python-strict", env=environment(tmp_path, **session))
    try:
        ok(kernel.execute("x = 1"))
    finally:
        kernel.shutdown()
    assert not list(tmp_path.glob("*" + images.SUFFIX))


# -- refused images ------------------------------------------------------------------------------


def _assembled(header: dict, blobs: bytes, raw: bytes) -> bytes:
    """An image file of ``header``, its compressed ``blobs`` and its ``raw`` extents, with a
    valid checksum."""
    encoded = json.dumps(header).encode()
    new = images.MAGIC + struct.pack("<II", images.FORMAT, len(encoded)) + encoded + blobs
    new += hashlib.sha256(new).digest()
    return new.ljust(images.raw_offset(len(new)), b"\0") + raw if raw else new


def _parts(data: bytes) -> tuple[dict, bytes, bytes]:
    """A sound image's header, compressed blobs and raw extents."""
    header, body, offset = images.verified_header(data)
    raw = data[images.raw_offset(len(body) + images.CHECKSUM) :] if header["memory"]["raw"] else b""
    return header, bytes(body[offset:]), raw


def _rebuilt(data: bytes, change) -> bytes:
    """The image with its header changed by ``change`` and a valid checksum again."""
    header, blobs, raw = _parts(data)
    change(header)
    return _assembled(header, blobs, raw)


def _with_archive(data: bytes, archive: bytes) -> bytes:
    """The image with another /tmp archive (and a valid checksum)."""
    header, blobs, raw = _parts(data)
    packed = zstandard.ZstdCompressor().compress(archive)
    kept = blobs[: len(blobs) - header["scratch"]]
    header["scratch"] = len(packed)
    return _assembled(header, kept + packed, raw)


def _nested_header(_: bytes) -> bytes:
    """A sound file whose header is JSON nested deeper than Python recurses."""
    header = b"[" * 100_000
    new = images.MAGIC + struct.pack("<II", images.FORMAT, len(header)) + header
    return new + hashlib.sha256(new).digest()


def _garbled_memory(data: bytes) -> bytes:
    """The image with every stored page overwritten (a sound file, an interpreter that cannot
    run): what a hostile image with a correct checksum could hold."""
    header, blobs, raw = _parts(data)
    garbled = b"\xff" * len(raw)
    header["memory"]["raw_sha256"] = hashlib.sha256(garbled).hexdigest()
    return _assembled(header, blobs, garbled)


def _damaged(data: bytes) -> bytes:
    """The image with a byte of its checked part flipped (the last before its checksum)."""
    _, body, _ = images.verified_header(data)
    at = len(body) - 1
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def _escaping_archive() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    return out.getvalue()


def _foreign(header: dict) -> None:
    header["needs"]["runtime_sha256"] = "0" * 64


def _before_the_wasmtime_upgrade(header: dict) -> None:
    header["needs"]["wasmtime"] = "49.0.0"


def _huge(header: dict) -> None:
    header["memory"]["size"] = 4 << 30


def _held(**fields: object):
    """A header change: one open file, the descriptor recorded with ``fields`` changed."""
    held = {"fd": 20, "path": "/tmp/kept.txt", "oflags": 0, "rights": 2, "inheriting": 0}
    held.update({"fdflags": 0, "lookup": 1, "offset": 0})

    def change(header: dict) -> None:
        header["host"]["held_files"] = [{**held, **fields}]

    return change


def _many_held(header: dict) -> None:
    _held()(header)
    header["host"]["held_files"] *= image_fields.MAX_HELD_FILES + 1


def _repeated_held(header: dict) -> None:
    _held()(header)
    header["host"]["held_files"] *= 2


BAD_IMAGES = {
    "damaged": (_damaged, "damaged or truncated"),
    "truncated": (lambda data: data[: len(data) // 2], "damaged or truncated"),
    "foreign-runtime": (
        lambda data: _rebuilt(data, _foreign),
        "taken with another runtime (sha256)",
    ),
    "other-wasmtime": (  # the upgrade routine: images of the wasmtime before say so
        lambda data: _rebuilt(data, _before_the_wasmtime_upgrade),
        f"another wasmtime version, '49.0.0'; this kernel has '{metadata.version('wasmtime')}'",
    ),
    "wrong-version": (
        lambda data: data[:8] + struct.pack("<I", 99) + data[12:],
        "format version 99",
    ),
    "not-an-image": (lambda data: b"PK\x03\x04" + data[4:], "not a wasm-kernel image"),
    "too-much-memory": (lambda data: _rebuilt(data, _huge), "more than this kernel's memory"),
    "escaping-archive": (lambda data: _with_archive(data, _escaping_archive()), "escapes /tmp"),
    "garbled-memory": (_garbled_memory, "the resumed interpreter"),
    "nested-header": (_nested_header, "header is malformed"),
    # a resume opens an image's files again: never creating, truncating, or leaving /tmp
    "creating-open-file": (lambda data: _rebuilt(data, _held(oflags=1 | 8)), "file's flags"),
    "escaping-open-file": (
        lambda data: _rebuilt(data, _held(path="/tmp/../etc/passwd")),
        "bad open file's path",
    ),
    "too-many-open-files": (lambda data: _rebuilt(data, _many_held), "bad open files"),
    "repeated-open-file": (lambda data: _rebuilt(data, _repeated_held), "unordered or repeated"),
    "huge-open-file-rights": (lambda data: _rebuilt(data, _held(rights=1 << 40)), "rights"),
}


def test_bad_images_are_refused_and_the_kernel_goes_on(start_kernel, prepared, tmp_path):
    folder = copy_folder(prepared.folder, tmp_path / "snapshots")
    good = (folder / ("base" + images.SUFFIX)).read_bytes()
    for name, (spoil, _) in BAD_IMAGES.items():
        (folder / (name + images.SUFFIX)).write_bytes(spoil(good))
    kernel = start_kernel(env=environment(folder))
    ok(kernel.execute("state = 'mine'"))
    for name, (_, reason) in BAD_IMAGES.items():
        ename, evalue = error_of(kernel.execute(f"%snapshot restore {name}"))
        assert ename == "SnapshotError" and reason in evalue, (name, evalue)
        assert plain(kernel.execute("state")) == "mine", name
    assert not (folder.parent / "outside.txt").exists()
    assert plain(kernel.execute("'array' in dir()")) is False


def test_bad_image_at_start_gives_a_fresh_kernel_that_says_why(start_kernel, prepared, tmp_path):
    image = tmp_path / "cut.wkimg"
    image.write_bytes((prepared.folder / ("base" + images.SUFFIX)).read_bytes()[:-100])
    kernel = start_kernel([f"--WasmKernel.resume_from={image}"], env=environment(tmp_path))
    first = ok(kernel.execute("'array' in dir()"))
    assert plain(first) is False
    assert "could not resume from" in first.stream_text("stderr")
    assert "damaged or truncated" in first.stream_text("stderr")
    assert plain(kernel.execute("1 + 1")) == 2


@pytest.mark.slow
def test_snapshot_command_lists_inspects_and_deletes(prepared, tmp_path):
    folder = copy_folder(prepared.folder, tmp_path / "snapshots")

    def command(*words: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "wasm_kernel",
                "snapshot",
                *words,
                "--snapshot-dir",
                str(folder),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    listed = command("list")
    assert listed.returncode == 0 and "base" in listed.stdout and "MiB used" in listed.stdout
    info = command("info", "base")
    assert info.returncode == 0, info.stderr
    assert "execution count: 3" in info.stdout and "(ok)" in info.stdout
    assert "differs" not in info.stdout
    refused = command("delete", "../base")
    assert refused.returncode == 1 and "is not a snapshot name" in refused.stderr
    assert command("delete", "base").returncode == 0
    assert "No snapshots" in command("list").stdout


# -- the boot image ------------------------------------------------------------------------------


@pytest.fixture
def own_cache(tmp_path) -> Path:
    """A copy of the compiled-runtime cache, as hard links (no second 400 MB), whose boot
    image a test may remove without touching the one other tests use."""
    from wasm_kernel.runtime.cache import RuntimeCache
    from wasm_kernel.runtime.runtime import load_runtime

    cache = RuntimeCache()
    entry = cache.entry_dir(load_runtime())
    assert images.boot_image_path(entry).exists(), "run `python -m wasm_kernel precompile`"
    copy = tmp_path / "cache"
    subprocess.run(["cp", "-al", str(cache.directory), str(copy)], check=True)
    return copy


def own_boot_image(cache: Path) -> Path:
    """This installation's boot image in ``cache`` (others' may be there too)."""
    from wasm_kernel.runtime.cache import RuntimeCache
    from wasm_kernel.runtime.runtime import load_runtime

    return images.boot_image_path(RuntimeCache(cache).entry_dir(load_runtime()))


@pytest.mark.slow
def test_kernels_start_from_the_boot_image(own_cache, tmp_path):
    env = environment(tmp_path, WASM_KERNEL_CACHE_DIR=str(own_cache))
    argv = [f"--WasmKernel.cache_dir={own_cache}"]
    kernels = [Kernel(argv, env=env) for _ in range(2)]
    memory_file = images.boot_memory_path(own_boot_image(own_cache))
    try:
        for kernel in kernels:
            described = ok(kernel.execute("%sandbox")).stream_text()
            assert "Interpreter: from the boot image" in described
            # the guest's memory is the cache's file, mapped copy-on-write, not a copy of it
            maps = Path(f"/proc/{kernel.manager.provisioner.process.pid}/maps").read_text()
            assert str(memory_file) in maps
        # numpy and pandas come loaded: a first import of them costs nothing
        assert plain(kernels[0].execute("import sys; 'pandas' in sys.modules")) is True
        ok(kernels[0].execute("import numpy as np, pandas as pd"))
        assert plain(kernels[0].execute("int(pd.Series(np.arange(4)).sum())")) == 6
        # each start reseeds: kernels from one boot image do not share their random numbers
        ok(kernels[0].execute("import random, os"))
        ok(kernels[1].execute("import random, os"))
        draws = [plain(kernel.execute("random.random()")) for kernel in kernels]
        assert draws[0] != draws[1]
        # the notebook profile's mount of the working folder, which the boot image was built
        # without, is where the kernel starts
        listing = "os.getcwd(), sorted(os.listdir())"
        from_image = plain(kernels[0].execute(listing))
    finally:
        for kernel in kernels:
            kernel.shutdown()
    # a damaged memory file (here: cut short) is never mapped; the kernel boots without it.
    # Replaced, not truncated in place: the copy's files are hard links to the real cache's.
    data = memory_file.read_bytes()
    memory_file.unlink()
    memory_file.write_bytes(data[: len(data) // 2])
    cut = Kernel(argv, env=env)
    try:
        assert "Interpreter: from a fresh boot" in cut.execute("%sandbox").stream_text()
        assert plain(cut.execute("6 * 7")) == 42
    finally:
        cut.shutdown()
    for boot in own_cache.rglob("boot-*"):
        boot.unlink()
    plain_boot = Kernel(argv, env=env)
    try:
        assert "Interpreter: from a fresh boot" in plain_boot.execute("%sandbox").stream_text()
        assert plain(plain_boot.execute(f"import os; {listing}")) == from_image
    finally:
        plain_boot.shutdown()
    # boot images of other guest code (other installations sharing the cache): the two most
    # recently built stay beside the new one, older ones go
    entry = memory_file.parent
    others = [entry / f"boot-other{number}" for number in range(3)]
    for age, other in enumerate(reversed(others)):
        for suffix in (images.SUFFIX, images.MEMORY_SUFFIX):
            other.with_suffix(suffix).write_bytes(b"")
            os.utime(other.with_suffix(suffix), (1e9 + age, 1e9 + age))
    built = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "precompile", "--cache-dir", str(own_cache)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    assert images.boot_image_path(entry).exists()
    assert images.boot_memory_path(images.boot_image_path(entry)).exists()
    left = {path.name for path in entry.glob("boot-other*")}
    assert left == {
        f"boot-other{number}{suffix}"
        for number in (0, 1)
        for suffix in (images.SUFFIX, images.MEMORY_SUFFIX)
    }


def test_a_boot_image_is_not_resumed_as_a_snapshot(own_cache, tmp_path):
    """A boot image's memory is a file beside it, which only the kernel's own boot path maps:
    named as an image to resume, it is refused (an image never names host files)."""
    boot = own_boot_image(own_cache)
    env = environment(tmp_path, WASM_KERNEL_CACHE_DIR=str(own_cache))
    kernel = Kernel([f"--WasmKernel.resume_from={boot}"], env=env)
    try:
        first = kernel.execute("x = 1")
        assert "keeps its memory in a file of its own" in first.stream_text("stderr")
        ok(first)
        assert plain(kernel.execute("x + 1")) == 2
    finally:
        kernel.shutdown()


def test_a_trap_in_the_first_cell_restarts_from_the_boot_image(start_kernel, tmp_path):
    """No checkpoint exists before the first cell ends, so its trap restarts the interpreter:
    from the boot image's mapped memory again (numpy and pandas loaded), not a boot."""
    kernel = start_kernel(["--WasmKernel.rollback=False"], env=environment(tmp_path))
    trapped = kernel.execute("import json; json.loads('[' * 200000 + ']' * 200000)")
    assert trapped.content["status"] == "error"
    assert trapped.content["ename"] == "StackOverflow"
    assert plain(kernel.execute("import sys; 'pandas' in sys.modules")) is True
    maps = Path(f"/proc/{kernel.manager.provisioner.process.pid}/maps").read_text()
    assert images.MEMORY_SUFFIX in maps


def test_the_boot_image_holds_immortal_objects(start_kernel):
    """What the boot image holds is immortal (using it writes no reference counts), except
    the memory reserve, which must be freed when memory runs out; new objects are not."""
    kernel = start_kernel()
    probe = (
        "import sys, pandas, _wasm_kernel\n"
        "sys._is_immortal(get_ipython()), sys._is_immortal(pandas.DataFrame),"
        " sys._is_immortal(_wasm_kernel._reserve), sys._is_immortal(object())"
    )
    assert plain(kernel.execute(probe)) == (True, True, False, False)


def test_the_first_banner_says_how_the_interpreter_started():
    """jupyter console shows the first kernel_info_reply's banner: it must not guess a fresh
    boot while the interpreter is still coming from the boot image (%sandbox says which)."""
    from conftest import KERNEL_NAME
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name=KERNEL_NAME)
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    try:
        reply = client.kernel_info(reply=True, timeout=120)  # the first request, as the console's
        first = [line for line in reply["content"]["banner"].splitlines() if "Interpreter:" in line]
        assert first == ["Interpreter: from the boot image"], reply["content"]["banner"]
        client.wait_for_ready(timeout=120)  # IOPub subscribed before a cell's output is read
        kernel = Kernel.__new__(Kernel)
        kernel.manager, kernel.client = manager, client
        assert first[0] in kernel.execute("%sandbox").stream_text()
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
