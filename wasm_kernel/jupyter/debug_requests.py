"""The answer to JupyterLab's visual debugger: it is not offered (the kernelspec and
kernel_info do not announce it), and a client that sends a ``debug_request`` anyway gets a
Debug Adapter Protocol error response rather than no reply at all. ``%debug``, ``%pdb`` and
``pdb.set_trace()`` work through the stdin channel (see the guest's debugging module)."""

from __future__ import annotations

from typing import Any

NOT_OFFERED = (
    "this kernel does not offer the visual debugger: its Python runs inside a WebAssembly"
    " sandbox, which no debug adapter reaches yet. Use %debug after an error, %pdb on, or"
    " pdb.set_trace() in a cell: the debugger then asks for its commands below the cell."
)


def refusal(request: Any) -> dict:
    """A DAP error response to ``request`` (whatever the client sent)."""
    request = request if isinstance(request, dict) else {}
    seq, command = request.get("seq"), request.get("command")
    return {
        "type": "response",
        "request_seq": seq if isinstance(seq, int) and not isinstance(seq, bool) else 0,
        "success": False,
        "command": command if isinstance(command, str) else "",
        "message": NOT_OFFERED,
    }
