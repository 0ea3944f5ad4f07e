"""The active-output policy: make the guest's mime bundles passive before they reach a front end.

JupyterLab runs what a kernel displays with the Jupyter server's credentials: JavaScript,
scripts and event handlers in HTML, widget and plotting mime types that load or execute code.
Under ``WasmKernel.active_output = "block"`` every bundle the guest produces (display_data,
update_display_data, execute_result, inspect_reply data, user_expressions) goes through
``ActiveOutput.bundle``, which keeps an allowlist of passive mime types: text/plain and JSON as
they are, raster images when they are text (base64), text/html cleaned by nh3 (ammonia),
image/svg+xml rebuilt from an allowlist of SVG elements, text/markdown and text/latex only when
they hold no HTML and no script URL. Everything else is dropped. What was dropped or changed
is said once per cell, when it ends, through ``tell`` (the cell's stderr). ``"allow"`` returns
every bundle untouched.

The guest is hostile: nothing here may raise on odd input (non-str payloads, lone surrogates,
huge strings), and a bundle of passive types alone is returned as it is, unexamined.
"""

from __future__ import annotations

import html
import logging
import re
import threading
import xml.parsers.expat
from collections.abc import Callable
from typing import Any

import nh3

log = logging.getLogger(__name__)

BLOCK, ALLOW = "block", "allow"

