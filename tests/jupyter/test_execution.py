"""What a Jupyter user expects of a Python kernel, checked over ZMQ through jupyter_client.

Tests that leave the interpreter usable share the module's ``kernel``. Tests that need a
fresh interpreter or restart one use ``start_kernel``; the history tests get a kernel with a
private history file, and the shutdown test owns its KernelManager outright, since it ends
the kernel itself.
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import KERNEL_NAME, NATIVE, CellRun, Kernel, ok, plain
from jupyter_client.manager import KernelManager

import wasm_kernel

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def shown(lines: list[str]) -> str:
    """Traceback or page text as a user reads it (IPython colours it, as natively)."""
    return ANSI.sub("", "\n".join(lines))


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HOST_PATHS = [str(Path(wasm_kernel.__file__).resolve().parent), sys.prefix, str(Path.home())]


# -- helpers ------------------------------------------------------------------------------------


def request(kernel: Kernel, method: str, *args: Any, **kwargs: Any) -> dict:
    """Send a shell request and return the reply to it (replies to other requests are skipped)."""
    msg_id = getattr(kernel.client, method)(*args, **kwargs)
    while True:
        reply = kernel.client.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def execute_answering(kernel: Kernel, code: str, answers: list[str]) -> tuple[CellRun, list[dict]]:
    """Run a cell with allow_stdin=True, answering each input_request in turn.

    Returns the cell's output and the input_request messages the kernel sent.
    """
    msg_id = kernel.client.execute(code, allow_stdin=True)
    requests = []
    for answer in answers:
        prompt = kernel.client.get_stdin_msg(timeout=60)
        requests.append(prompt)
        kernel.client.input(answer)
    return kernel.collect(msg_id), requests


def error_of(run: CellRun) -> dict:
    assert run.content["status"] == "error"
    errors = run.of_type("error")
    assert len(errors) == 1
    return errors[0]


def assert_no_kernel_frames(traceback: list[str]) -> None:
    text = "\n".join(traceback)
    assert "<wasm-kernel>" not in text
    assert "bootstrap" not in text
    for host_path in HOST_PATHS:
        assert host_path not in text


# -- state between cells ------------------------------------------------------------------------


def test_globals_imports_functions_classes_persist(kernel: Kernel) -> None:
    """A notebook is one program split into cells: definitions must outlive their cell."""
    ok(kernel.execute("counter = 41"))
    ok(kernel.execute("import fractions as fr"))
    ok(kernel.execute("def bump(n):\n    return n + 1"))
    ok(kernel.execute("class Box:\n    def __init__(self, v):\n        self.v = v"))
    run = ok(kernel.execute("Box(bump(counter)).v, fr.Fraction(1, 2) + fr.Fraction(1, 2)"))
    assert run.result_text() == "(42, Fraction(1, 1))"


def test_last_value_is_available_as_underscore(kernel: Kernel) -> None:
    """Like the Python REPL, `_` holds the last displayed result."""
    ok(kernel.execute("6 * 7"))
    assert plain(ok(kernel.execute("_ + 1"))) == 43


# -- streams --------------------------------------------------------------------------------------


def test_stream_output_is_live(kernel: Kernel) -> None:
    """Output flushed before a long step must reach the notebook before the step ends."""
    code = "print('first', flush=True); import time; time.sleep(1); print('second')"
    run = ok(kernel.execute(code))
    streams = [
        (msg["content"]["text"], at)
        for msg, at in zip(run.messages, run.arrival, strict=True)
        if msg["msg_type"] == "stream"
    ]
    first_at = next(at for text, at in streams if "first" in text)
    second_at = next(at for text, at in streams if "second" in text)
    assert not any("first" in text and "second" in text for text, _ in streams)
    assert second_at - first_at >= 0.7


def test_stdout_and_stderr_are_separate_streams_in_order(kernel: Kernel) -> None:
    """Interleaved prints keep their order and their stream name."""
    run = ok(
        kernel.execute(
            "import sys\nprint('out one')\nprint('err one', file=sys.stderr)\nprint('out two')"
        )
    )
    streams = [(c["name"], c["text"]) for c in run.of_type("stream")]
    assert streams == [("stdout", "out one\n"), ("stderr", "err one\n"), ("stdout", "out two\n")]


# -- results and rich output ----------------------------------------------------------------------


def test_execute_result_carries_execution_count(kernel: Kernel) -> None:
    """Out[n] must match In[n] and the reply's count, and counts go up by one per cell."""
    first = ok(kernel.execute("'a' + 'b'"))
    second = ok(kernel.execute("2 ** 10"))
    for run in (first, second):
        count = run.content["execution_count"]
        [result] = run.of_type("execute_result")
        [announced] = run.of_type("execute_input")
        assert result["execution_count"] == count == announced["execution_count"]
    assert second.content["execution_count"] == first.content["execution_count"] + 1
    assert first.result_text() == "'ab'"
    assert second.result_text() == "1024"


