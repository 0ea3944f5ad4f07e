"""Malformed Jupyter messages: the kernel answers them with an error or a harmless ok reply.

A client (or anything that can write to the shell socket with the session key) may send
requests whose content has the wrong types, is missing fields, or is not an object at all.
Each such request must get a reply within ``REPLY_TIMEOUT`` seconds, of the matching reply
type, with a status of ``ok`` (and sane content) or ``error``: a request that never gets a
reply leaves its client waiting forever. Unknown message types and messages that cannot be
authenticated or decoded are ignored instead (ipykernel logs them; there is nothing to reply
to). After every message the kernel must still be alive and answer ``1 + 1`` with ``2``.

One kernel serves the whole module, with a private history file so that the 50 MB cell and
the odd history requests never touch the user's real history.
"""

from __future__ import annotations

import json
import queue
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import Kernel

REPLY_TIMEOUT = 5  # seconds; a trivial request on an idle kernel is answered in milliseconds
HUGE_CODE_BYTES = 50 << 20


# -- talking to the kernel -------------------------------------------------------------------


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    history = tmp_path_factory.mktemp("history") / "history.sqlite"
    kernel = Kernel([f"--WasmKernel.history_file={history}"])
    try:
        assert_answers(kernel)  # also settles any stale kernel_info_reply from start-up
        yield kernel
    finally:
        kernel.shutdown()


def send(kernel: Kernel, msg_type: str, content: Any, metadata: Any = None) -> str:
    """Send a shell message exactly as given. ``content`` that is ``bytes`` goes out as the
    packed content frame unchanged (for JSON that jupyter_client would refuse to build, such
    as lone surrogates, or for content that is not an object)."""
    session = kernel.client.session
    msg = session.msg(msg_type, {} if isinstance(content, bytes) else content)
    if isinstance(content, bytes):
        msg["content"] = content
    if metadata is not None:
        msg["metadata"] = metadata
    session.send(kernel.client.shell_channel.socket, msg)
    return msg["header"]["msg_id"]