# Rendered as inert text or a JSON tree by every front end we know: kept as they are.
PASSIVE = frozenset(
    {
        "text/plain",
        "application/json",
        "application/vnd.jupyter.stdout",
        "application/vnd.jupyter.stderr",
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
NOTICE_TAIL = "; see WasmKernel.active_output"

# -- text/html ----------------------------------------------------------------------------------

SVG_TAGS = frozenset(
    {
        "svg",
        "g",
        "defs",
        "symbol",
        "use",
        "path",
        "rect",
        "circle",
        "ellipse",
        "line",
        "polyline",
        "polygon",
        "text",
        "tspan",
        "textPath",
        "title",
        "desc",
        "clipPath",
        "mask",
        "pattern",
        "marker",
        "linearGradient",
        "radialGradient",
        "stop",
    }
)
SVG_ATTRIBUTES = frozenset(
    {
        "viewBox",
        "preserveAspectRatio",
        "version",
        "x",
        "y",
        "x1",
        "x2",
        "y1",
        "y2",
        "cx",
        "cy",
        "r",
        "rx",
        "ry",
        "d",
        "points",
        "transform",
        "fill",
        "fill-opacity",
        "fill-rule",
        "stroke",
        "stroke-width",
        "stroke-opacity",
        "stroke-linecap",
        "stroke-linejoin",
        "stroke-dasharray",
        "stroke-dashoffset",
        "stroke-miterlimit",
        "opacity",
        "clip-path",
        "clip-rule",
        "clipPathUnits",
        "mask",
        "font-family",
        "font-size",
        "font-weight",
        "font-style",
        "text-anchor",
        "dominant-baseline",
        "dx",
        "dy",
        "offset",
        "stop-color",
        "stop-opacity",
        "gradientUnits",
        "gradientTransform",
        "fx",
        "fy",
        "patternUnits",
        "patternContentUnits",
        "patternTransform",
        "markerWidth",
        "markerHeight",
        "refX",
        "refY",
        "orient",
        "markerUnits",
        "marker-start",
        "marker-mid",
        "marker-end",
        "visibility",
        "display",
        "href",
    }
)
HTML_TAGS = (set(nh3.ALLOWED_TAGS) - {"area", "map"}) | {
    "style",
    "font",
    "video",
    "audio",
    "source",
}
GLOBAL_ATTRIBUTES = frozenset(
    {
        "class",
        "id",
        "style",
        "title",
        "lang",
        "dir",
        "align",
        "valign",
        "width",
        "height",
        "role",
    }
)
TAG_ATTRIBUTES: dict[str, frozenset[str]] = {
    tag: frozenset(names)
    for tag, names in {
        "a": {"href", "hreflang"},
        "img": {"src", "alt"},
        "table": {"border", "cellpadding", "cellspacing", "summary"},
        "td": {"colspan", "rowspan", "headers", "nowrap"},
        "th": {"colspan", "rowspan", "headers", "nowrap", "scope", "abbr"},
        "col": {"span"},
        "colgroup": {"span"},
        "ol": {"start", "reversed", "type"},
        "ul": {"type"},
        "li": {"value"},
        "details": {"open"},
        "time": {"datetime"},
        "del": {"datetime"},
        "ins": {"datetime"},
        "style": {"type", "scoped", "media"},
        "font": {"color", "face", "size"},
        "video": {"src", "controls", "loop", "muted"},
        "audio": {"src", "controls", "loop", "muted"},
        "source": {"src", "type"},
    }.items()
}
# Where a URL may point, by tag, for href and src (anything relative is allowed too).
URL_SCHEMES = {"a": ("http", "https", "mailto")}
DATA_URLS = {
    "img": ("image/",),
    "video": ("video/",),
    "audio": ("audio/",),
    "source": ("video/", "audio/"),
}

_TAG_NAME = re.compile(r"<([A-Za-z][^\t\n\f\r />]*)")
_URL_SPACE = str.maketrans("", "", "\t\n\r")
_ALLOWED_LOWER = {name.lower() for name in HTML_TAGS | SVG_TAGS}
# Removed with their content; every other tag that is not allowed is unwrapped (text kept).
_CLEAN_CONTENT = (
    {
        "script",
        "iframe",
        "object",
        "embed",
        "frame",
        "frameset",
        "noscript",
        "noembed",
        "noframes",
        "template",
        "textarea",
        "xmp",
        "plaintext",
        "select",
        "applet",
        "math",
        "foreignObject",
    }
    - HTML_TAGS
    - SVG_TAGS
)


def _scheme(url: str) -> str | None:
    """The scheme a browser would see in ``url`` (lowercase), or None for a relative URL."""
    url = url.translate(_URL_SPACE).strip(
        "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e"
        "\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a"
        "\x1b\x1c\x1d\x1e\x1f "
    )
    head = re.match(r"([A-Za-z][A-Za-z0-9+.\-]*):", url)
    if head:
        return head.group(1).lower()
    # no valid scheme: "a:b" with an invalid one, or a colon before any / ? # is not relative
    colon = url.find(":")
    cut = min((i for i in (url.find("/"), url.find("?"), url.find("#")) if i >= 0), default=-1)
    return "invalid" if colon >= 0 and (cut < 0 or colon < cut) else None


def _css_urls_local(value: str) -> bool:
    """True unless ``value`` (CSS or an SVG paint) may load something outside the document.
    CSS escapes could hide a url(), so any backslash counts as outside."""
    lowered = value.lower()
    if "\\" in value or "@import" in lowered or "image-set(" in lowered:
        return False
    if "url(" not in lowered:
        return True
    return all(
        part.lstrip(" \t\n\"'").startswith(("#", "data:image/"))
        for part in lowered.split("url(")[1:]
    )


class _HtmlFilter(threading.local):
    """nh3's attribute filter: it sees every attribute of every allowed tag and decides.

    One Cleaner serves every call (building one costs more than cleaning a small table), so
    what a call removed is kept per thread: cells clean on the guest worker, inspection and
    user_expressions on the event loop.
    """

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.urls = 0  # href and src attributes seen

    def keep(self, tag: str, attribute: str, value: str) -> str | None:
        try:
            if attribute.endswith(("href", "src")):
                self.urls += 1
            verdict = self._verdict(tag, attribute, value)
        except Exception:  # a raising filter would be reported on stderr by nh3
            verdict = False
        if not verdict:
            self.removed.append(attribute)
            return None
        return value

    @staticmethod
    def _verdict(tag: str, attribute: str, value: str) -> bool:
        svg = tag in SVG_TAGS
        if not (
            attribute in GLOBAL_ATTRIBUTES
            or attribute.startswith("aria-")
            or attribute in TAG_ATTRIBUTES.get(tag, ())
            or (svg and attribute in SVG_ATTRIBUTES)
        ):
            return False
        if attribute in ("href", "src"):
            if svg:
                return value.strip().startswith("#")  # <use href="#glyph">, nothing outside
            scheme = _scheme(value)
            if scheme is None:
                return True
            if scheme == "data":  # an image, video or sound for the tags that show one
                media = value.translate(_URL_SPACE).strip()[5:].lstrip().lower()
                return media.startswith(DATA_URLS.get(tag, ()))
            return scheme in URL_SCHEMES.get(tag, ("http", "https"))
        return True  # CSS is not policed in HTML: a <style> element could do the same


_FILTER = _HtmlFilter()
_CLEANER = nh3.Cleaner(
    tags=HTML_TAGS | SVG_TAGS,
    clean_content_tags=_CLEAN_CONTENT,
    attributes={},
    generic_attribute_prefixes={""},  # every attribute reaches the filter, which decides
    attribute_filter=_FILTER.keep,
    link_rel=None,  # JupyterLab adds rel="noopener" and target="_blank" to output links
    # other schemes are removed by ammonia before the filter sees them: counted below
    url_schemes={"http", "https", "mailto", "data"},
    strip_comments=True,
)
# Every href/src the parser can see is written so in the source: at least as many as these.
_URL_ATTRIBUTE = re.compile(r"(?:href|src)[\t\n\f\r ]*=", re.IGNORECASE)


def _clean_html(text: str) -> tuple[str, str]:
    """Sanitized HTML and what was removed ("" when nothing was)."""
    names = set(_TAG_NAME.findall(text))  # every start tag the parser can see, and more
    foreign = sorted({name.lower() if name.isascii() else name for name in names} - _ALLOWED_LOWER)
    _FILTER.removed, _FILTER.urls = [], 0
    cleaned = _CLEANER.clean(text)
    removed = sorted({name[:32] for name in _FILTER.removed})
    if _FILTER.urls < len(_URL_ATTRIBUTE.findall(text)):
        removed.insert(0, "URLs")  # a scheme ammonia refused (or text that looked like one)
    parts = [f"<{name[:32]}>" for name in foreign[:6]] + removed[:6]
    return cleaned, ", ".join(parts)


# -- image/svg+xml --------------------------------------------------------------------------------

SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
XML_NS = "http://www.w3.org/XML/1998/namespace"
SVG_ELEMENTS = SVG_TAGS | {
    "image",
    "style",
    "a",
    "switch",
    "filter",
    "feBlend",
    "feColorMatrix",
    "feComponentTransfer",
    "feComposite",
    "feConvolveMatrix",
    "feDiffuseLighting",
    "feDisplacementMap",
    "feDistantLight",
    "feDropShadow",
    "feFlood",
    "feFuncA",
    "feFuncB",
    "feFuncG",
    "feFuncR",
    "feGaussianBlur",
    "feMerge",
    "feMergeNode",
    "feMorphology",
    "feOffset",
    "fePointLight",
    "feSpecularLighting",
    "feSpotLight",
    "feTile",
    "feTurbulence",
}
# Attributes that take CSS or a paint reference: url() may only point inside the document.
CSS_ATTRIBUTES = frozenset(
    {
        "style",
        "fill",
        "stroke",
        "clip-path",
        "mask",
        "filter",
        "marker-start",
        "marker-mid",
        "marker-end",
        "cursor",
    }
)
_INERT = {"metadata"}  # dropped with their content and without a notice (matplotlib's RDF)


class _Rejected(Exception):
    """The SVG cannot be made passive as a whole (not well-formed, entities, not SVG)."""


class _SvgPass:
    """Stream an SVG document through expat and write back only the allowlisted parts."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.removed: set[str] = set()
        self.skip = 0  # depth inside a dropped element
        self.open: list[str] = []
        self.style: list[str] | None = None  # text of the <style> being read
        self.root_seen = False

    def run(self, text: str) -> str:
        parser = xml.parsers.expat.ParserCreate(namespace_separator=" ")
        parser.StartElementHandler = self.start
        parser.EndElementHandler = self.end
        parser.CharacterDataHandler = self.text
        parser.buffer_text = True  # one call per run of text, not per line
        parser.EntityDeclHandler = self.entity
        parser.StartDoctypeDeclHandler = self.doctype
        parser.SetParamEntityParsing(xml.parsers.expat.XML_PARAM_ENTITY_PARSING_NEVER)
        try:
            parser.Parse(text, True)
        except xml.parsers.expat.ExpatError as exc:
            raise _Rejected("not well-formed XML") from exc
        if not self.root_seen:
            raise _Rejected("not an SVG document")
        return "".join(self.out)

    def doctype(self, _name: str, _system: Any, _public: Any, has_internal_subset: int) -> None:
        if has_internal_subset:
            raise _Rejected("a DTD internal subset")

    def entity(self, *_args: Any) -> None:
        raise _Rejected("entity declarations")

    def start(self, name: str, attributes: dict[str, str]) -> None:
        namespace, _, local = name.rpartition(" ")
        if not self.root_seen:
            if (namespace, local) != (SVG_NS, "svg"):
                raise _Rejected("not an SVG document")
            self.root_seen = True
        if self.skip or namespace != SVG_NS or local not in SVG_ELEMENTS:
            if not self.skip and local not in _INERT:
                self.removed.add(f"<{local[:32]}>")
            self.skip += 1
            return
        written = [
            f' {key}="{_xml_escape(value, True)}"'
            for key, value in self._attributes(local, attributes)
        ]
        if not self.open:
            written.insert(0, f' xmlns="{SVG_NS}" xmlns:xlink="{XLINK_NS}"')
        self.out.append(f"<{local}{''.join(written)}>")
        self.open.append(local)
        if local == "style":
            self.style = []

    def _attributes(self, element: str, attributes: dict[str, str]):
        for name, value in attributes.items():
            namespace, _, local = name.rpartition(" ")
            prefix = {"": "", XLINK_NS: "xlink:", XML_NS: "xml:"}.get(namespace)
            handler = local.lower().startswith("on")
            if prefix is None or handler or (prefix, local) == ("xml:", "base"):
                self.removed.add(local[:32])
                continue
            if local == "href":
                target = value.strip()
                scheme = _scheme(target)
                ok = (
                    target.startswith("#")
                    or (
                        element == "image"
                        and scheme == "data"
                        and re.match(r"data:image/(png|jpeg|gif|webp|bmp)[;,]", target, re.I)
                    )
                    or (element == "a" and scheme in ("http", "https", "mailto"))
                )
                if not ok:
                    self.removed.add(f"{prefix}href")
                    continue
            elif (local in CSS_ATTRIBUTES and not _css_urls_local(value)) or (
                (":" in value or "&" in value) and _script_url(value)
            ):
                self.removed.add(local[:32])
                continue
            yield prefix + local, value

    def end(self, _name: str) -> None:
        if self.skip:
            self.skip -= 1
            return
        local = self.open.pop()
        if local == "style" and self.style is not None:
            css = "".join(self.style)
            if _css_urls_local(css):
                self.out.append(_xml_escape(css, False))
            else:
                self.removed.add("<style> with outside URLs")
            self.style = None
        self.out.append(f"</{local}>")

    def text(self, data: str) -> None:
        if self.skip or not self.open:
            return
        if self.style is not None:
            self.style.append(data)
        else:
            self.out.append(_xml_escape(data, False))


def _xml_escape(text: str, attribute: bool) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace('"', "&quot;") if attribute else text


def _clean_svg(text: str) -> tuple[str | None, str]:
    """Passive SVG (None if it cannot be made so) and what was removed."""
    run = _SvgPass()
    try:
        cleaned = run.run(text)
    except _Rejected as why:
        return None, f"image/svg+xml dropped ({why})"
    except RecursionError:
        return None, "image/svg+xml dropped (too deep)"
    if run.removed:
        return cleaned, f"image/svg+xml sanitized ({', '.join(sorted(run.removed)[:6])})"
    return cleaned, ""


# -- text/markdown and text/latex -----------------------------------------------------------------

# A tag, comment or declaration, except autolinks such as <https://jupyter.org>.
_MARKUP = re.compile(r"<(?!(?:https?://|mailto:)[^<>\s]*>)[A-Za-z!?/]")
_SCRIPT_URL = re.compile(r"(?:java|vb|live)script:")
_NOT_IN_URLS = str.maketrans("", "", "".join(map(chr, range(0x21))) + "\\\x7f")


def _script_url(text: str) -> bool:
    """Whether ``text`` may hold a script URL, with entities, escapes and spaces taken out."""
    decoded = html.unescape(text) if "&" in text else text
    return bool(_SCRIPT_URL.search(decoded.translate(_NOT_IN_URLS).lower()))


def _check_markdown(text: str) -> str:
    """Why this markdown is not passive ("" when it is): JupyterLab renders its raw HTML."""
    if _MARKUP.search(text):
        return "text/markdown dropped (it holds HTML)"
    if _script_url(text):
        return "text/markdown dropped (it holds a script URL)"
    return ""


def _check_latex(text: str) -> str:
    return "text/latex dropped (it holds a script URL)" if _script_url(text) else ""


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


def passive_bundle(data: Any) -> tuple[dict, list[str]]:
    """The passive part of a mime bundle, and a short phrase for each thing dropped or changed."""
    if not isinstance(data, dict):
        return {}, ["a malformed mime bundle dropped"]
    if all(mime in PASSIVE for mime in data):  # the common case costs one look-up per type
        return data, []
    kept: dict = {}
    changes: list[str] = []
    for mime, payload in data.items():
        if mime in PASSIVE:
            kept[mime] = payload
            continue
        if not isinstance(mime, str):
            changes.append("a malformed mime type dropped")
            continue
        shown = mime[:64]
        text = _as_text(payload)
        if mime in RASTER:
            if text is None:
                changes.append(f"{shown} dropped (not base64 text)")
            else:
                kept[mime] = payload
            continue
        if mime not in ("text/html", "image/svg+xml", "text/markdown", "text/latex"):
            changes.append(f"{shown} dropped")
            continue
        if text is None:
            changes.append(f"{shown} dropped (not text)")
            continue
        try:
            if mime == "text/html":
                cleaned, removed = _clean_html(text)
                kept[mime] = cleaned
                if removed:
                    changes.append(f"text/html sanitized (removed {removed})")
            elif mime == "image/svg+xml":
                cleaned_svg, change = _clean_svg(text)
                if cleaned_svg is not None:
                    kept[mime] = cleaned_svg
                if change:
                    changes.append(change)
            else:
                problem = (_check_markdown if mime == "text/markdown" else _check_latex)(text)
                if problem:
                    changes.append(problem)
                else:
                    kept[mime] = payload
        except Exception:  # a sanitizer bug must not let the payload through, nor kill the cell
            log.exception("dropping %s the sanitizer failed on", shown)
            changes.append(f"{shown} dropped (could not be sanitized)")
    return kept, changes


MAX_NAMED = 8  # kinds of change a notice names; a cell can invent any number of mime types


def notice(changes: list[str]) -> str:
    """The one-line notice for a cell's stderr: each kind of change once, the first example."""
    kinds: dict[str, str] = {}
    for change in changes:
        kinds.setdefault(change.split(" (")[0], change)
    named = list(kinds.values())[:MAX_NAMED]
    if len(kinds) > MAX_NAMED:
        named.append(f"{len(kinds) - MAX_NAMED} more kinds")
    return f"[wasm-kernel] active output blocked: {'; '.join(named)}{NOTICE_TAIL}\n"


class ActiveOutput:
    """The policy for one cell (or one request): ``bundle`` each output, then ``finish`` says
    in one notice, through ``tell``, what was dropped or changed during the whole cell."""

    def __init__(self, policy: str, tell: Callable[[str], None] | None = None):
        self.blocking = policy != ALLOW
        self._tell = tell
        self._changes: list[str] = []

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
