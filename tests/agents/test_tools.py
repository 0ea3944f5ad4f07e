"""Host tools: functions a cell calls as ``sandbox_tools.NAME`` that run outside the sandbox.

Real kernels through the project's client (its tools served on the stdin channel), nbclient
on the same kernel, and the operator's tools (``WasmKernel.tools``) imported by the kernel
process. Expected values come from calling the same functions on the host.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import math
import threading
from pathlib import Path

import nbformat
import pytest
from jupyter_client.session import Session as JupyterSession
from nbclient import NotebookClient

from wasm_kernel.agents.tools import ToolDeclarationError, python_tool
from wasm_kernel.client import AsyncSession, Session, SessionError
from wasm_kernel.guest.modules._wasm_kernel_contract import TOOL, TOOL_RESULT_LIMIT
from wasm_kernel.guest.modules._wasm_kernel_tools import MAX_DEPTH, decode, encode

TESTS = str(Path(__file__).resolve().parents[1])
WORDS = "three little words"


def search(query: str, limit: int = 3) -> list[str]:
    """Titles matching ``query``, at most ``limit`` of them."""
    return [f"{query} #{index}" for index in range(limit)]


async def scale(values: list[float], factor: float = 2.0) -> list[float]:
    """Each value times ``factor`` (asynchronously, as a network call would be)."""
    await asyncio.sleep(0)
    return [value * factor for value in values]


def refuse(reason: str) -> None:
    raise ValueError(f"refused: {reason}")


def checksum(data: bytes) -> dict:
    return {"size": len(data), "reversed": data[::-1]}


class Gate:
    """A tool that waits: it says when it started and whether it ran to its end."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def wait(self, seconds: float) -> str:
        """Wait up to ``seconds`` (or until released)."""
        self.started.set()
        self.release.wait(seconds)
        self.finished.set()
        return "done"


@pytest.fixture(scope="module")
def served() -> Session:
    with Session(
        profile="strict", tools=[search, scale, refuse, checksum], plain_tracebacks=True
    ) as session:
        yield session


@pytest.mark.slow
def test_sync_and_async_tools_in_a_loop(served: Session) -> None:
    code = (
        "from sandbox_tools import search, scale\n"
        "found = []\n"
        "for n in range(1, 6):\n"
        "    titles = search(f'q{n}', limit=n)\n"
        "    found.append((titles, scale([len(t) for t in titles], factor=n / 2)))\n"
        "found"
    )
    execution = served.run(code)
    assert execution.error is None, execution.error
    expected = []
    for n in range(1, 6):
        titles = search(f"q{n}", limit=n)
        expected.append((titles, asyncio.run(scale([len(t) for t in titles], factor=n / 2))))
    assert ast.literal_eval(execution.text or "") == expected


@pytest.mark.slow
def test_tools_have_their_signature_and_docstring(served: Session) -> None:
    shown = served.run(
        "import inspect, sandbox_tools\n"
        "[(f.__name__, str(inspect.signature(f)), f.__doc__)"
        " for f in (sandbox_tools.search, sandbox_tools.scale)]"
    )
    signatures = {f: inspect.signature(f, eval_str=True) for f in (search, scale)}
    expected = [(f.__name__, str(signatures[f]), f.__doc__) for f in (search, scale)]
    assert ast.literal_eval(shown.text or "") == expected
    helped = served.run("help(sandbox_tools.search)")
    assert f"search{signatures[search]}" in helped.stdout
    assert inspect.getdoc(search) in helped.stdout
    # completion, as a front end asks for it: names of the module, then a tool's parameters
    client = served.client
    for code, wanted in (
        ("sandbox_tools.sea", "search"),
        ("sandbox_tools.search('x', li", "limit="),
    ):
        msg_id = client.complete(code, len(code))
        reply = client.get_shell_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert wanted in reply["content"]["matches"], reply["content"]


