"""IPython magics and shell syntax in the sandbox, checked over ZMQ through jupyter_client.

The guest runs IPython's own shell; these tests hold its magics to what ipykernel users see,
and the sandbox's refusals (processes, packages, GUIs) to one clear UsageError each.
Tests that depend on the whole namespace (``%who``, ``%reset``) get a fresh kernel; the rest
share the module's kernel; `%cd` tests get their own, since they move the working directory.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import CellRun, Kernel, ok, plain

# -- helpers ------------------------------------------------------------------------------------


def error_of(run: CellRun) -> dict:
    """The single error message of a failed cell (and it agrees with the reply). A UsageError
    is shown as ipykernel shows it: one line on stderr, no traceback, an error reply."""
    assert run.content["status"] == "error", f"cell did not fail: {run.messages}"
    if run.content["ename"] == "UsageError":
        assert run.of_type("error") == []
        assert f"UsageError: {run.content['evalue']}" in run.stream_text("stderr")
        return run.content
    errors = run.of_type("error")
    assert len(errors) == 1, errors
    assert (errors[0]["ename"], errors[0]["evalue"]) == (
        run.content["ename"],
        run.content["evalue"],
    )
    return errors[0]


def published(run: CellRun) -> list[str]:
    """Message types a cell sent to the notebook, execute_input aside."""
    return [m["msg_type"] for m in run.messages if m["msg_type"] != "execute_input"]


# -- %time, %%time --------------------------------------------------------------------------------


def test_time_statement_runs_in_user_namespace(kernel: Kernel) -> None:
    """`%time x = ...` times a statement: prints times, binds the name, shows no result."""
    run = ok(kernel.execute("%time timed_total = sum(range(1000))"))
    assert "Wall time" in run.stream_text()
    assert "CPU times" in run.stream_text()
    assert run.of_type("execute_result") == []
    assert plain(ok(kernel.execute("timed_total"))) == 499500


def test_time_expression_returns_its_value(kernel: Kernel) -> None:
    """`%time expr` prints the times and its value becomes the cell's execute_result."""
    run = ok(kernel.execute("%time sum(range(10)) * 3"))
    assert "Wall time" in run.stream_text()
    assert plain(run) == 135


def test_time_cell_magic_runs_the_body(kernel: Kernel) -> None:
    """`%%time` runs the whole cell in the user namespace and prints the times."""
    run = ok(kernel.execute("%%time\ncell_a = 20\ncell_b = cell_a + 1\nprint('body ran')"))
    assert "body ran" in run.stream_text()
    assert "Wall time" in run.stream_text()
    assert plain(ok(kernel.execute("cell_a, cell_b"))) == (20, 21)


def test_time_cell_magic_shows_last_expression(kernel: Kernel) -> None:
    """IPython's `%%time` returns the value of a multi-line cell's last expression (Out[n])."""
    run = ok(kernel.execute("%%time\nlast_base = 6\nlast_base * 7"))
    assert "Wall time" in run.stream_text()
    assert run.result_text() == "42"


# -- %timeit, %%timeit ----------------------------------------------------------------------------


def test_timeit_prints_mean_and_std(kernel: Kernel) -> None:
    """Default `%timeit` prints IPython's summary line."""
    run = ok(kernel.execute("%timeit -r 2 sum(range(10))"))
    assert "per loop (mean ± std. dev. of" in run.stream_text()
    assert run.of_type("execute_result") == []


def test_timeit_respects_loops_and_repeats(kernel: Kernel) -> None:
    """`-n 5 -r 2` must be what ran, and what the summary says."""
    run = ok(kernel.execute("%timeit -n 5 -r 2 sum(range(10))"))
    assert re.search(
        r"per loop \(mean ± std\. dev\. of 2 runs, 5 loops each\)", run.stream_text()
    ), run.stream_text()


def test_timeit_counts_its_runs(kernel: Kernel) -> None:
    """The statement runs exactly n*r times when both are given (setup aside)."""
    ok(kernel.execute("timeit_calls = []"))
    ok(kernel.execute("%timeit -n 3 -r 4 timeit_calls.append(1)"))
    assert plain(ok(kernel.execute("len(timeit_calls)"))) == 12


