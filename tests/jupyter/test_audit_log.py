"""``WasmKernel.audit_log``: one JSON line per cell from a real kernel (with the same figures
as its reply, never its output), refusals of paths that cannot be written safely, and the
log's own behaviour when its file goes away, is rotated, or is handed oversized fields."""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import ok

from wasm_kernel.jupyter import audit
from wasm_kernel.jupyter.audit import MAX_LINE, AuditLog, AuditLogUnusable
from wasm_kernel.sandbox.metrics import METADATA_KEY


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def sha256(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


@pytest.mark.slow
def test_each_cell_leaves_one_line_without_its_output(start_kernel: Any, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "audit.jsonl"
    log.parent.mkdir()
    began = datetime.datetime.now(datetime.UTC)
    kernel = start_kernel([f"--WasmKernel.audit_log={log}", "--WasmKernel.fuel=1e9"])
    cells = [
        ("print('abc'.upper() * 3)", {}),
        ("1 / 0", {}),
        ("hidden = 5", {"silent": True}),
        ("while True: pass", {}),
    ]
    runs = [kernel.execute(code, **options) for code, options in cells]
    assert "ABCABCABC" in runs[0].stream_text()
    records = lines_of(log)
    assert len(records) == len(cells)
    assert "ABCABCABC" not in log.read_text()
    assert log.stat().st_mode & 0o777 == 0o600
    for record, (code, options), run in zip(records, cells, runs, strict=True):
        assert datetime.datetime.fromisoformat(record["time"]) >= began
        assert record["kind"] == "cell"
        assert record["session"] == run.reply["header"]["session"]  # the kernel's
        assert record["client_session"] == kernel.client.session.session
        assert record["code_sha256"] == sha256(code)
        assert record["metrics"] == run.reply["metadata"][METADATA_KEY]
        assert record["silent"] is bool(options.get("silent"))
        assert record["verdict"] == run.content["status"]
        assert record.get("error") == run.content.get("ename")
    assert [r.get("error") for r in records] == [None, "ZeroDivisionError", None, "FuelExhausted"]
    assert records[3]["metrics"]["rolled_back"] is True
    shown = ok(kernel.execute("%sandbox")).stream_text()
    assert f"Audit log: {log} (one line per cell" in shown


@pytest.mark.slow
@pytest.mark.parametrize("case", ["link", "folder", "mounted", "not writable", "relative"])
def test_a_path_that_cannot_be_written_safely_is_refused(
    case: str, start_kernel: Any, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep\n")
    path = tmp_path / "audit.jsonl"
    cwd = None
    expected = {
        "link": "is a symbolic link",
        "folder": "is a folder",
        "mounted": "a folder mounted into the sandbox",
        "not writable": "not writable (Permission denied)",
        "relative": "must be an absolute file path",
    }[case]
    if case == "link":
        path.symlink_to(target)
    elif case == "folder":
        path.mkdir()
    elif case == "mounted":
        cwd = tmp_path  # the notebook profile mounts the kernel's folder at /notebook
    elif case == "not writable":
        if not os.path.isdir("/sys/kernel"):
            pytest.skip("no sysfs, where no one may create a file")
        path = Path("/sys/kernel/wasm-kernel-audit.jsonl")  # refused to root too
    argument = "audit.jsonl" if case == "relative" else str(path)
    kernel = start_kernel([f"--WasmKernel.audit_log={argument}"], cwd=cwd)
    run = kernel.execute("1 + 1")
    assert run.content["status"] == "error" and run.content["ename"] == "InvalidSetting"
    assert "WasmKernel.audit_log" in run.content["evalue"]
    assert expected in run.content["evalue"]
    assert target.read_text() == "keep\n"
    if case in ("mounted", "not writable"):
        assert not path.exists()


@pytest.mark.nokernel
def test_lines_wait_while_the_file_cannot_be_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog.open(str(path), "kernel-1")
    log.cell("a = 1", "ok", {"fuel": 1})
    path.unlink()
    path.mkdir()  # the name now leads to a folder: nothing can be appended
    with caplog.at_level(logging.WARNING, logger="wasm_kernel.jupyter.audit"):
        log.cell("b = 2", "ok", {"fuel": 2})
        log.tool_call("search", "ok", seconds=0.5)
        assert "NOT being written" in log.describe() and "2 lines wait" in log.describe()
        path.rmdir()
        log.cell("c = 3", "error", None, error="NameError")
    assert [r.levelname for r in caplog.records] == ["ERROR", "WARNING"]
    assert "cannot be written" in caplog.records[0].getMessage()
    records = lines_of(path)  # a new file, the waiting lines first, in order
    assert [r["kind"] for r in records] == ["cell", "tool_call", "cell"]
    assert [r.get("code_sha256") for r in records] == [sha256("b = 2"), None, sha256("c = 3")]
    assert "NOT" not in log.describe()
    log.close()


@pytest.mark.nokernel
def test_lines_past_the_backlog_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog.open(str(path), "kernel-1")
    path.unlink()
    path.mkdir()
    for number in range(audit.BACKLOG + 3):
        log.cell(f"x = {number}", "ok", None)
    path.rmdir()
    log.close()
    records = lines_of(path)
    assert records[0]["kind"] == "lost" and records[0]["lines"] == 3
    assert len(records) == 1 + audit.BACKLOG
    assert records[1]["code_sha256"] == sha256("x = 3")  # the oldest made room


@pytest.mark.nokernel
def test_a_rotated_file_is_followed_and_records_stay_bounded(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog.open(str(path), "kernel-1")
    log.cell_started("for x in xs: search(x)")
    log.tool_call("search", "ok", seconds=0.25, sent_bytes=10, received_bytes=20)
    path.rename(tmp_path / "audit.jsonl.1")  # rotation by rename
    log.network_request(
        "GET",
        "https://user:secret@example.org:8443/data.csv?token=abc#frag",
        "refused",
        reason="not listed",
    )
    # escaped, an emoji takes 12 bytes: two such fields would pass the line's bound
    log.tool_call("\U0001f600" * 100_000, "error", seconds=float("nan"), error="\u2603" * 5000)
    log.close()
    rotated = lines_of(tmp_path / "audit.jsonl.1")
    assert rotated[0]["cell_sha256"] == sha256("for x in xs: search(x)")
    assert rotated[0]["metrics"] == {"seconds": 0.25, "sent_bytes": 10, "received_bytes": 20}
    text = path.read_text()
    assert not any(word in text for word in ("secret", "token", "frag", "data.csv"))
    request, oversized = lines_of(path)
    assert request["url"] == "https://example.org:8443"
    assert request["reason"] == "not listed" and request["verdict"] == "refused"
    assert all(len(line) + 1 <= MAX_LINE for line in text.encode().splitlines())
    assert oversized["shortened"] is True and oversized["tool"] == "\U0001f600" * audit.SHORT_TEXT
    assert oversized["metrics"]["seconds"] is None


@pytest.mark.nokernel
def test_a_file_with_other_names_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep\n")
    os.link(target, tmp_path / "audit.jsonl")
    with pytest.raises(AuditLogUnusable, match="hard links"):
        AuditLog.open(str(tmp_path / "audit.jsonl"), "kernel-1")
    (tmp_path / "sub").mkdir()
    with pytest.raises(AuditLogUnusable, match="mounted into the sandbox"):
        AuditLog.open(str(tmp_path / "sub" / "a.jsonl"), "k", [tmp_path])
    assert target.read_text() == "keep\n"


@pytest.mark.slow
def test_tool_calls_and_network_requests_leave_one_line_each(
    start_kernel: Any, tmp_path: Path
) -> None:
    """Without their arguments, results or the URL's path and query."""
    log = tmp_path / "audit.jsonl"
    tests = str(Path(__file__).resolve().parents[1])
    kernel = start_kernel(
        [f"--WasmKernel.audit_log={log}", "--WasmKernel.network_allow=['https://listed.test']"],
        env={"PYTHONPATH": tests, "WASM_KERNEL_TOOLS": "operator_tools:word_count"},
    )
    cell = (
        "from sandbox_tools import word_count\n"
        "import urllib.request\n"
        "counted = word_count('one two secret-words')\n"
        "try:\n"
        "    urllib.request.urlopen('https://elsewhere.test/path?token=hidden')\n"
        "except OSError as exc:\n"
        "    refused = type(exc).__name__\n"
        "counted, refused"
    )
    run = ok(kernel.execute(cell))
    assert run.result_text() == "(3, 'URLError')"
    tool, request, cell_line = lines_of(log)
    assert tool["kind"] == "tool_call" and tool["tool"] == "word_count"
    assert tool["verdict"] == "ok" and tool["cell_sha256"] == sha256(cell)
    assert request["kind"] == "network_request" and request["verdict"] == "refused"
    assert "not on this kernel's network allowlist" in request["reason"]
    assert cell_line["kind"] == "cell"
    text = log.read_text()
    assert "secret-words" not in text and "hidden" not in text and "/path" not in text


@pytest.mark.slow
def test_the_log_is_rotated_at_its_size_bound(start_kernel: Any, tmp_path: Path) -> None:
    """20,000 tool calls from one cell wrote 5.9 MB: past WasmKernel.audit_log_limit the file
    is renamed to PATH.1 (one older file kept) and the new one starts with a line saying so;
    neither passes the bound, and the latest lines are all there."""
    log = tmp_path / "audit.jsonl"
    limit = 1 << 20
    tests = str(Path(__file__).resolve().parents[1])
    kernel = start_kernel(
        [f"--WasmKernel.audit_log={log}", f"--WasmKernel.audit_log_limit={limit}"],
        env={"PYTHONPATH": tests, "WASM_KERNEL_TOOLS": "operator_tools:word_count"},
    )
    calls = 12_000  # about 3.5 MB of lines
    cell = f"from sandbox_tools import word_count\nsum(word_count('a b') for _ in range({calls}))"
    assert ok(kernel.execute(cell)).result_text() == str(2 * calls)
    assert f"past {limit:,} bytes" in ok(kernel.execute("%sandbox")).stream_text()
    older = tmp_path / "audit.jsonl.1"
    for path in (log, older):
        assert path.stat().st_size <= limit, path
        assert oct(path.stat().st_mode & 0o777) == "0o600", path
    current, previous = lines_of(log), lines_of(older)
    assert current[0]["kind"] == "rotated" and current[0]["previous"] == str(older)
    assert current[0]["limit"] == limit
    assert current[-1]["kind"] == "cell"  # %sandbox's
    assert current[-2]["kind"] == "cell" and current[-2]["code_sha256"] == sha256(cell)
    tools = [line for line in previous + current if line["kind"] == "tool_call"]
    assert len(tools) < calls  # the oldest went with an earlier rotation
    assert all(line["tool"] == "word_count" for line in tools)


@pytest.mark.nokernel
def test_kernels_sharing_a_log_rotate_it_once_each_time(tmp_path: Path) -> None:
    """Two kernels' logs on one file, taking turns: each rotation happens under the file's
    lock, so neither file passes the bound and every line is whole."""
    path = tmp_path / "audit.jsonl"
    limit = 2 * MAX_LINE
    first, second = (AuditLog.open(str(path), name, limit=limit) for name in ("k1", "k2"))
    for turn in range(400):
        (first, second)[turn % 2].tool_call(f"tool{turn}", "ok", seconds=0.001)
    first.close()
    second.close()
    older = tmp_path / "audit.jsonl.1"
    assert path.stat().st_size <= limit and older.stat().st_size <= limit
    current = lines_of(path)
    assert current[0]["kind"] == "rotated"
    assert current[-1]["tool"] == "tool399"
    shown = [line["tool"] for line in lines_of(older) + current if line["kind"] == "tool_call"]
    assert shown == [f"tool{turn}" for turn in range(400 - len(shown), 400)]  # none lost between
