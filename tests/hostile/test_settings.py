"""Hostile settings: values out of range or of the wrong type, from every source.

A bad setting must neither end the kernel process (a front end shows "kernel died" in a
restart loop) nor be used (a negative fuel budget is no limit at all): the kernel stays up,
says what is wrong in kernel_info's banner, fails every cell with ``InvalidSetting`` naming
the setting, the value, its source and what is allowed, and starts no sandbox. Good values
at the edges of each range (0 where it means "none", float notation for integers) work.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import wasmtime
from conftest import Kernel, ok

from wasm_kernel.runtime.cache import RuntimeCache
from wasm_kernel.runtime.runtime import load_runtime
from wasm_kernel.sandbox import interpreter
from wasm_kernel.sandbox.interrupts import Watchdog
from wasm_kernel.sandbox.limits import Limits
from wasm_kernel.sandbox.sandbox import Sandbox

# setting: (bad text for argv and environment, bad Python for a config file, what is allowed)
BAD = {
    "fuel": ("-1", "-1", "integer (units) from 1,000,000,000 to"),
    "time_limit": ("1e10", "float('inf')", "0 (no limit) or a number (seconds) from 0.1 to"),
    "memory_limit": ("0", "1 << 40", "from 67,108,864 (64 MiB) to 4,294,967,296 (4 GiB)"),
    "output_limit": ("-1", "10", "integer (bytes) from 1,000 to"),
    "scratch_limit": ("1000", "-1", "0 (no limit) or an integer (bytes) from 1,048,576 (1 MiB)"),
    "interrupt_grace": ("nan", "-1.0", "a number (seconds) from 0 to 3,600"),
    "rollback": ("maybe", "'maybe'", "true or false"),
    "profile": ("lax", "'lax'", "one of 'notebook', 'strict'"),
    "active_output": ("sometimes", "['block']", "one of 'block', 'allow'"),
    "packages": ("/no/such/wheelhouse", "['index']", "'index', 'off' or the path of an existing"),
    "packages_quota": ("10", "-1", "an integer (bytes) from 1,048,576 (1 MiB) to"),
    "packages_user_quota": ("-1", "1e30", "an integer (bytes) from 1,048,576 (1 MiB) to"),
    "checkpoint_mode": ("never", "'never'", "one of 'auto', 'copy'"),
}
SOURCE_TEXT = {
    "argv": "the kernel's command line",
    "env": "the environment (WASM_KERNEL_",
    "config": "jupyter_wasm_kernel_config.py",
}


@pytest.fixture
def bare_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernelspec naming no profile (as gateway launchers start kernels): the installed
    ones set it on the command line, where it wins over the environment and config file."""
    folder = tmp_path / "jupyter" / "kernels" / "wasm-bare"
    folder.mkdir(parents=True)
    argv = [sys.executable, "-P", "-m", "wasm_kernel", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "bare", "language": "python"}
    (folder / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "wasm-bare"


def configured(tmp_path: Path, lines: dict[str, str]) -> dict[str, str]:
    """Environment pointing the kernel at a config file setting ``lines`` (Python source)."""
    folder = tmp_path / "config"
    folder.mkdir(exist_ok=True)
    text = "".join(f"c.WasmKernel.{name} = {source}\n" for name, source in lines.items())
    (folder / "jupyter_wasm_kernel_config.py").write_text(text)
    return {"JUPYTER_CONFIG_DIR": str(folder)}


def start_with(
    start_kernel, tmp_path: Path, source: str, values: dict[str, str], **options
) -> Kernel:
    """A kernel given ``values`` (argv/env text, or config-file Python) through ``source``,
    with its own TMPDIR so a scratch folder left behind would show."""
    env = {"TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    argv = []
    if source == "argv":
        argv = [f"--WasmKernel.{name}={value}" for name, value in values.items()]
    elif source == "env":
        env.update({f"WASM_KERNEL_{name.upper()}": value for name, value in values.items()})
    else:
        env.update(configured(tmp_path, values))
    return start_kernel(argv, env, **options)


def refusal(kernel: Kernel) -> str:
    """The evalue of a cell, which must fail with InvalidSetting (and so must the next)."""
    first, second = kernel.execute("1 + 1").content, kernel.execute("2 + 2").content
    assert first["status"] == "error", first
    assert first["ename"] == "InvalidSetting", first
    assert second["ename"] == "InvalidSetting" and second["evalue"] == first["evalue"]
    return first["evalue"]


def assert_shuts_down_cleanly(kernel: Kernel, tmp_path: Path) -> None:
    """The kernel exits by itself on shutdown_request, leaving no scratch folder."""
    reply = kernel.client.shutdown(reply=True, timeout=30)
    assert reply["content"]["status"] == "ok"
    deadline = time.monotonic() + 15
    while kernel.manager.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not kernel.manager.is_alive()
    assert list((tmp_path / "tmp").glob("wasm-kernel-tmp-*")) == []


@pytest.mark.parametrize("source", ["argv", "env", "config"])
def test_every_bad_setting_is_named_by_every_cell(
    start_kernel, tmp_path: Path, bare_spec: str, source: str
) -> None:
    """All settings bad at once through one source: each is named with its value, source
    and range; the kernel answers kernel_info and completion, and shuts down cleanly. On the
    command line the installed kernelspec's own --WasmKernel.profile comes first: the
    repeated one wins (traitlets alone refuses the repetition and the process ends)."""
    column = 1 if source == "config" else 0
    values = {name: row[column] for name, row in BAD.items()}
    spec = {} if source == "argv" else {"kernel_name": bare_spec}
    kernel = start_with(start_kernel, tmp_path, source, values, **spec)
    evalue = refusal(kernel)
    banner = kernel.banner()
    for name, (text, python, allowed) in BAD.items():
        given = repr(eval(python)) if source == "config" else repr(text)
        line = next(line for line in evalue.splitlines() if f"WasmKernel.{name} = " in line)
        assert f"WasmKernel.{name} = {given} from " in line
        assert SOURCE_TEXT[source] in line and allowed in line, line
        assert line in banner
    reply = kernel.client.complete("pri", reply=True, timeout=30)["content"]
    assert reply["status"] == "ok" and reply["matches"] == []
    assert_shuts_down_cleanly(kernel, tmp_path)


@pytest.mark.parametrize(
    ("source", "name", "value"),
    [
        ("env", "fuel", "-1"),  # was ~1.8e19 units: no limit
        ("config", "fuel", "0"),  # was a kernel whose every cell failed
        ("argv", "fuel", "5000000000.5"),  # was a dead kernel (traitlets' Int parser)
        ("argv", "memory_limit", "-1"),  # was no memory cap
        ("env", "memory_limit", str((4 << 30) + 65536)),  # more than wasm32 addresses
        ("env", "time_limit", "-5"),  # stopped every cell
        ("argv", "time_limit", "inf"),  # killed the watchdog: nothing stopped a cell
        ("config", "time_limit", "float('nan')"),
        ("env", "output_limit", "-1"),  # dropped all output without a notice
        ("argv", "interrupt_grace", "-1"),
        ("env", "rollback", "maybe"),  # was a dead kernel (ValueError in a trait default)
    ],
)
def test_one_bad_value_is_refused_not_used(
    start_kernel, tmp_path: Path, source: str, name: str, value: str
) -> None:
    kernel = start_with(start_kernel, tmp_path, source, {name: value})
    evalue = refusal(kernel)
    assert f"WasmKernel.{name} = " in evalue and SOURCE_TEXT[source] in evalue
    assert evalue.count("\n- ") == 1, "only the bad setting is named"
    assert "not started" in kernel.banner()


def test_edge_values_on_the_command_line_are_taken(start_kernel, tmp_path: Path) -> None:
    """0 where it means none, float notation for an integer, the smallest memory."""
    kernel = start_kernel(
        [
            "--WasmKernel.fuel=1e12",
            "--WasmKernel.time_limit=0",
            "--WasmKernel.scratch_limit=0",
            "--WasmKernel.interrupt_grace=0",
            f"--WasmKernel.memory_limit={64 << 20}",
        ]
    )
    banner = kernel.banner()
    assert "fuel 1,000,000,000,000, no time limit, memory 64 MiB" in banner
    assert "/tmp: private scratch, deleted when the kernel stops, no size limit" in banner
    assert ok(kernel.execute("sum(range(10))")).result_text() == "45"


def test_edge_values_in_the_environment_are_taken(start_kernel) -> None:
    """The smallest fuel runs the interpreter's start-up and a cell; words for booleans."""
    kernel = start_kernel(
        env={
            "WASM_KERNEL_FUEL": "1e9",
            "WASM_KERNEL_ROLLBACK": "off",
            "WASM_KERNEL_TIME_LIMIT": "0.1e3",
            "WASM_KERNEL_OUTPUT_LIMIT": "1000",
        }
    )
    assert "fuel 1,000,000,000, time 100 s" in kernel.banner()
    assert ok(kernel.execute("print('x' * 10)")).stream_text() == "x" * 10 + "\n"


def test_edge_values_in_a_config_file_are_taken(start_kernel, tmp_path: Path) -> None:
    """A float that is a whole number is taken for an integer setting; 4 GiB is allowed."""
    env = configured(
        tmp_path,
        {
            "fuel": "1e12",
            "memory_limit": "4 << 30",
            "time_limit": "2592000",
            "interrupt_grace": "3600",
        },
    )
    kernel = start_kernel(env=env)
    assert "fuel 1,000,000,000,000, time 2592000 s, memory 4096 MiB" in kernel.banner()
    assert ok(kernel.execute("6 * 7")).result_text() == "42"


# -- the watchdog behind time limits and interrupts: nothing may end its thread --------------


def fires(watchdog: Watchdog) -> bool:
    """Does a fresh short deadline still fire?"""
    done = threading.Event()
    watchdog.arm(0.01, done.set)
    return done.wait(5)


def test_watchdog_survives_a_failing_callback() -> None:
    watchdog = Watchdog()
    try:
        watchdog.arm(0, lambda: 1 / 0)
        assert fires(watchdog)
    finally:
        watchdog.close()


@pytest.mark.parametrize("seconds", [math.inf, math.nan, 1e10])
def test_watchdog_survives_an_absurd_deadline(seconds: float) -> None:
    watchdog = Watchdog()
    try:
        watchdog.arm(seconds, lambda: None)
        time.sleep(0.05)  # let the thread pick the absurd deadline first
        assert fires(watchdog)
    finally:
        watchdog.close()


def test_a_sandbox_that_cannot_boot_leaves_no_scratch_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Too little fuel for the interpreter's start-up (its budget is the sandbox's own,
    shrunk here): the start fails, and its private /tmp goes with it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(interpreter, "BOOT_FUEL", 10**6)
    compiled = RuntimeCache(None).load(load_runtime())
    with pytest.raises(wasmtime.Trap):
        Sandbox(
            compiled, Limits(fuel=10**10, time_limit=10, memory_limit=1 << 30, output_limit=1 << 20)
        )
    assert list(tmp_path.glob("wasm-kernel-tmp-*")) == []