def test_timeit_output_object_is_usable_in_next_cell(kernel: Kernel) -> None:
    """`%timeit -o` returns a TimeitResult; its loops/repeat/best are readable afterwards."""
    run = ok(kernel.execute("%timeit -o -n 4 -r 3 sum(range(10))"))
    assert run.result_text() is not None and "per loop" in run.result_text()
    values = plain(
        ok(
            kernel.execute(
                "_.loops, _.repeat, isinstance(_.best, float) and _.best > 0, len(_.all_runs)"
            )
        )
    )
    assert values == (4, 3, True, 3)


def test_timeit_output_assigned_with_magic_syntax(kernel: Kernel) -> None:
    """IPython's `res = %timeit -o ...` (magic on the right of `=`) stores the result."""
    run = ok(kernel.execute("timeit_res = %timeit -o -q -n 2 -r 2 sum(range(10))"))
    assert published(run) == []
    assert plain(ok(kernel.execute("timeit_res.loops, timeit_res.repeat"))) == (2, 2)


def test_timeit_quiet_prints_nothing(kernel: Kernel) -> None:
    """`-q` suppresses the summary line entirely."""
    run = ok(kernel.execute("%timeit -q -n 3 -r 2 sum(range(10))"))
    assert published(run) == []


def test_timeit_cell_magic_uses_setup_from_magic_line(kernel: Kernel) -> None:
    """`%%timeit SETUP` runs the setup first; the body can use what it defines."""
    code = "%%timeit -n 2 -r 3 setup_only_list = list(range(50))\nsum(setup_only_list)"
    run = ok(kernel.execute(code))
    assert re.search(r"of 3 runs, 2 loops each", run.stream_text()), run.stream_text()
    # The setup is timeit's own, not the user's: the name does not leak into the namespace.
    assert plain(ok(kernel.execute("'setup_only_list' in globals()"))) is False


# -- %who, %whos, %reset (fresh kernels: they see the whole namespace) ----------------------------


def test_who_lists_user_names_only(start_kernel: Any) -> None:
    """`%who` lists what the user defined, never kernel-provided names like get_ipython."""
    fresh = start_kernel()
    assert ok(fresh.execute("%who")).stream_text().strip() == "Interactive namespace is empty."
    ok(fresh.execute("alpha = 1\nbeta = 'two'\ndef gamma(): pass"))
    names = ok(fresh.execute("%who")).stream_text().split()
    assert names == ["alpha", "beta", "gamma"]


def test_who_filters_by_type(start_kernel: Any) -> None:
    """`%who int` lists only names bound to ints."""
    fresh = start_kernel()
    ok(fresh.execute("n1 = 1\nn2 = 2\ntext = 'x'\nratio = 0.5"))
    assert ok(fresh.execute("%who int")).stream_text().split() == ["n1", "n2"]
    assert ok(fresh.execute("%who str float")).stream_text().split() == ["ratio", "text"]


def test_whos_table(start_kernel: Any) -> None:
    """`%whos` shows a Variable/Type/Data table of user names, without get_ipython."""
    fresh = start_kernel()
    ok(fresh.execute("count = 42\nlabel = 'hello'"))
    text = ok(fresh.execute("%whos")).stream_text()
    lines = text.splitlines()
    assert lines[0].split() == ["Variable", "Type", "Data/Info"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:] if line.strip()}
    assert rows == {"count": ["int", "42"], "label": ["str", "hello"]}  # as IPython shows
    assert "get_ipython" not in text


def test_reset_force_removes_user_names(start_kernel: Any) -> None:
    """`%reset -f` deletes user variables without asking; the kernel keeps working."""
    fresh = start_kernel()
    ok(fresh.execute("doomed = 1\nimport json"))
    ok(fresh.execute("%reset -f"))
    err = error_of(fresh.execute("doomed"))
    assert err["ename"] == "NameError"
    assert ok(fresh.execute("%who")).stream_text().strip() == "Interactive namespace is empty."
    assert plain(ok(fresh.execute("get_ipython() is not None"))) is True


def test_reset_without_force_needs_stdin(start_kernel: Any) -> None:
    """`%reset` asks for confirmation; with allow_stdin=False it fails cleanly, state intact."""
    fresh = start_kernel()
    ok(fresh.execute("kept = 5"))
    err = error_of(fresh.execute("%reset", allow_stdin=False))
    assert err["ename"] == "StdinNotImplementedError"
    assert plain(ok(fresh.execute("kept"))) == 5


