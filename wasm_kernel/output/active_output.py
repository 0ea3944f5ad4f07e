"""The active-output policy: make the guest's mime bundles passive before they reach a front end.

JupyterLab runs what a kernel displays with the Jupyter server's credentials: JavaScript,
scripts and event handlers in HTML, widget and plotting mime types that load or execute code.
Under ``WasmKernel.active_output = "block"`` every bundle the guest produces (display_data,
update_display_data, execute_result, inspect_reply data, user_expressions) goes through
``ActiveOutput.bundle``, which keeps an allowlist of passive mime types: text/plain, JSON and
widget views (their widgets' state is cleaned by ``active_widgets``) as they are, raster
images when they are text (base64), text/html cleaned (``active_html``), image/svg+xml
rebuilt from an allowlist of SVG elements (``active_svg``), text/markdown with its HTML
cleaned by the same allowlist and text/latex when it holds no script URL
(``active_markdown``). Everything else is dropped. What was dropped or removed is said once
per cell, when it ends, through ``tell`` (the cell's stderr), in words for the person reading
the notebook; nothing is said when nothing was. ``"allow"`` returns every bundle untouched.

The guest is hostile: nothing here may raise on odd input (non-str payloads, lone surrogates,
huge strings), and a bundle of passive types alone is returned as it is, unexamined.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from .active_html import clean_html
from .active_markdown import check_latex, clean_markdown
from .active_svg import clean_svg

log = logging.getLogger(__name__)

BLOCK, ALLOW = "block", "allow"

# Rendered as inert text or a JSON tree by every front end we know: kept as they are.
PASSIVE = frozenset(
    {
        "text/plain",
        "application/json",
        "application/vnd.jupyter.stdout",
        "application/vnd.jupyter.stderr",
        # a widget's view names a model by id; models come through comms, whose state the
        # policy cleans (active_widgets), or from the notebook's own saved state
        "application/vnd.jupyter.widget-view+json",
    }
)
# Rendered as <img src="data:MIME;base64,PAYLOAD">: an image context runs no script.
RASTER = frozenset(
    {
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/bmp",
        "image/webp",
        "image/avif",
    }
)
NOTICE_HEAD = "[wasm-kernel] active output blocked: "
NOTICE_TAIL = (
    ". These could run code in your browser, so they were left out of what this notebook"
    " shows; a kernel with WasmKernel.active_output=allow shows them, for notebooks you trust.\n"
)
#: One thing dropped or removed: its kind ("application/javascript dropped", "removed from
#: text/html") and what it names (a reason, tags, attributes).
Change = tuple[str, tuple[str, ...]]

# -- the policy ---------------------------------------------------------------------------------


_SURROGATE = re.compile("[\ud800-\udfff]")


def _as_text(payload: Any) -> str | None:
    """The payload as a string a parser can take (lone surrogates replaced), or None."""
    if not isinstance(payload, str):
        return None
    try:
        payload.encode("utf-8")
    except UnicodeEncodeError:
        payload = _SURROGATE.sub("\N{REPLACEMENT CHARACTER}", payload)
    return payload


def passive_bundle(data: Any) -> tuple[dict, list[Change]]:
    """The passive part of a mime bundle, and each thing dropped or removed from it."""
    if not isinstance(data, dict):
        return {}, [("a malformed mime bundle dropped", ())]
    if all(mime in PASSIVE for mime in data):  # the common case costs one look-up per type
        return data, []
    kept: dict = {}
    changes: list[Change] = []
    for mime, payload in data.items():
        if mime in PASSIVE:
            kept[mime] = payload
            continue
        if not isinstance(mime, str):
            changes.append(("a malformed mime type dropped", ()))
            continue
        shown = mime[:64]
        text = _as_text(payload)
        if mime in RASTER:
            if text is None:
                changes.append((f"{shown} dropped", ("not base64 text",)))
            else:
                kept[mime] = payload
            continue
        if mime not in ("text/html", "image/svg+xml", "text/markdown", "text/latex"):
            changes.append((f"{shown} dropped", ()))
            continue
        if text is None:
            changes.append((f"{shown} dropped", ("not text",)))
            continue
        try:
            cleaned, removed, dropped = _clean(mime, text)
        except Exception:  # a sanitizer bug must not let the payload through, nor kill the cell
            log.exception("dropping %s the sanitizer failed on", shown)
            cleaned, removed, dropped = None, [], "could not be sanitized"
        if cleaned is not None:
            kept[mime] = cleaned
        if dropped:
            changes.append((f"{shown} dropped", (dropped,)))
        elif removed:
            changes.append((f"removed from {shown}", tuple(removed)))
    return kept, changes


def _clean(mime: str, text: str) -> tuple[str | None, list[str], str]:
    """A text payload made passive (None: dropped), what was removed, why it was dropped."""
    if mime == "text/html":
        cleaned, removed = clean_html(text)
        return cleaned, removed, ""
    if mime == "image/svg+xml":
        return clean_svg(text)
    if mime == "text/markdown":
        return clean_markdown(text)
    problem = check_latex(text)
    return (None if problem else text), [], problem


MAX_NAMED = 8  # kinds of change a notice names; a cell can invent any number of mime types
MAX_ITEMS = 6  # what a notice names of one kind


def notice(changes: list[Change]) -> str:
    """The one-line notice for a cell's stderr: each kind of change once, with what it named."""
    kinds: dict[str, dict[str, None]] = {}
    for kind, items in changes:
        kinds.setdefault(kind, {}).update(dict.fromkeys(items))
    named = []
    for kind, names in list(kinds.items())[:MAX_NAMED]:
        listed = ", ".join(list(names)[:MAX_ITEMS])
        if not listed:
            named.append(kind)
        elif kind.startswith("removed from "):
            named.append(f"{kind}: {listed}")
        else:
            named.append(f"{kind} ({listed})")
    if len(kinds) > MAX_NAMED:
        named.append(f"{len(kinds) - MAX_NAMED} more kinds")
    return f"{NOTICE_HEAD}{'; '.join(named)}{NOTICE_TAIL}"


