"""Sending what the guest produced: every message is sendable, whatever text it holds.

Guest text can hold lone surrogates (``'\\ud800'`` in an exception, a repr, a completion, a
docstring). UTF-8 cannot encode them, and jupyter_client's packer then raises inside the
handler, so the reply is never sent and the client waits forever. The kernel's session packs
with ``pack`` instead, which replaces them with U+FFFD, as decoding bytes does elsewhere.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_client.jsonutil import json_clean, json_default


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=json_default, ensure_ascii=False, allow_nan=False)


def pack(obj: Any) -> bytes:
    """jupyter_client's JSON packing, except that text UTF-8 cannot hold is replaced."""
    try:
        text = _dumps(obj)
    except (TypeError, ValueError):  # NaN, bytes...: what jupyter_client's own fallback cleans
        text = _dumps(json_clean(obj))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # surrogate pairs become their character, lone surrogates U+FFFD
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace").encode()
