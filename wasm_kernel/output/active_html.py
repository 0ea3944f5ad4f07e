"""The allowlist for text/html (and for the HTML inside Markdown), and nh3's cleaning by it.

What is kept cannot run script or load anything but an allowed URL: formatting, tables, lists,
links, images, inline SVG shapes, ``<style>``, and attributes that only describe how things look
(colours, alignments, lengths: pandas' ``halign``, a table's ``bgcolor``). What is removed is
named as it really was: a tag only when the parser saw an element (not text in a script that
looks like one), an attribute by its name, a URL by its scheme. HTML from which nothing had to
be removed is returned as the guest wrote it, so that it matches what the native kernel sends.
"""

from __future__ import annotations

import html
import re
import threading

import nh3

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
GLOBAL_ATTRIBUTES = frozenset({"class", "id", "style", "title", "lang", "dir", "role"})
TAG_ATTRIBUTES: dict[str, frozenset[str]] = {
    tag: frozenset(names)
    for tag, names in {
        "a": {"href", "hreflang"},
        "img": {"src", "alt"},
        "table": {"summary"},
        "td": {"colspan", "rowspan", "headers"},
        "th": {"colspan", "rowspan", "headers", "scope", "abbr"},
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
        "video": {"src", "controls", "loop", "muted"},
        "audio": {"src", "controls", "loop", "muted"},
        "source": {"src", "type"},
    }.items()
}
# Presentational attributes, on any tag, kept when their value is of their kind: a colour, an
# alignment (a keyword), a length, a font list or a flag cannot hold a script or a URL.
_LENGTH = re.compile(
    r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)\s*(?:%|\*|px|em|rem|ex|ch|pt|pc|cm|mm|in|vw|vh)?|auto",
    re.IGNORECASE,
)
_COLOUR = re.compile(r"#[0-9a-f]{3,8}|[a-z]{3,32}|(?:rgba?|hsla?)\([0-9.,%\s/+-]*\)", re.IGNORECASE)
_KEYWORD = re.compile(r"[a-z][a-z-]{0,31}", re.IGNORECASE)
_FONTS = re.compile(r"[\w ,'\"-]{1,200}")
_FLAG = re.compile(r"[a-z]{0,32}", re.IGNORECASE)
PRESENTATIONAL: dict[str, re.Pattern[str]] = {
    **dict.fromkeys(("align", "valign", "halign", "clear", "frame", "rules"), _KEYWORD),
    **dict.fromkeys(("bgcolor", "bordercolor", "color"), _COLOUR),
    **dict.fromkeys(
        (
            "width",
            "height",
            "border",
            "cellpadding",
            "cellspacing",
            "hspace",
            "vspace",
            "charoff",
            "size",
        ),
        _LENGTH,
    ),
    "face": _FONTS,
    **dict.fromkeys(("nowrap", "noshade", "compact"), _FLAG),
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
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
ALLOWED_LOWER = {name.lower() for name in HTML_TAGS | SVG_TAGS}
# Removed with their content; every other tag that is not allowed is unwrapped (text kept).
CLEAN_CONTENT = (
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
# Elements whose text the serializer writes unescaped: a tag-like string inside one is text.
_RAW_TEXT = frozenset(
    {"script", "style", "xmp", "iframe", "noembed", "noframes", "plaintext", "noscript"}
)
# The parser writes SVG element names in these cases; the rest it lowercases.
_SVG_CASED = {
    name.lower(): name
    for name in {
        *SVG_TAGS,
        "foreignObject",
        "feImage",
        "feGaussianBlur",
        "feColorMatrix",
        "feTurbulence",
        "feDisplacementMap",
        "animateMotion",
        "animateTransform",
        "animateColor",
        "altGlyph",
        "glyphRef",
    }
    if name != name.lower()
}


def ascii_lower(name: str) -> str:
    """``name`` as the HTML parser folds a tag or attribute name (ASCII letters only)."""
    return name.translate(_ASCII_LOWER)


def url_scheme(url: str) -> str | None:
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


def css_urls_local(value: str) -> bool:
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


_SCRIPT_URL = re.compile(r"(?:java|vb|live)script:")
_NOT_IN_URLS = str.maketrans("", "", "".join(map(chr, range(0x21))) + "\\\x7f")


def script_url(text: str) -> bool:
    """Whether ``text`` may hold a script URL, with entities, escapes and spaces taken out."""
    decoded = html.unescape(text) if "&" in text else text
    return bool(_SCRIPT_URL.search(decoded.translate(_NOT_IN_URLS).lower()))


def attribute_problem(tag: str, attribute: str, value: str) -> str | None:
    """None if ``attribute="value"`` may stay on ``tag`` (names as the parser gives them, the
    value decoded), else how to name what is removed."""
    pattern = PRESENTATIONAL.get(attribute)
    if pattern is not None:
        return None if pattern.fullmatch(value.strip()) else attribute[:32]
    svg = tag in SVG_TAGS
    if not (
        attribute in GLOBAL_ATTRIBUTES
        or attribute.startswith("aria-")
        or attribute in TAG_ATTRIBUTES.get(tag, ())
        or (svg and attribute in SVG_ATTRIBUTES)
    ):
        return attribute[:32]
    if attribute not in ("href", "src"):
        return None  # CSS is not policed in HTML: a <style> element could do the same
    if svg:  # <use href="#glyph">, nothing outside
        return None if value.strip().startswith("#") else f"{attribute} out of the image"
    scheme = url_scheme(value)
    if scheme is None:
        return None
    if scheme == "data":  # an image, video or sound for the tags that show one
        media = value.translate(_URL_SPACE).strip()[5:].lstrip().lower()
        if media.startswith(DATA_URLS.get(tag, ())):
            return None
    elif scheme in URL_SCHEMES.get(tag, ("http", "https")):
        return None
    return f"{attribute}={scheme[:16]}:"


class _HtmlFilter(threading.local):
    """nh3's attribute filter: it sees every attribute of every element and decides.

    One Cleaner serves every call (building one costs more than cleaning a small table), so
    what a call removed is kept per thread: cells clean on the guest worker, inspection and
    user_expressions on the event loop.
    """

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.urls = 0  # href and src attributes seen

    def keep(self, tag: str, attribute: str, value: str) -> str | None:
        if attribute.endswith(("href", "src")):
            self.urls += 1
        if tag not in _ALLOWED:  # ammonia asks before removing the element, which is named
            return None
        try:
            problem = attribute_problem(tag, attribute, value)
        except Exception:  # a raising filter would be reported on stderr by nh3
            problem = attribute[:32]
        if problem is not None:
            self.removed.append(problem)
            return None
        return value


_ALLOWED = HTML_TAGS | SVG_TAGS
_FILTER = _HtmlFilter()
_SCHEMES = {"http", "https", "mailto", "data"}


def _cleaner(schemes: set[str]) -> nh3.Cleaner:
    return nh3.Cleaner(
        tags=_ALLOWED,
        clean_content_tags=CLEAN_CONTENT,
        attributes={},
        generic_attribute_prefixes={""},  # every attribute reaches the filter, which decides
        attribute_filter=_FILTER.keep,
        link_rel=None,  # JupyterLab adds rel="noopener" and target="_blank" to output links
        # other schemes are removed by ammonia before the filter sees them (see clean_html)
        url_schemes=schemes,
        strip_comments=True,
    )


_CLEANER = _cleaner(_SCHEMES)
# Every href/src the parser can see is written so in the source: at least as many as these.
_URL_ATTRIBUTE = re.compile(r"(?:href|src)[\t\n\f\r ]*=", re.IGNORECASE)
_SCHEME_LIKE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]{0,31}):")
MAX_SCHEMES = 64


