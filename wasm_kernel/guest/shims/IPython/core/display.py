"""Display objects (HTML, Markdown, Image, ...) and display_* helpers for wasm-kernel's sandbox.

The classes take the same arguments as IPython's and give the same representations, written
for the sandbox: files inside it can be read with ``filename=``, but nothing can be fetched
from a URL (the sandbox has no network). Where IPython would only link to a URL (an Image
that is not embedded) the link is kept; a Javascript URL is loaded by the browser through a
script element; anything that would need the URL's content raises NoNetworkError.
"""

import os

from IPython.core.display_functions import (
    DisplayHandle,
    clear_output,
    display,
    publish_display_data,
    update_display,
)

__all__ = [
    "display_pretty",
    "display_html",
    "display_markdown",
    "display_svg",
    "display_png",
    "display_jpeg",
    "display_webp",
    "display_latex",
    "display_json",
    "display_javascript",
    "display_pdf",
    "DisplayObject",
    "TextDisplayObject",
    "Pretty",
    "HTML",
    "Markdown",
    "Math",
    "Latex",
    "SVG",
    "JSON",
    "Javascript",
    "Image",
    # Kept here too for code written against older IPython, where they lived in this module.
    "display",
    "clear_output",
    "publish_display_data",
    "update_display",
    "DisplayHandle",
]


class NoNetworkError(ConnectionError):
    """A display object was asked to fetch a URL, which the sandbox cannot do."""

    def __init__(self, url):
        super().__init__(
            f"cannot fetch {url!r}: the wasm-kernel sandbox has no network access; "
            "pass the content as data= or write it to a file and use filename="
        )
        self.url = url


# -- display_* helpers: one mime type each ------------------------------------------------------


def _show_as(mime, objs, raw=False, metadata=None):
    if metadata:
        metadata = {mime: metadata}
    if raw:
        objs = [{mime: obj} for obj in objs]
    display(*objs, raw=raw, metadata=metadata, include=[mime])


def display_pretty(*objs, **kwargs):
    """Show the text/plain form of each object (``raw=True``: the objects are that text)."""
    _show_as("text/plain", objs, **kwargs)


def display_html(*objs, **kwargs):
    """Show the HTML form of each object (``raw=True``: the objects are HTML source)."""
    _show_as("text/html", objs, **kwargs)


def display_markdown(*objs, **kwargs):
    """Show the Markdown form of each object (``raw=True``: the objects are Markdown)."""
    _show_as("text/markdown", objs, **kwargs)


def display_svg(*objs, **kwargs):
    """Show the SVG form of each object (``raw=True``: the objects are SVG documents)."""
    _show_as("image/svg+xml", objs, **kwargs)


def display_png(*objs, **kwargs):
    """Show the PNG form of each object (``raw=True``: the objects are PNG bytes or base64)."""
    _show_as("image/png", objs, **kwargs)


def display_jpeg(*objs, **kwargs):
    """Show the JPEG form of each object (``raw=True``: the objects are JPEG bytes or base64)."""
    _show_as("image/jpeg", objs, **kwargs)


def display_webp(*objs, **kwargs):
    """Show the WebP form of each object (``raw=True``: the objects are WebP bytes or base64)."""
    _show_as("image/webp", objs, **kwargs)


def display_latex(*objs, **kwargs):
    """Show the LaTeX form of each object (``raw=True``: the objects are LaTeX source)."""
    _show_as("text/latex", objs, **kwargs)


def display_json(*objs, **kwargs):
    """Show the JSON form of each object (``raw=True``: the objects are JSON-able data)."""
    _show_as("application/json", objs, **kwargs)


def display_javascript(*objs, **kwargs):
    """Show the Javascript form of each object (``raw=True``: the objects are JS source)."""
    _show_as("application/javascript", objs, **kwargs)


def display_pdf(*objs, **kwargs):
    """Show the PDF form of each object (``raw=True``: the objects are PDF bytes or base64)."""
    _show_as("application/pdf", objs, **kwargs)


# -- display objects ----------------------------------------------------------------------------


def _is_file(path):
    try:
        return os.path.exists(path)
    except (OSError, ValueError, TypeError):
        return False


def _copy(metadata):
    import copy

    return copy.deepcopy(metadata)


