"""wasm_kernel.client: Session and AsyncSession against real kernels.

Where the native ipykernel can run the same code (``kernel_name="python3"`` through the same
client), its Execution is the expected one; the rest checks the sandbox's own promises: a
timeout interrupts and keeps the session, files round-trip through the kernel, refused
settings fail the start with the kernel's reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time

import pytest
from wheelmaker import make_wheel

from wasm_kernel.client import (
    DOWNLOAD_CHUNK,
    UPLOAD_CHUNK,
    AsyncSession,
    Execution,
    Session,
    SessionError,
)

NATIVE = "python3"
CELLS = {
    "result": "x = 40\nx + 2",
    "streams": "import sys\nprint('out', 1)\nprint('err', file=sys.stderr)",
    "error": "def f():\n    raise ValueError('bad value')\nf()",
    "display": "from IPython.display import display, HTML\ndisplay(HTML('<b>b</b>'))\n7",
    "silent": "y = 3;",
}


def comparable(execution: Execution) -> dict:
    return {
        "stdout": execution.stdout,
        "stderr": execution.stderr,
        "results": [bundle.get("text/plain") for bundle in execution.results],
        "html": [bundle.get("text/html") for bundle in execution.results],
        "error": (execution.error.name, execution.error.value) if execution.error else None,
        "count": execution.execution_count,
    }


@pytest.fixture(scope="module")
def strict() -> Session:
    # The grace is the time a KeyboardInterrupt has to end the cell, its traceback included
    # (~0.1 s on a quiet machine, several times that on a loaded one): past it the cell is
    # stopped hard and rolled back, which the timeout test tells apart from a soft interrupt.
    with Session(profile="strict", interrupt_grace=2.0) as session:
        yield session


@pytest.mark.slow
def test_run_gives_what_the_native_kernel_gives() -> None:
    runs = {}
    with Session(profile="strict") as sandboxed, Session(kernel_name=NATIVE) as native:
        for name, code in CELLS.items():
            runs[name] = ours, theirs = sandboxed.run(code), native.run(code)
            assert comparable(ours) == comparable(theirs), name
            assert ours.duration > 0
    error = runs["error"][0].error
    assert error is not None
    assert "\x1b[" not in error.traceback
    assert "ValueError" in error.traceback and "raise ValueError" in error.traceback


@pytest.mark.slow
def test_callbacks_stream_while_the_cell_runs(strict: Session) -> None:
    seen: list[tuple[str, str, float]] = []
    start = time.monotonic()

    def note(kind: str):
        return lambda item: seen.append((kind, str(item), time.monotonic() - start))

    execution = strict.run(
        "import sys, time\nprint('first')\ntime.sleep(1.5)\nprint('late', file=sys.stderr)\n5",
        on_stdout=note("out"),
        on_stderr=note("err"),
        on_result=note("result"),
    )
    assert [(kind, text) for kind, text, _ in seen] == [
        ("out", "first\n"),
        ("err", "late\n"),
        ("result", "{'text/plain': '5'}"),
    ]
    assert seen[0][2] < execution.duration - 1.0, "stdout arrived only at the end"


def test_timeout_interrupts_the_cell_and_keeps_the_session(strict: Session) -> None:
    assert strict.run("kept = []").error is None
    started = time.monotonic()
    execution = strict.run("import time\nkept.append(1)\nwhile True: time.sleep(0.05)", timeout=1.0)
    assert execution.timed_out
    assert execution.error is not None and execution.error.name == "KeyboardInterrupt"
    assert time.monotonic() - started < 8
    assert strict.run("kept").text == "[1]"  # an interrupt keeps what the cell did


def test_timeout_stops_a_cell_that_swallows_the_interrupt(strict: Session) -> None:
    assert strict.run("before = 1").error is None
    code = (
        "before = 2\n"
        "while True:\n"
        "    try:\n"
        "        while True:\n"
        "            before += 1\n"
        "    except BaseException:\n"
        "        pass"
    )
    execution = strict.run(code, timeout=1.0)
    assert execution.timed_out
    assert execution.error is not None and "rolled back" in execution.error.value
    assert strict.run("before").text == "1"


def test_files_round_trip_in_several_chunks(strict: Session) -> None:
    data = os.urandom(UPLOAD_CHUNK + DOWNLOAD_CHUNK + 12345)
    strict.run("import os; os.makedirs('/tmp/in', exist_ok=True)")
    strict.upload("/tmp/in/data.bin", data)
    assert strict.run("len(open('/tmp/in/data.bin', 'rb').read())").text == str(len(data))
    assert strict.download("/tmp/in/data.bin") == data
    strict.upload("/tmp/in/empty", b"")
    assert strict.download("/tmp/in/empty") == b""
    listing = {entry["name"]: entry for entry in strict.files("/tmp/in")}
    assert listing["data.bin"] == {"name": "data.bin", "is_dir": False, "size": len(data)}
    assert listing["empty"]["size"] == 0
    assert any(entry["name"] == "in" and entry["is_dir"] for entry in strict.files())


def test_file_operations_leave_no_trace_in_the_namespace_or_count(strict: Session) -> None:
    # every cell adds itself to IPython's input and output history (_i1, _1 ...): the rest
    names = "import re\nprint(sorted(n for n in dir() if not re.fullmatch(r'_i?[0-9]+', n)))"
    before = strict.run(names)
    strict.upload("/tmp/trace.txt", b"abc")
    strict.download("/tmp/trace.txt")
    strict.files("/tmp")
    after = strict.run(names)
    assert after.stdout == before.stdout
    assert after.execution_count == before.execution_count + 1


def test_file_errors_are_the_sandbox_s(strict: Session) -> None:
    with pytest.raises(SessionError, match="FileNotFoundError"):
        strict.download("/etc/passwd")
    with pytest.raises(SessionError, match="cannot write /usr/local/lib"):
        strict.upload("/usr/local/lib/evil.py", b"print('x')")
    strict.upload("/tmp/big", b"x" * 5000)
    with pytest.raises(SessionError, match="more than the limit"):
        strict.download("/tmp/big", limit=4999)
    with pytest.raises(SessionError, match="non-empty string"):
        strict.download("")


def test_reset_gives_a_fresh_interpreter_and_scratch_folder(strict: Session) -> None:
    strict.run("gone = 1")
    strict.upload("/tmp/gone.txt", b"x")
    strict.reset()
    assert strict.run("gone").error.name == "NameError"
    assert "gone.txt" not in {entry["name"] for entry in strict.files()}
    assert strict.run("1 + 1").text == "2"


@pytest.mark.parametrize(
    "settings, reason",
    [
        ({"fuel": 5}, "InvalidSetting"),
        ({"memory_limit": "lots"}, "InvalidSetting"),
        ({"fule": 10**10}, "unknown setting 'fule'"),
        ({"mounts": [".:/data:ro"]}, "grants no host folder"),
    ],
)
def test_refused_settings_fail_the_start_with_the_reason(settings: dict, reason: str) -> None:
    with pytest.raises(SessionError, match=reason), Session(profile="strict", **settings):
        pass


def test_settings_reach_the_kernel(tmp_path) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out.mkdir()
    (data / "given.txt").write_text("from the host")
    with Session(
        profile="notebook",
        cwd=str(tmp_path),
        mounts=["data:/data:ro", "out:/out:rw"],
        time_limit=7,
    ) as session:
        assert session.run("open('/data/given.txt').read()").text == "'from the host'"
        session.upload("/out/made.txt", b"by the client")
        with pytest.raises(SessionError, match="cannot write"):
            session.upload("/data/given.txt", b"overwritten")
        assert "time 7 s" in session.run("%sandbox").stdout
    assert (out / "made.txt").read_bytes() == b"by the client"
    assert (data / "given.txt").read_text() == "from the host"


@pytest.mark.slow
def test_async_session_has_the_same_shape() -> None:
    async def main() -> None:
        async with AsyncSession(profile="strict", interrupt_grace=0.5) as session:
            execution = await session.run("print('a')\n1 + 1")
            assert (execution.stdout, execution.text) == ("a\n", "2")
            slow = await session.run("import time\nwhile True: time.sleep(0.05)", timeout=1)
            assert slow.timed_out and slow.error.name == "KeyboardInterrupt"
            await session.upload("/tmp/a.bin", b"\0\1\2")
            assert await session.download("/tmp/a.bin") == b"\0\1\2"
            assert [e["name"] for e in await session.files()] == ["a.bin"]
            await session.reset()
            assert (await session.run("execution")).error.name == "NameError"

    asyncio.run(main())


@pytest.mark.slow
def test_snapshot_restore_and_fork_diverge(tmp_path) -> None:
    """snapshot/restore are the kernel's %snapshot; a fork resumes from an image of its
    parent, and from then on the two sessions are separate."""
    images = {"snapshots": True, "snapshot_dir": str(tmp_path)}
    with Session(profile="strict", **images) as parent:
        parent.run("shared = ['before']")
        parent.snapshot("before-change")
        parent.run("shared.append('parent only')")
        parent.restore("before-change")
        assert parent.run("shared").text == "['before']"
        with parent.fork() as child:
            child.run("shared.append('child')")
            parent.run("shared.append('parent')")
            assert child.run("shared").text == "['before', 'child']"
            assert parent.run("shared").text == "['before', 'parent']"
            child.reset()  # a fresh interpreter: the fork image is not resumed or waited for
            assert child.run("shared").error.name == "NameError"
            assert "could not resume" not in child.run("%sandbox").stdout
        assert sorted(path.name for path in tmp_path.iterdir() if "fork" in path.name) == []
        with parent.fork("kept") as named:
            assert named.run("shared").text == "['before', 'parent']"
        with pytest.raises(SessionError, match="there is no snapshot named 'absent'"):
            parent.restore("absent")
        with pytest.raises(SessionError, match="is not a snapshot name"):
            parent.snapshot("x\nimport os")
        assert parent.run("shared").text == "['before', 'parent']"


def test_a_session_starts_with_no_cell_of_its_own(tmp_path) -> None:
    """The kernel_info_reply that finds the kernel ready says the interpreter runs, so the
    client sends no silent cell to wait for it: the audit log, a line per request that runs,
    holds the user's cell only."""
    log = tmp_path / "audit.jsonl"
    with Session(profile="strict", audit_log=str(log)) as session:
        session.run("x = 1")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [record["code_sha256"] for record in records] == [hashlib.sha256(b"x = 1").hexdigest()]


