"""RuntimeCache on a tiny runtime: builds, hits, stale and damaged entries, races, read-only use.

The runtime here is a one-function WebAssembly module and a small stdlib zip with the
matplotlib data member, so every build compiles in milliseconds with the real engine
settings. Whether a build happened is read from the ``progress`` stages ``load`` reports
and from the entry files' inode and mtime, never from timing.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pwd
import select
import shutil
import signal
import tempfile
import threading
import zipfile
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest
import wasmtime

from wasm_kernel.runtime.cache import KEY_CHARS, CompiledRuntime, RuntimeCache, cache_key
from wasm_kernel.runtime.runtime import Runtime, RuntimeFile

STDLIB_GUEST_PATH = "/usr/local/lib/python315.zip"
MPL_MEMBER = "matplotlib/mpl-data.zip"
CHILD_TIMEOUT = 60  # seconds a forked loader may take
MPL_FILES = {"matplotlibrc": b"backend: Agg\n", "fonts/README.txt": b"no fonts here\n"}


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_stdlib_zip(path: Path) -> None:
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as mpl:
        for name, data in MPL_FILES.items():
            mpl.writestr(name, data)
    with zipfile.ZipFile(path, "w") as outer:
        outer.writestr("os.py", "# a stand-in stdlib module\n")
        outer.writestr(MPL_MEMBER, inner.getvalue())


@pytest.fixture
def runtime(tmp_path: Path) -> Runtime:
    source = tmp_path / "runtime-src"
    source.mkdir()
    module = source / "tiny.wasm"
    module.write_bytes(wasmtime.wat2wasm('(module (func (export "f")))'))
    stdlib = source / "stdlib.zip"
    make_stdlib_zip(stdlib)
    return Runtime(
        name="tiny-runtime",
        package="tiny-runtime",
        version="0",
        wheel="tiny_runtime-0-py3-none-any.whl",
        wheel_sha256="0" * 64,
        python_version="3.15.0",
        module=RuntimeFile(module, sha256_of(module)),
        stdlib=RuntimeFile(stdlib, sha256_of(stdlib)),
        preinitialized=True,
        stdlib_guest_path=STDLIB_GUEST_PATH,
        mpl_data_member=MPL_MEMBER,
    )


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


class Stages:
    """A ``progress`` callback that records the stages a ``load`` went through."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, description: str):
        with self._lock:
            self.seen.append(description)
        yield

    @property
    def compiled(self) -> int:
        """How many compiles ran (the stage named 'compiling ...')."""
        return sum(stage.startswith("compiling") for stage in self.seen)


def assert_usable(compiled: CompiledRuntime, runtime: Runtime) -> None:
    """The loaded module instantiates and runs; the guest folders hold the runtime's files."""
    store = wasmtime.Store(compiled.engine)
    store.set_fuel(10_000)
    store.set_epoch_deadline(1)
    instance = wasmtime.Instance(store, compiled.module, [])
    instance.exports(store)["f"](store)
    stdlib_copy = compiled.lib_dir / STDLIB_GUEST_PATH.rsplit("/", 1)[1]
    assert stdlib_copy.read_bytes() == runtime.stdlib.path.read_bytes()
    for name, data in MPL_FILES.items():
        assert (compiled.mpl_data_dir / name).read_bytes() == data