class DisplayObject:
    """Data to show, given directly (``data``), read from a file (``filename``) or a ``url``.

    A ``data`` string starting with "http" is taken as the URL, one naming an existing file
    as the file name, as in IPython. ``metadata`` goes with the representation.
    """

    _read_flags = "r"
    _show_mem_addr = False
    metadata = None

    def __init__(self, data=None, url=None, filename=None, metadata=None):
        if isinstance(data, os.PathLike):
            data = os.fspath(data)
        if isinstance(data, str):
            if url is None and data.startswith("http"):
                url, filename, data = data, None, None
            elif filename is None and _is_file(data):
                url, filename, data = None, data, None
        self.url = url
        self.filename = filename
        self.data = data  # after url and filename: subclasses' data setters look at them
        if metadata is not None:
            self.metadata = metadata
        elif self.metadata is None:
            self.metadata = {}
        self.reload()
        self._check_data()

    def __repr__(self):
        if self._show_mem_addr:
            return object.__repr__(self)
        return f"<{type(self).__module__}.{type(self).__name__} object>"

    def _check_data(self):
        """Raise TypeError when ``self.data`` is not what this kind of object shows."""

    def _data_and_metadata(self):
        if self.metadata:
            return self.data, _copy(self.metadata)
        return self.data

    def _fetch(self):
        raise NoNetworkError(self.url)

    def reload(self):
        """Read the data again from the file (or URL) it came from."""
        if self.filename is not None:
            binary = "b" in self._read_flags
            with open(self.filename, self._read_flags, encoding=None if binary else "utf-8") as f:
                self.data = f.read()
        elif self.url is not None:
            self.data = self._fetch()


class TextDisplayObject(DisplayObject):
    """A display object whose data is text."""

    def _check_data(self):
        if self.data is not None and not isinstance(self.data, str):
            raise TypeError(f"{type(self).__name__} expects text, not {self.data!r}")


class Pretty(TextDisplayObject):
    """Text shown as the object's plain-text form."""

    def _repr_pretty_(self, printer, cycle):
        return printer.text(self.data)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": self.data if self.data is not None else ""}


class HTML(TextDisplayObject):
    """HTML source, shown as text/html."""

    def __init__(self, data=None, url=None, filename=None, metadata=None):
        if (
            isinstance(data, str)
            and data[:8].lower() == "<iframe "
            and data[-9:].lower() == "</iframe>"
        ):
            import warnings

            warnings.warn("Consider using IPython.display.IFrame instead", stacklevel=2)
        super().__init__(data=data, url=url, filename=filename, metadata=metadata)

    def _repr_html_(self):
        return self._data_and_metadata()

    def __html__(self):
        """The HTML source, for libraries (markupsafe, ...) that check for ``__html__``."""
        return self.data


class Markdown(TextDisplayObject):
    """Markdown source, shown as text/markdown."""

    def _repr_markdown_(self):
        return self._data_and_metadata()


class Math(TextDisplayObject):
    """A LaTeX formula, shown as display math (text/latex); surrounding $ are optional."""

    def _repr_latex_(self):
        text = "$\\displaystyle " + self.data.strip("$") + "$"
        return (text, _copy(self.metadata)) if self.metadata else text


class Latex(TextDisplayObject):
    """LaTeX source, shown as text/latex as it is (include the $ or environment yourself)."""

    def _repr_latex_(self):
        return self._data_and_metadata()


class SVG(DisplayObject):
    """An SVG image, shown as image/svg+xml; the <svg> element is taken out of a document."""

    _read_flags = "rb"
    _data = None

    @property
    def data(self):
        return self._data

    @data.setter
    def data(self, svg):
        if svg is None:
            self._data = None
            return
        from xml.dom import minidom

        elements = minidom.parseString(svg).getElementsByTagName("svg")
        if elements:
            svg = elements[0].toxml()
        self._data = svg.decode(errors="replace") if isinstance(svg, bytes) else svg

    def _repr_svg_(self):
        return self._data_and_metadata()


