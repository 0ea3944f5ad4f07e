"""text/markdown made passive, and text/latex checked.

JupyterLab renders Markdown with marked and puts its raw HTML into the page as it is, so the
HTML in Markdown passes the same allowlist as text/html (``active_html``). Only the offending
parts are taken out of the source, which is otherwise left as written (code, math, and every
allowed tag byte for byte):

- a start tag of an allowed element keeps its allowed attributes and loses the others; an
  element removed with its content (``<script>``) goes with everything up to its end tag; any
  other tag is removed and its content kept;
- where marked passes text through unparsed (an HTML block: from a line that starts with
  ``<`` to a blank line) a ``<`` that could open markup the allowlist cannot vouch for becomes
  ``&lt;``, and is shown as text;
- a link's URL (an inline link or image, a reference definition, an autolink) is judged by the
  rule text/html's ``href`` and ``src`` are judged by (``attribute_problem``: a link to http,
  https, mailto or a relative URL, an image from those or a ``data:image/`` URL); one it
  refuses is removed, as text/html loses the attribute;
- a ``javascript:`` (or ``vbscript:``, ``livescript:``) URL, also behind entities, escapes and
  spaces, gets a zero-width space before its colon, so no browser reads it as a scheme.

The result is cleaned again until nothing changes (removing a tag can join the text around it
into a new one); Markdown that does not settle, or that still holds a script URL, is dropped.
"""

from __future__ import annotations

import bisect
import html
import re

from .active_html import (
    ALLOWED_LOWER,
    CLEAN_CONTENT,
    SVG_ATTRIBUTES,
    SVG_TAGS,
    ascii_lower,
    attribute_problem,
    script_url,
)

# Tags as CommonMark and marked recognise raw HTML, a little wider (names with . and :).
_ATTRIBUTE = r"""\s+[A-Za-z_:][\w.:-]*(?:\s*=\s*(?:[^\s"'=<>`]+|'[^']*'|"[^"]*"))?"""
_OPEN_TAG = re.compile(rf"<([A-Za-z][\w:.-]*)((?:{_ATTRIBUTE})*)\s*(/?)>")
_ATTRIBUTES = re.compile(r"""(\s+)([A-Za-z_:][\w.:-]*)(?:\s*=\s*([^\s"'=<>`]+|'[^']*'|"[^"]*"))?""")
_CLOSE_TAG = re.compile(r"</([A-Za-z][\w:.-]*)\s*>")
_COMMENT_START = re.compile(r"<!--(?!-?>)")
_MARKUP = re.compile(r"<[A-Za-z/!?]")
# A line that may start an HTML block: container markers (quotes, list items), then '<'.
_BLOCK_START = re.compile(r"(?:[ \t]*(?:>|[*+-](?=[ \t])|\d{1,9}[.)](?=[ \t])))*[ \t]*<")
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)?")
# HTML blocks that a blank line does not end, and what ends them.
_SPECIAL = re.compile(
    r"<(?:(script|pre|style|textarea)(?![\w-])|(!--)|(!\[CDATA\[)|(!)|(\?))", re.IGNORECASE
)
_ENDS = {
    2: re.compile(r"-->"),
    3: re.compile(r"\]\]>"),
    4: re.compile(r">"),
    5: re.compile(r"\?>"),
}
_CASED = {name.lower(): name for name in SVG_TAGS | SVG_ATTRIBUTES if name != name.lower()}
_CLEAN_CONTENT = {name.lower() for name in CLEAN_CONTENT}
_ENTITY = re.compile(r"&(?:#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[A-Za-z][A-Za-z0-9]*;?)")
_SCRIPT_SCHEME = re.compile(r"(?:java|vb|live)script:")
_NOT_IN_URLS = frozenset(map(chr, range(0x21))) | {"\\", "\x7f"}
MAX_ROUNDS = 8
# Where marked reads a link's URL: after "](" (an inline link or image) or "]:" (a reference
# definition), past spaces and one line break (and a blockquote's markers), or an autolink.
_BEFORE_URL = r"\](\(|:)[ \t]*(?:(?:\r\n|\r|\n)(?:[ \t]*>)*[ \t]*)?"
_AUTOLINK_START = r"(<)(?=[A-Za-z][A-Za-z0-9+.\-]{1,31}:)"
_URL_START = re.compile(f"{_BEFORE_URL}|{_AUTOLINK_START}")
# What any URL the rule could refuse matches (one not a web or relative URL): most Markdown
# has none, and is left as it is after a search for each (each starts with a literal: fast)
_MAY_BE_REFUSED = (
    re.compile(_BEFORE_URL + r"(?!<?https?://)(?:<[^\n>]*?|[^\x00-\x20]*?)[:&]"),
    re.compile(_AUTOLINK_START),
)
_BRACKETED_URL = re.compile(r"<((?:\\.|[^\n<>\\])*)>")
_AUTOLINK = re.compile(r"<([^\x00-\x20<>]*)>")
_BRACKET = re.compile(r"[\\\[\]]")
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")