def _seen_tags(text: str, names: set[str]) -> list[str]:
    """Which of ``names`` (folded) the parser sees as elements in ``text``: cleaned again with
    only those allowed and nothing removed with its content, the text of every other element
    (a script's included) comes out escaped, so a raw ``<name`` left is a real element. An
    element whose text is written raw is looked for alone."""
    seen: list[str] = []
    plain = names - _RAW_TEXT
    for group in [plain, *({name} for name in sorted(names & _RAW_TEXT))]:
        if not group:
            continue
        spelled = group | {_SVG_CASED[name] for name in group if name in _SVG_CASED}
        out = nh3.clean(
            text, tags=spelled, clean_content_tags=set(), attributes={}, strip_comments=True
        )
        found = {ascii_lower(name) for name in _TAG_NAME.findall(out)}
        seen += sorted(found & group)
    return seen


def clean_html(text: str) -> tuple[str, list[str]]:
    """Sanitized HTML and what was removed ([] when nothing was)."""
    candidates = {ascii_lower(name) for name in _TAG_NAME.findall(text)} - ALLOWED_LOWER
    _FILTER.removed, _FILTER.urls = [], 0
    cleaned = _CLEANER.clean(text)
    urls = len(_URL_ATTRIBUTE.findall(text))
    if _FILTER.urls < urls:
        # ammonia dropped URLs of schemes it does not allow before the filter saw them (or the
        # text only looked like one): again, with every scheme in sight, so the filter names them
        decoded = html.unescape(text).translate(_URL_SPACE)
        schemes = {name.lower() for name in _SCHEME_LIKE.findall(decoded)}
        extra = sorted(schemes - _SCHEMES)[:MAX_SCHEMES]
        _FILTER.removed, _FILTER.urls = [], 0
        cleaned = _cleaner(_SCHEMES | set(extra)).clean(text)
    removed = sorted(set(_FILTER.removed))
    untouched = not (candidates or removed or _FILTER.urls < urls or "<!" in text or "<?" in text)
    if untouched:  # the parser's view of it passed whole: what the browser will see too
        return text, []
    tags = _seen_tags(text, candidates) if candidates else []
    return cleaned, [f"<{name[:32]}>" for name in tags[:6]] + removed[:6]