class ActiveOutput:
    """The policy for one cell (or one request): ``bundle`` each output, then ``finish`` says
    in one notice, through ``tell``, what was dropped or changed during the whole cell."""

    def __init__(self, policy: str, tell: Callable[[str], None] | None = None):
        self.blocking = policy != ALLOW
        self._tell = tell
        self._changes: list[Change] = []

    def bundle(self, data: Any) -> Any:
        """The bundle to send instead of ``data``: ``data`` itself under allow."""
        if not self.blocking:
            return data
        kept, changes = passive_bundle(data)
        if changes:
            if not kept:  # something must still show where the output was
                kept = {"text/plain": "[output blocked by wasm-kernel's active-output policy]"}
            if len(self._changes) < 10_000:
                self._changes.extend(changes)
        return kept

    def expressions(self, results: Any) -> Any:
        """user_expressions results with each ``data`` bundle made passive."""
        if not self.blocking or not isinstance(results, dict):
            return results
        passive = {}
        for name, result in results.items():
            if isinstance(result, dict) and "data" in result:
                result = {**result, "data": self.bundle(result["data"])}
            passive[name] = result
        return passive

    def inspect(self, data: Any) -> Any:
        """inspect_reply data made passive; the notice goes into its text/plain."""
        if not self.blocking:
            return data
        kept, changes = passive_bundle(data)
        if changes:
            kept = dict(kept)
            plain = kept.get("text/plain")
            text = notice(changes)
            kept["text/plain"] = f"{plain}\n\n{text}" if isinstance(plain, str) else text
        return kept

    def finish(self) -> None:
        """At the end of the cell: tell what was blocked, if anything, once."""
        if self._changes and self._tell is not None:
            self._tell(notice(self._changes))
        self._changes = []
