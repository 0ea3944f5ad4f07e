"""Pages generated from the code at build time, so that the documentation never holds a copy of
what the code declares.

A page asks for a generated part with a marker line of its own (an HTML comment, so GitHub's
view of the page shows nothing there):

- ``<!-- generated: settings -->``: every setting of ``KernelSettings`` (name, type, default,
  help, as ``--help-all`` words them) as a ``confval`` that other pages reference with
  ``{confval}`name```;
- ``<!-- generated: profiles -->``: the fields of the sandbox profiles side by side;
- ``<!-- generated: package map -->``: each subpackage's docstring and its modules' first
  paragraphs, read with ``ast`` (nothing is imported).

The parts are written as MyST Markdown and spliced into the page's source before it is parsed.
"""

from __future__ import annotations

import ast
import dataclasses
import graphlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

PACKAGE = Path(__file__).resolve().parents[2] / "wasm_kernel"
PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # ASCII punctuation: CommonMark escapes any of it


def plain(text: str) -> str:
    """``text`` as Markdown that shows it literally."""
    return PUNCTUATION.sub(r"\\\1", re.sub(r"\s+", " ", text))


def code(text: str) -> str:
    """``text`` as a Markdown code span."""
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}" if fence == "`" else f"`` {text} ``"


def docstring_markdown(text: str) -> str:
    """A docstring paragraph in Markdown: its ``literals`` as code, everything else literal."""
    parts = " ".join(text.split()).split("``")
    return "".join(
        code(part) if index % 2 else plain(part) for index, part in enumerate(parts) if part
    )


# -- settings ---------------------------------------------------------------------------------


def _home_as_tilde(text: str) -> str:
    """Defaults worked out for the builder's account, written for any reader's."""
    return text.replace(str(Path.home()), "~")


def setting_type(trait: Any) -> str:
    from wasm_kernel.settings import settings

    if isinstance(trait, settings.Limit):
        return f"{'integer' if trait.integer else 'number'} ({trait.unit})"
    if isinstance(trait, settings.CheckedEnum):
        return "one of " + ", ".join(repr(value) for value in trait.values or ())
    if isinstance(trait, settings.CheckedBool):
        return "boolean"
    if isinstance(trait, settings.TextList):
        return "list of strings"
    if isinstance(trait, (settings.AbsoluteFolder, settings.AbsoluteFileOrOff)):
        return "absolute path"
    return "string"


def settings_markdown() -> str:
    from wasm_kernel.jupyter.app import real_default
    from wasm_kernel.settings.kernel_settings import KernelSettings

    blocks = []
    for name, trait in sorted(KernelSettings.class_own_traits(config=True).items()):
        default = _home_as_tilde(real_default(name, trait))
        blocks.append(
            f"````{{confval}} {name}\n:type: {plain(setting_type(trait))}\n"
            f":default: {code(default)}\n\n{plain(trait.help)}\n````"
        )
    return "\n\n".join(blocks)


def profiles_markdown() -> str:
    from wasm_kernel.jupyter.app import _shown
    from wasm_kernel.settings.kernel_settings import KernelSettings
    from wasm_kernel.settings.profiles import PROFILES, Profile

    traits = KernelSettings.class_own_traits(config=True)
    names = list(PROFILES)
    rows = ["| | " + " | ".join(f"`{name}`" for name in names) + " |"]
    rows.append("| --- " * (len(names) + 1) + "|")
    for field in dataclasses.fields(Profile):
        if field.name == "name":
            continue
        label = f"{{confval}}`{field.name}`" if field.name in traits else plain(field.name)
        cells = []
        for profile in PROFILES.values():
            value = getattr(profile, field.name)
            if field.name == "summary":
                cells.append(plain(value))
            else:
                trait = traits.get(field.name)
                cells.append(code(_shown(trait, value) if trait is not None else repr(value)))
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


# -- the package map ----------------------------------------------------------------------------


def first_paragraph(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.split("\n\n")[0]


def declared_imports(doc: str) -> set[str]:
    """The subpackages an ``__init__`` docstring's "May import:" line names."""
    allowed = " ".join(doc.partition("May import:")[2].split()).rstrip(".")
    return set() if allowed in ("", "nothing of the package") else set(allowed.split(", "))


def package_map_markdown() -> str:
    """The subpackages from the bottom layer up (each after those it may import), then the
    top-level modules, then the guest's code."""
    docs = {}
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        if doc:
            docs[init.parent.name] = doc
    layers = graphlib.TopologicalSorter({n: declared_imports(d) for n, d in docs.items()})
    blocks = []
    for name in layers.static_order():
        owns, _, may = docs[name].partition("May import:")
        modules = sorted(p for p in (PACKAGE / name).glob("*.py") if p.name != "__init__.py")
        lines = [
            f"### `wasm_kernel.{name}`",
            "",
            docstring_markdown(owns),
            "",
            f"May import: {plain(' '.join(may.split()))}",
            "",
        ]
        lines += [f"- `{p.name}`: {docstring_markdown(first_paragraph(p))}" for p in modules]
        blocks.append("\n".join(lines))
    top = sorted(p for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    guest = [PACKAGE / "guest" / "_wasm_kernel.py", *sorted(PACKAGE.glob("guest/modules/*.py"))]
    for title, paths, root in (
        ("The top-level modules", top, PACKAGE),
        ("The guest's code (`wasm_kernel/guest`)", guest, PACKAGE / "guest"),
    ):
        lines = [f"### {title}", ""]
        lines += [
            f"- `{p.relative_to(root)}`: {docstring_markdown(first_paragraph(p))}" for p in paths
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


GENERATED: dict[str, Callable[[], str]] = {
    "settings": settings_markdown,
    "profiles": profiles_markdown,
    "package map": package_map_markdown,
}
MARKER = re.compile(r"^<!-- generated: ([a-z ]+) -->$", re.MULTILINE)


def splice(app: Sphinx, docname: str, source: list[str]) -> None:
    def generated(match: re.Match[str]) -> str:
        make = GENERATED.get(match.group(1))
        if make is None:
            raise ExtensionError(f"{docname}: no generated part named {match.group(1)!r}")
        return make()

    source[0] = MARKER.sub(generated, source[0])


def generated_pages(app: Sphinx, env: Any, added: set, changed: set, removed: set) -> list[str]:
    """Pages with generated parts are read again at every build: the code may have changed."""
    return [name for name in env.found_docs if MARKER.search(Path(env.doc2path(name)).read_text())]


def setup(app: Sphinx) -> dict[str, Any]:
    # defaults as a reader's account has them, not as the builder's environment sets them
    for variable in [v for v in os.environ if v.startswith(("WASM_KERNEL_", "XDG_"))]:
        del os.environ[variable]
    app.connect("source-read", splice)
    app.connect("env-get-outdated", generated_pages)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
