"""The guest's pinned IPython packages: fetched and checked at install, never at kernel start.

A kernel whose cache lacks them, or holds them changed, refuses to start its sandbox with a
message naming the command that builds them; a wheel that is not the pinned one, or that
would unpack outside its folder, is refused at install.
"""

from __future__ import annotations

import dataclasses
import shutil
import zipfile
from pathlib import Path

import pytest
from conftest import Kernel

from wasm_kernel.runtime import guest_packages
from wasm_kernel.runtime.cache import RuntimeCache
from wasm_kernel.runtime.runtime import load_runtime
from wasm_kernel.sandbox.limits import Limits
from wasm_kernel.sandbox.sandbox import Sandbox


@pytest.fixture(scope="module")
def compiled():
    loaded = RuntimeCache().load(load_runtime())
    yield loaded
    loaded.close()


def test_kernel_without_guest_packages_says_to_run_install(
    tmp_path: Path, start_kernel, compiled
) -> None:
    """A cache holding only the compiled runtime: the cell says what to run; the kernel lives."""
    runtime_entry = RuntimeCache().entry_dir(compiled.runtime)
    (tmp_path / runtime_entry.name).symlink_to(runtime_entry)
    kernel: Kernel = start_kernel(env={"WASM_KERNEL_CACHE_DIR": str(tmp_path)})
    reply = kernel.execute("1 + 1").content
    assert reply["status"] == "error"
    assert reply["ename"] == "SandboxUnavailable"
    assert "python -m wasm_kernel install" in reply["evalue"]
    assert kernel.banner()  # still answering


def test_changed_package_file_is_refused(tmp_path: Path, compiled) -> None:
    packages = guest_packages.load_manifest()
    mount, checked = guest_packages.site_mount(compiled)
    checked.result()
    real = mount.host.parent
    copy = packages.entry_dir(tmp_path, compiled)
    shutil.copytree(real, copy)
    assert guest_packages.locate(packages, tmp_path, compiled) == copy / guest_packages.SITE
    target = copy / guest_packages.SITE / "IPython" / "core" / "interactiveshell.py"
    with open(target, "a") as file:
        file.write("\n# changed after the build\n")
    with pytest.raises(guest_packages.PackagesUnavailable, match="changed after they were built"):
        guest_packages.locate(packages, tmp_path, compiled)


def test_a_sandbox_on_changed_packages_never_runs_the_guest(tmp_path: Path, compiled) -> None:
    """The check of the packages' files runs beside the sandbox's start; its refusal still
    comes before any guest code runs (a cache whose packages were changed after the build)."""
    runtime_entry = RuntimeCache().entry_dir(compiled.runtime)
    (tmp_path / runtime_entry.name).symlink_to(runtime_entry)
    mount, checked = guest_packages.site_mount(compiled)
    checked.result()
    copy = guest_packages.load_manifest().entry_dir(tmp_path, compiled)
    shutil.copytree(mount.host.parent, copy)
    with open(copy / guest_packages.SITE / "IPython" / "__init__.py", "a") as file:
        file.write("\nraise SystemExit('the changed file ran')\n")
    elsewhere = RuntimeCache(tmp_path).load(compiled.runtime)
    limits = Limits(fuel=10**12, time_limit=0, memory_limit=1 << 30, output_limit=1 << 20)
    try:
        with pytest.raises(guest_packages.PackagesUnavailable, match="changed after they were"):
            Sandbox(elsewhere, limits)
    finally:
        elsewhere.close()


def test_unpack_takes_packages_and_purelib_and_refuses_escapes(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo/__init__.py", "VALUE = 1\n")
        archive.writestr("demo-1.0.data/purelib/extra.py", "EXTRA = 2\n")
        archive.writestr("demo-1.0.data/scripts/tool", "#!/bin/sh\n")
        archive.writestr("demo-1.0.dist-info/METADATA", "Name: demo\n")
    site = tmp_path / "site"
    guest_packages.unpack(wheel, site)
    found = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert found == ["demo-1.0.dist-info/METADATA", "demo/__init__.py", "extra.py"]

    evil = tmp_path / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(evil, "w") as archive:
        archive.writestr("../outside.py", "")
    with pytest.raises(guest_packages.PackagesUnavailable, match="unsafe member"):
        guest_packages.unpack(evil, tmp_path / "other")
    assert not (tmp_path / "outside.py").exists()


def test_download_refuses_a_wheel_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    packages = guest_packages.load_manifest()
    [comm] = [wheel for wheel in packages.wheels if wheel.name == "comm"]
    forged = dataclasses.replace(packages, wheels=(dataclasses.replace(comm, sha256="0" * 64),))
    with pytest.raises(
        guest_packages.PackagesUnavailable, match=r"(?s)could not download.*Expected sha256 0{64}"
    ):
        guest_packages.download(forged, tmp_path / "wheels")
    assert not (tmp_path / "wheels" / comm.wheel).exists()


def test_precompiling_says_nothing_of_the_packages_own_style(
    tmp_path: Path, compiled, capfd: pytest.CaptureFixture[str]
) -> None:
    """Compiling third-party code that uses an invalid escape (ipywidgets has "\\.") writes
    its bytecode without printing the compiler's SyntaxWarning into `install`'s output; a
    file that does not compile still fails the build."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "styled.py").write_text('PATTERN = "\\."\n')  # the source holds "\."
    guest = guest_packages.load_manifest().guest_path
    guest_packages.precompile_in_guest(compiled, site, guest)
    shown = capfd.readouterr()
    assert "SyntaxWarning" not in shown.out + shown.err, shown
    assert list((site / "__pycache__").glob("styled.*.pyc"))
    (site / "broken.py").write_text("def (:\n")
    with pytest.raises(guest_packages.PackagesUnavailable, match="failed"):
        guest_packages.precompile_in_guest(compiled, site, guest)
