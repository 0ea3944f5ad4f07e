"""docs/bounds.md, the table of the bounds at the kernel's doors, against the code: each row's
default is the value its declaration holds, so the table cannot drift from what the kernel
enforces."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from wasm_kernel.settings.kernel_settings import KernelSettings
from wasm_kernel.settings.profiles import PROFILES

pytestmark = pytest.mark.nokernel

TABLE = Path(__file__).resolve().parent.parent / "docs" / "bounds.md"
UNITS = {"": 1, "s": 1, "characters": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
# a value, or one per profile: "1 GiB (notebook), 64 MiB (strict)"
DEFAULT = re.compile(r"([\d,]+) ?(\w*)(?: \((\w+)\))?")
DECLARED = re.compile(r"`([\w.]+)`(?: `(\w+)`)?")
ALWAYS = "always"  # a refusal with no size: its declaration is the errno the row's error shows
ERRNO = re.compile(r"\[Errno (\d+)\]")


def rows() -> list[tuple[str, str, str, str]]:
    """(what is bounded, its default, where it is declared, past it) of each row."""
    found = []
    for line in TABLE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("door", "---"):
            found.append((cells[1], cells[2], cells[3], cells[4]))
    return found


def declared_value(where: str) -> object:
    """The value a row's declaration holds: a setting's default, a module's constant, or a
    field of one (a message's ``limit``)."""
    match = DECLARED.match(where)
    assert match is not None, where
    name, field = match.groups()
    if name.startswith("WasmKernel."):
        return KernelSettings.class_own_traits(config=True)[name.split(".", 1)[1]].declared
    module, _, attribute = name.rpartition(".")
    value = getattr(importlib.import_module(module), attribute)
    return getattr(value, field) if field else value


def profile_value(where: str, profile: str) -> object:
    """A setting's default under ``profile`` (for a setting the profile decides)."""
    match = DECLARED.match(where)
    assert match is not None and match.group(1).startswith("WasmKernel."), where
    return getattr(PROFILES[profile], match.group(1).split(".", 1)[1])


def test_the_table_has_a_row_per_door() -> None:
    doors = {line.split("|")[1].strip() for line in TABLE.read_text().splitlines() if "|" in line}
    for door in (
        "comms, front end -> guest",
        "tools",
        "audit log",
        "kernel server",
        "live forks",
        "files",
        "private /tmp",
        "images",
        "MCP server",
    ):
        assert door in doors, door


@pytest.mark.parametrize(
    ("what", "default", "where", "past"), rows(), ids=[row[0][:40] for row in rows()]
)
def test_each_default_is_the_declared_value(what: str, default: str, where: str, past: str) -> None:
    if default == ALWAYS:
        shown_errno = ERRNO.search(past)
        assert shown_errno is not None, (what, past)
        assert int(shown_errno.group(1)) == declared_value(where), (what, past, where)
        return
    for part in default.split(", "):
        match = DEFAULT.fullmatch(part)
        assert match is not None and match.group(2) in UNITS, default
        shown = int(match.group(1).replace(",", "")) * UNITS[match.group(2)]
        profile = match.group(3)
        declared = declared_value(where) if profile is None else profile_value(where, profile)
        assert shown == declared, (what, default, where)