def test_trailing_semicolon_suppresses_result(kernel: Kernel) -> None:
    """IPython's convention: `expr;` runs the expression but shows nothing."""
    run = ok(kernel.execute("shown_value = 5\nshown_value * 2;"))
    assert run.of_type("execute_result") == []
    assert ok(kernel.execute("shown_value * 2")).result_text() == "10"


def test_statement_gives_no_result(kernel: Kernel) -> None:
    assert ok(kernel.execute("quiet = [1, 2, 3]")).of_type("execute_result") == []


def test_repr_html_gives_html_and_plain(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "class Shouty:\n"
            "    def _repr_html_(self):\n"
            "        return '<h1>LOUD</h1>'\n"
            "    def __repr__(self):\n"
            "        return 'Shouty()'\n"
            "Shouty()"
        )
    )
    [result] = run.of_type("execute_result")
    assert result["data"]["text/html"] == "<h1>LOUD</h1>"
    assert result["data"]["text/plain"] == "Shouty()"


def test_repr_png_bytes_are_base64_encoded(kernel: Kernel) -> None:
    """Binary mime data must travel as base64 text, as the messaging spec requires."""
    run = ok(
        kernel.execute(
            "class Dot:\n"
            "    def _repr_png_(self):\n"
            "        return b'\\x89PNG\\r\\n\\x1a\\n' + bytes(range(16))\n"
            "Dot()"
        )
    )
    [result] = run.of_type("execute_result")
    assert base64.b64decode(result["data"]["image/png"]) == PNG_SIGNATURE + bytes(range(16))
    assert "text/plain" in result["data"]


def test_repr_mimebundle_gives_every_mime_type(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "class Multi:\n"
            "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
            "        return {'text/markdown': '**multi**', 'application/json': {'k': [1, 2]}}\n"
            "Multi()"
        )
    )
    [result] = run.of_type("execute_result")
    assert result["data"]["text/markdown"] == "**multi**"
    assert result["data"]["application/json"] == {"k": [1, 2]}
    assert result["data"]["text/plain"].startswith("<__main__.Multi at 0x")  # IPython's repr


def test_dataframe_renders_as_html_table(kernel: Kernel) -> None:
    run = ok(kernel.execute("import pandas as pd\npd.DataFrame({'city': ['Oslo'], 'n': [3]})"))
    [result] = run.of_type("execute_result")
    assert "<table" in result["data"]["text/html"]
    assert "Oslo" in result["data"]["text/html"]
    assert "Oslo" in result["data"]["text/plain"]


# -- errors -------------------------------------------------------------------------------------


def test_exception_reports_error_message_and_reply(kernel: Kernel) -> None:
    """The user sees their own line in the traceback, not the kernel's machinery."""
    run = kernel.execute("limit = 3\nraise ValueError(f'limit was {limit}')")
    error = error_of(run)
    assert error["ename"] == run.content["ename"] == "ValueError"
    assert error["evalue"] == run.content["evalue"] == "limit was 3"
    assert error["traceback"] == run.content["traceback"]
    assert "raise ValueError(f'limit was {limit}')" in shown(error["traceback"])
    assert_no_kernel_frames(error["traceback"])


def test_exception_in_library_shows_no_host_paths(kernel: Kernel) -> None:
    """Frames from the guest's stdlib are fine; nothing may reveal the host's file system."""
    run = kernel.execute("import json\njson.loads('{not json')")
    error = error_of(run)
    assert error["ename"] == "JSONDecodeError"
    assert "json.loads('{not json')" in shown(error["traceback"])
    assert_no_kernel_frames(error["traceback"])


def test_syntax_error_is_reported(kernel: Kernel) -> None:
    run = kernel.execute("def broken(:\n    pass")
    error = error_of(run)
    assert error["ename"] == "SyntaxError"
    assert "def broken(:" in shown(error["traceback"])
    assert_no_kernel_frames(error["traceback"])


