"""Input history for history_request: one numbered session per kernel, kept in SQLite.

Like IPython's history, sessions persist across kernels (so `jupyter console` can recall
earlier work) and session 0 / negative numbers mean "this one" / "n sessions back". Writes use
SQLite's WAL mode without a sync per cell, which keeps recording off the round trip. If the
history file cannot be created or written (read-only home, read-only or locked file), history
lives in memory for this kernel, with a warning in the kernel log; the kernel still starts.
The file (and SQLite's side files) is this user's only, 0600, and so is the per-user data
folder holding it by default (see files/private_files.py): it holds every cell's code.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..files.private_files import (
    make_parents,
    narrow_existing,
    private_file,
    private_folder,
)
from ..settings.kernel_settings import user_data

log = logging.getLogger(__name__)

Entry = tuple[int, int, str]

_SCHEMA = """
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS sessions (session INTEGER PRIMARY KEY AUTOINCREMENT, start TEXT);
CREATE TABLE IF NOT EXISTS history (
    session INTEGER, line INTEGER, source TEXT, PRIMARY KEY (session, line));
"""


class History:
    def __init__(self, path: str):
        self.db, self.session = self._open(path)

    @classmethod
    def _open(cls, path: str) -> tuple[sqlite3.Connection, int]:
        """The database and this kernel's session number: from ``path``, else in memory.

        Opening counts as working only once the new session is written, so a file that opens
        but refuses writes (read-only file or folder) also falls back.
        """
        if path != ":memory:":
            db = None
            try:
                _make_private(Path(path))
                db = sqlite3.connect(path, check_same_thread=False, timeout=2)
                return db, cls._start_session(db)
            except (OSError, sqlite3.Error) as exc:
                if db is not None:
                    db.close()
                log.warning("history file %s unusable (%s); keeping history in memory", path, exc)
        db = sqlite3.connect(":memory:", check_same_thread=False)
        return db, cls._start_session(db)

    @staticmethod
    def _start_session(db: sqlite3.Connection) -> int:
        db.executescript(_SCHEMA)
        with db:
            cursor = db.execute(
                "INSERT INTO sessions (start) VALUES (?)", (datetime.now(UTC).isoformat(),)
            )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def store(self, line: int, source: str) -> None:
        try:
            with self.db:
                self.db.execute(
                    "INSERT OR REPLACE INTO history VALUES (?, ?, ?)", (self.session, line, source)
                )
        except (sqlite3.Error, UnicodeEncodeError) as exc:
            log.warning("could not record history: %s", exc)

    def tail(self, n: int, unique: bool = False) -> list[Entry]:
        query = "SELECT session, line, source FROM history"
        if unique:
            query += " GROUP BY source HAVING rowid = MAX(rowid)"
        rows = self.db.execute(query + " ORDER BY session DESC, line DESC LIMIT ?", (max(n, 0),))
        return list(reversed(rows.fetchall()))

    def range(self, session: int, start: int, stop: int | None) -> list[Entry]:
        """Lines [start, stop) of a session; 0 is this session, -k is k sessions back."""
        if session <= 0:
            session += self.session
        query = "SELECT session, line, source FROM history WHERE session = ? AND line >= ?"
        params: list[int] = [session, start]
        if stop is not None:
            query += " AND line < ?"
            params.append(stop)
        return self.db.execute(query + " ORDER BY line", params).fetchall()

    def search(self, pattern: str, n: int | None, unique: bool = False) -> list[Entry]:
        """Entries whose source matches the glob ``pattern``, newest last."""
        query = "SELECT session, line, source FROM history WHERE source GLOB ?"
        if unique:
            query += " GROUP BY source HAVING rowid = MAX(rowid)"
        query += " ORDER BY session DESC, line DESC"
        params: list[object] = [pattern]
        if n:
            query += " LIMIT ?"
            params.append(n)
        return list(reversed(self.db.execute(query, params).fetchall()))

    def close(self) -> None:
        self.db.close()

    def reply(
        self,
        hist_access_type: str,
        output: bool,
        session: Any,
        start: Any,
        stop: Any,
        n: Any,
        pattern: Any,
        unique: Any,
    ) -> dict:
        """A history_reply, its parameters checked (they arrive as any JSON)."""
        try:
            if hist_access_type == "tail":
                entries = self.tail(bounded(n, 10), bool(unique))
            elif hist_access_type == "range":
                stop_line = None if stop is None else bounded(stop, 0)
                entries = self.range(bounded(session, 0), bounded(start, 0), stop_line)
            elif hist_access_type == "search":
                entries = self.search(str(pattern or "*"), bounded(n, 0) or None, bool(unique))
            else:
                entries = []
        except (TypeError, ValueError) as exc:
            return {
                "status": "error",
                "ename": "MalformedRequest",
                "evalue": str(exc),
                "traceback": [],
            }
        if output:
            return {"status": "ok", "history": [(s, n_, (src, None)) for s, n_, src in entries]}
        return {"status": "ok", "history": entries}


def bounded(value: Any, fallback: int) -> int:
    """An integer history parameter, within SQLite's range."""
    if value is None:
        return fallback
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return max(min(value, 2**62), -(2**62))


def _make_private(path: Path) -> None:
    """The history file 0600 before SQLite opens it (SQLite gives its journal and WAL the
    file's mode), its side files narrowed too; its folder made private if missing, and
    narrowed if it is the per-user data folder (a folder of the user's own choosing is
    left as it is)."""
    make_parents(path)
    if path.parent == Path(user_data("")):
        private_folder(path.parent)
    os.close(private_file(path))
    for suffix in ("-wal", "-shm", "-journal"):
        narrow_existing(path.with_name(path.name + suffix))
