"""The Jupyter Server configuration installed with the kernel: the extension that gives each
kernel its notebook's file ID (``notebook_sessions``). Written by ``install`` beside the
kernelspecs; this module imports no Jupyter Server, which a plain install need not have."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

NOTEBOOK_SESSIONS = "wasm_kernel.server.notebook_sessions"
CONFIG_NAME = "wasm-kernel.json"  # in jupyter_server_config.d


def server_config() -> dict[str, Any]:
    """The Jupyter Server configuration that enables the extension (the file ID service it
    relies on enables itself when it is installed)."""
    return {"ServerApp": {"jpserver_extensions": {NOTEBOOK_SESSIONS: True}}}


def write_server_config(config_dir: Path) -> Path:
    """Write ``server_config`` into ``config_dir``'s ``jupyter_server_config.d``, readable by
    every user who reads that folder (as the kernelspecs installed with it are)."""
    folder = config_dir / "jupyter_server_config.d"
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = folder / CONFIG_NAME
    staging = path.with_suffix(".partial")
    staging.write_text(json.dumps(server_config(), indent=2) + "\n")
    os.chmod(staging, 0o644)
    os.replace(staging, path)
    return path