def test_traceback_spans_cells(kernel: Kernel) -> None:
    """An error inside a function from an earlier cell shows both cells' source lines."""
    definition = ok(kernel.execute("def ratio(a, b):\n    return a / b"))
    run = kernel.execute("ratio(1, 0)")
    error = error_of(run)
    assert error["ename"] == "ZeroDivisionError"
    text = shown(error["traceback"])
    assert "ratio(1, 0)" in text
    assert "return a / b" in text
    assert f"In[{definition.content['execution_count']}]" in text
    assert f"In[{run.content['execution_count']}]" in text
    assert_no_kernel_frames(error["traceback"])


def test_kernel_keeps_working_after_error(kernel: Kernel) -> None:
    kernel.execute("1 / 0")
    assert ok(kernel.execute("'still alive'")).result_text() == "'still alive'"


# -- display ------------------------------------------------------------------------------------


def test_display_sends_display_data(kernel: Kernel) -> None:
    run = ok(kernel.execute("display('shown'); display(7, {'k': 'v'})"))
    shown = [c["data"]["text/plain"] for c in run.of_type("display_data")]
    assert shown == ["'shown'", "7", "{'k': 'v'}"]
    assert run.of_type("execute_result") == []  # display() returns None


def test_display_handle_update_reuses_display_id(kernel: Kernel) -> None:
    """Progress-style output: a handle updates the output it created, in a later cell too."""
    first = ok(kernel.execute("progress = display('0%', display_id=True)"))
    [created] = first.of_type("display_data")
    display_id = created["transient"]["display_id"]
    assert display_id
    second = ok(kernel.execute("progress.update('100%')"))
    [updated] = second.of_type("update_display_data")
    assert updated["transient"]["display_id"] == display_id
    assert updated["data"]["text/plain"] == "'100%'"
    assert second.of_type("display_data") == []


def test_clear_output_message(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "from IPython.display import clear_output\nprint('gone')\nclear_output(wait=True)"
        )
    )
    assert run.of_type("clear_output") == [{"wait": True}]


# -- stdin --------------------------------------------------------------------------------------


def test_input_round_trip(kernel: Kernel) -> None:
    run, requests = execute_answering(
        kernel, "answer = input('Your name: ')\nprint('hello', answer)", ["Ada"]
    )
    ok(run)
    [prompt] = requests
    assert prompt["msg_type"] == "input_request"
    assert prompt["content"] == {"prompt": "Your name: ", "password": False}
    assert run.stream_text() == "hello Ada\n"


def test_getpass_sets_password_flag(kernel: Kernel) -> None:
    run, requests = execute_answering(
        kernel,
        "import getpass\nsecret = getpass.getpass('Token: ')\nlen(secret), secret[::-1]",
        ["s3cret"],
    )
    ok(run)
    [prompt] = requests
    assert prompt["content"] == {"prompt": "Token: ", "password": True}
    assert plain(run) == (6, "terc3s")


def test_several_inputs_in_one_cell(kernel: Kernel) -> None:
    run, requests = execute_answering(
        kernel, "a = int(input('a? '))\nb = int(input('b? '))\na * b", ["6", "7"]
    )
    assert [r["content"]["prompt"] for r in requests] == ["a? ", "b? "]
    assert plain(ok(run)) == 42


@pytest.mark.parametrize("code", ["input('never answered: ')", "import getpass; getpass.getpass()"])
def test_input_without_stdin_fails_fast(kernel: Kernel, code: str) -> None:
    """With allow_stdin=False the cell must raise at once instead of waiting forever."""
    run = kernel.execute(code, timeout=30, allow_stdin=False)
    error = error_of(run)
    assert error["ename"] == "StdinNotImplementedError"
    assert_no_kernel_frames(error["traceback"])


# -- completion, inspection, is_complete -----------------------------------------------------------


def test_complete_module_name_in_import(start_kernel: Any) -> None:
    """In a fresh interpreter `import nu<TAB>` must offer installed modules, e.g. numpy."""
    fresh = start_kernel()
    assert plain(ok(fresh.execute("'numpy' in globals()"))) is False
    reply = request(fresh, "complete", "import nu", 9)["content"]
    assert reply["status"] == "ok"
    assert "numpy" in reply["matches"]
    assert (reply["cursor_start"], reply["cursor_end"]) == (7, 9)


