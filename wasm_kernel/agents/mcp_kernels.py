"""The MCP server's kernels: one sandbox per MCP session, and the sandboxes forked from it.

A session's first call starts its ``main`` sandbox. Where snapshots are allowed, the model may
fork a sandbox into a new one under a name of its own (``Session.fork``: the new kernel maps
the old one's memory copy-on-write) and pass that name to any tool; the two then go their own
ways, to try two approaches from the same state. Every sandbox is a kernel process, so all of
them count against ``max_sessions``, and a session holds at most ``MAX_FORKS`` forks; all of a
session's sandboxes end with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..client import AsyncSession, SessionError
from ..settings.profiles import PROFILES
from ..settings.settings import TRUE_WORDS

MAX_SESSIONS = 8  # kernels at once (sessions and their forks): each is a process (~150 MB)
MAX_FORKS = 4  # forked sandboxes one MCP session may hold besides its main one
FORK_END_WAIT = 60.0  # seconds the server's end waits for forks being started, to end them
MAIN = "main"  # the name of a session's own sandbox
SANDBOX_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


@dataclass
class Kernels:
    """The kernels of this server, by MCP session (key None: the stdio session), then by
    sandbox name.

    A session is idle when no call uses any of its sandboxes and its last call ended
    ``idle_timeout`` seconds ago (the SDK expires the session itself on the same clock);
    ``max_sessions`` bounds the kernels alive, so a session the SDK has expired holds its
    places until its kernels are gone."""

    profile: str
    settings: dict[str, Any]
    cwd: str | None = None
    max_sessions: int = MAX_SESSIONS
    upstream: str | None = None  # the --upstream configuration file
    tools: dict[str, Any] = field(default_factory=dict)  # its tools, once connected
    sessions: dict[str | None, dict[str, AsyncSession]] = field(default_factory=dict)
    used: dict[str | None, float] = field(default_factory=dict)
    calls: dict[str | None, int] = field(default_factory=dict)  # calls in progress
    # forks being started, by session: their places and names are taken before they start,
    # so that concurrent calls cannot all pass the check and then all start a kernel
    starting: dict[str | None, set[str]] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _turns: weakref.WeakKeyDictionary[AsyncSession, asyncio.Lock] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    _closing: bool = False  # the server is ending: a fork that starts meanwhile ends at once

    @contextlib.asynccontextmanager
    async def use(
        self, key: str | None, idle_timeout: float, sandbox: str = MAIN
    ) -> AsyncIterator[AsyncSession]:
        """A sandbox of the session (its main one started on first use), with the session
        marked in use until the call ends."""
        async with self._lock:
            if self._closing:
                raise SessionError("the server is shutting down")
            sandboxes = self.sessions.get(key, {})
            session = sandboxes.get(sandbox)
            if session is None and sandbox != MAIN:
                raise SessionError(f"there is no sandbox {sandbox!r}: {self._names(key)}")
            if session is None:
                await self._make_room(idle_timeout)
                session = await self.start()
                self.sessions.setdefault(key, {})[MAIN] = session
            self.calls[key] = self.calls.get(key, 0) + 1
            self.used[key] = time.monotonic()
        try:
            # one call at a time per sandbox: a session's client reads its kernel's messages
            # for one request at a time (two concurrent forks took each other's replies)
            async with self._turns.setdefault(session, asyncio.Lock()):
                yield session
        finally:
            if self.sessions.get(key, {}).get(sandbox) is session:  # not closed meanwhile
                self.calls[key] -= 1
                self.used[key] = time.monotonic()

    async def fork(self, key: str | None, idle_timeout: float, source: str, name: str) -> None:
        """Start sandbox ``name`` of the session as a fork of its sandbox ``source``."""
        if name == MAIN or SANDBOX_NAME.fullmatch(name) is None:
            raise SessionError(
                f"a sandbox name is 1 to 64 letters, digits, '_' or '-', not {MAIN!r}: {name!r}"
            )
        async with self._lock:  # the place and the name are taken before the fork waits
            self._check_fork(key, name)
            await self._make_room(idle_timeout)
            self.starting.setdefault(key, set()).add(name)
        try:
            async with self.use(key, idle_timeout, source) as parent:
                forked = await parent.fork()
        except BaseException:
            async with self._lock:
                self.starting[key].discard(name)
            raise
        async with self._lock:
            ended = key not in self.sessions or self._closing
            if not ended:
                self.sessions[key][name] = forked
                self.starting[key].discard(name)
                return
        try:  # its place is held until it has ended: close_all waits for that
            await forked.close()
        finally:
            async with self._lock:
                self.starting[key].discard(name)
        raise SessionError("the session ended while its sandbox was forked")

    def _check_fork(self, key: str | None, name: str) -> None:
        sandboxes = self.sessions.get(key, {})
        starting = self.starting.get(key, set())
        if name in sandboxes or name in starting:
            raise SessionError(f"there is a sandbox {name!r} already: close it first")
        if len(sandboxes) - (MAIN in sandboxes) + len(starting) >= MAX_FORKS:
            raise SessionError(f"this session holds {MAX_FORKS} forks already: close one first")

    async def _make_room(self, idle_timeout: float) -> None:
        """Room for one more kernel, ending idle sessions if need be; raises if there is none."""
        if self._alive() >= self.max_sessions:
            await self._close_idle(idle_timeout)
        if self._alive() >= self.max_sessions:
            raise SessionError(self._full())

    def _full(self) -> str:
        return (
            f"this server already runs its {self.max_sessions} kernels (sessions and their"
            " forks, --max-sessions): try again when another has ended"
        )

    def _alive(self) -> int:
        """Kernels running or being started."""
        started = sum(len(sandboxes) for sandboxes in self.sessions.values())
        return started + sum(len(names) for names in self.starting.values())

    def _names(self, key: str | None) -> str:
        return f"this session's sandboxes are {', '.join(self.names(key))}"

    def names(self, key: str | None) -> list[str]:
        """The session's sandboxes: ``main`` (started on first use) and its forks."""
        return sorted({MAIN, *self.sessions.get(key, {})})

    async def start(self) -> AsyncSession:
        session = AsyncSession(
            self.profile,
            cwd=self.cwd,
            kernel_stdout=subprocess.DEVNULL,
            tools=self.tools,
            **self.settings,
        )
        await session.start()
        return session

    async def close_sandbox(self, key: str | None, name: str) -> None:
        """End one forked sandbox of the session (its main one ends with the session)."""
        async with self._lock:
            if name == MAIN:
                raise SessionError(f"{MAIN!r} ends with the session; reset starts it afresh")
            session = self.sessions.get(key, {}).pop(name, None)
        if session is None:
            raise SessionError(f"there is no sandbox {name!r}: {self._names(key)}")
        await session.close()

    async def close_idle(self, seconds: float) -> None:
        async with self._lock:
            await self._close_idle(seconds)

    async def _close_idle(self, seconds: float) -> None:
        now = time.monotonic()
        for key, when in list(self.used.items()):
            if not self.calls.get(key) and now - when >= seconds:
                await self.close(key)

    async def close(self, key: str | None) -> None:
        """End the session's sandboxes, forks first."""
        sandboxes = self.sessions.pop(key, {})
        self.used.pop(key, None)
        self.calls.pop(key, None)
        for name in sorted(sandboxes, key=lambda name: name == MAIN):
            await sandboxes[name].close()

    async def close_all(self) -> None:
        """At the server's end: every kernel, and those being started once they are."""
        async with self._lock:
            self._closing = True
            for key in list(self.sessions):
                await self.close(key)
        deadline = time.monotonic() + FORK_END_WAIT
        while any(self.starting.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # each fork closes its kernel once it has started

    def allows(self, setting: str) -> bool:
        """Does the kernels' ``snapshots`` or ``packages`` setting allow its tools? From
        ``--set``, else the server's environment, else the profile, as the kernel reads it;
        a value the kernel would refuse allows nothing."""
        value = self.settings.get(setting, os.environ.get(f"WASM_KERNEL_{setting.upper()}"))
        if value is None:
            value = getattr(PROFILES[self.profile], setting)
        if setting == "packages":
            return str(value).strip() not in ("", "off")
        return str(value).strip().lower() in TRUE_WORDS
