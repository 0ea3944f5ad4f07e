"""The active-output policy through real kernels: under ``block`` (both profiles' default) what a
cell displays cannot run code in the front end, and the cell says what was taken out; under
``allow`` every bundle arrives exactly as the guest sent it.

Each hostile output is a real display from a cell (IPython.display objects, raw bundles,
``_repr_*_`` methods, a replaced guest inspector), checked on the messages a front end receives.
"""

from __future__ import annotations

import base64
import html.parser
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import nh3
import pytest
from conftest import CellRun, Kernel, ok

ALLOW = ["--WasmKernel.active_output=allow"]
NOTICE = "[wasm-kernel] active output blocked"

JAVASCRIPT = (
    "from IPython.display import Javascript, display\n"
    "display(Javascript('document.body.dataset.pwned = 1'))"
)
HOSTILE_HTML = (
    '<p id="keep">kept <b>bold</b> <a href="https://jupyter.org/">safe link</a></p>'
    "<script>fetch('/api/contents/pwned', {method: 'PUT'})</script>"
    '<img src="data:image/png;base64,iVBORw0KGgo=" alt="inline" onerror="alert(1)">'
    '<iframe src="/lab"></iframe>'
    '<a href=" JaVa&#x09;script:alert(2)">bad link</a>'
    '<div data-commandlinker-command="terminal:create-new" onclick="alert(3)">click</div>'
)
HOSTILE_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40" onload="alert(1)">'
    "<script>alert(2)</script>"
    '<rect id="kept" width="20" height="20" fill="#00f"/>'
    '<foreignObject><div xmlns="http://www.w3.org/1999/xhtml">x</div></foreignObject>'
    '<a href="javascript:alert(3)"><circle r="5"/></a>'
    "</svg>"
)


@pytest.fixture(scope="module")
def blocked() -> Iterator[Kernel]:
    """A kernel with the default policy (the notebook profile's: block)."""
    started = Kernel()
    yield started
    started.shutdown()


@pytest.fixture(scope="module")
def allowed() -> Iterator[Kernel]:
    started = Kernel(ALLOW)
    yield started
    started.shutdown()


def shown(run: CellRun) -> list[dict]:
    """The data of every display_data, update_display_data and execute_result, in order."""
    kinds = ("display_data", "update_display_data", "execute_result")
    return [m["content"]["data"] for m in run.messages if m["msg_type"] in kinds]


def notices(run: CellRun) -> list[str]:
    return [line for line in run.stream_text("stderr").splitlines() if line.startswith(NOTICE)]


def only(items: list) -> object:
    assert len(items) == 1, items
    return items[0]


class Structure(html.parser.HTMLParser):
    """Tags, attributes and text of an HTML fragment: equal for equal documents, however
    they are serialized (quoting, ``scoped`` vs ``scoped=""``, spaces inside tags)."""

    def __init__(self, source: str):
        super().__init__(convert_charrefs=True)
        self.events: list[tuple] = []
        self.feed(source)
        self.close()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.events.append(("start", tag, sorted((k, v or "") for k, v in attrs)))

    def handle_endtag(self, tag: str) -> None:
        self.events.append(("end", tag))

    def handle_data(self, data: str) -> None:
        if data.strip():
            self.events.append(("text", data.strip()))


# -- JavaScript and script-bearing mime types -------------------------------------------------


def test_javascript_is_dropped_with_a_notice(blocked: Kernel) -> None:
    """display(Javascript(...)) loses its script; its text/plain still shows; stderr says why."""
    run = ok(blocked.execute(JAVASCRIPT))
    data = only(shown(run))
    assert "application/javascript" not in data
    assert data["text/plain"] == "<IPython.core.display.Javascript object>"
    assert "application/javascript dropped" in only(notices(run))


def test_javascript_passes_under_allow(allowed: Kernel) -> None:
    run = ok(allowed.execute(JAVASCRIPT))
    data = only(shown(run))
    assert data["application/javascript"] == "document.body.dataset.pwned = 1"
    assert notices(run) == []
    assert run.stream_text("stderr") == ""