def test_complete_user_variable(kernel: Kernel) -> None:
    ok(kernel.execute("my_variable_123 = 1"))
    reply = request(kernel, "complete", "my_var", 6)["content"]
    assert "my_variable_123" in reply["matches"]
    assert (reply["cursor_start"], reply["cursor_end"]) == (0, 6)


def test_complete_attribute(kernel: Kernel) -> None:
    ok(kernel.execute("import math"))
    reply = request(kernel, "complete", "math.sq", 7)["content"]
    assert "sqrt" in reply["matches"]
    assert reply["cursor_start"] == 5  # the replacement starts at `sq`, after the dot
    assert reply["cursor_end"] == 7


def test_complete_with_cursor_in_the_middle(kernel: Kernel) -> None:
    """Only the text before the cursor counts; code after it is left alone."""
    ok(kernel.execute("import math\nmy_variable_123 = 1"))
    code = "x = math.fl + 1\nprint(my_variable_123)"
    cursor = code.index(".fl") + 3
    reply = request(kernel, "complete", code, cursor)["content"]
    assert "floor" in reply["matches"]
    assert "my_variable_123" not in reply["matches"]
    assert reply["cursor_start"] == cursor - 2
    assert reply["cursor_end"] == cursor


def test_inspect_builtin(kernel: Kernel) -> None:
    reply = request(kernel, "inspect", "len", 3)["content"]
    assert reply["status"] == "ok"
    assert reply["found"] is True
    text = reply["data"]["text/plain"]
    assert "len(obj, /)" in text
    assert "Return the number of items in a container." in text


def test_inspect_user_function(kernel: Kernel) -> None:
    ok(
        kernel.execute(
            "def greet(name, punctuation='!'):\n"
            "    '''Say hello to someone by name.'''\n"
            "    return 'hello ' + name + punctuation"
        )
    )
    for code, cursor in [("greet", 3), ("greet(", 6), ("greet('Ada', ", 13)]:
        reply = request(kernel, "inspect", code, cursor)["content"]
        assert reply["found"] is True, code
        text = shown([reply["data"]["text/plain"]])
        assert "greet(name, punctuation='!')" in text
        assert "Say hello to someone by name." in text


def test_inspect_unknown_name(kernel: Kernel) -> None:
    reply = request(kernel, "inspect", "no_such_name_anywhere", 5)["content"]
    assert reply["status"] == "ok"
    assert reply["found"] is False


@pytest.mark.parametrize(
    ("code", "status", "indent"),
    [
        ("x = 1", "complete", None),
        ("for item in range(3):\n    print(item)\n", "complete", None),
        ("for item in range(3):", "incomplete", "    "),
        ("if True:\n    def inner():", "incomplete", "        "),
        ("items = [1,\n", "incomplete", ""),
        ("def broken(:", "invalid", None),
        ("1 +* 2", "invalid", None),
    ],
)
def test_is_complete(kernel: Kernel, code: str, status: str, indent: str | None) -> None:
    reply = request(kernel, "is_complete", code)["content"]
    assert reply["status"] == status
    if indent is not None:
        assert reply["indent"] == indent


# -- history --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def history_kernel(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A kernel with a private history file, so other kernels' cells cannot interleave."""
    history_file = tmp_path_factory.mktemp("history") / "history.sqlite"
    started = Kernel(env={"WASM_KERNEL_HISTORY_FILE": str(history_file)})
    marker = uuid.uuid4().hex[:8]
    cells = [f"history_{marker}_a = 1", "unrelated = 2", f"history_{marker}_b = 3"]
    counts = [ok(started.execute(cell)).content["execution_count"] for cell in cells]
    yield started, marker, cells, counts
    started.shutdown()


def test_history_tail(history_kernel: Any) -> None:
    started, _, cells, counts = history_kernel
    reply = request(started, "history", hist_access_type="tail", n=3, output=False, raw=True)
    history = reply["content"]["history"]
    assert [entry[2] for entry in history] == cells
    assert [entry[1] for entry in history] == counts


def test_history_range_of_current_session(history_kernel: Any) -> None:
    started, _, cells, counts = history_kernel
    reply = request(
        started,
        "history",
        hist_access_type="range",
        session=0,
        start=counts[1],
        stop=counts[2] + 1,
        output=False,
        raw=True,
    )
    history = reply["content"]["history"]
    assert [(entry[1], entry[2]) for entry in history] == list(
        zip(counts[1:], cells[1:], strict=True)
    )


