"""Text that UTF-8 cannot encode (lone surrogates) in anything the guest sends back.

Every reply must still be sent, with the text replaced (U+FFFD), never left unsent.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Kernel, ok

REPLACED = "\ufffd"


@pytest.fixture(scope="module")
def kernel() -> Kernel:
    started = Kernel()
    ok(
        started.execute(
            "class Odd:\n"
            "    def __repr__(self):\n"
            "        return 'odd \\udfff'\n"
            "Odd.__doc__ = 'doc with \\ud800 inside'\n"  # (a literal docstring: compile error)
            "odd = Odd()\n"
            "globals()['name_\\ud800'] = 1"
        )
    )
    yield started
    started.shutdown()


def test_an_error_message(kernel: Kernel) -> None:
    run = kernel.execute("raise ValueError('\\ud800')", timeout=30)
    assert run.content["status"] == "error"
    assert run.content["ename"] == "ValueError"
    assert run.content["evalue"] == REPLACED


def test_a_result(kernel: Kernel) -> None:
    assert kernel.execute("odd", timeout=30).result_text() == f"odd {REPLACED}"


def test_user_expressions(kernel: Kernel) -> None:
    run = ok(kernel.execute("x = 1", user_expressions={"o": "odd"}, timeout=30))
    value = run.content["user_expressions"]["o"]
    assert value["status"] == "ok" and value["data"]["text/plain"] == f"odd {REPLACED}"


def test_completion(kernel: Kernel) -> None:
    reply = kernel.client.complete("name_", 5, reply=True, timeout=30)
    assert reply["content"]["matches"] == [f"name_{REPLACED}"]


def test_inspection(kernel: Kernel) -> None:
    reply = kernel.client.inspect("Odd", 3, reply=True, timeout=30)
    assert f"doc with {REPLACED} inside" in reply["content"]["data"]["text/plain"]


def test_numbers_json_lacks_are_sent_as_the_native_kernel_sends_them(
    kernel: Kernel, start_kernel: Any
) -> None:
    """NaN and the infinities in what a cell displays are packed as jupyter_client's session
    packs them for ipykernel (null where orjson is installed, text where it is not)."""
    code = (
        "from IPython.display import display\n"
        "display({'text/plain': 'x'}, metadata={'nan': float('nan'), 'inf': float('-inf')},"
        " raw=True)"
    )
    native, ours = (
        ok(started.execute(code, timeout=60)).of_type("display_data")[0]["metadata"]
        for started in (start_kernel(kernel_name="python3"), kernel)
    )
    assert ours == native