def test_one_notice_per_cell(blocked: Kernel) -> None:
    """Ten scripts and an HTML handler in one cell: passive displays, and one notice line, at
    the end of the cell, naming each kind of change once."""
    run = ok(
        blocked.execute(
            "from IPython.display import HTML, Javascript, display\n"
            "for i in range(10):\n    display(Javascript(f'window.n = {i}'))\n"
            "display(HTML('<b onclick=\"x()\">b</b>'))\n"
            "print('done')"
        )
    )
    assert len(shown(run)) == 11
    assert all("application/javascript" not in data for data in shown(run))
    notice = only(notices(run))
    assert notice.count("application/javascript dropped") == 1 and "onclick" in notice
    assert run.messages[-1]["content"]["text"].startswith(NOTICE)  # after all the output
    again = ok(blocked.execute(JAVASCRIPT))  # the next cell is told again
    assert len(notices(again)) == 1


CODE_MIME_TYPES = {
    "application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2},
    "application/vnd.bokehjs_exec.v0+json": "",
    "application/vnd.holoviews_exec.v0+json": "document.title = 'pwned'",
    "text/javascript": "alert(1)",
    "application/vnd.vegalite.v5+json": {
        "data": {"url": "/api/contents/secret.csv"},
        "mark": "point",
    },
    "application/vnd.plotly.v1+json": {"data": [], "layout": {}},
}


def test_code_carrying_mime_types_are_dropped(blocked: Kernel, allowed: Kernel) -> None:
    """Saved widget state, bokeh/holoviews loaders, other script types and data-spec renderers
    are not shown under block (a widget's view passes: its state is policed, see
    test_comms.py); a raw bundle of them alone leaves a placeholder text."""
    cell = (
        f"display({{**{CODE_MIME_TYPES!r}, 'text/plain': 'a widget'}}, raw=True)\n"
        f"display({{'application/vnd.bokehjs_exec.v0+json': 'x'}}, raw=True)"
    )
    run = ok(blocked.execute(cell))
    first, second = shown(run)
    assert first == {"text/plain": "a widget"}
    assert set(second) == {"text/plain"} and "blocked" in second["text/plain"]
    notice = only(notices(run))
    for mime in CODE_MIME_TYPES:
        assert f"{mime} dropped" in notice

    first, second = shown(ok(allowed.execute(cell)))
    assert first == {**CODE_MIME_TYPES, "text/plain": "a widget"}
    assert second == {"application/vnd.bokehjs_exec.v0+json": "x"}


def test_execute_result_of_a_custom_repr(blocked: Kernel) -> None:
    """A cell's value is a result, not a display: its _repr_html_ and bundle are cleaned too."""
    run = ok(
        blocked.execute(
            "class Sneaky:\n"
            "    def _repr_html_(self):\n"
            "        return '<b>value</b><img src=x onerror=\"alert(1)\">'\n"
            "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
            "        return {'application/javascript': 'alert(2)'}\n"
            "Sneaky()"
        )
    )
    data = only(run.of_type("execute_result"))["data"]
    assert "application/javascript" not in data
    assert "<b>value</b>" in data["text/html"] and "onerror" not in data["text/html"]
    assert "onerror" in only(notices(run))


# -- HTML ---------------------------------------------------------------------------------------


def test_html_loses_scripts_handlers_frames_and_script_links(blocked: Kernel) -> None:
    run = ok(blocked.execute(f"from IPython.display import HTML\nHTML({HOSTILE_HTML!r})"))
    cleaned = only(run.of_type("execute_result"))["data"]["text/html"]
    for gone in ("<script", "onerror", "onclick", "<iframe", "javascript", "commandlinker"):
        assert gone not in cleaned.lower().replace("\t", ""), cleaned
    for kept in (
        '<p id="keep">',
        "<b>bold</b>",
        'href="https://jupyter.org/"',
        "safe link",
        'src="data:image/png;base64,iVBORw0KGgo="',
        'alt="inline"',
        "bad link",
        "click",
    ):
        assert kept in cleaned, (kept, cleaned)
    notice = only(notices(run))
    assert "removed from text/html: " in notice
    for what in (
        "<script>",
        "<iframe>",
        "onerror",
        "onclick",
        "href=javascript:",
        "data-commandlinker-command",
    ):
        assert what in notice
    assert "could run code in your browser" in notice


