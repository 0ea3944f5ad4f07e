"""The operator's audit log (``WasmKernel.audit_log``): one JSON line per cell, tool call and
network request, written by the host only, never holding what the code printed or returned.

A line is at most ``MAX_LINE`` bytes, written with one ``write`` to a file opened for
appending without following a link, so several kernels may share one log. The file is bounded
(``WasmKernel.audit_log_limit``): the line that would take it past its bound renames it to
the same name with ``.1`` (replacing the one before) and starts a new file with a ``rotated``
line naming it; kernels sharing the log do this under a lock on the file, so each file stays
within the bound. The path is
checked when the kernel starts (a link, a folder, a file with other names, a file inside a
folder mounted into the guest, or one that cannot be opened: the setting is refused and no
cell runs). If a line cannot be written later (disk full, the file removed with its folder),
the cell goes on and its reply is sent; the line waits in memory (up to ``BACKLOG`` lines)
and is written before the next one; the kernel log says so at once and again when writing
works again, and ``%sandbox`` shows it meanwhile. Lines past the backlog are counted, and
the count is written as a ``lost`` record when the file takes lines again.

Interface for the kernel's other host code (tools, the network): ``AuditLog.tool_call`` and
``AuditLog.network_request``; both are thread-safe and tag their line with the cell running
at the time (``cell_started``, called by the kernel).
"""

from __future__ import annotations

import collections
import datetime
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import stat
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..files.host_files import NotAFile, open_regular

log = logging.getLogger(__name__)

MAX_LINE = 8192  # bytes of one record, newline included
MAX_TEXT = 512  # characters of any one text field (a tool's name, an error's name, a URL)
SHORT_TEXT = 32  # characters each text field keeps when a record would outgrow MAX_LINE
BACKLOG = 1000  # lines kept in memory while the file cannot be written
DEFAULT_LIMIT = 64 << 20  # bytes of the file (WasmKernel.audit_log_limit's default)
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT


class AuditLogUnusable(ValueError):
    """The audit path cannot be written safely; the reason is for the operator."""


def code_digest(code: str) -> str:
    """The sha256 of a cell's code (UTF-8; lone surrogates kept), the code's only trace."""
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