@pytest.mark.slow
def test_a_tool_that_raises_and_bad_arguments(served: Session) -> None:
    with pytest.raises(ValueError) as raised:
        refuse("no")
    failed = served.run("import sandbox_tools\nsandbox_tools.refuse('no')")
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("ValueError", str(raised.value))
    caught = served.run(
        "try:\n    sandbox_tools.refuse('again')\n"
        "except ValueError as exc:\n"
        "    print(isinstance(exc, sandbox_tools.ToolError), exc)"
    )
    assert caught.stdout == "True refused: again\n"
    wrong = served.run("sandbox_tools.search('x', limit='many')")
    assert wrong.error is not None and wrong.error.name == "TypeError"
    assert "limit" in wrong.error.value and "integer" in wrong.error.value
    for call in ("scale(['x'])", "scale([1.0], factor='big')"):  # async, as a sync tool says
        awrong = served.run(f"sandbox_tools.{call}")
        assert awrong.error is not None and awrong.error.name == "TypeError", awrong.error
        assert "scale() arguments do not match its annotations: " in awrong.error.value
        named = "values.0" if "'x'" in call else "factor"
        assert f"{named}: Input should be a valid number" in awrong.error.value, awrong.error
    unsendable = served.run("sandbox_tools.search({1, 2})")
    assert unsendable.error is not None and "set" in unsendable.error.value
    missing = served.run("sandbox_tools.search()")  # bound in the guest, as Python would
    assert missing.error is not None and missing.error.name == "TypeError"
    # the host serves only the tools declared for the cell, whatever the guest asks for
    forged = served.run("import _wasm_kernel_tools\n_wasm_kernel_tools.call('open', {'file': '/'})")
    assert forged.error is not None and forged.error.name == "ToolUnavailable"
    data = bytes(range(256)) * 3
    echoed = served.run(f"sandbox_tools.checksum({data!r}) == {checksum(data)!r}")
    assert echoed.text == "True"
    assert served.run("'still here'").text == "'still here'"


@pytest.mark.slow
def test_an_argument_over_the_bound_of_a_call_says_so(served: Session) -> None:
    """48 MiB of bytes go as 64 MiB of base64: over the bound of one tool message, which the
    error names (not "tools can only be called while a cell runs"); the session goes on."""
    limit = TOOL.limit
    refused = served.run(
        "import sandbox_tools\n"
        "try:\n"
        "    sandbox_tools.checksum(bytes(48 << 20))\n"
        "except ValueError as exc:\n"
        "    print(type(exc).__mro__[1].__name__, exc)"
    )
    assert refused.error is None, refused.error
    assert refused.stdout.startswith("ToolError checksum(): its arguments are too big"), (
        refused.stdout
    )
    assert f"bound of {limit:,} bytes" in refused.stdout
    assert "output limit" not in refused.stderr  # it was refused, not left out as output
    assert served.run("sandbox_tools.checksum(b'ab')['size']").text == "2"


@pytest.mark.slow
def test_a_result_over_its_bound_says_so(served: Session) -> None:
    """13 MiB of bytes come back as more than 16 MiB of base64: the error names the bound."""
    refused = served.run("import sandbox_tools\nsandbox_tools.checksum(bytes(13 << 20))")
    assert refused.error is not None and refused.error.name == "ValueError", refused.error
    assert "the tool's result is too big" in refused.error.value
    assert f"over the bound of {TOOL_RESULT_LIMIT:,} bytes" in refused.error.value


@pytest.mark.slow
def test_the_host_refuses_a_call_over_the_bound_that_the_guest_did_not_check(
    served: Session,
) -> None:
    """A cell that skips sandbox_tools and writes its own tool message to the host: the host
    reads none over its bound, and answers with the bound named, not silence."""
    limit = TOOL.limit
    sent = served.run(
        "import _host, json\n"
        "message = json.dumps({'op': 'tool', 'name': 'checksum',"
        f" 'arguments': {{'data': 'x' * {limit}}}}}).encode()\n"
        "json.loads(_host.call(message))"
    )
    assert sent.error is None, sent.error
    assert f"over the bound of {limit:,} bytes on one tool message" in sent.text, sent.text
    assert "ValueError" in sent.text