class JSON(DisplayObject):
    """A dict or list shown as application/json, with the viewer's ``expanded`` and ``root``."""

    _data = None

    def __init__(
        self,
        data=None,
        url=None,
        filename=None,
        expanded=False,
        metadata=None,
        root="root",
        **kwargs,
    ):
        self.metadata = {"expanded": expanded, "root": root, **(metadata or {}), **kwargs}
        super().__init__(data=data, url=url, filename=filename)

    @property
    def data(self):
        return self._data

    @data.setter
    def data(self, data):
        if isinstance(data, os.PathLike):
            data = os.fspath(data)
        if isinstance(data, (str, bytes)):
            if self.filename is None and self.url is None:
                import warnings

                warnings.warn("JSON expects JSONable dict or list, not JSON strings", stacklevel=2)
            import json

            data = json.loads(data)
        self._data = data

    def _check_data(self):
        if self.data is not None and not isinstance(self.data, (dict, list)):
            raise TypeError(
                f"{type(self).__name__} expects JSONable dict or list, not {self.data!r}"
            )

    def _data_and_metadata(self):
        return self.data, self.metadata

    def _repr_json_(self):
        return self._data_and_metadata()


_LOAD_CSS = (
    'var link = document.createElement("link");\n'
    'link.rel = "stylesheet";\n'
    'link.type = "text/css";\n'
    'link.href = "{}";\n'
    "document.head.appendChild(link);\n"
)
_LOAD_SCRIPT_THEN = (
    "new Promise(function(resolve, reject) {{\n"
    '  var script = document.createElement("script");\n'
    "  script.onload = resolve;\n"
    "  script.onerror = reject;\n"
    '  script.src = "{}";\n'
    "  document.head.appendChild(script);\n"
    "}}).then(() => {{\n"
)


class Javascript(TextDisplayObject):
    """Javascript source, shown as application/javascript, after loading ``lib`` and ``css``.

    A ``url`` is not fetched by the kernel (the sandbox has no network): the browser loads
    it as one more script, after ``lib``.
    """

    def __init__(self, data=None, url=None, filename=None, lib=None, css=None):
        lib = [lib] if isinstance(lib, str) else [] if lib is None else lib
        css = [css] if isinstance(css, str) else [] if css is None else css
        if not isinstance(lib, (list, tuple)):
            raise TypeError(f"expected sequence, got: {lib!r}")
        if not isinstance(css, (list, tuple)):
            raise TypeError(f"expected sequence, got: {css!r}")
        self.lib = lib
        self.css = css
        super().__init__(data=data, url=url, filename=filename)

    def _fetch(self):
        return ""  # the browser loads the URL: see _repr_javascript_

    def _repr_javascript_(self):
        scripts = list(self.lib)
        if self.url is not None and self.filename is None:
            scripts.append(self.url)
        parts = [_LOAD_CSS.format(href) for href in self.css]
        parts += [_LOAD_SCRIPT_THEN.format(src) for src in scripts]
        parts.append(self.data or "")
        parts.append("\n});" * len(scripts))
        return "".join(parts)


# -- images ---------------------------------------------------------------------------------


def _png_size(data):
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    raise ValueError("not a PNG image with an IHDR header")


def _gif_size(data):
    return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")


