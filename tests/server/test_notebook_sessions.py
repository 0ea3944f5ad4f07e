"""A hibernated session belongs to its notebook, not to the notebook's first name.

Driven as JupyterLab drives a server: notebooks made, renamed and deleted through the contents
API, sessions opened, renamed and closed through the sessions API, cells run over the kernel
websocket. The server reads the configuration ``python -m wasm_kernel install`` wrote (the
extension and its session manager) and the file ID service; hibernated sessions go to a folder
of the test's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_server import JupyterLab, execute, running_jupyterlab

from wasm_kernel.server.server_config import NOTEBOOK_SESSIONS

pytestmark = pytest.mark.slow  # a server and five kernels: tens of seconds

KERNEL = "wasm-python"
SECRET = "4111-1111-1111-1111"


def open_notebook(lab: JupyterLab, path: str) -> tuple[str, str]:
    """A session for the notebook at ``path``, as opening it in JupyterLab makes one: its id
    and its kernel's."""
    session = lab.api(
        "sessions",
        "POST",
        {"path": path, "name": path, "type": "notebook", "kernel": {"name": KERNEL}},
    )
    return session["id"], session["kernel"]["id"]


def new_notebook(lab: JupyterLab) -> str:
    """File > New > Notebook: an untitled notebook in the root folder; its path."""
    return lab.api("contents", "POST", {"type": "notebook"})["path"]


def rename(lab: JupyterLab, session: str, old: str, new: str) -> None:
    """JupyterLab's rename of an open notebook: the file, then its session."""
    lab.api(f"contents/{old}", "PATCH", {"path": new})
    lab.api(f"sessions/{session}", "PATCH", {"path": new, "name": new})


def close(lab: JupyterLab, session: str) -> None:
    """Shutting the notebook's kernel down, which hibernates its session."""
    lab.api(f"sessions/{session}", "DELETE")


def has_secret(lab: JupyterLab, kernel: str) -> bool:
    reply = execute(lab, kernel, "print(globals().get('secret'))")
    assert reply["status"] == "ok", reply
    return SECRET in reply["output"]


def test_a_renamed_notebook_keeps_its_session_and_a_new_one_at_its_old_name_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WASM_KERNEL_SNAPSHOT_DIR", str(tmp_path / "images"))
    root = tmp_path / "notebooks"
    root.mkdir()
    with running_jupyterlab(root, tmp_path / "server.log") as lab:
        first = new_notebook(lab)
        session, kernel = open_notebook(lab, first)
        assert execute(lab, kernel, f"secret = {SECRET!r}")["status"] == "ok"
        rename(lab, session, first, "analysis.ipynb")
        close(lab, session)

        # the renamed notebook, reopened, is the session that was saved
        session, kernel = open_notebook(lab, "analysis.ipynb")
        assert has_secret(lab, kernel), lab.log_tail()
        close(lab, session)

        # a new notebook takes the first one's old name, and starts fresh
        again = new_notebook(lab)
        assert again == first
        session, kernel = open_notebook(lab, again)
        assert not has_secret(lab, kernel)
        close(lab, session)

        # a deleted notebook's session goes to no successor at its name
        lab.api(f"contents/{again}", "DELETE")
        lab.api("contents/analysis.ipynb", "DELETE")
        successor = new_notebook(lab)
        rename_target = "analysis.ipynb"
        session, kernel = open_notebook(lab, successor)
        rename(lab, session, successor, rename_target)
        close(lab, session)
        session, kernel = open_notebook(lab, rename_target)
        assert not has_secret(lab, kernel)
        close(lab, session)
        log = lab.log_tail(lines=10_000)
        assert f"{NOTEBOOK_SESSIONS} | extension was successfully loaded" in log, log
        assert "follow notebooks' paths" not in log, log
