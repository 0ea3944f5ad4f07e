"""Error tracebacks as IPython shows them, checked over ZMQ through jupyter_client.

Notebook frontends print the ``traceback`` list of an error message verbatim (ANSI colours
included), so its text is the user's only view of what went wrong: it must name cells as
``Cell In[N], line L``, point at the failing line, keep chained causes in order, and never
show the kernel's own guest code.
"""

from __future__ import annotations

import re

import pytest
from conftest import Kernel, ok

ANSI = re.compile(r"\x1b\[[0-9;]*m")


# -- helpers ------------------------------------------------------------------------------------


def failure(kernel: Kernel, code: str) -> tuple[dict, int]:
    """Run a cell that must fail; return its single error message and execution count."""
    run = kernel.execute(code)
    assert run.content["status"] == "error", f"cell did not fail: {run.messages}"
    errors = run.of_type("error")
    assert len(errors) == 1, errors
    assert errors[0]["traceback"] == run.content["traceback"]
    return errors[0], run.content["execution_count"]


def raw(error: dict) -> str:
    return "\n".join(error["traceback"])


def text(error: dict) -> str:
    """The traceback as a user reads it: colours removed."""
    return ANSI.sub("", raw(error))


def position(haystack: str, needle: str, start: int = 0) -> int:
    """Index of ``needle`` in ``haystack`` (after ``start``), failing loudly when absent."""
    index = haystack.find(needle, start)
    assert index >= 0, f"{needle!r} not found in:\n{haystack[start:]}"
    return index


# -- basic layout -------------------------------------------------------------------------------


def test_traceback_has_ansi_colours(kernel: Kernel) -> None:
    """Frontends render IPython's colours: the traceback carries ANSI escape codes."""
    error, _ = failure(kernel, "1 / 0")
    assert "\x1b[" in raw(error)
    assert "Traceback (most recent call last)" in text(error)


def test_cell_label_uses_execution_count(kernel: Kernel) -> None:
    """Frames of a cell are labelled `Cell In[N], line L` with that cell's count."""
    error, count = failure(kernel, "first_line = 1\nsecond_line = 2\nraise RuntimeError('x')")
    assert f"Cell In[{count}], line 3" in text(error)


def test_failing_line_has_arrow(kernel: Kernel) -> None:
    """The failing source line is shown, marked with IPython's `---->` arrow and line number."""
    error, _ = failure(kernel, "arrow_a = 1\narrow_b = arrow_a / 0\narrow_c = 3")
    lines = text(error).splitlines()
    assert any(re.fullmatch(r"-+> 2 arrow_b = arrow_a / 0", line) for line in lines), lines
    assert any(line.startswith("----> ") for line in lines), lines
    # Context lines are shown without the arrow.
    assert any(re.fullmatch(r"\s+1 arrow_a = 1", line) for line in lines), lines


def test_frames_from_two_cells(kernel: Kernel) -> None:
    """A function defined in one cell and called from another: both cells' frames appear."""
    define = ok(kernel.execute("def divide_by(d):\n    scale = 10\n    return scale / d"))
    define_count = define.content["execution_count"]
    error, call_count = failure(kernel, "prepared = 0\ndivide_by(prepared)")
    shown = text(error)
    caller = position(shown, f"Cell In[{call_count}], line 2")
    callee = position(shown, f"Cell In[{define_count}], line 3", caller)
    assert "divide_by(prepared)" in shown[caller:callee]
    assert "return scale / d" in shown[callee:]
    assert error["ename"] == "ZeroDivisionError"


def test_no_kernel_frames(kernel: Kernel) -> None:
    """Errors that pass through the kernel's guest code (magics, display hooks, capture,
    input) show the user's frames only, never `<wasm-kernel...>` files."""
    cells = [
        "1 / 0",
        "%time 1 / 0",
        "%%capture hidden\nprint('x')\n1 / 0",
        "class BadRepr:\n    def __repr__(self):\n        raise RuntimeError('repr')\nBadRepr()",
        "input('prompt')",
        "%timeit -n 1 -r 1 1 / 0",
        "get_ipython().run_cell_magic('time', '', 'undefined_in_magic')",
    ]
    for code in cells:
        error, count = failure(kernel, code)
        assert "<wasm-kernel" not in raw(error), (code, text(error))
        # IPython names a cell run by a magic (%%capture) by the next count, natively too
        assert re.search(rf"Cell In\[({count}|{count + 1})\]", text(error)), (code, text(error))


# -- chained exceptions, notes, groups ----------------------------------------------------------


def test_explicit_chain_shows_cause_first(kernel: Kernel) -> None:
    """`raise ... from e`: the cause's traceback, the link sentence, then the new one."""
    code = (
        "try:\n"
        "    int('not a number')\n"
        "except ValueError as exc:\n"
        "    raise LookupError('wrapped failure') from exc"
    )
    error, _ = failure(kernel, code)
    shown = text(error)
    cause = position(shown, "ValueError: invalid literal for int()")
    link = position(
        shown, "The above exception was the direct cause of the following exception", cause
    )
    effect = position(shown, "LookupError: wrapped failure", link)
    assert "int('not a number')" in shown[:link]
    assert "raise LookupError('wrapped failure') from exc" in shown[link:effect]
    assert shown.count("Traceback (most recent call last)") == 2
    assert (error["ename"], error["evalue"]) == ("LookupError", "wrapped failure")


def test_implicit_chain(kernel: Kernel) -> None:
    """An error while handling another shows both, joined by Python's 'During handling'."""
    code = "try:\n    {}['missing_key']\nexcept KeyError:\n    undefined_handler_name"
    error, _ = failure(kernel, code)
    shown = text(error)
    first = position(shown, "KeyError: 'missing_key'")
    link = position(
        shown, "During handling of the above exception, another exception occurred", first
    )
    position(shown, "NameError: name 'undefined_handler_name' is not defined", link)
    assert "The above exception was the direct cause" not in shown


def test_notes_are_shown(kernel: Kernel) -> None:
    """Notes added with add_note() follow the exception line."""
    code = (
        "problem = ValueError('noted failure')\n"
        "problem.add_note('first note')\nproblem.add_note('second note')\nraise problem"
    )
    error, _ = failure(kernel, code)
    shown = text(error)
    line = position(shown, "ValueError: noted failure")
    second = position(shown, "second note", position(shown, "first note", line))
    assert second > line
    assert error["evalue"] == "noted failure"


def test_exception_group_shows_members(kernel: Kernel) -> None:
    """An ExceptionGroup lists each sub-exception with its type and message. IPython 9.18
    cannot format groups itself and prints Python's own traceback on stderr, under ipykernel
    too: the cell fails, and that text names every member."""
    code = (
        "raise ExceptionGroup('batch failed', "
        "[ValueError('first member'), TypeError('second member')])"
    )
    run = kernel.execute(code)
    assert (run.content["status"], run.content["ename"]) == ("error", "ExceptionGroup")
    shown = ANSI.sub("", "\n".join(run.content["traceback"]) + run.stream_text("stderr"))
    group = position(shown, "ExceptionGroup: batch failed (2 sub-exceptions)")
    first = position(shown, "ValueError: first member", group)
    position(shown, "TypeError: second member", first)
    assert "<wasm-kernel" not in shown


# -- syntax errors and library frames -----------------------------------------------------------


def test_syntax_error_has_cell_label_and_caret(kernel: Kernel) -> None:
    """A SyntaxError names the cell and line and points at the spot with a caret."""
    error, count = failure(kernel, "fine = 1\nbroken = (1 +\n")
    shown = text(error)
    assert error["ename"] == "SyntaxError"
    assert f"Cell In[{count}], line 2" in shown
    lines = shown.splitlines()
    source = next(i for i, line in enumerate(lines) if "broken = (1 +" in line)
    assert re.fullmatch(r"\s*\^+\s*", lines[source + 1]), lines


def test_library_frames_show_zip_path_and_line(kernel: Kernel) -> None:
    """Frames in the standard library name their file in the runtime's zip and the line."""
    error, _ = failure(kernel, "import json\njson.loads('{broken')")
    shown = text(error)
    assert re.search(r"File /usr/local/lib/python315\.zip/json/\w+\.py:\d+", shown), shown
    assert error["ename"] == "JSONDecodeError"


def test_ename_and_evalue_are_plain(kernel: Kernel) -> None:
    """The reply's ename/evalue are the bare class name and message, without colours."""
    run = kernel.execute("raise KeyError('plain key')")
    content = run.content
    assert (content["ename"], content["evalue"]) == ("KeyError", "'plain key'")
    error = run.of_type("error")[0]
    assert (error["ename"], error["evalue"]) == ("KeyError", "'plain key'")
    run = kernel.execute("class CustomProblem(Exception):\n    pass\nraise CustomProblem('own')")
    assert (run.content["ename"], run.content["evalue"]) == ("CustomProblem", "own")
    for value in (content["ename"], content["evalue"], run.content["ename"]):
        assert "\x1b" not in value


def test_refused_path_explains_the_sandbox(kernel: Kernel) -> None:
    """WASI answers a path outside the grants (or a write to a read-only one) with a bare
    EPERM; the traceback says why and where to look. Other PermissionErrors get no hint."""
    error, _ = failure(kernel, "open('/usr/local/lib/new-file', 'w')")
    assert error["ename"] == "PermissionError"
    assert "only /tmp and read-write mounts can be changed" in text(error)
    assert "%sandbox" in text(error)
    error, _ = failure(kernel, "raise PermissionError('not from the sandbox')")
    assert "mounted folders" not in text(error)


@pytest.mark.slow
def test_plain_tracebacks_setting_drops_colours(start_kernel) -> None:
    """``plain_tracebacks`` (for programmatic clients) gives IPython's traceback uncoloured,
    from the command line or the environment; the default keeps ipykernel's colours."""
    for kernel in (
        start_kernel(["--WasmKernel.plain_tracebacks=True"]),
        start_kernel(env={"WASM_KERNEL_PLAIN_TRACEBACKS": "true"}),
    ):
        error, count = failure(kernel, "def f():\n    return 1 / 0\nf()")
        assert not ANSI.search(raw(error)), raw(error)
        assert f"Cell In[{count}], line 3" in raw(error)
        assert "----> 2     return 1 / 0" in raw(error)