def _jpeg_size(data):
    """Width and height from a JPEG's start-of-frame segment."""
    index = 2
    while index + 9 < len(data):
        if data[index] != 0xFF:
            raise ValueError("malformed JPEG data")
        marker = data[index + 1]
        if marker == 0xFF:
            index += 1
            continue
        length = int.from_bytes(data[index + 2 : index + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height = int.from_bytes(data[index + 5 : index + 7], "big")
            width = int.from_bytes(data[index + 7 : index + 9], "big")
            return width, height
        index += 2 + length
    raise ValueError("no frame size found in the JPEG data")


class Image(DisplayObject):
    """A PNG, JPEG, GIF or WebP image: embedded (base64 in the output) or linked by URL.

    The format comes from ``format``, else the file name's or URL's extension, else the
    data's first bytes (PNG when unknown). ``width``/``height`` (and ``unconfined``, ``alt``)
    go into the output's metadata; ``retina=True`` halves the pixel size for HiDPI screens.
    """

    _read_flags = "rb"
    _FMT_JPEG = "jpeg"
    _FMT_PNG = "png"
    _FMT_GIF = "gif"
    _FMT_WEBP = "webp"
    _ACCEPTABLE_EMBEDDINGS = [_FMT_JPEG, _FMT_PNG, _FMT_GIF, _FMT_WEBP]
    _MIMETYPES = {
        _FMT_PNG: "image/png",
        _FMT_JPEG: "image/jpeg",
        _FMT_GIF: "image/gif",
        _FMT_WEBP: "image/webp",
    }

    def __init__(
        self,
        data=None,
        url=None,
        filename=None,
        format=None,
        embed=None,
        width=None,
        height=None,
        retina=False,
        unconfined=False,
        metadata=None,
        alt=None,
    ):
        if isinstance(data, os.PathLike):
            data = os.fspath(data)
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        if filename is not None:
            ext = self._find_ext(filename)
        elif url is not None:
            ext = self._find_ext(url)
        elif data is None:
            raise ValueError("No image data found. Expecting filename, url, or data.")
        elif isinstance(data, str) and (data.startswith("http") or _is_file(data)):
            ext = self._find_ext(data)
        else:
            ext = None

        if format is None:
            if ext is not None:
                format = {"jpg": self._FMT_JPEG}.get(ext, ext)
            elif isinstance(data, bytes):
                format = self._sniff(data)
        format = (format or self._FMT_PNG).lower()
        self.format = self._FMT_JPEG if format == "jpg" else format

        if embed is None:
            embed = url is None and not (isinstance(data, str) and data.startswith("http"))
        self.embed = embed
        if self.embed and self.format not in self._ACCEPTABLE_EMBEDDINGS:
            raise ValueError(f"Cannot embed the '{self.format}' image format")
        self._mimetype = self._MIMETYPES.get(self.format)
        self.width = width
        self.height = height
        self.retina = retina
        self.unconfined = unconfined
        self.alt = alt
        super().__init__(data=data, url=url, filename=filename, metadata=metadata)
        if self.embed and isinstance(self.data, str):
            raise FileNotFoundError(f"No such file or directory: '{self.data}'")

        for name in ("width", "height", "alt"):
            if getattr(self, name) is None and self.metadata.get(name):
                setattr(self, name, self.metadata[name])
        if retina:
            self._retina_shape()

    @classmethod
    def _sniff(cls, data):
        """The image format told by the data's first bytes, or None."""
        if data[:8] == b"\x89PNG\r\n\x1a\n":
            return cls._FMT_PNG
        if data[:2] == b"\xff\xd8":
            return cls._FMT_JPEG
        if data[:6] in (b"GIF87a", b"GIF89a"):
            return cls._FMT_GIF
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            return cls._FMT_WEBP
        return None

    @staticmethod
    def _find_ext(name):
        base, ext = os.path.splitext(name)
        return ext[1:].lower() if ext else base

    def _retina_shape(self):
        """Show the image at half its pixel size (HiDPI screens)."""
        if not self.embed:
            return
        measure = {
            self._FMT_PNG: _png_size,
            self._FMT_JPEG: _jpeg_size,
            self._FMT_GIF: _gif_size,
        }.get(self.format)
        if measure is None:
            return
        width, height = measure(self.data)
        self.width, self.height = width // 2, height // 2

    def reload(self):
        if self.embed:
            super().reload()
            if self.retina:
                self._retina_shape()

    def _html_attributes(self):
        import html

        attributes = ""
        if self.width:
            attributes += f' width="{self.width}"'
        if self.height:
            attributes += f' height="{self.height}"'
        if self.unconfined:
            attributes += ' class="unconfined"'
        if self.alt:
            attributes += f' alt="{html.escape(str(self.alt))}"'
        return attributes

    def _repr_html_(self):
        if not self.embed:
            return f'<img src="{self.url}"{self._html_attributes()}/>'
        return None

    def _data_and_metadata(self, always_both=False):
        if not isinstance(self.data, bytes):
            raise FileNotFoundError(f"No such file or directory: '{self.data}'")
        import base64

        encoded = base64.b64encode(self.data).decode("ascii")
        metadata = dict(self.metadata or {})
        for name in ("width", "height", "unconfined", "alt"):
            value = getattr(self, name)
            if value:
                metadata[name] = value
        if metadata or always_both:
            return encoded, metadata
        return encoded

    def _repr_mimebundle_(self, include=None, exclude=None):
        if not self.embed:
            return {"text/html": self._repr_html_()}
        encoded, metadata = self._data_and_metadata(always_both=True)
        return {self._mimetype: encoded}, ({self._mimetype: metadata} if metadata else {})

    def _repr_png_(self):
        if self.embed and self.format == self._FMT_PNG:
            return self._data_and_metadata()
        return None

    def _repr_jpeg_(self):
        if self.embed and self.format == self._FMT_JPEG:
            return self._data_and_metadata()
        return None
