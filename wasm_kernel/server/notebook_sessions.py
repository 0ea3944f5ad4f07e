"""Jupyter Server's side of hibernation: each kernel learns which notebook it belongs to by
an identity that survives renames, so that a renamed notebook keeps its session and a new
notebook at an old name never resumes another's.

Jupyter Server tells a kernel only its notebook's path at start (``JPY_SESSION_NAME``), and
JupyterLab renames through the contents and sessions APIs without telling the kernel. The file
ID service (``jupyter_server_fileid``, a Jupyter Server extension) follows renames and deletes
made through the contents API; ``NotebookSessions`` puts the notebook's file ID in its kernel's
environment, where ``jupyter.hibernation`` keys the session by it.

``python -m wasm_kernel install`` enables this module as a server extension
(``server_config``, apart so that installing needs no Jupyter Server); linked before the
server makes its managers, it makes ``NotebookSessions`` the session manager, unless the
operator configured another. Without the
file ID service, kernels get no ID and hibernation follows the path, as before.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.gateway.gateway_client import GatewayClient
from jupyter_server.services.sessions.sessionmanager import SessionManager

from ..settings.kernel_settings import NOTEBOOK_ID_ENV

EXTENSION = __name__
NOTEBOOK_SUFFIX = ".ipynb"


class NotebookSessions(SessionManager):
    """Jupyter Server's session manager, adding the notebook's file ID to its kernel's
    environment."""

    def get_kernel_env(self, path: str | None, name: Any = None) -> dict[str, str]:
        env = super().get_kernel_env(path, name)
        file_id = self._file_id(path)
        if file_id is not None:
            env[NOTEBOOK_ID_ENV] = file_id
        return env

    def _file_id(self, path: str | None) -> str | None:
        """The file ID of the notebook at ``path`` (indexed now if new); None for a session
        that is no notebook's, or where the server has no file ID service."""
        if not path or not path.endswith(NOTEBOOK_SUFFIX):
            return None
        manager = file_ids(self.parent)
        if manager is None:
            return None
        try:
            return str(manager.index(path))
        except Exception:  # the service's database: a failure costs only the rename-proofing
            self.log.warning("wasm-kernel: no file ID for %s; hibernation follows its path", path)
            return None


def file_ids(server: Any) -> Any:
    """The server's file ID manager, if the file ID extension is loaded."""
    web_app = getattr(server, "web_app", None)
    return web_app.settings.get("file_id_manager") if web_app is not None else None


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": EXTENSION}]


def _link_jupyter_server_extension(server: Any) -> None:
    """Before the server makes its managers: sessions through ``NotebookSessions``, unless the
    operator chose another session manager (a gateway's, for one)."""
    configured = "session_manager_class" in server.config.get("ServerApp", {})
    if not configured and not GatewayClient.instance(parent=server).gateway_enabled:
        server.session_manager_class = NotebookSessions


def _load_jupyter_server_extension(server: Any) -> None:
    """Say at start-up whether notebooks' kernels will get file IDs: an operator reading the
    server's log learns why renamed notebooks would start fresh."""
    if not isinstance(server.session_manager, NotebookSessions):
        server.log.warning(
            "wasm-kernel: ServerApp.session_manager_class is %s, not %s.NotebookSessions:"
            " hibernated sessions follow notebooks' paths, not their renames",
            type(server.session_manager).__name__,
            EXTENSION,
        )
    elif file_ids(server) is None:
        server.log.warning(
            "wasm-kernel: the file ID service (jupyter_server_fileid) is not loaded:"
            " hibernated sessions follow notebooks' paths, not their renames"
        )
