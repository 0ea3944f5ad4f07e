"""Every message a cell sends counts against its output limit; an error is never lost.

The strict profile allows 1 MiB of output per cell. The guest can call the kernel's message
channel (``_host.call``) directly, so these cells forge messages of every type.
"""

from __future__ import annotations

import pytest
from conftest import CellRun, Kernel, ok

LIMIT = 1 << 20  # the strict profile's output_limit
NOTICE = "[wasm-kernel] output limit reached"
FORGE = "import _host, json\ndef forge(**message):\n    _host.call(json.dumps(message).encode())\n"


@pytest.fixture(scope="module")
def strict() -> Kernel:
    started = Kernel(kernel_name="wasm-python-strict")
    ok(started.execute("sentinel = 'kept'"))
    yield started
    started.shutdown()


def published_bytes(run: CellRun) -> int:
    return sum(len(str(message["content"])) for message in run.messages)


def test_forged_errors_count_against_the_limit(strict: Kernel) -> None:
    run = strict.execute(
        FORGE + "for i in range(400):\n"
        "    forge(op='error', ename='Forged', evalue='x' * 250_000, traceback=[])"
    )
    assert run.content["status"] == "error"
    assert run.content["ename"] == "Forged"
    assert published_bytes(run) < 2 * LIMIT
    assert NOTICE in run.stream_text("stderr")


@pytest.mark.parametrize(
    "message",
    [
        "op='clear', wait=False",
        "op='display', data={'text/plain': 'y' * 1000}, metadata={}, transient={}",
        "op='result', data={'text/plain': 'z' * 1000}, metadata={}",
    ],
)
def test_forged_output_of_each_type_counts(strict: Kernel, message: str) -> None:
    run = ok(strict.execute(FORGE + f"for i in range(5000):\n    forge({message})"))
    assert published_bytes(run) < 2 * LIMIT
    assert NOTICE in run.stream_text("stderr")


def test_a_huge_error_still_fails_the_cell(strict: Kernel) -> None:
    """A 40 MiB assertion message is an error, cut, never a success."""
    run = strict.execute("assert 1 == 2, 'x' * (40 << 20)", timeout=120)
    assert run.content["status"] == "error"
    assert run.content["ename"] == "AssertionError"
    errors = run.of_type("error")
    assert len(errors) == 1 and errors[0]["ename"] == "AssertionError"
    assert published_bytes(run) < 2 * LIMIT


def test_an_unreadably_large_error_still_fails_the_cell(strict: Kernel) -> None:
    run = strict.execute(
        FORGE + "_host.call(json.dumps({'op': 'error', 'ename': 'E',"
        " 'evalue': 'x' * (70 << 20), 'traceback': []}).encode())",
        timeout=120,
    )
    assert run.content["status"] == "error"
    assert run.content["ename"] == "ErrorTooLarge"


def test_an_error_after_the_budget_is_spent_is_still_shown(strict: Kernel) -> None:
    run = strict.execute("print('p' * (2 << 20))\nraise ValueError('after the flood')")
    assert run.content["status"] == "error"
    assert run.content["ename"] == "ValueError"
    shown = run.of_type("error")
    assert len(shown) == 1 and shown[0]["evalue"] == "after the flood"


def test_output_after_a_dropped_large_image_is_kept(strict: Kernel) -> None:
    run = ok(
        strict.execute(
            "import base64\nfrom IPython.display import display\nprint('before')\n"
            "display({'image/png': base64.b64encode(bytes(20 << 20)).decode()}, raw=True)\n"
            "print('after')\ndisplay({'text/plain': 'small'}, raw=True)"
        )
    )
    assert run.stream_text() == "before\nafter\n"
    assert NOTICE in run.stream_text("stderr")
    assert [data["data"] for data in run.of_type("display_data")] == [{"text/plain": "small"}]
    assert strict.execute("sentinel").result_text() == "'kept'"


@pytest.mark.slow
def test_output_waiting_for_a_client_that_does_not_read_is_bounded() -> None:
    """A subscriber that never reads IOPub: ZMQ would queue a thousand messages for it, here
    ~300 MiB of cell output, in the kernel's memory. What waits is bounded (64 MiB)."""
    import psutil
    import zmq

    kernel = Kernel(kernel_name="wasm-python-strict")
    context = zmq.Context()
    stalled = context.socket(zmq.SUB)
    try:
        stalled.setsockopt(zmq.RCVHWM, 1)
        stalled.setsockopt(zmq.RCVBUF, 4096)
        info = kernel.manager.get_connection_info()
        stalled.connect(f"{info['transport']}://{info['ip']}:{info['iopub_port']}")
        stalled.setsockopt(zmq.SUBSCRIBE, b"")
        ok(kernel.execute("import base64\nfrom IPython.display import display"))
        kernel.client.iopub_channel.stop()  # our own client stops reading too
        process = psutil.Process(kernel.manager.provisioner.process.pid)
        before = process.memory_info().rss
        cell = (
            "for i in range(3):\n"
            "    display({'image/png': base64.b64encode(bytes(300_000)).decode() + str(i)},"
            " raw=True)"
        )
        for _ in range(250):
            kernel.client.execute(cell)
            assert kernel.client.get_shell_msg(timeout=60)["content"]["status"] == "ok"
        grown = process.memory_info().rss - before
        assert grown < 150 << 20, f"kernel grew by {grown >> 20} MiB"
    finally:
        stalled.close(linger=0)
        context.term()
        kernel.client.stop_channels()
        kernel.manager.shutdown_kernel(now=True)
