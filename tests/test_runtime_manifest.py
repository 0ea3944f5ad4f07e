"""Runtime manifests: the shipped one loads and verifies; bad pins, ABIs, packages are refused."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest

from wasm_kernel.cache import RuntimeCache
from wasm_kernel.runtime import (
    DEFAULT_RUNTIME,
    SUPPORTED_ABI,
    RuntimeUnavailable,
    load_runtime,
    manifest_dir,
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
    """The default runtime is installed, and its files are the pinned bytes."""
    runtime = load_runtime()
    spec = shipped_manifest()
    assert runtime.name == DEFAULT_RUNTIME
    assert runtime.version == spec["version"] == metadata.version(spec["package"])
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


def test_unknown_package_is_refused_with_install_hint(tmp_path: Path) -> None:
    spec = shipped_manifest()
    spec["package"] = "wasm-kernel-no-such-runtime-package"
    name = write_manifest(tmp_path, spec)
    with pytest.raises(RuntimeUnavailable) as refused:
        load_runtime(name, directory=tmp_path)
    message = str(refused.value)
    assert f"wasm-kernel-no-such-runtime-package=={spec['version']}" in message
    assert "pip" in message


def test_wrong_version_is_refused_naming_both_versions(tmp_path: Path) -> None:
    spec = shipped_manifest()
    installed = metadata.version(spec["package"])
    spec["version"] = installed + ".post999"
    name = write_manifest(tmp_path, spec)
    with pytest.raises(RuntimeUnavailable) as refused:
        load_runtime(name, directory=tmp_path)
    message = str(refused.value)
    assert f"{spec['package']}=={spec['version']}" in message
    assert f"found {installed}" in message


def test_missing_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnavailable) as refused:
        load_runtime("no-such-runtime", directory=tmp_path)
    assert "no-such-runtime" in str(refused.value)
