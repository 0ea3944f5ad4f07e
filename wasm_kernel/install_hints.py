"""The pip command that adds one of this package's extras, as it works where it was installed.

``pip install 'wasm-kernel[agents]'`` asks the package index, which does not have a clone's
code: installed from a folder (a clone, ``pip install -e .``), the extra comes from that
folder. Imports nothing of the package, so every part can say it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

DISTRIBUTION = "wasm-kernel"


def pip_install(*requirements: str) -> str:
    """The command that installs ``requirements`` (``"[agents]"``, an extra of this package,
    or other names) into this Python's environment."""
    source, editable = installed_from()
    named = [
        ("-e " if editable else "")
        + shlex.quote(f"{source or DISTRIBUTION}{item}" if item.startswith("[") else item)
        for item in requirements
    ]
    return " ".join([pip_command(), "install", *named])


def pip_command() -> str:
    """This environment's pip: by name when it is the one on PATH, else by its path."""
    here = Path(sys.executable).parent
    found = shutil.which("pip")
    if found and Path(found).parent == here:
        return "pip"
    if (here / "pip").exists():
        return str(here / "pip")
    return f"{shlex.quote(sys.executable)} -m pip"


def installed_from() -> tuple[str | None, bool]:
    """The folder this package was installed from (a clone), and whether it was installed
    editable (``pip install -e``: the extra keeps it so); (None, False) when it came from a
    package index. A source tree run without installing gives its folder."""
    try:
        recorded = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        checkout = Path(__file__).resolve().parent.parent
        return (str(checkout) if (checkout / "pyproject.toml").is_file() else None), False
    try:
        direct = json.loads(recorded or "{}")
    except ValueError:
        return None, False
    if not isinstance(direct, dict) or not isinstance(direct.get("dir_info"), dict):
        return None, False
    url = urlparse(str(direct.get("url", "")))
    folder = Path(unquote(url.path))
    if url.scheme != "file" or not (folder / "pyproject.toml").is_file():
        return None, False
    return str(folder), direct["dir_info"].get("editable") is True