def test_html_passes_under_allow(allowed: Kernel) -> None:
    run = ok(allowed.execute(f"from IPython.display import HTML\nHTML({HOSTILE_HTML!r})"))
    assert only(run.of_type("execute_result"))["data"]["text/html"] == HOSTILE_HTML
    assert notices(run) == []


def test_updated_display_is_cleaned_too(blocked: Kernel) -> None:
    """update_display_data replaces a shown output: it must not smuggle a script in later."""
    run = ok(
        blocked.execute(
            "from IPython.display import HTML, display\n"
            "handle = display(HTML('<i>first</i>'), display_id=True)\n"
            "handle.update(HTML('<i>second</i><script>alert(1)</script>'))"
        )
    )
    updates = run.of_type("update_display_data")
    assert only(updates)["data"]["text/html"] == "<i>second</i>"
    assert "<script>" in only(notices(run))


@pytest.mark.slow
def test_dataframe_and_styler_html_keep_their_structure(blocked: Kernel, allowed: Kernel) -> None:
    """pandas' table, its <style scoped> and class attributes, multi-level columns (halign) and
    rows (valign), and a Styler's ids, classes and CSS pass as pandas wrote them (nothing had to
    be removed, so the HTML is not rewritten), with no notice."""
    cells = [
        "import pandas as pd\n"
        "df = pd.DataFrame({'animal': ['owl', 'newt'], 'legs': [2, 4], 'w': [0.5, 1.5]})\ndf",
        "df.style.set_uuid('t').background_gradient().format(precision=1)"
        ".set_caption('<b>caption</b>')",
        "df.set_index(['animal', 'legs']).T.T.pivot_table(index=['animal', 'legs'],"
        " values='w', aggfunc=['sum', 'mean'])",
        "pd.DataFrame({'w': [1, 2]}, index=pd.MultiIndex.from_product([['a'], ['x', 'y']]))",
    ]
    for cell in cells:
        before = only(ok(allowed.execute(cell)).of_type("execute_result"))["data"]["text/html"]
        run = ok(blocked.execute(cell))
        after = only(run.of_type("execute_result"))["data"]["text/html"]
        assert after == before
        assert notices(run) == []
        assert "<style" in after and ('class="dataframe"' in after or 'id="T_' in after)


def test_presentational_attributes_stay(blocked: Kernel) -> None:
    """Colours, alignments and lengths cannot carry a script or a URL: a table's bgcolor and
    align, a font's colour stay, without a notice; the same attributes holding anything but
    a colour, an alignment or a length do not."""
    table = (
        '<table border="1" cellpadding="4" width="60%"><tr bgcolor="#eeeeee">'
        '<th align="left" halign="left">a</th><th valign="top" nowrap>b</th></tr>'
        '<tr><td bgcolor="yellow" height="2em"><font color="red" face="Arial, sans-serif"'
        ' size="+1">1</font></td><td bgcolor="rgb(0, 128, 0)">2</td></tr></table>'
    )
    run = ok(blocked.execute(f"from IPython.display import HTML\nHTML({table!r})"))
    assert only(run.of_type("execute_result"))["data"]["text/html"] == table
    assert notices(run) == []
    odd = (
        '<table><tr><td bgcolor="url(/x)" width="expression(alert(1))" align="a:b">x</td>'
        "</tr></table>"
    )
    run = ok(blocked.execute(f"HTML({odd!r})"))
    cleaned = only(run.of_type("execute_result"))["data"]["text/html"]
    assert "<td>x</td>" in cleaned
    assert "align, bgcolor, width" in only(notices(run))


