"""A real nbgrader course graded by the strict kernel (issue 12, point 5).

One assignment with solution regions, visible and hidden tests, released with ``nbgrader
generate_assignment`` and autograded with ``nbgrader autograde`` (its own command line, in
a subprocess, as a teacher runs it) for students whose answers are right, wrong, or hostile.
The same submissions are graded by the native ``python3`` kernel where it can finish, and the
scores compared through nbgrader's Gradebook. docs/teachers.md quotes what this test shows.
Every kernel nbgrader starts comes from the kernel server, through the provisioner.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("nbgrader", reason="nbgrader is not installed (pip install nbgrader)")
from nbgrader.api import Gradebook
from served_kernels import handed_out, server_answering

pytestmark = pytest.mark.slow

STRICT = "wasm-python-strict"
ASSIGNMENT = "ps1"
KERNEL_TIME_LIMIT = 5  # seconds per cell
MEMORY_LIMIT = 128 << 20
NBGRADER_TIMEOUT = 60  # above the kernel's time limit plus interrupt_grace: the kernel stops first
HIDDEN_MARK = "hidden test: negative numbers"

SQUARE_SOLUTION = "def square(x):\n    ### BEGIN SOLUTION\n    return x * x\n    ### END SOLUTION"
SQUARE_TESTS = (
    "assert square(3) == 9\n"
    "### BEGIN HIDDEN TESTS\n"
    f"assert square(-4) == 16, {HIDDEN_MARK!r}\n"
    "### END HIDDEN TESTS"
)
DOUBLE_SOLUTION = "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"
DOUBLE_TESTS = "assert double(5) == 10"
FULL_MARKS = 3.0  # square's tests are worth 2 points, double's 1

RIGHT = "def square(x):\n    return x * x"
SNOOPED_PATHS = (
    # the submission runs in autograded/<student>/ps1: the course folder is three levels up
    "../../../source/ps1/ps1.ipynb",
    "../../../gradebook.db",
    "/etc/passwd",
)

# Each student's answer to the first question; every one answers the second one right, so
# a hostile cell that is stopped must still leave the later cells graded.
SUBMISSIONS = {
    "right": RIGHT,
    "wrong": "def square(x):\n    return x + x",
    "loop": "while True:\n    pass\n" + RIGHT,
    "stubborn": (
        "while True:\n    try:\n        while True:\n            pass\n"
        "    except KeyboardInterrupt:\n        pass\n" + RIGHT
    ),
    # bounded so that the native kernel can finish it; the strict kernel's limit is lower
    "bomb": "blob = bytearray(256 << 20)\n" + RIGHT,
    "chatty": "for line in range(200):\n    print(line, 'spam' * 10_000)\n" + RIGHT,  # 8 MB
    "snoop": (
        f"for path in {SNOOPED_PATHS!r}:\n"
        "    try:\n"
        "        print(path, open(path, 'rb').read(4000))\n"
        "    except OSError as error:\n"
        "        print(path, type(error).__name__)\n" + RIGHT
    ),
}
# The two loops would hold the native kernel until nbgrader's own timeout, and the stubborn
# one swallows the interrupt nbgrader sends then, so nbgrader restarts it and loses the
# submission's remaining cells: the native kernel cannot grade them, so it does not run them.
NATIVE_CANNOT_FINISH = {"loop", "stubborn"}


def cell(source: str, grade_id: str, points: int | None = None) -> nbformat.NotebookNode:
    """A code cell with nbgrader's metadata: a solution cell, or a test cell worth points."""
    grader = {"grade_id": grade_id, "schema_version": 3, "task": False}
    if points is None:
        grader |= {"grade": False, "solution": True, "locked": False}
    else:
        grader |= {"grade": True, "solution": False, "locked": True, "points": points}
    return nbformat.v4.new_code_cell(source, metadata={"nbgrader": grader})


def make_course(root: Path, kernel_name: str) -> None:
    """The teacher's side: the config, the source notebook, the released assignment."""
    root.mkdir()
    (root / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"c.CourseDirectory.root = {str(root)!r}\n"
        f"c.ExecutePreprocessor.kernel_name = {kernel_name!r}\n"
        f"c.ExecutePreprocessor.timeout = {NBGRADER_TIMEOUT}\n"
    )
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": kernel_name, "display_name": kernel_name}
    notebook.cells = [
        cell(SQUARE_SOLUTION, "square"),
        cell(SQUARE_TESTS, "test_square", points=2),
        cell(DOUBLE_SOLUTION, "double"),
        cell(DOUBLE_TESTS, "test_double", points=1),
    ]
    source = root / "source" / ASSIGNMENT
    source.mkdir(parents=True)
    nbformat.write(notebook, source / f"{ASSIGNMENT}.ipynb")
    nbgrader(root, "generate_assignment", ASSIGNMENT, "--force")


def submit(root: Path, students: list[str]) -> None:
    """The students' side: each hands in the released notebook with their answers in it."""
    released = nbformat.read(root / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    for student in students:
        notebook = nbformat.from_dict(released)
        notebook.cells[0].source = SUBMISSIONS[student]
        notebook.cells[2].source = "def double(x):\n    return 2 * x"
        folder = root / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        nbformat.write(notebook, folder / f"{ASSIGNMENT}.ipynb")


def nbgrader(root: Path, *arguments: str, env: dict[str, str] | None = None) -> None:
    """Run nbgrader's command line in the course folder, as a teacher does."""
    command = [sys.executable, "-m", "nbgrader", *arguments]
    done = subprocess.run(
        command,
        cwd=root,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"


def autograde(root: Path, students: list[str]) -> float:
    """Hand in ``students``' submissions and autograde them; the seconds it took."""
    submit(root, students)
    env = {
        "WASM_KERNEL_TIME_LIMIT": str(KERNEL_TIME_LIMIT),
        "WASM_KERNEL_MEMORY_LIMIT": str(MEMORY_LIMIT),
    }
    start = time.monotonic()
    # without --force: submissions graded by an earlier run are left as they are
    nbgrader(root, "autograde", ASSIGNMENT, "--create", env=env)
    return time.monotonic() - start


def scores(root: Path) -> dict[str, float]:
    """Each student's score, from the gradebook nbgrader wrote."""
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gradebook:
        return {
            submission.student.id: submission.score
            for submission in gradebook.assignment_submissions(ASSIGNMENT)
        }


def answer_cell(root: Path, student: str) -> nbformat.NotebookNode:
    """The student's first cell as autograded: what their feedback shows for it."""
    path = root / "autograded" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    return nbformat.read(path, as_version=4).cells[0]


def shown(answer: nbformat.NotebookNode) -> str:
    """All text of a cell's outputs: streams, results, errors (colours removed)."""
    parts = []
    for output in answer.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type == "error":
            parts.append("\n".join(output.traceback))
        else:
            parts.append(str(output.get("data", {}).get("text/plain", "")))
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(parts))


def error_name(answer: nbformat.NotebookNode) -> str | None:
    errors = [output.ename for output in answer.outputs if output.output_type == "error"]
    return errors[-1] if errors else None


@pytest.fixture(autouse=True)
def environment_bin_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """nbgrader runs ``alembic`` from PATH to open a gradebook: the test environment's
    scripts must be on it, as they are for a teacher in an activated environment."""
    scripts = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", os.pathsep.join([scripts, os.environ.get("PATH", "")]))


def test_a_course_graded_by_the_strict_kernel(tmp_path: Path) -> None:
    students = sorted(SUBMISSIONS)
    finishing = sorted(set(students) - NATIVE_CANNOT_FINISH)
    ours = tmp_path / "strict"
    make_course(ours, STRICT)
    server_answering()  # so that nbgrader's kernels can all come from the server
    before = handed_out()
    ours_seconds = autograde(ours, finishing)
    loops_seconds = autograde(ours, sorted(NATIVE_CANNOT_FINISH))
    graded_by = handed_out()[len(before) :]
    assert len(graded_by) == len(students), f"served kernels {graded_by} for {students}"
    ours_scores = scores(ours)
    assert sorted(ours_scores) == students, "a submission was lost"

    native = tmp_path / "native"
    make_course(native, "python3")
    native_seconds = autograde(native, finishing)
    native_scores = scores(native)
    print(f"\nautograde of {finishing}: strict {ours_seconds:.1f} s, native {native_seconds:.1f} s")
    print(f"autograde of {sorted(NATIVE_CANNOT_FINISH)}: strict {loops_seconds:.1f} s")
    print(f"scores: strict {ours_scores}, native {native_scores}")

    for student in ("right", "wrong", "chatty", "snoop"):
        assert ours_scores[student] == native_scores[student], student
    assert ours_scores["right"] == FULL_MARKS
    assert ours_scores["wrong"] == FULL_MARKS - 2
    # a stopped cell costs its own question only: the later cells are graded
    for student, limit in [
        ("loop", "TimeLimitExceeded"),
        ("stubborn", "TimeLimitExceeded"),
        ("bomb", "MemoryLimitExceeded"),
    ]:
        assert error_name(answer_cell(ours, student)) == limit, shown(answer_cell(ours, student))
        assert ours_scores[student] == FULL_MARKS - 2, student
    assert native_scores["bomb"] == FULL_MARKS  # the native kernel has no memory limit
    assert "did not stop within" in shown(answer_cell(ours, "stubborn"))

    # nbgrader cuts long outputs itself (its LimitOutput); the kernel cut them first, and says so
    chatty = shown(answer_cell(ours, "chatty"))
    assert "output limit reached" in chatty, chatty[-2000:]
    assert "output limit reached" not in shown(answer_cell(native, "chatty"))

    # the native kernel hands a snooping student the hidden tests, the gradebook and the host
    # password file; the strict kernel shows none of them, in any student's output
    leaks = (HIDDEN_MARK, "SQLite format", "root:")
    native_snoop = shown(answer_cell(native, "snoop"))
    assert all(leak in native_snoop for leak in leaks), native_snoop[:2000]
    ours_snoop = shown(answer_cell(ours, "snoop")).splitlines()
    refused = [f"{path} PermissionError" for path in SNOOPED_PATHS[:2]]
    assert ours_snoop == [*refused, "/etc/passwd FileNotFoundError"], ours_snoop
    for student in students:
        output = shown(answer_cell(ours, student))
        assert not [leak for leak in leaks if leak in output], (student, output[:2000])