def clean_markdown(text: str) -> tuple[str | None, list[str], str]:
    """Passive Markdown (None if it cannot be made so), what was removed or disabled, and why
    it was dropped ("" when it was not)."""
    removed: list[str] = []
    for _ in range(MAX_ROUNDS):
        step = _clean_markup(text, removed)
        step = _remove_refused_urls(step, removed)
        step = _defuse_script_urls(step, removed)
        if step == text:
            break
        text = step
    else:
        return None, [], "its HTML did not settle when cleaned"
    if script_url(text):
        return None, [], "it holds a script URL"
    return text, list(dict.fromkeys(removed))[:6], ""


def _raw_spans(text: str) -> list[tuple[int, int]]:
    """Where marked may pass the text through unparsed: from a line that may open an HTML
    block to the next blank line, and past the end of any comment, script, style, pre or
    processing instruction opened there (a blank line does not end those)."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    until = 0  # a blank line ends the span only after this
    known: dict[object, int] = {}  # the next end of each kind found so far
    for match in _LINE.finditer(text):
        pos, line = match.start(), match.group()
        if not line:
            break
        if start is None and _BLOCK_START.match(line):
            start = pos
        if start is None:
            continue
        for special in _SPECIAL.finditer(line):
            if until >= len(text):
                break
            name = special.group(1)
            kind: object = name.lower() if name else special.lastindex
            ends = re.compile(rf"</{name}\s*>", re.I) if name else _ENDS[special.lastindex or 4]
            after = pos + special.end()
            if known.get(kind, -1) < after:
                found = ends.search(text, after)
                known[kind] = found.end() if found else len(text)
            until = max(until, known[kind])
        if pos >= until and not line.strip(" \t\r\n"):  # blank as Markdown means it
            spans.append((start, pos))
            start = None
    if start is not None:
        spans.append((start, len(text)))
    return spans


def _clean_markup(text: str, removed: list[str]) -> str:
    """One pass over every '<' that could open markup (see the module's doc)."""
    if not _MARKUP.search(text):
        return text
    spans = _raw_spans(text)
    starts = [span[0] for span in spans]

    def raw(pos: int) -> bool:
        index = bisect.bisect_right(starts, pos) - 1
        return index >= 0 and pos < spans[index][1]

    comment_end = -1  # the end of the first "-->" found so far (len(text) + 1: none)

    def comment(pos: int) -> bool:
        """Whether a comment starts at pos: one search for the end serves many starts."""
        nonlocal comment_end
        if not _COMMENT_START.match(text, pos):
            return False
        if comment_end < pos + 4:
            found = text.find("-->", pos + 4)
            comment_end = found + 3 if found >= 0 else len(text) + 1
        return comment_end <= len(text)

    out: list[str] = []
    done = 0  # text before this is written to out, or dropped
    for match in _MARKUP.finditer(text):
        pos = match.start()
        if pos < done:
            continue
        tag = _OPEN_TAG.match(text, pos)
        if tag is not None:
            replacement, end = _start_tag(text, tag, removed)
        elif (close := _CLOSE_TAG.match(text, pos)) is not None:
            name = ascii_lower(close.group(1))
            keep = name in ALLOWED_LOWER and name not in _CLEAN_CONTENT
            replacement, end = (None, pos) if keep else ("", close.end())
        elif comment(pos):
            replacement, end = None, pos
        elif text[pos + 1] in "!?" or raw(pos):
            replacement, end = "&lt;", pos + 1
            removed.append("markup it could not check (shown as text)")
        else:
            replacement, end = None, pos  # marked writes this '<' as text itself
        if replacement is None:
            continue
        kept = text[done:pos]
        if replacement == "" and kept.endswith("<"):
            kept = kept[:-1] + "&lt;"  # so that what follows cannot join it into a tag
        out += [kept, replacement]
        done = end
    out.append(text[done:])
    return "".join(out)


def _start_tag(text: str, tag: re.Match[str], removed: list[str]) -> tuple[str | None, int]:
    """What replaces a start tag (None: it stays as it is) and where the replaced part ends."""
    name = ascii_lower(tag.group(1))
    if name in _CLEAN_CONTENT:
        removed.append(f"<{name[:32]}>")
        end = re.compile(rf"</{re.escape(name)}[^>]*>", re.I).search(text, tag.end())
        return "", end.end() if end else len(text)
    if name not in ALLOWED_LOWER:
        removed.append(f"<{name[:32]}>")
        return "", tag.end()
    cased = _CASED.get(name, name)
    kept, problems = [], []
    for attribute in _ATTRIBUTES.finditer(tag.group(2)):
        key = ascii_lower(attribute.group(2))
        value = attribute.group(3) or ""
        if value[:1] in ("'", '"'):
            value = value[1:-1]
        problem = attribute_problem(cased, _CASED.get(key, key), html.unescape(value))
        if problem is None:
            kept.append(attribute.group())
        else:
            problems.append(problem)
    if not problems:
        return None, tag.start()
    removed += problems
    return f"<{tag.group(1)}{''.join(kept)}{tag.group(3)}>", tag.end()


def _remove_refused_urls(text: str, removed: list[str]) -> str:
    """``text`` less every link URL that text/html's rule for ``href`` and ``src`` refuses
    (an autolink's becomes text)."""
    if not any(pattern.search(text) for pattern in _MAY_BE_REFUSED):
        return text
    out: list[str] = []
    done = 0
    image_ends: set[int] | None = None  # found when first needed
    for start in _URL_START.finditer(text):
        if start.start() < done:
            continue
        pos = start.end()
        if start.group(2):  # an autolink: <scheme:...>
            url = _AUTOLINK.match(text, start.start())
            if url is None:
                continue
            tag, attribute, end, replacement = "a", "href", url.end(), "&lt;" + url.group()[1:]
        else:
            bracketed = _BRACKETED_URL.match(text, pos)
            url = bracketed or _bare_url(text, pos)
            raw = url.group(1)
            if raw.startswith(("https://", "http://")) or not (":" in raw or "&" in raw):
                continue  # a web or relative URL, whichever the tag (no entity hides a colon)
            tag, attribute = "a", "href"
            end, replacement = url.end(), "<>" if bracketed else ""
        destination = html.unescape(_ESCAPE.sub(r"\1", url.group(1)))
        problem = attribute_problem(tag, attribute, destination)
        if start.group(1) == "(":  # an inline link, or an image: judged as an img's src too
            as_image = attribute_problem("img", "src", destination)
            if as_image != problem:  # which it is decides, or names what is removed
                if image_ends is None:
                    image_ends = _image_ends(text)
                if start.start() in image_ends:
                    problem = as_image
        if problem is None:
            continue
        removed.append(problem)
        out += [text[done : url.start()], replacement]
        done = end
    out.append(text[done:])
    return "".join(out) if done else text


_BARE_URL = re.compile(r"((?:\\.|[^\x00-\x20\\()]|\\|\((?:\\.|[^\x00-\x20\\()])*\))*)")


def _bare_url(text: str, pos: int) -> re.Match[str]:
    """A destination not in <>: no spaces, parentheses balanced (one level, as is enough to
    judge its scheme, which comes first)."""
    match = _BARE_URL.match(text, pos)
    assert match is not None  # it matches the empty string
    return match


def _image_ends(text: str) -> set[int]:
    """Where a ']' ends an image's alt text (``![`` to its ']', brackets within it balanced,
    escaped ones left out): one pass over the text."""
    ends: set[int] = set()
    opened: list[bool] = []  # for each '[' still open: whether it opens an image
    escaped = -1  # the last character a backslash escapes
    for bracket in _BRACKET.finditer(text):
        at = bracket.start()
        if at == escaped:
            continue
        char = text[at]
        if char == "\\":
            escaped = at + 1
        elif char == "[":
            opened.append(at > 0 and text[at - 1] == "!" and escaped != at - 1)
        elif opened and opened.pop():
            ends.add(at)
    return ends


def _defuse_script_urls(text: str, removed: list[str]) -> str:
    """``text`` with a zero-width space before the colon of every script URL in it, found as
    ``script_url`` finds them (entities decoded, spaces and backslashes left out)."""
    if not script_url(text):
        return text
    decoded: list[str] = []
    source: list[int] = []  # where in text each decoded character came from
    pos = 0
    while pos < len(text):
        char = text[pos]
        entity = _ENTITY.match(text, pos) if char == "&" else None
        if entity is not None:
            for one in html.unescape(entity.group()):
                decoded.append(one.lower() if one.isascii() else one)
                source.append(pos)
            pos = entity.end()
            continue
        if char not in _NOT_IN_URLS:
            decoded.append(char.lower() if char.isascii() else char)
            source.append(pos)
        pos += 1
    colons = sorted({source[m.end() - 1] for m in _SCRIPT_SCHEME.finditer("".join(decoded))})
    if not colons:
        return text
    removed.append("script URLs (disabled)")
    parts, done = [], 0
    for colon in colons:
        parts += [text[done:colon], "\u200b"]
        done = colon
    parts.append(text[done:])
    return "".join(parts)


def check_latex(text: str) -> str:
    """Why this LaTeX is not passive ("" when it is): MathJax follows ``\\href`` links."""
    return "it holds a script URL" if script_url(text) else ""
