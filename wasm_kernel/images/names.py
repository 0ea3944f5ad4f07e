"""What a client may know of images without loading them: snapshot names, the error an image
gives, its file suffix, and the banner words a resumed kernel says where it came from.

Kept free of wasmtime and the image format, so that ``wasm_kernel.client`` imports only this."""

from __future__ import annotations

import re

SUFFIX = ".wkimg"
# how a kernel that could not resume an image, and started afresh, says so in its banner and
# on its first cell (the client looks for it: a session asked to resume must not start empty)
NOT_RESUMED = "could not resume from"
# the banner's line until the interpreter runs, and how it begins once it does (where from)
STILL_STARTING = "Interpreter: still starting"
RUNNING_FROM = "Interpreter: from "
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class ImageError(Exception):
    """An image that this kernel cannot or will not resume; the message says why."""


def check_name(name: str) -> str:
    """A snapshot name: letters, digits, '.', '_', '-' (not first), up to 64; no paths."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise ImageError(
            f"{name[:80]!r} is not a snapshot name: use up to 64 letters, digits, '.', '_' or"
            " '-', starting with a letter or digit"
        )
    return name