def test_the_notice_names_only_what_was_removed(blocked: Kernel) -> None:
    """A script whose text looks like tags (``i<frames.length;``) and URLs (``x.src=``) is
    named as the one element it is; a comment that holds a tag is no element at all."""
    page = (
        "<p>kept</p><script>for (var i=0;i<frames.length;i++) { img.src = frames[i].src }"
        "</script><!-- <iframe src=x> --><b>end</b>"
    )
    run = ok(blocked.execute(f"from IPython.display import HTML\nHTML({page!r})"))
    assert only(run.of_type("execute_result"))["data"]["text/html"] == "<p>kept</p><b>end</b>"
    notice = only(notices(run))
    assert notice.startswith(f"{NOTICE}: removed from text/html: <script>. "), notice


# -- SVG ------------------------------------------------------------------------------------------


def test_svg_loses_scripts_handlers_and_foreign_content(blocked: Kernel) -> None:
    run = ok(
        blocked.execute(
            f"from IPython.display import display\n"
            f"display({{'image/svg+xml': {HOSTILE_SVG!r}, 'text/plain': 'svg'}}, raw=True)"
        )
    )
    svg = only(shown(run))["image/svg+xml"]
    root = ET.fromstring(svg)  # still a well-formed SVG document
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.find("{http://www.w3.org/2000/svg}rect").get("id") == "kept"
    for gone in ("script", "onload", "foreignObject", "javascript", "xhtml"):
        assert gone not in svg, svg
    assert "<circle" in svg  # the content of a dropped link attribute's <a> stays
    notice = only(notices(run))
    assert "removed from image/svg+xml: " in notice
    assert "<script>" in notice and "onload" in notice


def test_svg_passes_under_allow(allowed: Kernel) -> None:
    run = ok(
        allowed.execute(
            f"display({{'image/svg+xml': {HOSTILE_SVG!r}, 'text/plain': 'svg'}}, raw=True)"
        )
    )
    assert only(shown(run))["image/svg+xml"] == HOSTILE_SVG


@pytest.mark.slow
def test_matplotlib_svg_stays_valid(blocked: Kernel, allowed: Kernel) -> None:
    """A real matplotlib SVG: same elements (less its RDF metadata), no notice, well-formed."""
    cell = (
        "%config InlineBackend.figure_formats = ['svg']\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 3, 2], label='a < b & c'); plt.legend(); plt.title('T'); plt.show()"
    )

    def elements(svg: str) -> list[str]:
        root = ET.fromstring(svg)
        skip = {id(e) for m in root.iter("{http://www.w3.org/2000/svg}metadata") for e in m.iter()}
        return [e.tag for e in root.iter() if id(e) not in skip]

    before = only(shown(ok(allowed.execute(cell))))["image/svg+xml"]
    run = ok(blocked.execute(cell))
    after = only(shown(run))["image/svg+xml"]
    assert notices(run) == []
    assert elements(after) == elements(before)
    assert len(re.findall(r"<use ", after)) == len(re.findall(r"<use ", before)) > 0
    assert 'xlink:href="#' in after


# -- Markdown and LaTeX ---------------------------------------------------------------------------


def test_markdown_keeps_its_html_less_what_is_active(blocked: Kernel, allowed: Kernel) -> None:
    """Markdown's HTML passes the HTML allowlist: allowed tags stay as written, an event
    handler or a script goes, a link's script URL goes as an href's would; the rest of the
    Markdown is kept."""
    cell = (
        "from IPython.display import Markdown, display\n"
        "display(Markdown('# Title <img src=x onerror=\"alert(1)\">'))\n"
        "display(Markdown('[click](jav&#x61;script:alert(2))'))\n"
        "display(Markdown('# Plain\\n\\n> a < b, see <https://jupyter.org>\\n\\n**bold**'))\n"
        "display(Markdown('E = mc<sup>2</sup><br>next <center>line</center>'))\n"
        "display(Markdown('before <script>alert(3)</script> after'))"
    )
    run = ok(blocked.execute(cell))
    with_html, with_link, plain, fine, with_script = (data["text/markdown"] for data in shown(run))
    assert with_html == "# Title <img src=x>"
    assert with_link == "[click]()"
    assert (
        plain.startswith("# Plain") and fine == "E = mc<sup>2</sup><br>next <center>line</center>"
    )
    assert with_script == "before  after"
    notice = only(notices(run))
    assert "removed from text/markdown: onerror, href=javascript:, <script>" in notice
    assert all("text/markdown" in data for data in shown(ok(allowed.execute(cell))))


