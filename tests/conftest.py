"""Shared fixtures: real wasm-kernel processes started through jupyter_client over ZMQ.

The kernelspec must be installed (``python -m wasm_kernel install``) and the runtime
precompiled; the README's test command does both.
"""

from __future__ import annotations

import ast
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

KERNEL_NAME = os.environ.get("WASM_KERNEL_TEST_KERNEL", "wasm-python")
NATIVE = "python3"  # ipykernel's kernelspec: what ours is compared with


@dataclass
class CellRun:
    """Everything one execute_request produced: the reply and the iopub messages in order."""

    reply: dict
    messages: list[dict] = field(default_factory=list)
    arrival: list[float] = field(default_factory=list)  # seconds after the request was sent
    strays: list[dict] = field(default_factory=list)  # iopub messages of other requests
    seconds: float = 0.0  # from the request to its reply

    @property
    def content(self) -> dict:
        return self.reply["content"]

    def of_type(self, msg_type: str) -> list[dict]:
        return [m["content"] for m in self.messages if m["msg_type"] == msg_type]

    def stream_text(self, name: str = "stdout") -> str:
        return "".join(c["text"] for c in self.of_type("stream") if c["name"] == name)

    def result_text(self) -> str | None:
        results = self.of_type("execute_result")
        return results[-1]["data"]["text/plain"] if results else None


def ok(run: CellRun) -> CellRun:
    """Assert the cell succeeded, showing the kernel's traceback when it did not."""
    assert run.content["status"] == "ok", "\n".join(run.content.get("traceback", []))
    return run


def plain(run: CellRun) -> Any:
    """The execute_result's text/plain, read back as a Python literal."""
    text = run.result_text()
    assert text is not None, f"no execute_result in {run.messages}"
    return ast.literal_eval(text)


class Kernel:
    """A started kernel and its blocking client, with a helper to run a cell to completion."""

    def __init__(
        self,
        extra_arguments: list[str] | None = None,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        kernel_name: str = KERNEL_NAME,
    ):
        self.manager = KernelManager(kernel_name=kernel_name)
        kwargs: dict[str, Any] = {"extra_arguments": extra_arguments or []}
        if env is not None:
            kwargs["env"] = {**os.environ, **env}
        if cwd is not None:  # Jupyter starts a kernel in its notebook's folder
            kwargs["cwd"] = str(cwd)
        self.manager.start_kernel(**kwargs)
        self.client: BlockingKernelClient = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def execute(self, code: str, timeout: float = 120, **kwargs: Any) -> CellRun:
        """Run ``code`` and collect what it produced until the kernel is idle again."""
        kwargs.setdefault("allow_stdin", False)
        return self.collect(self.client.execute(code, **kwargs), timeout)

    def collect(self, msg_id: str, timeout: float = 120) -> CellRun:
        """The iopub messages of request ``msg_id`` until idle, then its shell reply.

        Shell replies to other requests (a late kernel_info_reply left by wait_for_ready) are
        skipped; iopub messages of other requests are kept apart in ``strays``.
        """
        start = time.monotonic()
        run = CellRun(reply={})
        while True:
            msg = self.client.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                if msg["msg_type"] != "status":
                    run.strays.append(msg)
                continue
            if msg["msg_type"] == "status":
                if msg["content"]["execution_state"] == "idle":
                    break
                continue
            run.messages.append(msg)
            run.arrival.append(time.monotonic() - start)
        while run.reply.get("parent_header", {}).get("msg_id") != msg_id:
            run.reply = self.client.get_shell_msg(timeout=timeout)
        run.seconds = time.monotonic() - start
        return run

    def banner(self) -> str:
        """The kernel_info_reply's banner: the running configuration, as the kernel shows it."""
        reply = self.client.kernel_info(reply=True, timeout=30)
        assert reply["content"]["status"] == "ok", reply["content"]
        return reply["content"]["banner"]

    def shutdown(self) -> None:
        """Stop the kernel (again is a no-op: a test may stop one the fixture stops too)."""
        if self.manager.has_kernel:
            self.client.stop_channels()
            self.manager.shutdown_kernel(now=False)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    """One kernel shared by a test module: for tests that leave its state usable."""
    started = Kernel()
    yield started
    started.shutdown()


@pytest.fixture(scope="module")
def native_and_ours() -> Iterator[tuple[Kernel, Kernel]]:
    """The native kernel and wasm-kernel side by side, shared by a test module."""
    native, ours = Kernel(kernel_name=NATIVE), Kernel()
    yield native, ours
    native.shutdown()
    ours.shutdown()


@pytest.fixture
def start_kernel() -> Iterator[Any]:
    """Factory for kernels with their own settings; all are shut down after the test."""
    started: list[Kernel] = []

    def start(
        extra_arguments: list[str] | None = None, env: dict[str, str] | None = None, **options: Any
    ) -> Kernel:
        started.append(Kernel(extra_arguments, env, **options))
        return started[-1]

    yield start
    for item in started:
        item.shutdown()
