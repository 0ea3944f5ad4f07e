"""The execute_request a cell answers, as the kernel saw it when it arrived.

Its own module because both a cell's messages and the host tools it calls carry it, and
neither should import the other for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Request:
    """The execute_request a cell answers, as the kernel saw it when it arrived."""

    parent: dict
    stdin_ident: Any
    silent: bool
    allow_stdin: bool
    execution_count: int