#: Markdown whose HTML a front end would run if the Markdown's own syntax were trusted to hide
#: it: code spans that open a comment or an attribute value, tags joined by a removal, an HTML
#: block (raw to its blank line, which a no-break space does not make) with markup no Markdown
#: parser calls a tag, entities.
HOSTILE_MARKDOWN = [
    "`<!--` <script>alert(1)</script> `-->`",
    '`<span title="` <img src=x onerror=alert(2)> `">`',
    "<<b onclick=x>img src=x onerror=alert(3)>",
    '<div>\n<img/src="x"/onerror=alert(4)>\n</div>',
    "<div>\n<svg><a xlink:href=javascript:alert(5)><text>t</text></a></svg>\n</div>",
    '<a href="javascript&colon;alert(6)">x</a> [y](java\tscript\\:alert(7))',
    "<textarea><img src=x onerror=alert(8)></textarea>",
    "- item\n\n  <details open ontoggle=alert(9)>\n  <summary>s</summary>\n  </details>",
    '<div>\n\u00a0\ntext <img/src="x"/onerror=alert(10)>\n</div>',
]
SCHEMES = {"http", "https", "mailto", "data", "javascript", "vbscript", "livescript"}


def as_browser_sees(page: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The elements and the (element, attribute, value) of ``page`` as an HTML5 parser (nh3's
    html5ever) builds them: text that only looks like a tag is not among them."""
    names = {name.lower() for name in re.findall(r"<([A-Za-z][^\t\n\f\r />]*)", page)}
    attributes: list[tuple[str, str, str]] = []

    def seen(tag: str, name: str, value: str) -> str:
        attributes.append((tag, name, value))
        return value

    out = nh3.clean(
        page,
        tags=names,
        clean_content_tags=set(),
        attributes={},
        generic_attribute_prefixes={""},
        attribute_filter=seen,
        url_schemes=SCHEMES,
    )
    return re.findall(r"<([A-Za-z][^\t\n\f\r />]*)", out), attributes


def test_hostile_markdown_is_made_passive(blocked: Kernel) -> None:
    """Each of HOSTILE_MARKDOWN, cleaned, rendered by a CommonMark parser with raw HTML on (as
    JupyterLab's marked renders it) and read by an HTML5 parser, holds no handler, script or
    script URL, whichever way its Markdown is read (also as if all of it were HTML)."""
    from markdown_it import MarkdownIt

    render = MarkdownIt("commonmark", {"html": True}).render
    cell = "\n".join(f"display(Markdown({text!r}))" for text in HOSTILE_MARKDOWN)
    run = ok(blocked.execute("from IPython.display import Markdown, display\n" + cell))
    cleaned = [data.get("text/markdown") for data in shown(run)]
    assert all(text is not None for text in cleaned), cleaned  # cleaned, not dropped
    for text in cleaned:
        for page in (render(text), text):
            elements, attributes = as_browser_sees(page)
            assert not {"script", "textarea"} & set(elements), (text, page)
            for _tag, name, value in attributes:
                assert not name.startswith("on"), (text, page)
                assert "script:" not in value.replace("\t", "").lower(), (text, page)
    assert notices(run)


@pytest.mark.nokernel
def test_the_hostile_markdown_is_hostile() -> None:
    """The control: uncleaned, each of HOSTILE_MARKDOWN does hold what the test above looks for,
    read one way or the other."""
    from markdown_it import MarkdownIt

    render = MarkdownIt("commonmark", {"html": True}).render
    for text in HOSTILE_MARKDOWN:
        found = []
        for page in (render(text), text):
            elements, attributes = as_browser_sees(page)
            found += [name for name in elements if name in ("script", "textarea")]
            found += [name for _, name, _ in attributes if name.startswith("on")]
            found += [v for _, _, v in attributes if "script:" in v.replace("\t", "").lower()]
        assert found, text


PAGE = base64.b64encode(b"<script>parent.document.body.dataset.pwned = 1</script>").decode()
#: Markdown links whose URL text/html would lose (href=data: on a link, a data URL that is no
#: image on an image), in each way Markdown writes a link's destination; and links it keeps.
REFUSED_LINKS = [
    f"[y](data:text/html;base64,{PAGE})",
    f"[y]( <data:text/html;base64,{PAGE}> 'a title')",
    f"[y](DATA&#58;text/html;base64,{PAGE})",
    f"![i](data:text/html;base64,{PAGE})",
    f"<data:text/html;base64,{PAGE}>",
    f"[y][ref]\n\n[ref]: data:text/html;base64,{PAGE}",
    f"> [y][ref]\n>\n> [ref]:\n>   data:text/html;base64,{PAGE} 'title'",
    f"[![i](data:image/png;base64,iVBORw0KGgo=)](data:text/html;base64,{PAGE})",
]
KEPT_LINKS = [
    "![i](data:image/png;base64,iVBORw0KGgo=)",
    "[site](https://jupyter.org/) and [mail](mailto:a@b.c), [here](#section), [up](../x.md)",
]


def test_markdown_links_follow_the_html_rule_for_urls(blocked: Kernel) -> None:
    """A link's URL in text/markdown is judged as text/html judges an href or src: each of
    REFUSED_LINKS, rendered by a CommonMark parser (as JupyterLab's marked renders it), holds
    no URL the HTML cleaner would remove, and says so; KEPT_LINKS are kept as written."""
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark", {"html": True})
    parser.validateLink = lambda url: True  # as marked: every URL becomes a link
    render = parser.render
    cell = "\n".join(f"display(Markdown({text!r}))" for text in REFUSED_LINKS + KEPT_LINKS)
    run = ok(blocked.execute("from IPython.display import Markdown, display\n" + cell))
    cleaned = [data.get("text/markdown") for data in shown(run)]
    assert cleaned[len(REFUSED_LINKS) :] == KEPT_LINKS

    def script_pages(text: str) -> list[str]:
        _, attributes = as_browser_sees(render(text))
        return [
            v for _, name, v in attributes if name in ("href", "src") and "data:text" in v.lower()
        ]

    for text, original in zip(cleaned, REFUSED_LINKS, strict=False):
        assert script_pages(original), original  # the control: a link to a page, uncleaned
        assert text is not None, original  # cleaned, not dropped
        assert not script_pages(text), (original, text)
    link = f'<a href="data:text/html;base64,{PAGE}">y</a>'
    as_html = ok(blocked.execute(f"from IPython.display import HTML\nHTML({link!r})"))
    assert "href=data:" in only(notices(as_html))  # the same words for the same rule
    assert "removed from text/markdown: href=data:, src=data:" in only(notices(run))


def test_latex_with_a_script_link_is_dropped(blocked: Kernel) -> None:
    run = ok(
        blocked.execute(
            "from IPython.display import Latex, display\n"
            "display(Latex(r'$\\href{javascript:alert(1)}{x}$'))\n"
            "display(Latex(r'$x^2$'))"
        )
    )
    hostile, fine = shown(run)
    assert "text/latex" not in hostile and fine["text/latex"] == "$x^2$"
    assert "text/latex dropped" in only(notices(run))


# -- inspection and user_expressions ----------------------------------------------------------


def test_user_expressions_are_passive(blocked: Kernel, allowed: Kernel) -> None:
    expression = {"e": "HTML('<b>x</b><script>alert(1)</script>')", "n": "1 + 1"}
    ok(blocked.execute("from IPython.display import HTML"))
    ok(allowed.execute("from IPython.display import HTML"))
    run = ok(blocked.execute("pass", user_expressions=expression))
    results = run.content["user_expressions"]
    assert results["e"]["data"]["text/html"] == "<b>x</b>"
    assert results["n"]["data"] == {"text/plain": "2"}
    assert "<script>" in only(notices(run))
    run = ok(allowed.execute("pass", user_expressions=expression))
    assert "<script>" in run.content["user_expressions"]["e"]["data"]["text/html"]


INSPECTOR = (  # rewrites the guest's inspect reply on its way out, through the raw channel
    "import _host, json\n"
    "_real_call = _host.call\n"
    "def forging(payload):\n"
    "    message = json.loads(payload)\n"
    "    if message.get('op') == 'reply' and 'found' in message.get('content', {}):\n"
    "        message['content'] = {'found': True, 'data': {\n"
    "            'text/plain': 'docs', 'text/html': '<b>docs</b><img src=x onerror=alert(1)>',\n"
    "            'application/javascript': 'alert(2)'}}\n"
    "        payload = json.dumps(message).encode()\n"
    "    return _real_call(payload)\n"
    "_host.call = forging"
)


def _inspect(kernel: Kernel) -> dict:
    ok(kernel.execute(INSPECTOR))
    reply = kernel.client.inspect("print", 5, reply=True, timeout=60)
    assert reply["content"]["status"] == "ok"
    return reply["content"]["data"]


def test_inspection_is_passive(blocked: Kernel, allowed: Kernel) -> None:
    """JupyterLab's inspector renders inspect_reply data; a cell can rewrite what the guest's
    inspector sends, so that data is guest output like any other."""
    data = _inspect(blocked)
    assert "application/javascript" not in data
    assert data["text/html"] == '<b>docs</b><img src="x">'
    assert data["text/plain"].startswith("docs\n\n" + NOTICE)
    assert _inspect(allowed)["application/javascript"] == "alert(2)"


# -- odd input, settings --------------------------------------------------------------------------


def test_odd_payloads_do_not_break_the_kernel(blocked: Kernel) -> None:
    """Lists for text, dicts for images, lone surrogates, bad XML: dropped or cleaned, never
    a crash, and the next cell runs."""
    run = ok(
        blocked.execute(
            "display({'text/html': ['<b>', 'x'], 'image/png': {'a': 1}, 'text/plain': 'p'},"
            " raw=True)\n"
            "display({'text/html': '<b>\\ud800</b>', 'image/svg+xml': '<svg><unclosed>',"
            " 'text/plain': 'q'}, raw=True)\n"
            "display({'image/svg+xml': '<!DOCTYPE s [<!ENTITY a \"aaaa\">]><svg>&a;</svg>'},"
            " raw=True)"
        )
    )
    first, second, third = shown(run)
    assert first == {"text/plain": "p"}
    assert second["text/html"] == "<b>\N{REPLACEMENT CHARACTER}</b>"
    assert "image/svg+xml" not in second
    assert set(third) == {"text/plain"}
    notice = only(notices(run))
    assert "text/html dropped (not text)" in notice and "image/svg+xml dropped" in notice
    assert ok(blocked.execute("6 * 7")).result_text() == "42"


def test_plain_text_is_untouched_and_unnoticed(blocked: Kernel) -> None:
    run = ok(blocked.execute("print('hi'); {'a': '<script>alert(1)</script>'}"))
    assert run.result_text() == "{'a': '<script>alert(1)</script>'}"
    assert run.stream_text("stderr") == ""


@pytest.mark.slow
def test_environment_and_strict_profile(start_kernel) -> None:
    """WASM_KERNEL_ACTIVE_OUTPUT=allow turns blocking off; the strict kernelspec blocks."""
    allowed_by_env = start_kernel(env={"WASM_KERNEL_ACTIVE_OUTPUT": "allow"})
    assert "application/javascript" in only(shown(ok(allowed_by_env.execute(JAVASCRIPT))))
    strict = start_kernel(kernel_name="wasm-python-strict")
    run = ok(strict.execute(JAVASCRIPT))
    assert "application/javascript" not in only(shown(run)) and notices(run)