def _text(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."


def _public_url(url: str) -> str:
    """A URL's origin only (scheme, host, port): paths, queries and user names may carry
    secrets (tokens in paths are common), and the origin is what the allowlist judges."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "(not a URL)"
    if ":" in host:
        host = f"[{host}]"
    return _text(urllib.parse.urlunsplit((parts.scheme, host + port, "", "", "")))


class AuditLog:
    """Appends records to the operator's audit file; see the module's docstring."""

    def __init__(self, path: Path, session: str, limit: int = DEFAULT_LIMIT):
        self.path = path
        self.previous = path.with_name(path.name + ".1")  # where the rotated lines go
        self.session = session
        if limit < 2 * MAX_LINE:  # a new file must hold its rotated line and a record
            raise ValueError(f"an audit log's bound must be at least {2 * MAX_LINE} bytes")
        self.limit = limit
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None
        self._waiting: collections.deque[bytes] = collections.deque(maxlen=BACKLOG)
        self._lost = 0
        self._failure = ""  # why the last write failed ("": it worked)
        self._cell: str | None = None  # the sha256 of the running cell's code

    @classmethod
    def open(
        cls,
        path: str,
        session: str,
        guest_folders: Iterable[Path] = (),
        limit: int = DEFAULT_LIMIT,
    ) -> AuditLog:
        """The log at ``path`` (absolute), opened now; AuditLogUnusable says why it cannot be.

        ``guest_folders``: host folders mounted into the guest, which may not hold the log (a
        cell could read it, or replace it with a link); ``limit``: bytes the file may reach."""
        target = Path(path)
        try:
            folder = target.parent.resolve(strict=True)
        except (OSError, RuntimeError) as exc:
            raise AuditLogUnusable(f"its folder {target.parent} cannot be used: {exc}") from None
        for mounted in guest_folders:
            if folder == mounted or mounted in folder.parents:
                raise AuditLogUnusable(
                    f"it is inside {mounted}, a folder mounted into the sandbox: cells could"
                    " read it or replace it"
                )
        audit = cls(folder / target.name, session, limit)
        try:
            audit._reopen()
        except OSError as exc:
            raise AuditLogUnusable(_reason(exc)) from None
        return audit

    # -- the records ------------------------------------------------------------------------------

    def cell_started(self, code: str) -> None:
        """The cell now running, whose digest the tool and network records carry."""
        self._cell = code_digest(code)

    def cell(
        self,
        code: str,
        verdict: str,
        metrics: Mapping[str, Any] | None,
        *,
        execution_count: int | None = None,
        client_session: Any = None,
        error: str | None = None,
        silent: bool = False,
    ) -> None:
        """A cell ended (or was refused): ``verdict`` 'ok' or 'error' (``error``: its ename);
        ``metrics``: what it cost, None if it never reached the interpreter."""
        self._cell = None
        self._write(
            "cell",
            verdict,
            code_sha256=code_digest(code),
            execution_count=execution_count,
            client_session=None if client_session is None else _text(client_session),
            silent=silent,
            error=None if error is None else _text(error),
            metrics=dict(metrics) if metrics is not None else None,
        )

    def tool_call(
        self,
        tool: str,
        verdict: str,
        *,
        seconds: float,
        error: str | None = None,
        sent_bytes: int | None = None,
        received_bytes: int | None = None,
    ) -> None:
        """A cell called a host tool: ``verdict`` 'ok', 'error' (the tool raised; ``error``:
        the exception's name) or 'refused' (``error``: why); sizes of the JSON arguments
        and result, never their contents."""
        self._write(
            "tool_call",
            verdict,
            cell_sha256=self._cell,
            tool=_text(tool),
            error=None if error is None else _text(error),
            metrics={
                "seconds": seconds,
                "sent_bytes": sent_bytes,
                "received_bytes": received_bytes,
            },
        )

    def network_request(
        self,
        method: str,
        url: str,
        verdict: str,
        *,
        reason: str | None = None,
        status: int | None = None,
        seconds: float | None = None,
        sent_bytes: int | None = None,
        received_bytes: int | None = None,
    ) -> None:
        """A cell asked for ``url``: ``verdict`` 'allowed' (``status``: the HTTP status) or
        'refused' (``reason``: not listed, private address, over budget...). The URL is kept
        as its origin only (scheme, host, port); no header or body is kept."""
        self._write(
            "network_request",
            verdict,
            cell_sha256=self._cell,
            method=_text(method),
            url=_public_url(url),
            reason=None if reason is None else _text(reason),
            status=status,
            metrics={
                "seconds": seconds,
                "sent_bytes": sent_bytes,
                "received_bytes": received_bytes,
            },
        )

    # -- the file ---------------------------------------------------------------------------------

    def describe(self) -> str:
        """For ``%sandbox``: where the log goes, and whether it is being written."""
        if not self._failure:
            return (
                f"{self.path} (one line per cell, tool call and network request; renamed to"
                f" {self.previous.name} past {self.limit:,} bytes)"
            )
        return (
            f"{self.path}, NOT being written: {self._failure}; {len(self._waiting)} lines wait"
            + (f", {self._lost} lost" if self._lost else "")
        )

    def close(self) -> None:
        """Write what waits, if the file takes it now, and let the file go."""
        with self._lock:
            if self._waiting or self._lost:
                self._flush()
            if self._waiting or self._lost:
                log.error(
                    "audit log %s: %d lines could not be written and are lost",
                    self.path,
                    len(self._waiting) + self._lost,
                )
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _write(self, kind: str, verdict: str, **fields: Any) -> None:
        record = {
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
            "kind": kind,
            "session": self.session,
            "verdict": _text(verdict),
            **{name: value for name, value in fields.items() if value is not None},
        }
        line = _line(record)
        with self._lock:
            if len(self._waiting) == self._waiting.maxlen:
                self._lost += 1  # the oldest waiting line makes room
            self._waiting.append(line)
            self._flush()

    def _flush(self) -> None:
        """Write the waiting lines in order, a lost-lines record first; stop at a failure."""
        try:
            if self._lost:
                lost = {"time": _now(), "kind": "lost", "session": self.session}
                self._append(_line({**lost, "verdict": "lost", "lines": self._lost}))
                self._lost = 0
            while self._waiting:
                self._append(self._waiting[0])
                self._waiting.popleft()
        except OSError as exc:
            failure = _reason(exc)
            if failure != self._failure:
                log.error(
                    "audit log %s cannot be written (%s): cells go on; %d lines wait in memory",
                    self.path,
                    failure,
                    len(self._waiting),
                )
            self._failure = failure
            return
        if self._failure:
            log.warning("audit log %s is written again", self.path)
            self._failure = ""

    def _append(self, line: bytes) -> None:
        """Write one line, under the file's lock: the file the path names now, rotated first
        if the line would take it past the bound."""
        while True:
            if self._fd is None or not self._same_file():
                self._reopen()
            assert self._fd is not None
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                if not self._same_file():
                    continue  # another kernel rotated it meanwhile: take the new file
                if os.fstat(self._fd).st_size + len(line) > self.limit:
                    self._rotate()
                    continue
                written = os.write(self._fd, line)
                if written != len(line):  # a full disk mid-line: it would join the next line
                    os.write(self._fd, b"\n")
                    raise OSError(errno.ENOSPC, "the line was cut short")
                return
            finally:
                if self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _rotate(self) -> None:
        """Rename the full file (its lock held) and start the next with a line saying so."""
        assert self._fd is not None
        os.rename(self.path, self.previous)
        self._reopen()
        assert self._fd is not None
        rotated = {"time": _now(), "kind": "rotated", "session": self.session}
        note = {**rotated, "verdict": "rotated", "previous": str(self.previous)}
        os.write(self._fd, _line({**note, "limit": self.limit}))

    def _same_file(self) -> bool:
        """Whether the path still names the open file (not rotated away, removed or replaced)."""
        try:
            status = os.lstat(self.path)
        except OSError:
            return False
        return (status.st_dev, status.st_ino) == self._identity and stat.S_ISREG(status.st_mode)

    def _reopen(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        fd = open_regular(self.path, _APPEND)
        status = os.fstat(fd)
        if status.st_nlink > 1:
            os.close(fd)
            raise NotAFile(errno.EMLINK, f"{self.path} has other names (hard links)")
        self._fd, self._identity = fd, (status.st_dev, status.st_ino)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def _line(record: dict[str, Any]) -> bytes:
    """One JSON line of at most MAX_LINE bytes: a record whose texts (escaped, non-ASCII
    takes up to 12 bytes a character) would make it longer keeps SHORT_TEXT of each."""
    record = {name: _value(value) for name, value in record.items()}
    data = _encoded(record)
    if len(data) > MAX_LINE:
        record = {name: _shortened(value) for name, value in record.items()}
        data = _encoded({**record, "shortened": True})
    if len(data) > MAX_LINE:  # many long metric names: the figures go, the record stays
        record = {name: value for name, value in record.items() if not isinstance(value, dict)}
        data = _encoded({**record, "shortened": True})
    return data


def _encoded(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")


def _value(value: Any) -> Any:
    """JSON only: a scalar, or a flat mapping of scalars (a record's metrics)."""
    if isinstance(value, Mapping):
        return {_text(name): _scalar(item) for name, item in list(value.items())[:32]}
    return _scalar(value)


def _scalar(value: Any) -> Any:
    """None, a boolean, a 64-bit integer, a finite float (others: None) or a bounded text."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return _text(value)


def _shortened(value: Any) -> Any:
    if isinstance(value, str):
        return value[:SHORT_TEXT]
    if isinstance(value, dict):
        return {name[:SHORT_TEXT]: _shortened(item) for name, item in value.items()}
    return value


def _reason(exc: OSError) -> str:
    if isinstance(exc, NotAFile):
        return exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"not writable ({exc.strerror})"
    return exc.strerror or str(exc)
