"""Finding the kernel server of this test environment, and kernels it handed out.

Shared by the tests that check that a kernel came from the server (``test_provisioner``) and
that tools starting their own kernels (nbgrader, papermill) get served ones.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import psutil
from conftest import Kernel
from jupyter_client.kernelspec import KernelSpecManager

from wasm_kernel.server import kernel_server
from wasm_kernel.server.provisioner import ServedKernel

HANDED_OUT = "wasm-kernel server: kernel "  # the server's log line per kernel, then its pid


def server_folder() -> Path:
    python = KernelSpecManager().get_kernel_spec("wasm-python").argv[0]
    return kernel_server.runtime_folder(kernel_server.code_fingerprint(python))


def server_pid() -> int | None:
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "wasm_kernel.server.kernel_server" in cmdline and str(server_folder()) in cmdline:
            return process.pid
    return None


def served(**options: object) -> Kernel:
    """A kernel forked by the server: starts kernels (and so the server) until one is."""
    deadline = time.monotonic() + 60
    while True:
        kernel = Kernel(**options)  # type: ignore[arg-type]
        if isinstance(kernel.manager.provisioner.process, ServedKernel):
            return kernel
        kernel.shutdown()
        assert time.monotonic() < deadline, "no kernel came from the kernel server"
        time.sleep(0.5)


def server_answering() -> None:
    """Make sure the server answers, so that the kernels a tool starts next come from it:
    at once if it does (a connection without a request is refused and closed), else
    through a served kernel, which starts it."""
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(kernel_server.socket_path(server_folder())))
        except OSError:
            served().shutdown()


def handed_out() -> list[int]:
    """The pids of the kernels the running server has forked, from its log."""
    log = server_folder() / kernel_server.LOG_NAME
    lines = log.read_text().splitlines() if log.exists() else []
    told = [line[len(HANDED_OUT) :] for line in lines if line.startswith(HANDED_OUT)]
    return [int(rest.split()[0]) for rest in told]
