"""A shutdown_request answers within the client's wait, whatever the running cell does.

jupyter_client waits 5 s for a kernel to exit after its shutdown_request, then kills it; the
native kernel answers in about half a second. A kernel that waits for a spinning cell, or
one blocked in input(), is killed instead: nothing hibernates and its files stay behind. So
the running cell is stopped, the session hibernates from the state before that cell (the
last checkpoint), and the reply goes out.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import Kernel, ok, plain

from wasm_kernel.images import images

SPINNING = "print('running', flush=True)\nwhile True:\n    pass"
WAITING = "print('running', flush=True)\nname = input('name? ')"
CLIENT_WAIT = 5.0  # jupyter_client's KernelManager.shutdown_wait_time


def started(kernel: Kernel, code: str) -> None:
    """Send ``code`` without waiting for it, and return once it is running."""
    kernel.client.execute(code, allow_stdin=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msg = kernel.client.get_iopub_msg(timeout=60)
        if msg["msg_type"] == "stream" and "running" in msg["content"]["text"]:
            return
    raise AssertionError("the cell never started")


def shutdown_reply_seconds(kernel: Kernel) -> float:
    """From the shutdown_request to its reply on the control channel."""
    start = time.monotonic()
    msg_id = kernel.client.shutdown()
    while True:
        reply = kernel.client.control_channel.get_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg_id:
            assert reply["content"]["status"] == "ok", reply["content"]
            return time.monotonic() - start


@pytest.mark.parametrize("code", [SPINNING, WAITING], ids=["spinning", "in-input"])
@pytest.mark.parametrize("kernel_name", ["wasm-python", "wasm-python-strict"])
def test_shutdown_answers_within_the_client_s_wait(
    tmp_path: Path, kernel_name: str, code: str
) -> None:
    env = {"WASM_KERNEL_SNAPSHOT_DIR": str(tmp_path), "JPY_SESSION_NAME": "busy.ipynb"}
    kernel = Kernel(kernel_name=kernel_name, env=env)
    try:
        ok(kernel.execute("kept = 'before the running cell'"))
        started(kernel, code)
        seconds = shutdown_reply_seconds(kernel)
        assert seconds < CLIENT_WAIT, f"shutdown_reply after {seconds:.1f} s"
        kernel.manager.shutdown_kernel(now=False)  # the process is gone within the wait too
    finally:
        kernel.shutdown()
    hibernated = list(tmp_path.glob("*" + images.SUFFIX))
    if kernel_name == "wasm-python-strict":
        assert not hibernated  # the strict profile never hibernates
        return
    assert len(hibernated) == 1, "the session did not hibernate"
    resumed = Kernel(kernel_name=kernel_name, env=env)
    try:
        assert plain(resumed.execute("kept")) == "before the running cell"
        assert plain(resumed.execute("'name' in dir()")) is False
    finally:
        resumed.shutdown()
