"""The README stays a five-minute read that leads to the documentation: short, linking every
page under docs/, its links leading to files and headings that exist, and its test command the
one CI runs. (The documentation's own links are checked by its build: see docs/conf.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.nokernel

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 300
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it (and MyST, with myst_heading_anchors)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def local_links() -> list[str]:
    return [link for link in LINK.findall(README.read_text()) if "://" not in link]


def test_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; move the detail to docs/"


def test_readme_links_every_documentation_page() -> None:
    linked = {link.split("#")[0] for link in local_links()}
    pages = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")} - {"docs/index.md"}
    assert pages - linked == set(), "pages the README does not link"


def test_readme_links_lead_to_files_and_headings_that_exist() -> None:
    broken = []
    for link in local_links():
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else README
        if not target.is_file():
            broken.append(f"{link}: no file {path}")
        elif anchor and anchor not in anchors(target):
            broken.append(f"{link}: no heading #{anchor} in {path or 'README.md'}")
    assert not broken


def test_readme_test_command_is_what_ci_runs() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.DOTALL)
    readme_command = next(b.strip() for b in blocks if b.startswith(".ci/install-system-deps"))
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_command == ci_lines[-1]