def test_history_search_glob(history_kernel: Any) -> None:
    started, marker, cells, _ = history_kernel
    reply = request(
        started,
        "history",
        hist_access_type="search",
        pattern=f"history_{marker}_*",
        output=False,
        raw=True,
    )
    assert [entry[2] for entry in reply["content"]["history"]] == [cells[0], cells[2]]


# -- kernel information ---------------------------------------------------------------------------


def test_comm_info(kernel: Kernel) -> None:
    reply = request(kernel, "comm_info")["content"]
    assert reply["status"] == "ok"
    assert isinstance(reply["comms"], dict)


def test_kernel_info(kernel: Kernel) -> None:
    reply = request(kernel, "kernel_info")["content"]
    assert reply["status"] == "ok"
    info = reply["language_info"]
    assert info["name"] == "python"
    assert info["version"].startswith("3.15")
    assert info["mimetype"] == "text/x-python"
    assert info["file_extension"] == ".py"
    assert reply["banner"].strip()


def test_kernel_info_version_matches_interpreter(kernel: Kernel) -> None:
    """The advertised version is the guest's own, not the host's."""
    reply = request(kernel, "kernel_info")["content"]
    guest = plain(ok(kernel.execute("import platform; platform.python_version()")))
    assert reply["language_info"]["version"] == guest


def test_kernel_info_offers_the_debugger(kernel: Kernel) -> None:
    """JupyterLab turns its debugger panel on for this feature (see test_debug_protocol)."""
    reply = request(kernel, "kernel_info")["content"]
    assert "debugger" in reply["supported_features"]
    assert kernel.manager.kernel_spec.metadata["debugger"] is True


# -- scientific stack ---------------------------------------------------------------------------


def test_numpy(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "import numpy as np\n"
            "m = np.array([[2.0, 1.0], [1.0, 3.0]])\n"
            "x = np.linalg.solve(m, np.array([3.0, 5.0]))\n"
            "x.round(6).tolist(), int(np.arange(10).sum())"
        )
    )
    assert plain(run) == ([0.8, 1.4], 45)


def test_pandas(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "import pandas as pd\n"
            "df = pd.DataFrame({'g': ['a', 'b', 'a'], 'v': [1, 2, 3]})\n"
            "df.groupby('g')['v'].sum().to_dict()"
        )
    )
    assert plain(run) == {"a": 4, "b": 2}


def test_scipy(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "from scipy import integrate, optimize\n"
            "area, _ = integrate.quad(lambda t: t ** 2, 0, 3)\n"
            "root = optimize.brentq(lambda t: t ** 2 - 2, 0, 2)\n"
            "round(area, 9), round(root, 9)"
        )
    )
    assert plain(run) == (9.0, 1.414213562)


@pytest.mark.slow
def test_matplotlib_renders_png(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "import io\n"
            "import matplotlib\n"
            "matplotlib.use('Agg')\n"
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots()\n"
            "ax.plot([0, 1, 2], [0, 1, 4])\n"
            "buffer = io.BytesIO()\n"
            "fig.savefig(buffer, format='png')\n"
            "plt.close(fig)\n"
            "buffer.getvalue()[:8], len(buffer.getvalue())"
        )
    )
    signature, size = plain(run)
    assert signature == PNG_SIGNATURE
    assert size > 1000


# -- malformed and edge-case requests -------------------------------------------------------------


@pytest.mark.parametrize("cursor", [1000, -5])
def test_complete_with_out_of_range_cursor(kernel: Kernel, cursor: int) -> None:
    reply = request(kernel, "complete", "pri", cursor)["content"]
    assert reply["status"] == "ok"
    assert isinstance(reply["matches"], list)
    assert 0 <= reply["cursor_start"] <= reply["cursor_end"] <= len("pri")


@pytest.mark.parametrize("cursor", [1000, -5])
def test_inspect_with_out_of_range_cursor(kernel: Kernel, cursor: int) -> None:
    reply = request(kernel, "inspect", "len", cursor)["content"]
    assert reply["status"] == "ok"
    assert isinstance(reply["found"], bool)
    assert isinstance(reply["data"], dict)


@pytest.mark.parametrize("code", ["", "   \n\n", "# only a comment"])
def test_execute_empty_code(kernel: Kernel, code: str) -> None:
    run = ok(kernel.execute(code))
    assert run.of_type("execute_result") == []
    assert run.of_type("error") == []


# -- restart and shutdown -------------------------------------------------------------------------


@pytest.mark.slow
def test_restart_gives_fresh_interpreter(start_kernel: Any) -> None:
    own = start_kernel()
    ok(own.execute("survivor = 'from before the restart'"))
    own.manager.restart_kernel()
    own.client.wait_for_ready(timeout=120)
    assert plain(ok(own.execute("'survivor' in globals()"))) is False
    error = error_of(own.execute("survivor"))
    assert error["ename"] == "NameError"
    assert plain(ok(own.execute("21 * 2"))) == 42


@pytest.mark.parametrize("attempt", range(3))
def test_shutdown_request_ends_the_process_gracefully(attempt: int) -> None:
    """After shutdown_reply the kernel must exit by itself within jupyter_client's grace period.

    Jupyter waits ``shutdown_wait_time`` and then terminates the process; a kernel that needs
    that is not shutting down cleanly. Repeated because a race at exit shows only sometimes.
    """
    manager = KernelManager(kernel_name=KERNEL_NAME)
    manager.start_kernel()
    client = manager.client()
    process = manager.provisioner.process
    try:
        client.start_channels()
        client.wait_for_ready(timeout=120)
        assert (
            client.execute_interactive("1", timeout=60, output_hook=lambda _: None)["content"][
                "status"
            ]
            == "ok"
        )
        msg_id = client.shutdown()
        reply = client.get_control_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"] == {"status": "ok", "restart": False}
        try:
            exit_code = process.wait(timeout=manager.shutdown_wait_time)
        except subprocess.TimeoutExpired:
            exit_code = None
        assert exit_code == 0, "the kernel did not exit by itself after shutdown_reply"
    finally:
        client.stop_channels()
        if process.poll() is None:
            manager.shutdown_kernel(now=True)
        else:
            manager.cleanup_resources()


def test_carriage_returns_and_long_lines_pass_through(kernel: Kernel) -> None:
    """tqdm's \\r progress bars and very long lines reach the client unchanged."""
    run = ok(
        kernel.execute(
            "from tqdm import tqdm\n"
            "for _ in tqdm(range(3), mininterval=0):\n"
            "    pass\n"
            "print('y' * 200_000)"
        )
    )
    progress = run.stream_text("stderr")
    assert "\r" in progress and "100%" in progress and "3/3" in progress
    assert run.stream_text("stdout") == "y" * 200_000 + "\n"


VERSION_SHAPE = re.compile(r"\d+\.\d+\.\d+\S* \([^()]*\) \[[^\[\]]+\]")  # X.Y.Z (build) [compiler]


def test_sys_version_reads_as_natively_formatted(start_kernel: Any) -> None:
    """sys.version has the native kernel's shape, its compiler's bracket closed (CPython
    cut the runtime's long compiler description mid-word), and platform reads it."""
    code = "import sys, platform\nprint(sys.version)\nprint(platform.python_compiler())"
    native, ours = (
        ok(kernel.execute(code)).stream_text().splitlines()
        for kernel in (start_kernel(kernel_name="python3"), start_kernel())
    )
    for version, compiler in (native, ours):
        assert VERSION_SHAPE.fullmatch(version), version
        assert version.endswith(f"[{compiler}]"), (version, compiler)


@pytest.mark.parametrize("kernel_name", [NATIVE, KERNEL_NAME])
def test_values_shown_as_statements_run_arrive_while_the_cell_runs(
    start_kernel, kernel_name: str
) -> None:
    """Under ``ast_node_interactivity = 'all'`` each expression statement shows its value as it
    runs: the first reaches the client while the cell is still busy (here until interrupted),
    as on the native kernel, not when the cell sends its next message or ends."""
    kernel = start_kernel(kernel_name=kernel_name)
    ok(kernel.execute("%config InteractiveShell.ast_node_interactivity = 'all'"))
    msg_id = kernel.client.execute("6 * 7\nwhile True:\n    pass")
    while True:  # a missing result fails here, after the client's wait
        msg = kernel.client.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_result":
            break
    assert msg["content"]["data"]["text/plain"] == "42"
    kernel.manager.interrupt_kernel()
    run = kernel.collect(msg_id)
    assert run.reply["content"]["status"] == "error"
    assert run.reply["content"]["ename"] == "KeyboardInterrupt"
