"""Completion, inspection, is_complete and user_expressions: guest turns for the client.

They run the user's code too (properties, ``__repr__``, ``__getattr__``), bounded like a cell
and more tightly. A service stopped by a limit (what it wrote to ``/tmp`` past the limit
stays, as a cell's does) cannot say so in a completion, which a front end shows no error
for: the next cell says it on stderr, and user_expressions carry it as each expression's
error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from ipykernel.kernelbase import Kernel

from ..guest.modules import _wasm_kernel_contract as declared
from ..output.active_output import ActiveOutput
from ..sandbox.guest_thread import GuestThread
from ..sandbox.sandbox import Sandbox
from ..sandbox.stops import CellStopped
from .request_checks import clean_request, complete_reply, is_complete_reply

SERVICE_NAMES = {
    declared.COMPLETE: "a completion request",
    declared.INSPECT: "an inspection request",
    declared.IS_COMPLETE: "an is_complete request",
    declared.EVALUATE_EXPRESSIONS: "the cell's user_expressions",
    declared.COMM_INFO: "a comm_info request",
}


class GuestServices(Kernel):
    """ipykernel's service handlers, answered by the guest."""

    _worker: GuestThread
    _sandbox: Callable[[Any], Awaitable[Sandbox]]
    active_output: str
    _service_stopped = ""  # what to tell the next cell

    async def _service(self, service: str, *args: Any) -> dict:
        """The guest's answer; raises CellStopped if a limit stopped it."""
        sandbox = await self._sandbox(lambda _: None)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._worker, partial(sandbox.request, service, *args)
            )
        except CellStopped as stop:
            self.log.warning("%s request stopped: %s", service, stop)
            self._service_stopped = (
                f"wasm-kernel: code of this session run for {SERVICE_NAMES[service]}"
                f" (a property, __repr__ or __getattr__) was stopped: {stop.ename}:"
                f" {stop.evalue}\n"
            )
            raise

    async def _answer(self, service: str, *args: Any) -> dict:
        """The answer, or an empty one when there is no sandbox or a limit stopped it
        (a front end shows nothing for a failed completion either way)."""
        try:
            return await self._service(service, *args)
        except Exception:  # no sandbox (bad settings or mounts): cells say why
            return {}

    def take_service_notice(self) -> str:
        """What the next cell says about a service stopped since the last one."""
        notice, self._service_stopped = self._service_stopped, ""
        return notice

    async def user_expressions(self, expressions: dict) -> dict:
        """user_expressions as IPython evaluates them; a stop is every expression's error."""
        try:
            return await self._service(declared.EVALUATE_EXPRESSIONS, expressions)
        except CellStopped as stop:
            self._service_stopped = ""  # the reply carries it
            error = {"status": "error", "ename": stop.ename, "evalue": stop.evalue}
            return {name: {**error, "traceback": []} for name in expressions}
        except Exception:
            return {}

    async def do_complete(self, code: str, cursor_pos: int | None) -> dict:
        code, cursor = clean_request(code, cursor_pos)
        return complete_reply(await self._answer(declared.COMPLETE, code, cursor), code, cursor)

    async def do_inspect(
        self, code: str, cursor_pos: int | None, detail_level: int = 0, omit_sections: Any = ()
    ) -> dict:
        code, cursor = clean_request(code, cursor_pos)
        omit = [str(name) for name in omit_sections] if isinstance(omit_sections, list) else []
        reply = await self._answer(declared.INSPECT, code, cursor, 1 if detail_level else 0, omit)
        data = reply.get("data") if isinstance(reply.get("data"), dict) else {}
        data = ActiveOutput(self.active_output).inspect(data)  # active-output policy
        return {"status": "ok", "found": bool(reply.get("found")), "data": data, "metadata": {}}

    async def do_is_complete(self, code: str) -> dict:
        code, _ = clean_request(code, 0)
        return is_complete_reply(await self._answer(declared.IS_COMPLETE, code))
