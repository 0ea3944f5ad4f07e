"""docs/bounds.md, the table of the bounds at the kernel's doors, against the code: each row's
default is the value its declaration holds, so the table cannot drift from what the kernel
enforces."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from wasm_kernel.settings.kernel_settings import KernelSettings

pytestmark = pytest.mark.nokernel

TABLE = Path(__file__).resolve().parent.parent / "docs" / "bounds.md"
UNITS = {"": 1, "s": 1, "characters": 1, "KiB": 1 << 10, "MiB": 1 << 20}
DEFAULT = re.compile(r"([\d,]+) ?(\w*)")
DECLARED = re.compile(r"`([\w.]+)`(?: `(\w+)`)?")


def rows() -> list[tuple[str, str, str]]:
    """(what is bounded, its default, where it is declared) of each row of the table."""
    found = []
    for line in TABLE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("door", "---"):
            found.append((cells[1], cells[2], cells[3]))
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


def test_the_table_has_a_row_per_door() -> None:
    doors = {line.split("|")[1].strip() for line in TABLE.read_text().splitlines() if "|" in line}
    for door in ("comms, front end -> guest", "tools", "audit log", "kernel server", "live forks"):
        assert door in doors, door


@pytest.mark.parametrize(("what", "default", "where"), rows(), ids=[row[0][:40] for row in rows()])
def test_each_default_is_the_declared_value(what: str, default: str, where: str) -> None:
    match = DEFAULT.fullmatch(default)
    assert match is not None and match.group(2) in UNITS, default
    shown = int(match.group(1).replace(",", "")) * UNITS[match.group(2)]
    assert shown == declared_value(where), (what, default, where)