# -- %pwd, %cd ------------------------------------------------------------------------------------


def test_pwd_returns_cwd_string(kernel: Kernel) -> None:
    """`%pwd` returns the guest's working directory as a str (execute_result)."""
    value = plain(ok(kernel.execute("%pwd")))
    assert isinstance(value, str) and value.startswith("/")
    assert plain(ok(kernel.execute("import os\nos.getcwd()"))) == value


def test_cd_changes_directory_for_relative_paths(start_kernel: Any) -> None:
    """After `%cd /tmp`, `%pwd` is /tmp and a relative open() lands there."""
    fresh = start_kernel()
    run = ok(fresh.execute("%cd /tmp"))
    assert run.stream_text().strip() == "/tmp"
    assert plain(ok(fresh.execute("%pwd"))) == "/tmp"
    ok(fresh.execute("with open('cd_probe.txt', 'w') as fh:\n    fh.write('here')"))
    assert plain(ok(fresh.execute("open('/tmp/cd_probe.txt').read()"))) == "here"


def test_cd_back_to_starting_directory(start_kernel: Any) -> None:
    """The directory `%pwd` reported at start must be one `%cd` can return to."""
    fresh = start_kernel()
    start = plain(ok(fresh.execute("%pwd")))
    ok(fresh.execute("%cd /tmp"))
    ok(fresh.execute(f"%cd {start}"))
    assert plain(ok(fresh.execute("%pwd"))) == start


def test_cd_to_missing_folder_says_so_and_stays_put(kernel: Kernel) -> None:
    """`%cd` to a folder that does not exist prints why and stays put (as IPython does)."""
    before = plain(ok(kernel.execute("%pwd")))
    run = ok(kernel.execute("%cd /no/such/folder/here"))
    assert "No such file or directory: '/no/such/folder/here'" in run.stream_text()
    assert plain(ok(kernel.execute("%pwd"))) == before


# -- %env -----------------------------------------------------------------------------------------


def test_env_returns_guest_environment(kernel: Kernel) -> None:
    """Bare `%env` returns a dict of the guest's environment, HOME included."""
    run = ok(kernel.execute("%env"))
    assert "'HOME'" in (run.result_text() or "")
    check = "import os\ntype(_).__name__, _ == dict(os.environ), 'HOME' in _"
    assert plain(ok(kernel.execute(check))) == ("dict", True, True)


def test_env_set_and_get(kernel: Kernel) -> None:
    """`%env NAME=value` sets it in os.environ; `%env NAME` reads it back."""
    run = ok(kernel.execute("%env WK_MAGIC_TEST=some value"))
    assert "WK_MAGIC_TEST" in run.stream_text()
    assert plain(ok(kernel.execute("%env WK_MAGIC_TEST"))) == "some value"
    assert plain(ok(kernel.execute("import os\nos.environ['WK_MAGIC_TEST']"))) == "some value"


# -- %matplotlib ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_matplotlib_inline_accepted(kernel: Kernel) -> None:
    """`%matplotlib inline` succeeds and selects the inline backend."""
    run = ok(kernel.execute("%matplotlib inline"))
    assert published(run) == []
    backend = plain(ok(kernel.execute("import matplotlib\nmatplotlib.get_backend()")))
    assert "inline" in backend


def test_matplotlib_gui_backend_is_usage_error(kernel: Kernel) -> None:
    """A GUI backend cannot work in the sandbox: UsageError that points to inline."""
    err = error_of(kernel.execute("%matplotlib qt"))
    assert err["ename"] == "UsageError"
    assert "inline" in err["evalue"]


# -- %load_ext ------------------------------------------------------------------------------------

EXTENSION = """
import sys
source = (
    "calls = []\\n"
    "def load_ipython_extension(ip):\\n"
    "    calls.append(ip)\\n"
    "    ip.user_ns['ext_was_given'] = ip\\n"
    "    print('extension loaded')\\n"
)
with open('/tmp/wk_demo_extension.py', 'w') as fh:
    fh.write(source)
with open('/tmp/wk_not_extension.py', 'w') as fh:
    fh.write('VALUE = 1\\n')
if '/tmp' not in sys.path:
    sys.path.insert(0, '/tmp')
"""


