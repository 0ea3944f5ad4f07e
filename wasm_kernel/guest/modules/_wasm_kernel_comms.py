"""Comms in the guest, as ipykernel has them: the ``comm`` package's contract, fulfilled.

ipywidgets (and anything else written against ``comm``) asks ``comm.create_comm`` for a comm
and ``comm.get_comm_manager`` for the manager; ``install`` points both here. A comm opened
in the guest sends its ``comm_open``, ``comm_msg`` and ``comm_close`` to the host as the
contract's ``comm`` message, which publishes it on IOPub under the request being answered;
what the front end sends arrives through the kernel module's ``comm_received`` entry point,
one guest turn per message, and is dispatched by ``comm``'s own manager, as ipykernel does.
"""

import base64
import json
import sys

import _wasm_kernel_contract as contract
import comm
from comm.base_comm import BaseComm, CommManager


class CommNotSent(RuntimeError):
    """A comm message the kernel would not send: past the output budget, too large, or a
    widget the active-output policy refuses."""


def _kernel():
    return sys.modules["_wasm_kernel"]


def _encoded(buffers):
    """Binary buffers (bytes, memoryviews, numpy arrays...) as the base64 the contract carries."""
    if len(buffers or ()) > contract.COMM_BUFFERS:
        raise CommNotSent(
            f"a comm message carries at most {contract.COMM_BUFFERS} buffers, not {len(buffers)}"
        )
    return [base64.b64encode(memoryview(item).cast("B")).decode("ascii") for item in buffers or ()]


def _plain(value):
    """JSON the host can read, as ipykernel's json_clean makes it: anything else by its str."""
    return json.loads(json.dumps(value, default=str))


class GuestComm(BaseComm):
    """A comm whose messages go out through the host (ipykernel's Comm sends them itself)."""

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        content = _plain({"data": {} if data is None else data, "comm_id": self.comm_id, **keys})
        kernel = _kernel()
        try:
            reply = kernel.call_host(
                contract.COMM,
                msg_type=msg_type,
                content=content,
                metadata=_plain(metadata or {}),
                buffers=_encoded(buffers),
            )
        except kernel.MessageTooLarge as exc:
            raise CommNotSent(f"the comm message is too big: {exc}") from None
        if reply.get("error"):
            raise CommNotSent(reply["error"])


manager = CommManager()


def create_comm(*args, **kwargs):
    return GuestComm(*args, **kwargs)


def get_comm_manager():
    return manager


def install():
    """Point the ``comm`` package at this module, before anything imports ipywidgets. The
    manager's log (a handler that raised, a comm nobody opened) goes where the guest's
    ``logging`` writes, the request's stderr: the kernel's own log is the host's, which
    guest code does not reach."""
    comm.create_comm = create_comm
    comm.get_comm_manager = get_comm_manager


def received(message):
    """One comm_open, comm_msg or comm_close from the front end, handled by comm's manager as
    ipykernel's manager does (a handler's exception is logged, and the turn goes on)."""
    msg = json.loads(message)
    msg["buffers"] = [memoryview(base64.b64decode(item)) for item in msg.get("buffers", ())]
    handle = getattr(manager, msg["msg_type"])
    handle(None, None, msg)


def info(target_name=None):
    """The open comms, as ipykernel's comm_info_reply lists them."""
    return {
        "comms": {
            comm_id: {"target_name": opened.target_name}
            for comm_id, opened in list(manager.comms.items())
            if target_name is None or opened.target_name == target_name
        }
    }