def reply_to(kernel: Kernel, msg_id: str, timeout: float = REPLY_TIMEOUT) -> dict | None:
    """The shell reply to ``msg_id``, or None if none came within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = kernel.client.get_shell_msg(timeout=left)
        except queue.Empty:
            return None
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg
    return None


def execute(kernel: Kernel, code: str, timeout: float = 60) -> tuple[dict, list[dict]]:
    """Run ``code``; return its reply and iopub messages."""
    run = kernel.execute(code, timeout=timeout)
    return run.reply, run.messages


def result_of(messages: list[dict]) -> str | None:
    results = [m["content"] for m in messages if m["msg_type"] == "execute_result"]
    return results[-1]["data"]["text/plain"] if results else None


def assert_answers(kernel: Kernel) -> None:
    assert kernel.manager.is_alive(), "the kernel process died"
    reply, messages = execute(kernel, "1 + 1")
    assert reply["content"]["status"] == "ok", reply["content"]
    assert result_of(messages) == "2"


@pytest.fixture(autouse=True)
def answers_afterwards(target: Kernel) -> Iterator[None]:
    yield
    assert_answers(target)


# -- checks on the replies -------------------------------------------------------------------

Check = Callable[[dict], None]


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def error_or_ok(content: dict) -> None:
    assert content.get("status") in ("ok", "error"), content


def execute_error(content: dict) -> None:
    assert content.get("status") == "error", content
    assert content.get("ename"), content
    assert is_int(content.get("execution_count")), f"every execute_reply has a count: {content}"


def complete_checked(code: Any) -> Check:
    length = len(code) if isinstance(code, str) else 0

    def check(content: dict) -> None:
        error_or_ok(content)
        if content["status"] != "ok":
            return
        assert isinstance(content["matches"], list), content
        assert all(isinstance(match, str) for match in content["matches"]), content
        start, end = content["cursor_start"], content["cursor_end"]
        assert is_int(start) and is_int(end), f"cursor positions must be integers: {content}"
        assert 0 <= start <= end <= length, content
        assert isinstance(content.get("metadata", {}), dict), content

    return check


def inspect_checked(content: dict) -> None:
    error_or_ok(content)
    if content["status"] == "ok":
        assert isinstance(content["found"], bool), content
        assert isinstance(content["data"], dict), content
        assert all(isinstance(key, str) for key in content["data"]), content


def is_complete_checked(content: dict) -> None:
    statuses = ("complete", "incomplete", "invalid", "unknown", "error")
    assert content.get("status") in statuses, content
    if content["status"] == "incomplete":
        assert isinstance(content.get("indent", ""), str), content


def history_checked(content: dict) -> None:
    error_or_ok(content)
    if content["status"] == "ok":
        assert isinstance(content["history"], list), content
        for entry in content["history"]:
            assert len(entry) == 3 and is_int(entry[0]) and is_int(entry[1]), content


@dataclass(frozen=True)
class Request:
    id: str
    msg_type: str
    content: Any
    check: Check = error_or_ok
    metadata: Any = None


def packed(content: Any) -> bytes:
    """JSON as any client could write it (\\u escapes, so lone surrogates travel fine)."""
    return json.dumps(content, ensure_ascii=True).encode()


def replies(msg_type: str) -> str:
    return msg_type.rsplit("_", 1)[0] + "_reply"


PRINT_CODE = "print"
REQUESTS = [
    # -- execute_request: code that is not a string
    Request("execute-code-int", "execute_request", {"code": 5}, execute_error),
    Request("execute-code-none", "execute_request", {"code": None}, execute_error),
    Request("execute-code-list", "execute_request", {"code": ["1 + 1"]}, execute_error),
    Request("execute-code-object", "execute_request", {"code": {"source": "1"}}, execute_error),
    Request("execute-code-float", "execute_request", {"code": 1.5}, execute_error),
    # -- execute_request: lone surrogates (valid JSON escapes, invalid Unicode)
    Request("execute-lone-high-surrogate", "execute_request", packed({"code": 'x = "\ud800"'})),
    Request("execute-lone-low-surrogate", "execute_request", packed({"code": 'x = "\udcff"'})),
    Request(
        "execute-lone-surrogate-in-comment", "execute_request", packed({"code": "# \udfff\n6 * 7"})
    ),
    Request(
        "execute-lone-surrogate-silent",
        "execute_request",
        packed({"code": 'x = "\ud800"', "silent": True, "store_history": False}),
    ),
    # -- execute_request: odd optional fields
    Request(
        "execute-odd-flags",
        "execute_request",
        {"code": "1", "silent": "yes", "store_history": "no", "stop_on_error": "x"},
    ),
    Request(
        "execute-user-expressions-not-object",
        "execute_request",
        {"code": "1", "user_expressions": "1 + 1"},
    ),
    Request(
        "execute-user-expressions-odd-values",
        "execute_request",
        {"code": "1", "user_expressions": {"a": 5, "b": None, "c": "1/0"}},
    ),
    # -- execute_request: missing or malformed content and metadata
    Request("execute-empty-content", "execute_request", {}),
    Request("execute-without-code", "execute_request", {"silent": False, "store_history": True}),
    Request("execute-content-is-list", "execute_request", b'["1 + 1"]'),
    Request("execute-content-is-null", "execute_request", b"null"),
    Request("execute-metadata-not-object", "execute_request", {"code": "1"}, metadata=[1]),
    # -- complete_request: bad cursor positions and code
    Request(
        "complete-cursor-negative",
        "complete_request",
        {"code": "pri", "cursor_pos": -5},
        complete_checked("pri"),
    ),
    Request(
        "complete-cursor-huge",
        "complete_request",
        {"code": "pri", "cursor_pos": 10**30},
        complete_checked("pri"),
    ),
    Request(
        "complete-cursor-string",
        "complete_request",
        {"code": "pri", "cursor_pos": "3"},
        complete_checked("pri"),
    ),
    Request(
        "complete-cursor-float",
        "complete_request",
        {"code": "pri", "cursor_pos": 2.5},
        complete_checked("pri"),
    ),
    Request(
        "complete-cursor-none",
        "complete_request",
        {"code": "pri", "cursor_pos": None},
        complete_checked("pri"),
    ),
    Request(
        "complete-cursor-bool",
        "complete_request",
        {"code": "pri", "cursor_pos": True},
        complete_checked("pri"),
    ),
    Request(
        "complete-cursor-list",
        "complete_request",
        {"code": "pri", "cursor_pos": [3]},
        complete_checked("pri"),
    ),
    Request(
        "complete-code-int", "complete_request", {"code": 5, "cursor_pos": 1}, complete_checked(5)
    ),
    Request(
        "complete-code-none",
        "complete_request",
        {"code": None, "cursor_pos": 0},
        complete_checked(None),
    ),
    Request(
        "complete-without-cursor", "complete_request", {"code": "pri"}, complete_checked("pri")
    ),
    Request("complete-empty-content", "complete_request", {}, complete_checked("")),
    # -- inspect_request
    Request(
        "inspect-cursor-negative",
        "inspect_request",
        {"code": PRINT_CODE, "cursor_pos": -1, "detail_level": 0},
        inspect_checked,
    ),
    Request(
        "inspect-cursor-huge",
        "inspect_request",
        {"code": PRINT_CODE, "cursor_pos": 10**30, "detail_level": 0},
        inspect_checked,
    ),
    Request(
        "inspect-cursor-string",
        "inspect_request",
        {"code": PRINT_CODE, "cursor_pos": "x", "detail_level": 0},
        inspect_checked,
    ),
    Request(
        "inspect-cursor-none",
        "inspect_request",
        {"code": PRINT_CODE, "cursor_pos": None, "detail_level": 0},
        inspect_checked,
    ),
    Request(
        "inspect-detail-level-odd",
        "inspect_request",
        {"code": PRINT_CODE, "cursor_pos": 3, "detail_level": "all"},
        inspect_checked,
    ),
    Request(
        "inspect-code-list",
        "inspect_request",
        {"code": ["print"], "cursor_pos": 3, "detail_level": 0},
        inspect_checked,
    ),
    Request("inspect-without-cursor", "inspect_request", {"code": PRINT_CODE}, inspect_checked),
    Request("inspect-empty-content", "inspect_request", {}, inspect_checked),
    # -- is_complete_request
    Request("is-complete-code-int", "is_complete_request", {"code": 5}, is_complete_checked),
    Request("is-complete-code-none", "is_complete_request", {"code": None}, is_complete_checked),
    Request(
        "is-complete-code-list",
        "is_complete_request",
        {"code": ["for x in y:"]},
        is_complete_checked,
    ),
    Request("is-complete-empty-content", "is_complete_request", {}, is_complete_checked),
    # -- history_request
    Request(
        "history-tail-negative-n",
        "history_request",
        {"hist_access_type": "tail", "n": -5, "output": False, "raw": True},
        history_checked,
    ),
    Request(
        "history-tail-huge-n",
        "history_request",
        {"hist_access_type": "tail", "n": 10**30, "output": False, "raw": True},
        history_checked,
    ),
    Request(
        "history-tail-string-n",
        "history_request",
        {"hist_access_type": "tail", "n": "ten", "output": False, "raw": True},
        history_checked,
    ),
    Request(
        "history-range-string-session",
        "history_request",
        {
            "hist_access_type": "range",
            "session": "this",
            "start": 0,
            "stop": None,
            "output": True,
            "raw": True,
        },
        history_checked,
    ),
    Request(
        "history-range-huge-numbers",
        "history_request",
        {
            "hist_access_type": "range",
            "session": -(10**30),
            "start": 10**30,
            "stop": -1,
            "output": False,
            "raw": True,
        },
        history_checked,
    ),
    Request(
        "history-search-pattern-not-string",
        "history_request",
        {"hist_access_type": "search", "pattern": ["*"], "output": False, "raw": True},
        history_checked,
    ),
    Request(
        "history-search-string-n",
        "history_request",
        {"hist_access_type": "search", "pattern": "*", "n": "q", "output": False, "raw": True},
        history_checked,
    ),
    Request(
        "history-unknown-access-type",
        "history_request",
        {"hist_access_type": "bogus", "output": False, "raw": True},
        history_checked,
    ),
    Request(
        "history-access-type-not-string",
        "history_request",
        {"hist_access_type": 5, "output": "x", "raw": None},
        history_checked,
    ),
    Request(
        "history-without-output-and-raw",
        "history_request",
        {"hist_access_type": "tail", "n": 3},
        history_checked,
    ),
    Request("history-empty-content", "history_request", {}, history_checked),
    # -- other requests with content that is not an object
    Request("kernel-info-content-is-list", "kernel_info_request", b"[]"),
    Request("comm-info-content-is-number", "comm_info_request", b"5"),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=[r.id for r in REQUESTS])
def test_malformed_request_gets_a_reply(target: Kernel, request_: Request) -> None:
    msg_id = send(target, request_.msg_type, request_.content, request_.metadata)
    reply = reply_to(target, msg_id)
    assert reply is not None, (
        f"no {replies(request_.msg_type)} within {REPLY_TIMEOUT} s: the client would wait forever"
    )
    assert reply["msg_type"] == replies(request_.msg_type), reply["msg_type"]
    request_.check(reply["content"])


def test_request_ids_are_unique() -> None:
    assert len({r.id for r in REQUESTS}) == len(REQUESTS)


@pytest.mark.slow
def test_huge_code_of_comments_runs(target: Kernel) -> None:
    """50 MB of ``#`` comment lines, then an expression: the cell runs and shows its value."""
    code = ("#" * 99 + "\n") * (HUGE_CODE_BYTES // 100) + "6 * 7"
    assert len(code) >= HUGE_CODE_BYTES
    reply, messages = execute(target, code, timeout=300)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert result_of(messages) == "42"


# -- messages that must be ignored -----------------------------------------------------------


def no_reply_expected(target: Kernel, msg_id: str) -> None:
    """Nothing to answer; wait a moment for a stray reply, then the kernel must still work."""
    reply = reply_to(target, msg_id, timeout=1)
    assert reply is None or reply["content"].get("status") in ("ok", "error"), reply


@pytest.mark.parametrize("msg_type", ["nonsense_request", "execute_reply", "", "x" * 10_000])
def test_unknown_message_type_is_ignored(target: Kernel, msg_type: str) -> None:
    no_reply_expected(target, send(target, msg_type, {}))


def test_undecodable_content_is_ignored(target: Kernel) -> None:
    no_reply_expected(target, send(target, "execute_request", b'{"code": "1 + '))


def test_unsigned_message_is_not_executed(target: Kernel) -> None:
    """A message signed with the wrong key is dropped: its code must never run."""
    name = f"FORGED_{uuid.uuid4().hex}"
    session = target.client.session
    msg = session.msg("execute_request", {"code": f"{name} = 1", "silent": False})
    socket = target.client.shell_channel.socket
    frames = session.serialize(msg)
    delimiter = frames.index(b"<IDS|MSG>")
    frames[delimiter + 1] = b"0" * len(frames[delimiter + 1])  # a wrong HMAC
    socket.send_multipart(frames)
    no_reply_expected(target, msg["header"]["msg_id"])
    reply, messages = execute(target, f"{name!r} in globals()")
    assert reply["content"]["status"] == "ok", reply["content"]
    assert result_of(messages) == "False", "a message with a forged signature was executed"


def test_garbage_frames_are_ignored(target: Kernel) -> None:
    socket = target.client.shell_channel.socket
    socket.send_multipart([b"\x00\xff garbage"])
    socket.send_multipart([b"<IDS|MSG>", b"sig", b"{}", b"{}", b"{}"])
    socket.send_multipart([b"<IDS|MSG>"] + [b"\xff" * 1000] * 5)
    time.sleep(0.5)
