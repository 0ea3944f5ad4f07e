"""Tenants a gateway names (KERNEL_USERNAME): their folders are their own, private, and never
a link or a folder someone else planted; the process's own user keeps its usual folders.

Kernels here are started by jupyter_client with the tenant in their environment, as Enterprise
Gateway starts them (tests/server/test_enterprise_gateway.py runs a real gateway).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from conftest import ok
from wheelmaker import make_wheel

from wasm_kernel.files import tenancy
from wasm_kernel.runtime.cache import default_cache_dir


@pytest.mark.nokernel
def test_tenant_folder_names_are_safe_and_distinct() -> None:
    names = ["alice", "Alice", "a/b", "a_b", "..", "../../etc", ".", "ü", "a" * 300, "x\udcff"]
    folders = [tenancy.folder_name(name) for name in names]
    assert len(set(folders)) == len(names)
    for folder in folders:
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}-[0-9a-f]{16}", folder), folder
    assert folders[0].startswith("alice-")


def data_env(tmp_path: Path, tenant: str) -> dict[str, str]:
    return {
        "KERNEL_USERNAME": tenant,
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "WASM_KERNEL_CACHE_DIR": str(default_cache_dir()),  # the runtime the setup built
    }


def test_tenant_folders_are_private_whatever_the_umask(tmp_path: Path, start_kernel) -> None:
    data = tmp_path / "data" / "wasm-kernel"
    tenants = data / "snapshots" / tenancy.TENANTS
    tenants.mkdir(parents=True, mode=0o755)
    tenants.chmod(0o755)  # left wider by an earlier version: narrowed on first use
    previous = os.umask(0)
    try:
        kernel = start_kernel(env=data_env(tmp_path, "alice"), cwd=tmp_path)
    finally:
        os.umask(previous)
    assert "Saved snapshot" in ok(kernel.execute("%snapshot save mine")).stream_text()
    kernel.shutdown()
    own = tenancy.folder_name("alice")
    made = [tenants, tenants / own, data / tenancy.TENANTS, data / tenancy.TENANTS / own]
    for folder in made:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert (tenants / own / "mine.wkimg").is_file()
    assert (data / tenancy.TENANTS / own / "history.sqlite").is_file()
    assert not (data / "history.sqlite").exists()


def test_a_planted_link_is_refused_not_followed(tmp_path: Path, start_kernel) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    tenants = tmp_path / "data" / "wasm-kernel" / "snapshots" / tenancy.TENANTS
    tenants.mkdir(parents=True, mode=0o700)
    (tenants / tenancy.folder_name("mallory")).symlink_to(elsewhere)
    kernel = start_kernel(env=data_env(tmp_path, "mallory"), cwd=tmp_path)
    run = kernel.execute("1 + 1")
    assert run.content["status"] == "error"
    assert "is not a folder of this user's" in run.content["evalue"], run.content
    kernel.shutdown()
    assert list(elsewhere.iterdir()) == []


def test_the_process_own_user_keeps_its_folders(tmp_path: Path, start_kernel) -> None:
    kernel = start_kernel(env=data_env(tmp_path, tenancy.process_user()), cwd=tmp_path)
    ok(kernel.execute("%snapshot save mine"))
    kernel.shutdown()
    data = tmp_path / "data" / "wasm-kernel"
    assert (data / "snapshots" / "mine.wkimg").is_file()
    assert (data / "history.sqlite").is_file()
    assert not list(tmp_path.rglob(tenancy.TENANTS))


def test_each_tenant_has_its_own_package_quota(tmp_path: Path, start_kernel) -> None:
    """packages_user_quota counts one tenant's kernels together, and no other tenant's."""
    house = tmp_path / "house"
    house.mkdir()
    make_wheel(house, "wkt-big", files={"wkt_big.bin": os.urandom(3 << 19)})  # 1.5 MiB
    settings = [f"--WasmKernel.packages={house}", f"--WasmKernel.packages_user_quota={2 << 20}"]
    alice = start_kernel(settings, env=data_env(tmp_path, "alice"), cwd=tmp_path)
    ok(alice.execute("%pip install wkt-big"))  # 1.5 MiB of alice's 2 MiB
    bob = start_kernel(settings, env=data_env(tmp_path, "bob"), cwd=tmp_path)
    ok(bob.execute("%pip install wkt-big"))  # bob's own 2 MiB
    again = start_kernel(settings, env=data_env(tmp_path, "alice"), cwd=tmp_path)
    refused = again.execute("%pip install wkt-big")
    assert refused.content["status"] == "error"
    assert f"per-user quota of {2 << 20:,} bytes" in refused.content["evalue"]
    held = tmp_path / "cache" / "wasm-kernel" / tenancy.TENANTS
    assert len(list(held.glob("*/packages/wasm-kernel-packages-*"))) == 3  # theirs, apart
