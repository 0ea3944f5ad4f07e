"""Operator tools for tests/agents/test_tools.py: imported by the kernel (WasmKernel.tools)."""

from __future__ import annotations

import os


def word_count(text: str) -> int:
    """How many words ``text`` has."""
    return len(text.split())


async def kernel_pid() -> int:
    """The process the tool runs in (the kernel's, not the guest's)."""
    return os.getpid()