def test_load_ext_calls_load_ipython_extension(kernel: Kernel) -> None:
    """`%load_ext mod` imports mod and calls load_ipython_extension(shell) once."""
    ok(kernel.execute(EXTENSION))
    run = ok(kernel.execute("%load_ext wk_demo_extension"))
    assert "extension loaded" in run.stream_text()
    check = "import wk_demo_extension\nlen(wk_demo_extension.calls), ext_was_given is get_ipython()"
    assert plain(ok(kernel.execute(check))) == (1, True)


def test_load_ext_without_entry_point_says_so(kernel: Kernel) -> None:
    """A module without load_ipython_extension is not an extension (as IPython says)."""
    ok(kernel.execute(EXTENSION))
    run = ok(kernel.execute("%load_ext wk_not_extension"))
    assert "wk_not_extension module is not an IPython extension" in run.stream_text()


# -- %%capture ------------------------------------------------------------------------------------

CAPTURED_CELL = """%%capture captured
import sys
print('captured text')
print('captured err', file=sys.stderr)
display({'k': 1})
from IPython.display import HTML
display(HTML('<b>captured html</b>'))
"""


def test_capture_publishes_nothing_and_keeps_everything(kernel: Kernel) -> None:
    """`%%capture out` swallows stdout, stderr and displays; `out` holds them all."""
    run = ok(kernel.execute(CAPTURED_CELL))
    assert published(run) == []
    assert plain(ok(kernel.execute("captured.stdout, captured.stderr"))) == (
        "captured text\n",
        "captured err\n",
    )
    mimes = plain(ok(kernel.execute("[sorted(o.data) for o in captured.outputs]")))
    assert mimes == [["text/plain"], ["text/html", "text/plain"]]


def test_capture_show_replays_outputs(kernel: Kernel) -> None:
    """`out.show()` in a later cell publishes what was captured, in kind."""
    ok(kernel.execute(CAPTURED_CELL))
    run = ok(kernel.execute("captured.show()"))
    assert run.stream_text("stdout") == "captured text\n"
    assert run.stream_text("stderr") == "captured err\n"
    displays = run.of_type("display_data")
    assert [d["data"].get("text/html") for d in displays] == [None, "<b>captured html</b>"]
    assert displays[0]["data"]["text/plain"] == "{'k': 1}"


def test_capture_also_captures_last_expression(kernel: Kernel) -> None:
    """IPython's %%capture swaps the displayhook too: a trailing expression is captured."""
    run = ok(kernel.execute("%%capture captured_expr\nprint('p')\n40 + 2"))
    assert published(run) == []
    texts = plain(ok(kernel.execute("[o.data.get('text/plain') for o in captured_expr.outputs]")))
    assert texts == ["42"]


# -- packages and processes -----------------------------------------------------------------------


def test_pip_list_shows_shipped_versions(kernel: Kernel) -> None:
    """`%pip list` prints a Package/Version table whose versions are the importable ones."""
    text = ok(kernel.execute("%pip list")).stream_text()
    assert text.splitlines()[0].split() == ["Package", "Version"]
    table = dict(line.split()[:2] for line in text.splitlines()[2:] if line.strip())
    actual = plain(
        ok(kernel.execute("import numpy, pandas\nnumpy.__version__, pandas.__version__"))
    )
    assert (table.get("numpy"), table.get("pandas")) == actual


@pytest.mark.parametrize(
    ("code", "phrase"),
    [
        ("%conda install x", "no processes"),
        ("!ls", "cannot start processes"),
        ("x_before_bang = 1\n!echo hi", "cannot start processes"),
        ("%%bash\necho hi", "cannot start processes"),
        ("%%script python3\nprint(1)", "cannot start processes"),
        ("x = !ls", "cannot start processes"),
        ("%gui qt", "no GUI"),
    ],
)
def test_process_syntax_is_usage_error(kernel: Kernel, code: str, phrase: str) -> None:
    """Shell escapes, process magics and GUIs end in a UsageError that says why, on one
    line."""
    err = error_of(kernel.execute(code))
    assert err["ename"] == "UsageError"
    assert phrase in err["evalue"]


def test_matplotlib_notebook_falls_back_to_inline_with_a_notice(kernel: Kernel) -> None:
    run = ok(kernel.execute("%matplotlib notebook\nimport matplotlib\nmatplotlib.get_backend()"))
    assert "figures are shown inline" in run.stream_text("stderr")
    assert plain(run) == "inline"