def file_identity(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_ino, stat.st_mtime_ns


def build(cache_dir: Path, runtime: Runtime) -> Path:
    RuntimeCache(cache_dir).load(runtime)
    return RuntimeCache(cache_dir).entry_dir(runtime)


def test_miss_builds_a_usable_entry(cache_dir: Path, runtime: Runtime) -> None:
    """An empty cache has nothing to look up; load compiles and writes a complete entry."""
    cache = RuntimeCache(cache_dir)
    assert cache.lookup(runtime) is None
    stages = Stages()
    compiled = cache.load(runtime, progress=stages)
    assert stages.compiled == 1
    entry = cache.entry_dir(runtime)
    assert entry.parent == cache_dir and entry.is_dir()
    assert (entry / RuntimeCache.MODULE).is_file()
    record = json.loads((entry / RuntimeCache.RECORD).read_text())
    assert record["key"] == cache_key(runtime)
    assert compiled.lib_dir.is_relative_to(entry) and compiled.mpl_data_dir.is_relative_to(entry)
    assert_usable(compiled, runtime)


def test_hit_loads_without_compiling(cache_dir: Path, runtime: Runtime) -> None:
    """A second cache on the same folder reuses the entry untouched, even without the sources."""
    entry = build(cache_dir, runtime)
    module_before = file_identity(entry / RuntimeCache.MODULE)
    record_before = file_identity(entry / RuntimeCache.RECORD)
    runtime.module.path.unlink()  # a rebuild would now fail: only a real hit can succeed
    stages = Stages()
    compiled = RuntimeCache(cache_dir).load(runtime, progress=stages)
    assert stages.seen == []
    assert file_identity(entry / RuntimeCache.MODULE) == module_before
    assert file_identity(entry / RuntimeCache.RECORD) == record_before
    assert_usable(compiled, runtime)


def test_touched_but_unchanged_entry_is_reused(cache_dir: Path, runtime: Runtime) -> None:
    """Files whose mtime changed (copied into an image) are rehashed and kept if intact."""
    entry = build(cache_dir, runtime)
    stamped = [entry / RuntimeCache.MODULE, entry / "lib" / STDLIB_GUEST_PATH.rsplit("/", 1)[1]]
    for path in stamped:
        os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    inodes = [path.stat().st_ino for path in stamped]
    stages = Stages()
    compiled = RuntimeCache(cache_dir).load(runtime, progress=stages)
    assert stages.compiled == 0
    assert [path.stat().st_ino for path in stamped] == inodes
    assert_usable(compiled, runtime)


def test_stale_entry_of_same_runtime_is_pruned_after_build(
    cache_dir: Path, runtime: Runtime
) -> None:
    """An entry left by another wasmtime or engine (other key) goes once the new one is built."""
    cache_dir.mkdir()
    stale = cache_dir / f"{runtime.name}-{'0' * 24}"
    stale.mkdir()
    (stale / RuntimeCache.MODULE).write_bytes(b"old native code")
    (stale / RuntimeCache.RECORD).write_text(json.dumps({"key": "0" * 64, "files": {}}))
    unrelated = cache_dir / f"another-{'1' * 24}"
    unrelated.mkdir()
    cache = RuntimeCache(cache_dir)
    assert cache.entry_dir(runtime) != stale
    compiled = cache.load(runtime)
    assert not stale.exists()
    assert unrelated.is_dir()
    assert cache.entry_dir(runtime).is_dir()
    assert_usable(compiled, runtime)


def test_prune_keeps_entries_of_runtimes_whose_name_extends_this_one(
    cache_dir: Path, runtime: Runtime
) -> None:
    """Pruning is for this runtime's old entries only, not for e.g. '<name>-debug' runtimes."""
    sibling = replace(runtime, name=f"{runtime.name}-debug")
    RuntimeCache(cache_dir).load(sibling)
    sibling_entry = RuntimeCache(cache_dir).entry_dir(sibling)
    assert sibling_entry.is_dir()
    RuntimeCache(cache_dir).load(runtime)
    assert sibling_entry.is_dir(), "building one runtime deleted another runtime's entry"
    stages = Stages()
    RuntimeCache(cache_dir).load(sibling, progress=stages)
    assert stages.compiled == 0


def test_record_with_other_key_is_rebuilt(cache_dir: Path, runtime: Runtime) -> None:
    """entry.json naming another key means the code was compiled for something else."""
    entry = build(cache_dir, runtime)
    record_path = entry / RuntimeCache.RECORD
    record = json.loads(record_path.read_text())
    record["key"] = hashlib.sha256(b"another engine").hexdigest()
    record_path.write_text(json.dumps(record))
    cache = RuntimeCache(cache_dir)
    assert cache.lookup(runtime) is None
    stages = Stages()
    compiled = cache.load(runtime, progress=stages)
    assert stages.compiled == 1
    assert json.loads(record_path.read_text())["key"] == cache_key(runtime)
    assert_usable(compiled, runtime)


def _truncate_module(entry: Path) -> None:
    path = entry / RuntimeCache.MODULE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage_module_same_stamp(entry: Path) -> None:
    """Same size and mtime as recorded, so only wasmtime itself can notice."""
    path = entry / RuntimeCache.MODULE
    stat = path.stat()
    path.write_bytes(bytes((i * 7 + 3) % 251 for i in range(stat.st_size)))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _stdlib_same_size_other_bytes(entry: Path) -> None:
    path = entry / "lib" / STDLIB_GUEST_PATH.rsplit("/", 1)[1]
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    assert path.stat().st_size == stat.st_size


def _missing_stdlib(entry: Path) -> None:
    (entry / "lib" / STDLIB_GUEST_PATH.rsplit("/", 1)[1]).unlink()


def _truncated_record(entry: Path) -> None:
    path = entry / RuntimeCache.RECORD
    path.write_text(path.read_text()[:20])


@pytest.mark.parametrize(
    "damage",
    [
        _truncate_module,
        _garbage_module_same_stamp,
        _stdlib_same_size_other_bytes,
        _missing_stdlib,
        _truncated_record,
    ],
    ids=lambda damage: damage.__name__.strip("_"),
)
def test_corrupt_entry_is_dropped_and_rebuilt(cache_dir: Path, runtime: Runtime, damage) -> None:
    """A damaged entry is never used and never makes lookup or load raise."""
    entry = build(cache_dir, runtime)
    damage(entry)
    cache = RuntimeCache(cache_dir)
    assert cache.lookup(runtime) is None
    assert not entry.exists()
    stages = Stages()
    compiled = cache.load(runtime, progress=stages)
    assert stages.compiled == 1
    assert_usable(compiled, runtime)


def test_concurrent_builders_both_succeed(cache_dir: Path, runtime: Runtime) -> None:
    """Two loads racing on an empty folder both get the runtime; it is compiled once."""
    barrier = threading.Barrier(2)
    stages = Stages()
    results: list[CompiledRuntime] = []
    errors: list[BaseException] = []

    def builder() -> None:
        cache = RuntimeCache(cache_dir)
        barrier.wait()
        try:
            results.append(cache.load(runtime, progress=stages))
        except BaseException as exc:  # reported below, with the thread's exception
            errors.append(exc)

    threads = [threading.Thread(target=builder) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert len(results) == 2
    for compiled in results:
        assert_usable(compiled, runtime)
    assert stages.compiled == 1
    entries = sorted(path.name for path in cache_dir.iterdir() if path.is_dir())
    assert entries == [RuntimeCache(cache_dir).entry_dir(runtime).name]


def _make_read_only(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        path.chmod(0o555 if path.is_dir() else 0o444)
    root.chmod(0o555)


def _load_in_child(
    cache_dir: Path, runtime: Runtime, uid: int | None, lookup_first: bool = True
) -> str:
    """Look up and load the entry in a forked child, as ``uid`` if given; returns its verdict.

    A fork rather than a new interpreter: the venv's Python may live where another user
    cannot read it. A forked child that starts compiling can hang (wasmtime's threads are not
    forked), so a child that has not answered in time is killed and reported.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        verdict = "crashed"
        try:
            os.close(read_end)
            if uid is not None:
                os.setgroups([])
                os.setgid(pwd.getpwuid(uid).pw_gid)
                os.setuid(uid)
            cache = RuntimeCache(cache_dir)
            if lookup_first and cache.lookup(runtime) is None:
                verdict = "lookup refused the entry"
            else:
                cache.load(runtime)
                verdict = "loaded"
        except BaseException as exc:
            verdict = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(write_end, verdict.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        if select.select([pipe], [], [], CHILD_TIMEOUT)[0]:
            verdict = pipe.read().decode()
        else:
            os.kill(pid, signal.SIGKILL)
            verdict = f"no answer within {CHILD_TIMEOUT} s (killed)"
    os.waitpid(pid, 0)
    return verdict


@pytest.mark.parametrize("touched", [False, True], ids=["as-built", "touched"])
def test_read_only_healthy_entry_loads(runtime: Runtime, touched: bool) -> None:
    """A pre-baked cache the user cannot write to still loads, also when it must be rehashed.

    As root, permissions do not stop writes, so the load runs in a child that dropped to
    'nobody' (skipped if that user is missing).
    """
    uid = None
    if os.geteuid() == 0:
        try:
            uid = pwd.getpwnam("nobody").pw_uid
        except KeyError:
            pytest.skip("running as root and there is no 'nobody' user to drop to")
    root = Path(tempfile.mkdtemp(prefix="wasm-kernel-ro-cache-"))
    try:
        root.chmod(0o755)
        cache_dir = root / "cache"
        entry = build(cache_dir, runtime)
        if touched:
            for rel in (RuntimeCache.MODULE, f"lib/{STDLIB_GUEST_PATH.rsplit('/', 1)[1]}"):
                os.utime(entry / rel, ns=(2_000_000_000, 2_000_000_000))
        _make_read_only(cache_dir)
        before = sorted((p.relative_to(root), file_identity(p)) for p in root.rglob("*"))
        assert _load_in_child(cache_dir, runtime, uid) == "loaded"
        after = sorted((p.relative_to(root), file_identity(p)) for p in root.rglob("*"))
        assert after == before
    finally:
        for path in [root, *root.rglob("*")]:
            with contextlib.suppress(OSError):
                path.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


def test_entry_built_by_root_loads_for_another_user(runtime: Runtime) -> None:
    """A cache pre-baked by root (say, in an image) at the usual umask serves other users."""
    if os.geteuid() != 0:
        pytest.skip("needs root to build as one user and load as another")
    try:
        uid = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("there is no 'nobody' user to load as")
    old_umask = os.umask(0o022)
    root = Path(tempfile.mkdtemp(prefix="wasm-kernel-shared-cache-"))
    try:
        root.chmod(0o755)
        build(root / "cache", runtime)
        assert _load_in_child(root / "cache", runtime, uid) == "loaded"
    finally:
        os.umask(old_umask)
        shutil.rmtree(root, ignore_errors=True)


def test_touched_entry_is_restamped_where_writable(cache_dir: Path, runtime: Runtime) -> None:
    """After rehashing touched files, a writable entry records their new mtimes (no rehash next)."""
    entry = build(cache_dir, runtime)
    module = entry / RuntimeCache.MODULE
    os.utime(module, ns=(3_000_000_000, 3_000_000_000))
    RuntimeCache(cache_dir).load(runtime)
    record = json.loads((entry / RuntimeCache.RECORD).read_text())
    assert record["files"][RuntimeCache.MODULE][1] == 3_000_000_000
    assert [p.name for p in entry.iterdir() if p.name.startswith(".")] == []


def _snapshot(root: Path) -> list[tuple[str, int, int, int, str]]:
    """Every path under ``root`` with its mode, inode, mtime and content digest."""
    rows = []
    for path in sorted([root, *root.rglob("*")]):
        stat = path.lstat()
        digest = sha256_of(path) if path.is_file() else ""
        rows.append(
            (str(path.relative_to(root)), stat.st_mode, stat.st_ino, stat.st_mtime_ns, digest)
        )
    return rows


@contextlib.contextmanager
def _sealed_cache(runtime: Runtime, entry_damage=None):
    """A cache folder readable by all and writable by none (chmod a-w), removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="wasm-kernel-sealed-cache-"))
    try:
        root.chmod(0o755)
        cache_dir = root / "cache"
        cache_dir.mkdir()
        cache_dir.chmod(0o755)
        if entry_damage is not None:
            entry_damage(build(cache_dir, runtime))
        _make_read_only(cache_dir)
        yield cache_dir
    finally:
        for path in [root, *root.rglob("*")]:
            with contextlib.suppress(OSError):
                path.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


def _as_built_by_wasmtime_49(entry: Path) -> None:
    """What an upgrade leaves behind: the entry of the wasmtime before, under its own key."""
    record = json.loads((entry / RuntimeCache.RECORD).read_text())
    record["wasmtime"] = "49.0.0"
    (entry / RuntimeCache.RECORD).write_text(json.dumps(record))
    entry.rename(entry.with_name(f"{entry.name[:-KEY_CHARS]}{'0' * KEY_CHARS}"))


def _users_to_try() -> list[int | None]:
    """This process (root or not), plus 'nobody' when root, so the OS itself refuses writes."""
    users: list[int | None] = [None]
    if os.geteuid() == 0:
        with contextlib.suppress(KeyError):
            users.append(pwd.getpwnam("nobody").pw_uid)
    return users


@pytest.mark.parametrize(
    "uid", _users_to_try(), ids=lambda uid: "self" if uid is None else "nobody"
)
def test_missing_entry_in_read_only_cache_names_folder_and_command(
    runtime: Runtime, uid: int | None
) -> None:
    """No entry and no right to build one: an error saying where and how, and no writes.

    Run as this process (as root, only the missing write bits say "read-only") and, when
    root, as 'nobody', whom the OS stops.
    """
    with _sealed_cache(runtime) as cache_dir:
        before = _snapshot(cache_dir)
        verdict = _load_in_child(cache_dir, runtime, uid, lookup_first=False)
        assert verdict.startswith("ReadOnlyCache: "), verdict
        assert str(cache_dir) in verdict
        assert f"python -m wasm_kernel precompile --cache-dir {cache_dir}" in verdict
        assert RuntimeCache(cache_dir).entry_dir(runtime).name in verdict
        assert _snapshot(cache_dir) == before


def test_entry_of_another_wasmtime_in_read_only_cache_names_both_versions(
    runtime: Runtime,
) -> None:
    """The wasmtime upgrade routine: a baked cache built before the upgrade is reported as
    such (its wasmtime and ours), with the command that rebuilds it, and left alone."""
    with _sealed_cache(runtime, entry_damage=_as_built_by_wasmtime_49) as cache_dir:
        verdict = _load_in_child(cache_dir, runtime, None, lookup_first=False)
        assert verdict.startswith("ReadOnlyCache: "), verdict
        assert "(wasmtime 49.0.0)" in verdict
        assert f"this is wasmtime {metadata.version('wasmtime')}" in verdict
        assert f"precompile --cache-dir {cache_dir}" in verdict


@pytest.mark.parametrize(
    "uid", _users_to_try(), ids=lambda uid: "self" if uid is None else "nobody"
)
def test_damaged_entry_in_read_only_cache_is_kept_and_reported(
    runtime: Runtime, uid: int | None
) -> None:
    """A damaged entry in a sealed folder is neither deleted nor rebuilt; the error says why."""
    with _sealed_cache(runtime, entry_damage=_truncate_module) as cache_dir:
        before = _snapshot(cache_dir)
        verdict = _load_in_child(cache_dir, runtime, uid, lookup_first=False)
        assert verdict.startswith("ReadOnlyCache: "), verdict
        assert "unusable" in verdict and "precompile --cache-dir" in verdict
        assert _snapshot(cache_dir) == before
