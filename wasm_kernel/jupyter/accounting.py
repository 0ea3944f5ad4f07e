"""The kernel's accounts of its cells: each ``execute_reply`` carries what the cell cost in
its metadata (``metrics.METADATA_KEY``), and, with ``WasmKernel.audit_log`` set, each cell
leaves one line in the operator's audit log (``audit``).

Both ride on ipykernel's own hooks around an execute_request: ``init_metadata`` as it
starts (the running cell, for the tool and network records made during it) and
``finish_metadata`` just before the reply is sent (so the audit line is written before the
client can see the reply).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ipykernel.kernelbase import Kernel

from ..sandbox.metrics import METADATA_KEY, CellMetrics
from ..settings.settings import ENV_PREFIX, config_source
from .audit import AuditLog, AuditLogUnusable

MEASURED_KEPT = 16  # figures waiting for their reply (subshells may run cells side by side)


class CellAccounting(Kernel):
    """Per-cell metrics in execute_reply metadata; the audit log's cell records."""

    def __init__(self, **kwargs: Any):
        self.audit: AuditLog | None = None
        self._measured: dict[str, CellMetrics] = {}  # by request msg_id, until its reply
        super().__init__(**kwargs)

    def open_audit_log(self, guest_folders: Iterable[Path], configured: set[str]) -> None:
        """Open the configured audit log, or refuse the setting (no cell runs then: an
        operator who asked for an audit must not get cells that leave none).
        ``configured``: the settings given in config or argv (else from the environment)."""
        path = getattr(self, "audit_log", "")
        if not path:
            return
        try:
            session = self.session.session if self.session is not None else ""
            limit = self.audit_log_limit  # type: ignore[attr-defined]
            self.audit = AuditLog.open(path, session, guest_folders, limit)
        except AuditLogUnusable as exc:
            source = f"the environment ({ENV_PREFIX}AUDIT_LOG)"
            if "audit_log" in configured:
                source = config_source(self.parent, "audit_log")
            reason = f"the audit log cannot be written safely: {exc}"
            self.refuse_setting("audit_log", path, source, reason)  # type: ignore[attr-defined]

    def cell_measured(self, parent: dict, metrics: CellMetrics | None) -> None:
        """What the request's cell cost, for its reply (None: it never ran). A request whose
        reply never came (its handler raised) leaves its figures: only the latest are kept."""
        if metrics is not None:
            while len(self._measured) >= MEASURED_KEPT:
                del self._measured[next(iter(self._measured))]
            self._measured[_msg_id(parent)] = metrics

    def init_metadata(self, parent: dict) -> dict:
        metadata = super().init_metadata(parent)
        if self.audit is not None:
            self.audit.cell_started(_code(parent))
        return metadata

    def finish_metadata(self, parent: dict, metadata: dict, reply_content: dict) -> dict:
        metadata = super().finish_metadata(parent, metadata, reply_content)
        measured = self._measured.pop(_msg_id(parent), None)
        if measured is not None:
            metadata[METADATA_KEY] = measured.as_metadata()
        if self.audit is not None:
            content = parent.get("content") or {}
            status = reply_content.get("status")
            self.audit.cell(
                _code(parent),
                "ok" if status == "ok" else "error",
                None if measured is None else measured.as_metadata(),
                execution_count=reply_content.get("execution_count"),
                client_session=(parent.get("header") or {}).get("session"),
                error=None if status == "ok" else str(reply_content.get("ename", status)),
                silent=bool(content.get("silent")),
            )
        return metadata

    def close_audit_log(self) -> None:
        if self.audit is not None:
            self.audit.close()


def _msg_id(parent: dict) -> str:
    return str((parent.get("header") or {}).get("msg_id", ""))


def _code(parent: dict) -> str:
    code = (parent.get("content") or {}).get("code")
    return code if isinstance(code, str) else ""
