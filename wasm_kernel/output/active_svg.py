"""image/svg+xml made passive: the document is streamed through expat and only the allowlisted
elements and attributes are written back (a well-formed SVG document, or nothing)."""

from __future__ import annotations

import re
import xml.parsers.expat
from typing import Any

from .active_html import SVG_TAGS, css_urls_local, script_url, url_scheme

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
                scheme = url_scheme(target)
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
            elif (local in CSS_ATTRIBUTES and not css_urls_local(value)) or (
                (":" in value or "&" in value) and script_url(value)
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
            if css_urls_local(css):
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


def clean_svg(text: str) -> tuple[str | None, list[str], str]:
    """Passive SVG (None if it cannot be made so), what was removed, and why it was dropped
    ("" when it was not)."""
    run = _SvgPass()
    try:
        cleaned = run.run(text)
    except _Rejected as why:
        return None, [], str(why)
    except RecursionError:
        return None, [], "too deep"
    return cleaned, sorted(run.removed)[:6], ""