@pytest.mark.slow
def test_a_reply_nested_deeper_than_the_bound_says_so(start_kernel) -> None:
    """A client's tool_reply 100,000 lists deep (its JSON written here: json.dumps would not
    write it) fails the call with the bound named, and the kernel goes on."""
    kernel = start_kernel()
    client = kernel.client
    tools = {"deep": {"doc": "", "parameters": []}}
    code = "from sandbox_tools import deep\ndeep()"
    request = client.session.msg(
        "execute_request",
        {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": True,
            "stop_on_error": True,
        },
        metadata={"wasm_kernel": {"tools": tools}},
    )
    client.shell_channel.send(request)
    call = client.get_stdin_msg(timeout=120)
    assert call["msg_type"] == "tool_request" and call["content"]["name"] == "deep"
    depth = 100_000
    content = b'{"call_id": "%s", "status": "ok", "value": %s%s}' % (
        call["content"]["call_id"].encode(),
        b"[" * depth,
        b"]" * depth,
    )
    client.session.send(client.stdin_channel.socket, "tool_reply", content, parent=call)
    run = kernel.collect(request["header"]["msg_id"])
    assert run.content["status"] == "error"
    assert run.content["ename"] == "ValueError", run.content
    assert f"nested more than {MAX_DEPTH} deep" in run.content["evalue"]
    assert kernel.execute("1 + 1").result_text() == "2"


@pytest.mark.slow
def test_waiting_counts_against_the_time_limit_and_costs_no_fuel() -> None:
    gate = Gate()
    with Session(
        profile="strict", time_limit=2, fuel=10**9, interrupt_grace=2, tools={"wait": gate.wait}
    ) as session:
        # a second waiting on a tool is free; the same second spent computing is not
        assert session.run("from sandbox_tools import wait\nwait(1.0)").text == "'done'"
        spin = session.run(
            "import time\nend = time.time() + 1\nwhile time.time() < end:\n"
            "    for i in range(10_000): pass"
        )
        assert spin.error is not None and spin.error.name == "FuelExhausted"
        gate.finished.clear()
        slow = session.run("x = 'kept'\nwait(10)")
        assert slow.error is not None and slow.error.name == "TimeLimitExceeded", slow.error
        assert gate.started.is_set() and not gate.finished.is_set()  # the cell did not wait
        assert session.run("x").text == "'kept'"
        gate.release.set()


@pytest.mark.slow
def test_an_interrupt_while_waiting_on_a_tool() -> None:
    gate = Gate()
    with Session(profile="strict", interrupt_grace=5, tools=[gate.wait]) as session:

        def interrupt() -> None:
            if gate.started.wait(60):
                session.manager.interrupt_kernel()

        interrupter = threading.Thread(target=interrupt)
        interrupter.start()
        waited = session.run("y = 7\nfrom sandbox_tools import wait\nwait(60)")
        interrupter.join()
        assert waited.error is not None and waited.error.name == "KeyboardInterrupt"
        assert not gate.finished.is_set()
        gate.release.set()
        assert session.run("y, wait(0)").text == "(7, 'done')"


@pytest.mark.slow
def test_a_client_without_tools_gets_a_clear_error() -> None:
    with Session(profile="strict", plain_tracebacks=True) as session:
        assert session.run("import sandbox_tools\nsandbox_tools.__all__").text == "[]"
        refused = session.run("from sandbox_tools import search")
        assert refused.error is not None and refused.error.name == "ToolUnavailable"
        assert "Session(tools=...)" in refused.error.value
        assert session.run("isinstance(ImportError(), Exception)").text == "True"


