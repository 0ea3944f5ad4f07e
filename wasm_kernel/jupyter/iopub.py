"""Sending what the guest produced: every message is sendable, whatever text it holds, and
what waits to be sent is bounded.

Guest text can hold lone surrogates (``'\\ud800'`` in an exception, a repr, a completion, a
docstring). UTF-8 cannot encode them, and jupyter_client's packer then raises inside the
handler, so the reply is never sent and the client waits forever. The kernel's session packs
with ``pack`` instead, which replaces them with U+FFFD, as decoding bytes does elsewhere.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import Any

import zmq
from jupyter_client.jsonutil import json_clean, json_default

try:
    import orjson
except ModuleNotFoundError:  # jupyter_client packs with json then, and so does pack
    orjson = None  # type: ignore[assignment]

ORJSON_OPTIONS = 0 if orjson is None else orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z  # as Session
SENT_WAIT = 10.0  # seconds an input_request waits for earlier output (ipykernel's flush_timeout)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=json_default, ensure_ascii=False, allow_nan=False)


def pack(obj: Any) -> bytes:
    """jupyter_client's JSON packing, except that text UTF-8 cannot hold is replaced.

    As jupyter_client's session does, orjson first where it is installed (a message packed
    in ~5 us, not ~60: five messages a cell); what orjson refuses (lone surrogates, integers
    past 64 bits, keys that are not text) goes the standard library's way."""
    if orjson is not None:
        try:
            return orjson.dumps(obj, default=json_default, option=ORJSON_OPTIONS)
        except TypeError:  # orjson.JSONEncodeError: the standard library's way, below
            pass
    try:
        text = _dumps(obj)
    except (TypeError, ValueError):  # NaN, bytes...: what jupyter_client's own fallback cleans
        text = _dumps(json_clean(obj))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # surrogate pairs become their character, lone surrogates U+FFFD
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace").encode()


class GuestPublisher:
    """Publishes what the guest produced on IOPub, and bounds what waits there for clients.

    ZMQ keeps up to a thousand messages for each subscriber that does not read, so a client
    that stops reading IOPub would let cell output pile up in the kernel's memory. Messages are
    handed to ZMQ with tracking (ZMQ then says when it has let go of them); while more than
    ``limit`` bytes wait, further ones are left out. Messages under ZMQ's copy threshold
    (64 KiB) are copied at once and so not counted: at most a thousand of them can wait.
    """

    def __init__(self, session: Any, iopub_thread: Any, limit: int):
        self._session = session
        self._thread = iopub_thread
        self.limit = limit
        self._lock = threading.Lock()
        self._waiting: deque[list[Any]] = deque()  # [size, tracker, or True once sent]
        self._bytes = 0  # handed to ZMQ and not yet let go of

    def publish(
        self,
        msg_type: str,
        content: dict,
        parent: dict,
        ident: bytes,
        buffers: Sequence[bytes] = (),
        metadata: dict | None = None,
    ) -> bool:
        """Send one message, with its binary buffers (thread-safe); False if it was left out."""
        message = self._session.msg(msg_type, content, parent=parent, metadata=metadata)
        frames = [*self._session.serialize(message, ident), *buffers]
        size = sum(len(frame) for frame in frames)
        entry: list[Any] = [size, None]
        with self._lock:
            self._forget_sent()
            if self._bytes + size > self.limit:
                return False
            self._waiting.append(entry)
            self._bytes += size
        self._thread.schedule(partial(self._send, frames, entry))
        return True

    def handed_over(self, timeout: float = SENT_WAIT) -> None:
        """Wait (up to ``timeout``) until everything published so far is handed to ZMQ, as
        ipykernel flushes its streams before an input_request: a prompt then follows the
        output printed before it (the debugger's listing before its ``ipdb>``)."""
        done = threading.Event()
        self._thread.schedule(done.set)  # the IOPub thread runs what it is given in order
        done.wait(timeout)

    def _send(self, frames: list[bytes], entry: list[Any]) -> None:
        """On the IOPub thread, which owns the socket."""
        try:
            entry[1] = self._thread.socket.send_multipart(frames, copy=False, track=True)
        except (AttributeError, zmq.ZMQError):  # the socket closed at shutdown
            entry[1] = True

    def _forget_sent(self) -> None:
        while self._waiting:
            size, tracker = self._waiting[0]
            if tracker is None or (tracker is not True and not tracker.done):
                break
            self._waiting.popleft()
            self._bytes -= size
