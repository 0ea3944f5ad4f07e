"""IFrame, FileLink and Code for wasm-kernel's sandbox, with IPython's constructors."""

import os

from IPython.core.display import TextDisplayObject

__all__ = ["Code", "FileLink", "IFrame"]


class IFrame:
    """Another page embedded in the output (text/html iframe); extra keywords become its query."""

    def __init__(self, src, width, height, extras=None, **kwargs):
        self.src = src
        self.width = width
        self.height = height
        self.extras = list(extras or [])
        self.params = kwargs

    def _repr_html_(self):
        from urllib.parse import urlencode

        query = "?" + urlencode(self.params) if self.params else ""
        extras = "".join(" " + extra for extra in self.extras)
        return (
            f'<iframe width="{self.width}" height="{self.height}" src="{self.src}{query}" '
            f'frameborder="0" allowfullscreen referrerpolicy="strict-origin-when-cross-origin"'
            f"{extras}></iframe>"
        )


class FileLink:
    """A link to a local file in the output; its plain-text form is the file's absolute path."""

    def __init__(self, path, url_prefix="", result_html_prefix="", result_html_suffix="<br>"):
        if os.path.isdir(path):
            raise ValueError(
                f"Cannot display a directory using FileLink. Use FileLinks to display '{path}'."
            )
        self.path = os.fsdecode(path)
        self.url_prefix = url_prefix
        self.result_html_prefix = result_html_prefix
        self.result_html_suffix = result_html_suffix

    def _repr_html_(self):
        import html

        if not os.path.exists(self.path):
            return (
                f"Path (<tt>{html.escape(self.path)}</tt>) doesn't exist. It may still be in the "
                "process of being generated, or you may have the incorrect path."
            )
        href = self.url_prefix + html.escape(self.path)
        return (
            f"{self.result_html_prefix}<a href='{href}' target='_blank'>"
            f"{html.escape(self.path, quote=False)}</a>{self.result_html_suffix}"
        )

    def __repr__(self):
        return os.path.abspath(self.path)


class Code(TextDisplayObject):
    """Source code: plain text, and HTML in a <pre> block (no highlighting in the sandbox)."""

    def __init__(self, data=None, url=None, filename=None, language=None):
        self.language = language
        super().__init__(data=data, url=url, filename=filename)

    def __repr__(self):
        return self.data

    def _repr_html_(self):
        import html

        language = f' class="language-{html.escape(self.language)}"' if self.language else ""
        return f"<pre><code{language}>{html.escape(self.data)}</code></pre>"