# -- unknown magics and the rewriting itself ------------------------------------------------------


def test_unknown_line_magic(kernel: Kernel) -> None:
    """An unknown line magic gives IPython's exact message."""
    err = error_of(kernel.execute("%nosuchmagic"))
    assert err["ename"] == "UsageError"
    assert err["evalue"] == "Line magic function `%nosuchmagic` not found."


def test_unknown_cell_magic(kernel: Kernel) -> None:
    """An unknown cell magic gives IPython's exact message."""
    err = error_of(kernel.execute("%%nosuchcell\nx = 1"))
    assert err["ename"] == "UsageError"
    assert err["evalue"] == "Cell magic `%%nosuchcell` not found."


def test_modulo_operator_is_not_rewritten(kernel: Kernel) -> None:
    """Valid Python using `%` (operator, %-format on a line of its own) runs untouched."""
    assert plain(ok(kernel.execute("mod_x = 10 % 3\nmod_x"))) == 1
    code = "fmt = '''\n%d items\n''' % 3\nfmt"
    assert plain(ok(kernel.execute(code))) == "\n3 items\n"


def test_magic_inside_indented_block(kernel: Kernel) -> None:
    """A line magic inside an `if` block keeps its indentation and runs."""
    run = ok(kernel.execute("if True:\n    %time indented_y = 1\nindented_y + 1"))
    assert "Wall time" in run.stream_text()
    assert plain(run) == 2


def test_run_line_magic_from_code(kernel: Kernel) -> None:
    """get_ipython().run_line_magic works from ordinary code and returns the value."""
    run = ok(kernel.execute("import os\nget_ipython().run_line_magic('pwd', '') == os.getcwd()"))
    assert plain(run) is True


# -- IPython's input transformations --------------------------------------------------------

TRANSFORMED_CELLS = [
    "x + 1",
    "x = 1\ny = 2\n",
    "  indented = 1\n  more = 2",
    "\n\nafter_blank_lines = 1",
    "%time x",
    "x = %pwd",
    "x = !ls",
    "len?",
    "len??",
    "/len 'ab'",
    ",print a b",
    ";print a b",
    "a = 10 % 3",
    "d = 4 / 2",
    "f(1,\n  2)",
    ">>> x = 1\n... y = 2",
    "In [1]: x = 1",
    "'%' + '!' + '?'",
    "%%time\nx = 1",
    "for i in range(2):\n    !echo hi",
    "s = '''\n%not_a_magic\n'''",
]


def test_cells_transform_as_with_ipythons_own_manager(kernel: Kernel) -> None:
    """The sandbox's transformer manager skips tokenizing cells its token transformers cannot
    change: every kind of cell still comes out as IPython's stock manager makes it."""
    code = (
        "from IPython.core.inputtransformer2 import TransformerManager\n"
        "_mine, _stock = get_ipython().input_transformer_manager, TransformerManager()\n"
        f"print(type(_mine).__name__, [c for c in {TRANSFORMED_CELLS!r}"
        " if _mine.transform_cell(c) != _stock.transform_cell(c)])\n"
        "del _mine, _stock"
    )
    assert ok(kernel.execute(code)).stream_text() == "CellTransformerManager []\n"


def test_a_token_transformer_the_user_adds_runs(kernel: Kernel) -> None:
    setup = (
        "from IPython.core.inputtransformer2 import TokenTransformBase\n"
        "class Greeting(TokenTransformBase):\n"
        "    @classmethod\n"
        "    def find(cls, tokens_by_line):\n"
        "        for line in tokens_by_line:\n"
        "            for token in line:\n"
        "                if token.string == 'greet_me':\n"
        "                    return cls(token.start)\n"
        "    def transform(self, lines):\n"
        "        return [line.replace('greet_me', 'print(\"hello\")') for line in lines]\n"
        "get_ipython().input_transformer_manager.token_transformers.append(Greeting)"
    )
    ok(kernel.execute(setup))
    try:
        assert ok(kernel.execute("greet_me")).stream_text() == "hello\n"
    finally:
        ok(kernel.execute("get_ipython().input_transformer_manager.token_transformers.pop()"))
