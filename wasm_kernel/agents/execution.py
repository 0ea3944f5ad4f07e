"""What one ``run`` of a session produced, built from the IOPub messages of its request.

Kept apart from the sessions (client.py), which only wait for the messages and feed them here.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..sandbox.metrics import CellMetrics

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")

Callback = Callable[[Any], None]


@dataclass(frozen=True)
class ExecutionError:
    """An uncaught exception of a cell (or the kernel's own verdict, e.g. FuelExhausted)."""

    name: str
    value: str
    traceback: str  # plain text, no terminal colours

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"


@dataclass
class Execution:
    """What one ``run`` produced."""

    results: list[dict[str, Any]] = field(default_factory=list)  # mime bundles, in order
    stdout: str = ""
    stderr: str = ""
    error: ExecutionError | None = None
    execution_count: int | None = None
    duration: float = 0.0  # seconds from the request to the reply
    timed_out: bool = False  # the client's timeout interrupted the cell
    metrics: CellMetrics | None = None  # what the cell cost, as the kernel measured it

    @property
    def text(self) -> str | None:
        """The text/plain of the last result, if any (the value of the cell's last line)."""
        for bundle in reversed(self.results):
            if isinstance(bundle.get("text/plain"), str):
                return bundle["text/plain"]
        return None


def plain_text(text: str) -> str:
    return ANSI.sub("", text)


class Collector:
    """Builds an Execution from the IOPub messages of one request."""

    def __init__(
        self,
        msg_id: str,
        on_stdout: Callback | None,
        on_stderr: Callback | None,
        on_result: Callback | None,
    ):
        self.msg_id = msg_id
        self.execution = Execution()
        self.callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self.on_result = on_result
        self.started = time.monotonic()
        self._clear_pending = False

    def feed(self, message: dict) -> bool:
        """Take one IOPub message; True once the request is done (the kernel went idle)."""
        if message.get("parent_header", {}).get("msg_id") != self.msg_id:
            return False
        kind, content = message.get("msg_type"), message.get("content") or {}
        if kind == "status":
            return content.get("execution_state") == "idle"
        execution = self.execution
        if kind in ("stream", "display_data", "execute_result", "error") and self._clear_pending:
            self._clear()
        if kind == "stream" and content.get("name") in ("stdout", "stderr"):
            name, text = content["name"], str(content.get("text", ""))
            setattr(execution, name, getattr(execution, name) + text)
            callback = self.callbacks[name]
            if callback is not None:
                callback(text)
        elif kind in ("display_data", "execute_result") and isinstance(content.get("data"), dict):
            execution.results.append(content["data"])
            if self.on_result is not None:
                self.on_result(content["data"])
        elif kind == "error":
            execution.error = _error(content)
        elif kind == "clear_output":
            if content.get("wait"):
                self._clear_pending = True
            else:
                self._clear()
        return False

    def _clear(self) -> None:
        self._clear_pending = False
        self.execution.results, self.execution.stdout, self.execution.stderr = [], "", ""

    def finish(self, reply: dict | None) -> Execution:
        execution = self.execution
        execution.duration = time.monotonic() - self.started
        content = (reply or {}).get("content") or {}
        execution.metrics = CellMetrics.from_metadata((reply or {}).get("metadata"))
        count = content.get("execution_count")
        execution.execution_count = count if isinstance(count, int) else None
        if content.get("status") == "error" and execution.error is None:
            execution.error = _error(content)
        return execution


def _error(content: dict) -> ExecutionError:
    lines = content.get("traceback") or []
    return ExecutionError(
        name=str(content.get("ename", "")),
        value=str(content.get("evalue", "")),
        traceback=plain_text("\n".join(str(line) for line in lines)),
    )
