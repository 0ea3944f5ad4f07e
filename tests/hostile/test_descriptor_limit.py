"""A kernel process with a small descriptor limit (128, soft and hard): a cell that opens
files until refused, then writes past the scratch limit, must leave the kernel answering.

The guest used to get half the process's limit whatever the kernel held already, and the
kernel then had none left for the ZMQ socket of its next thread to publish: no further cell
was answered. The kernel is started here on its own (not through the per-user kernel server,
whose limit is that of whoever started it first), with a real client connected to it.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Kernel, ok
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

LIMIT = 128


class LimitedKernel(Kernel):
    """A strict kernel process started directly, with RLIMIT_NOFILE at LIMIT."""

    def __init__(self, folder: Path):  # not Kernel.__init__: that starts one the usual way
        connection, _ = write_connection_file(str(folder / "kernel.json"))

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))

        self.process = subprocess.Popen(
            [sys.executable, "-m", "wasm_kernel", "-f", connection, "--WasmKernel.profile=strict"],
            preexec_fn=limit,  # noqa: PLW1509 (nothing else runs threads in this test process)
            env={**os.environ, "JPY_PARENT_PID": str(os.getpid())},
        )
        self.client = BlockingKernelClient(connection_file=connection)
        self.client.load_connection_file()
        self.client.start_channels(hb=False)  # its liveness is the process's
        self.client.wait_for_ready(timeout=120)

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.process.kill()
        self.process.wait()


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[LimitedKernel]:
    started = LimitedKernel(tmp_path)
    yield started
    started.shutdown()


def test_descriptors_used_up_then_a_full_tmp_leave_the_kernel_answering(
    limited: LimitedKernel,
) -> None:
    # what formatting a traceback imports, so that it works while no descriptor is left
    assert limited.execute("open('/no/such/file')").content["ename"] == "FileNotFoundError"
    run = limited.execute(
        "import os\nheld = []\nwhile True:\n    held.append(open(f'/tmp/f{len(held)}', 'wb'))"
    )
    assert run.content["evalue"].startswith("[Errno 33]"), run.content
    assert "limits how many files" in "\n".join(run.content["traceback"])
    run = limited.execute(
        "while True:\n    held[0].write(bytes(1 << 20))\n    held[0].flush()", timeout=120
    )
    assert run.content["ename"] == "ScratchLimitExceeded", run.content
    assert ok(limited.execute("len(held) > 0")).result_text() == "True"
    assert ok(limited.execute("print('answered')")).stream_text() == "answered\n"