def test_snapshot_says_why_the_strict_profile_refuses(strict: Session) -> None:
    with pytest.raises(SessionError, match="%snapshot is off in this kernel"):
        strict.snapshot("refused")
    with pytest.raises(SessionError, match="%snapshot is off in this kernel"):
        strict.fork()


@pytest.mark.slow
def test_install_from_a_wheelhouse(tmp_path) -> None:
    house = tmp_path / "wheelhouse"
    house.mkdir()
    make_wheel(house, "wkc-tool", files={"wkc_tool.py": "ANSWER = 42\n"})
    with Session(profile="notebook", packages=str(house)) as session:
        session.install("wkc-tool>=0.1")
        assert session.run("import wkc_tool; wkc_tool.ANSWER").text == "42"
        with pytest.raises(SessionError, match=r"install failed: .*wkc-absent"):
            session.install("wkc-absent")
        with pytest.raises(SessionError, match="one line"):
            session.install("wkc-tool\nimport os")


def test_install_says_why_the_strict_profile_refuses(strict: Session) -> None:
    with pytest.raises(SessionError, match=r"install failed: UsageError: .*"):
        strict.install("anything")


@pytest.mark.slow
def test_async_session_snapshots_forks_and_installs(tmp_path) -> None:
    house = tmp_path / "wheelhouse"
    house.mkdir()
    make_wheel(house, "wkc-async", files={"wkc_async.py": "NAME = 'async'\n"})
    settings = {"snapshots": True, "snapshot_dir": str(tmp_path / "images")}

    async def main() -> None:
        async with AsyncSession(profile="notebook", packages=str(house), **settings) as parent:
            await parent.install("wkc-async")
            await parent.run("import wkc_async; value = 1")
            await parent.snapshot("one")
            await parent.run("value = 2")
            forked = await parent.fork()
            async with forked:
                await forked.run("value += 10")
                assert (await forked.run("wkc_async.NAME, value")).text == "('async', 12)"
            await parent.restore("one")
            assert (await parent.run("value")).text == "1"

    asyncio.run(main())


def test_exit_ends_the_kernel_and_reset_starts_a_new_one() -> None:
    with Session(profile="strict") as session:
        session.run("x = 1")
        assert session.run("exit()").error is None
        deadline = time.monotonic() + 30
        while session.manager.is_alive():
            assert time.monotonic() < deadline, "exit() did not end the kernel"
            time.sleep(0.1)
        with pytest.raises(SessionError, match="the kernel process ended"):
            session.run("x")
        session.reset()
        assert session.run("x").error.name == "NameError"
        assert session.run("'alive'").text == "'alive'"
