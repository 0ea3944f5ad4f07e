"""The package's shape: subpackages named after the parts of the design, no import cycle,
modules and classes of a size one can read, and a client that loads no sandbox.

Read from the sources (the import graph counts every import, those inside functions and under
``TYPE_CHECKING`` too: a cycle hidden in a function is still a cycle to a reader)."""

from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import wasm_kernel

pytestmark = pytest.mark.nokernel

PACKAGE = Path(wasm_kernel.__file__).resolve().parent
GUEST = PACKAGE / "guest"  # runs inside the sandbox's own interpreter, not part of the host's graph
MODULE_LINES = 500
CLASS_LINES = 300
TOP_LEVEL_MODULES = 20


def host_modules() -> dict[str, Path]:
    """Every host module by its dotted name."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if GUEST in path.parents:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, wherever in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets.add(stem)
            targets.update(f"{stem}.{alias.name}" for alias in node.names)
    return {
        t for t in targets if t in modules and t != name and not t.startswith("wasm_kernel.guest")
    }


def test_no_import_cycle() -> None:
    modules = host_modules()
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    # a package's __init__ is imported by each of its modules: leave those edges out
    graph = {n: {t for t in ts if not n.startswith(t + ".")} for n, ts in graph.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = path[path.index(name) :] + [name]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_modules_and_classes_stay_readable() -> None:
    too_big = []
    for name, path in host_modules().items():
        text = path.read_text()
        if text.count("\n") > MODULE_LINES:
            too_big.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > CLASS_LINES:
                    too_big.append(f"{name}.{node.name}: {size} lines")
    assert not too_big, too_big


def declared_imports(init: Path) -> set[str]:
    """The subpackages an ``__init__``'s docstring says its modules may import."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    _, found, allowed = doc.partition("May import:")
    assert found, f"{init.parent.name}/__init__ says nothing of what it may import"
    allowed = " ".join(allowed.split()).rstrip(".")
    return set() if allowed == "nothing of the package" else set(allowed.split(", "))


def test_subpackages_import_only_what_they_declare() -> None:
    """Each subpackage's docstring says what it owns and which others it may import; the
    declared graph is layered (no subpackage reaches back to one that imports it)."""
    top = list(PACKAGE.glob("*.py"))
    assert len(top) <= TOP_LEVEL_MODULES, sorted(p.name for p in top)
    declared = {
        init.parent.name: declared_imports(init)
        for init in PACKAGE.glob("*/__init__.py")
        if init.parent != GUEST
    }
    modules = host_modules()
    undeclared = []
    for name, path in modules.items():
        if name.count(".") < 2:
            continue  # the top-level modules sit above every subpackage
        mine = name.split(".")[1]
        for target in imported(name, path, modules):
            theirs = target.split(".")[1] if target.count(".") >= 2 else None
            if theirs not in (None, mine) and theirs not in declared[mine]:
                undeclared.append(f"{name} -> {target}")
    assert not undeclared, undeclared
    graphlib.TopologicalSorter(declared).prepare()  # raises CycleError on a cycle


def test_the_client_loads_neither_wasmtime_nor_ipykernel() -> None:
    """An agent's or a grader's process drives kernels; it runs none itself."""
    probe = (
        "import json, sys; import wasm_kernel.client;"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('wasmtime', 'ipykernel', 'IPython'))))"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []
