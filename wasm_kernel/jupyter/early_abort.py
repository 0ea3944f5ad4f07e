"""When a cell fails, the requests already waiting are aborted before its reply goes out.

ipykernel aborts the execute_requests waiting behind a failed cell (``stop_on_error``) once it
has sent the error reply. A client quick to send its next request on that reply could see it
aborted too whenever this process was slow to start the abort (after an interrupt, the
guest's recovery and the interrupt relay keep it busy: 2 of 3 runs under five SIGINTs). The
native kernel means to abort only what was sent before the reply; starting the abort before
the reply makes that so.
"""

from __future__ import annotations

from typing import Any

from ipykernel.kernelbase import Kernel


class EarlyAbort(Kernel):
    """``do_execute`` runs ``_execute`` and starts the abort itself when the cell failed."""

    _aborted_before_reply: set[str | None]

    async def _execute(
        self,
        code: str,
        silent: bool,
        store_history: bool,
        user_expressions: dict | None,
        allow_stdin: bool,
    ) -> dict:
        raise NotImplementedError

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: Any = None,
        cell_id: Any = None,
    ) -> dict:
        reply = await self._execute(code, silent, store_history, user_expressions, allow_stdin)
        parent = self.get_parent("shell")
        content = parent.get("content") or {}
        if reply.get("status") == "error" and not silent and content.get("stop_on_error", True):
            header = parent.get("header", {})
            self._aborted_before_reply.add(header.get("msg_id"))
            super()._abort_queues(header.get("subshell_id"))
        return reply

    def _abort_queues(self, subshell_id: str | None = None) -> None:
        msg_id = self.get_parent("shell").get("header", {}).get("msg_id")
        if msg_id in self._aborted_before_reply:
            self._aborted_before_reply.discard(msg_id)  # begun in do_execute
            return
        super()._abort_queues(subshell_id)