@pytest.mark.slow
def test_nbclient_and_operator_tools_on_a_kernel_with_a_tool_client() -> None:
    env = {
        "PYTHONPATH": TESTS,
        "WASM_KERNEL_TOOLS": "operator_tools:word_count;pid=operator_tools:kernel_pid",
    }
    with Session(profile="strict", env=env, tools=[search]) as session:
        kept = session.run(
            "import sandbox_tools\nfind = sandbox_tools.search\nsorted(sandbox_tools.__all__)"
        )
        assert kept.text == repr(["pid", "search", "word_count"])
        assert "WasmKernel.tools, run outside the sandbox): word_count, pid" in (
            session.run("%sandbox").stdout
        )
        pid = session.run("sandbox_tools.pid()").text
        assert pid == str(session.manager.provisioner.process.pid)  # the kernel process
        notebook = nbformat.v4.new_notebook()
        notebook.cells = [
            nbformat.v4.new_code_cell("find('x')"),
            nbformat.v4.new_code_cell("from sandbox_tools import search"),
            nbformat.v4.new_code_cell(f"sandbox_tools.word_count({WORDS!r})"),
        ]
        # nbclient on the same kernel, as a second front end (JupyterLab) would be: a client
        # of its own, with its own session, which declares no tools
        runner = NotebookClient(notebook, km=session.manager, allow_errors=True, timeout=60)
        runner.kc = session.manager.client(session=JupyterSession(key=session.manager.session.key))
        runner.kc.start_channels()
        try:
            runner.kc.wait_for_ready(timeout=60)
            runner.execute()
        finally:
            runner.kc.stop_channels()
        stale, imported, counted = (cell.outputs for cell in notebook.cells)
        assert stale[0]["ename"] == "ToolUnavailable"
        assert "its client serves no tools" in stale[0]["evalue"]
        assert imported[0]["ename"] == "ToolUnavailable"
        assert counted[0]["data"]["text/plain"] == str(len(WORDS.split()))
        assert session.run("find('y', 1)").text == repr(search("y", 1))


@pytest.mark.slow
def test_an_operator_tool_that_cannot_be_imported_is_a_refused_setting() -> None:
    env = {"PYTHONPATH": TESTS, "WASM_KERNEL_TOOLS": "operator_tools:no_such_function"}
    with pytest.raises(SessionError, match=r"WasmKernel\.tools .* cannot be imported"):
        Session(profile="strict", env=env).start()


def test_an_operator_tool_beside_the_notebook_says_why_it_is_not_imported(tmp_path) -> None:
    """The kernel's working folder (the notebook's) is kept off the host's sys.path on
    purpose; a tools module left there is refused with that reason, not only "No module"."""
    (tmp_path / "notebook_tools.py").write_text("def hello() -> str:\n    return 'hi'\n")
    env = {"WASM_KERNEL_TOOLS": "notebook_tools:hello"}
    with pytest.raises(SessionError) as refused:
        Session(profile="strict", env=env, cwd=tmp_path).start()
    message = str(refused.value)
    assert "No module named 'notebook_tools'" in message, message
    assert f"never from its working folder ({tmp_path})" in message, message
    assert "kept off sys.path on purpose" in message and "PYTHONPATH" in message, message


@pytest.mark.slow
def test_async_session_runs_async_tools_on_its_own_loop() -> None:
    loops = []

    async def where() -> bool:
        loops.append(asyncio.get_running_loop())
        return True

    async def main() -> None:
        async with AsyncSession(profile="strict", tools={"where": where}) as session:
            execution = await session.run(
                "from sandbox_tools import where\n[where() for _ in range(3)]"
            )
            assert execution.text == "[True, True, True]"
            assert loops == [asyncio.get_running_loop()] * 3

    asyncio.run(main())


@pytest.mark.nokernel
def test_values_are_json_and_bytes() -> None:
    value = {"a": [1, 2.5, None, True, "é"], "b": b"\x00\xff", "c": (1, 2)}
    assert decode(encode(value)) == {**value, "c": [1, 2]}
    for bad, why in (
        ({1: "x"}, "keys must be strings"),
        ({1, 2}, "not set"),
        (math.nan, "JSON has no such number"),
        ({"$bytes": "x"}, "cannot be sent"),
    ):
        with pytest.raises((TypeError, ValueError), match=why):
            encode(bad)


@pytest.mark.nokernel
def test_declarations_refuse_what_the_guest_could_not_build() -> None:
    with pytest.raises(ToolDeclarationError, match="identifier"):
        python_tool(search, "not a name")
    with pytest.raises(ToolDeclarationError, match="callable"):
        python_tool(42)  # type: ignore[arg-type]
    tool = python_tool(search)
    assert tool.invoke({"query": "q", "limit": 2}) == search("q", 2)
    with pytest.raises(TypeError, match="limit"):
        tool.invoke({"query": "q", "limit": "two"})
