"""The function bench/tool_calls.py calls as a tool (importable by the kernel process too)."""

from __future__ import annotations


def lookup(key: str) -> dict:
    """A record for ``key``: what a small tool returns."""
    return {"key": key, "size": len(key)}
