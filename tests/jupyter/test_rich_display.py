"""IPython.display inside the sandbox: display objects, display ids, clear_output, mime bundles.

There is no real IPython in the guest; these tests check that wasm-kernel's own
IPython.display gives the Jupyter messages IPython's would, over ZMQ through jupyter_client.
Their kernel allows active output, so that bundles arrive exactly as the guest made them
(the policy that blocks them is tested in tests/hostile/test_active_output.py).
"""

from __future__ import annotations

import base64
import json

import pytest
from conftest import Kernel, ok

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def kernel():
    """One kernel for the module, with active output allowed: representations, not policy."""
    started = Kernel(["--WasmKernel.active_output=allow"])
    yield started
    started.shutdown()


def shown(kernel: Kernel, code: str) -> list[dict]:
    """display_data contents of a cell that must succeed."""
    return ok(kernel.execute(code)).of_type("display_data")


def one(kernel: Kernel, code: str) -> dict:
    [content] = shown(kernel, code)
    return content


def failure(kernel: Kernel, code: str) -> dict:
    run = kernel.execute(code)
    assert run.content["status"] == "error"
    [error] = run.of_type("error")
    return error


# -- display objects ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "mime", "value", "plain"),
    [
        ("HTML('<b>bold</b>')", "text/html", "<b>bold</b>", "HTML"),
        ("Markdown('# Title')", "text/markdown", "# Title", "Markdown"),
        ("Latex(r'$\\alpha + \\beta$')", "text/latex", "$\\alpha + \\beta$", "Latex"),
        ("Math(r'\\int_0^1 x\\,dx')", "text/latex", "$\\displaystyle \\int_0^1 x\\,dx$", "Math"),
        ("Math('$$e^{i\\\\pi}$$')", "text/latex", "$\\displaystyle e^{i\\pi}$", "Math"),
        ("JSON({'a': [1, 2]})", "application/json", {"a": [1, 2]}, "JSON"),
        ("JSON([1, {'b': None}])", "application/json", [1, {"b": None}], "JSON"),
        ("Javascript('console.log(1)')", "application/javascript", "console.log(1)", "Javascript"),
        (
            "SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"><rect/></svg>')",
            "image/svg+xml",
            '<svg xmlns="http://www.w3.org/2000/svg"><rect/></svg>',
            "SVG",
        ),
    ],
)
def test_display_object_mime_type_and_content(
    kernel: Kernel, code: str, mime: str, value: object, plain: str
) -> None:
    content = one(kernel, f"from IPython.display import *\ndisplay({code})")
    assert content["data"] == {mime: value, "text/plain": f"<IPython.core.display.{plain} object>"}
    if mime != "application/json":
        assert content["metadata"] == {}


def test_display_object_as_last_expression_is_execute_result(kernel: Kernel) -> None:
    run = ok(kernel.execute("from IPython.display import Markdown\nMarkdown('*shown*')"))
    [result] = run.of_type("execute_result")
    assert result["data"]["text/markdown"] == "*shown*"
    assert run.of_type("display_data") == []


def test_pretty_is_plain_text(kernel: Kernel) -> None:
    content = one(
        kernel, "from IPython.display import Pretty\ndisplay(Pretty('just text\\nline 2'))"
    )
    assert content["data"] == {"text/plain": "just text\nline 2"}


def test_text_objects_carry_metadata(kernel: Kernel) -> None:
    content = one(
        kernel,
        "from IPython.display import HTML\ndisplay(HTML('<p>x</p>', metadata={'isolated': True}))",
    )
    assert content["metadata"] == {"text/html": {"isolated": True}}


def test_math_metadata_goes_with_latex(kernel: Kernel) -> None:
    content = one(kernel, "from IPython.display import Math\ndisplay(Math('x', metadata={'k': 1}))")
    assert content["data"]["text/latex"] == "$\\displaystyle x$"
    assert content["metadata"] == {"text/latex": {"k": 1}}


def test_text_object_rejects_non_text(kernel: Kernel) -> None:
    error = failure(kernel, "from IPython.display import HTML\nHTML(42)")
    assert error["ename"] == "TypeError"  # IPython's own check, as under ipykernel


def test_json_expanded_root_and_extra_metadata(kernel: Kernel) -> None:
    content = one(
        kernel,
        "from IPython.display import JSON\n"
        "display(JSON({'k': 1}, expanded=True, root='data',"
        " metadata={'m': 2}, x=3))",
    )
    assert content["data"]["application/json"] == {"k": 1}
    assert content["metadata"] == {
        "application/json": {"expanded": True, "root": "data", "m": 2, "x": 3}
    }


def test_json_default_metadata(kernel: Kernel) -> None:
    content = one(kernel, "from IPython.display import JSON\ndisplay(JSON([1]))")
    assert content["metadata"] == {"application/json": {"expanded": False, "root": "root"}}


def test_json_string_is_parsed_with_a_warning(kernel: Kernel) -> None:
    run = ok(kernel.execute("from IPython.display import JSON\ndisplay(JSON('{\"n\": [1, 2]}'))"))
    [content] = run.of_type("display_data")
    assert content["data"]["application/json"] == {"n": [1, 2]}
    assert "JSON expects JSONable dict or list" in run.stream_text("stderr")


def test_json_rejects_scalars(kernel: Kernel) -> None:
    assert failure(kernel, "from IPython.display import JSON\nJSON(5)")["ename"] == "TypeError"


def test_svg_is_taken_out_of_a_document(kernel: Kernel) -> None:
    content = one(
        kernel,
        (
            "from IPython.display import SVG\n"
            'doc = \'\'\'<?xml version="1.0" encoding="utf-8"?>\n'
            "<!-- made by hand -->\n"
            '<svg xmlns="http://www.w3.org/2000/svg" width="20" height="10">'
            '<circle cx="5" cy="5" r="4"/></svg>\n\'\'\'\n'
            "display(SVG(doc.encode()))"
        ),
    )
    assert content["data"]["image/svg+xml"] == (
        '<svg xmlns="http://www.w3.org/2000/svg" width="20" height="10">'
        '<circle cx="5" cy="5" r="4"/></svg>'
    )


def test_svg_from_a_file_in_the_sandbox(kernel: Kernel) -> None:
    content = one(
        kernel,
        (
            "from IPython.display import SVG\n"
            "with open('/tmp/drawing.svg', 'w') as f:\n"
            "    f.write('<?xml version=\"1.0\"?>'\n"
            "            '<svg xmlns=\"http://www.w3.org/2000/svg\"><g/></svg>')\n"
            "display(SVG(filename='/tmp/drawing.svg'))"
        ),
    )
    assert content["data"]["image/svg+xml"] == '<svg xmlns="http://www.w3.org/2000/svg"><g/></svg>'


def test_text_objects_read_files_in_the_sandbox(kernel: Kernel) -> None:
    contents = shown(
        kernel,
        (
            "from IPython.display import HTML, Markdown\n"
            "with open('/tmp/page.html', 'w') as f:\n"
            "    f.write('<h1>from a file</h1>')\n"
            "with open('/tmp/notes.md', 'w') as f:\n"
            "    f.write('**notes** ü')\n"
            "display(HTML(filename='/tmp/page.html'), Markdown('/tmp/notes.md'))"
        ),
    )
    assert contents[0]["data"]["text/html"] == "<h1>from a file</h1>"
    assert contents[1]["data"]["text/markdown"] == "**notes** ü"  # a path given as data


def test_javascript_loads_css_and_libraries_first(kernel: Kernel) -> None:
    content = one(
        kernel,
        (
            "from IPython.display import Javascript\n"
            "display(Javascript('draw()', lib=['https://cdn.example/a.js', 'https://cdn.example/b.js'],"
            " css='https://cdn.example/s.css'))"
        ),
    )
    script = content["data"]["application/javascript"]
    parts = (
        "https://cdn.example/s.css",
        "https://cdn.example/a.js",
        "https://cdn.example/b.js",
        "draw()",
    )
    css, lib_a, lib_b, body = (script.index(part) for part in parts)
    assert css < lib_a < lib_b < body
    assert script.rstrip().endswith("});")
    assert script.count("});") == 2  # each library's promise is closed after the body


@pytest.mark.parametrize(
    "code",
    [
        "from IPython.display import Javascript\ndisplay(Javascript(url='https://cdn.example/w.js'))",
        "from IPython.display import HTML\nHTML(url='https://example.com/')",
        "from IPython.display import Image\nImage(url='https://example.com/cat.png', embed=True)",
    ],
)
def test_display_objects_fetch_urls_in_the_guest_which_has_no_network(
    kernel: Kernel, code: str
) -> None:
    """IPython fetches a display object's url when it is made; in the sandbox that fails as
    any network use does: URLError, its reason NetworkUnavailable, and the hint."""
    error = failure(kernel, code)
    assert error["ename"] == "URLError"
    assert "there is no network in this sandbox" in error["evalue"]
    assert "The sandbox has no network" in error["traceback"][-1]
    caught = ok(
        kernel.execute(
            "from IPython.display import Markdown\n"
            "try:\n    Markdown('https://example.com/readme.md')\n"
            "except OSError as exc:\n    print('OSError', type(exc.reason).__name__)"
        )
    )
    assert caught.stream_text() == "OSError NetworkUnavailable\n"


def test_code_iframe_and_filelink(kernel: Kernel) -> None:
    contents = shown(
        kernel,
        (
            "from IPython.display import Code, IFrame, FileLink\n"
            "open('/tmp/report.csv', 'w').close()\n"
            "display(Code('if a < b:\\n    pass', language='python'),"
            " IFrame('https://example.com/page', width=400, height=300, q='x y'),"
            " FileLink('/tmp/report.csv'))"
        ),
    )
    code, iframe, link = (c["data"] for c in contents)
    assert code["text/plain"] == "if a < b:\n    pass"
    assert 'class="o">&lt;</span>' in code["text/html"]  # highlighted by pygments
    assert 'src="https://example.com/page?q=x+y"' in iframe["text/html"]
    assert 'width="400"' in iframe["text/html"] and 'height="300"' in iframe["text/html"]
    assert link["text/plain"] == "/tmp/report.csv"
    assert "href='/tmp/report.csv'" in link["text/html"]


# -- images ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "mime"),
    [
        ("b'\\x89PNG\\r\\n\\x1a\\n'", "image/png"),
        ("b'\\xff\\xd8\\xff\\xe0'", "image/jpeg"),
        ("b'GIF89a'", "image/gif"),
        ("b'GIF87a'", "image/gif"),
        ("b'RIFF\\x10\\x00\\x00\\x00WEBPVP8 '", "image/webp"),
    ],
)
def test_image_format_from_magic_bytes(kernel: Kernel, header: str, mime: str) -> None:
    content = one(
        kernel, f"from IPython.display import Image\ndisplay(Image(data={header} + bytes(16)))"
    )
    raw = base64.b64decode(content["data"][mime])
    assert raw.endswith(bytes(16))
    assert set(content["data"]) == {mime, "text/plain"}
    assert content["data"]["text/plain"] == "<IPython.core.display.Image object>"


def test_image_width_and_height_metadata(kernel: Kernel) -> None:
    content = one(
        kernel,
        (
            "from IPython.display import Image\n"
            "display(Image(data=b'\\x89PNG\\r\\n\\x1a\\n' + bytes(16), width=120, height=80,"
            " metadata={'note': 'n'}))"
        ),
    )
    assert content["metadata"] == {"image/png": {"note": "n", "width": 120, "height": 80}}


def test_image_alt_and_unconfined_metadata(kernel: Kernel) -> None:
    content = one(
        kernel,
        (
            "from IPython.display import Image\n"
            "display(Image(data=b'\\xff\\xd8' + bytes(8), alt='a chart', unconfined=True))"
        ),
    )
    assert content["metadata"] == {"image/jpeg": {"alt": "a chart", "unconfined": True}}


def test_image_from_a_file_in_the_sandbox(kernel: Kernel) -> None:
    content = one(
        kernel,
        (
            "from IPython.display import Image\n"
            "payload = b'\\xff\\xd8\\xff' + bytes(range(200))\n"
            "with open('/tmp/photo.jpg', 'wb') as f:\n"
            "    f.write(payload)\n"
            "display(Image(filename='/tmp/photo.jpg', width=50))"
        ),
    )
    assert base64.b64decode(content["data"]["image/jpeg"]) == b"\xff\xd8\xff" + bytes(range(200))
    assert content["metadata"] == {"image/jpeg": {"width": 50}}


def test_image_url_is_kept_as_a_link(kernel: Kernel) -> None:
    content = one(
        kernel,
        "from IPython.display import Image\n"
        "display(Image(url='https://example.com/cat.png', width=64,"
        " alt='a <cat>'))",
    )
    assert content["data"]["text/html"] == (
        '<img src="https://example.com/cat.png" width="64" alt="a &lt;cat&gt;"/>'
    )
    assert "image/png" not in content["data"]


def test_image_errors(kernel: Kernel) -> None:
    assert failure(kernel, "from IPython.display import Image\nImage()")["ename"] == "ValueError"
    missing = kernel.execute("from IPython.display import Image\nImage('/tmp/no-such.png')")
    assert missing.content["status"] == "error" and missing.of_type("error")  # as natively
    bmp = failure(kernel, "from IPython.display import Image\nImage(data=b'BM', format='bmp')")
    assert bmp["ename"] == "ValueError" and "bmp" in bmp["evalue"]


def test_image_repr_png_and_repr_jpeg(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "from IPython.display import Image\n"
            "png = Image(data=b'\\x89PNG\\r\\n\\x1a\\n' + bytes(4))\n"
            "jpeg = Image(data=b'\\xff\\xd8' + bytes(4), height=3)\n"
            "print(png._repr_png_(), png._repr_jpeg_(), jpeg._repr_jpeg_(), jpeg._repr_png_())"
        )
    )
    assert run.stream_text() == "iVBORw0KGgoAAAAA None ('/9gAAAAA', {'height': 3}) None\n"


@pytest.mark.slow
def test_matplotlib_png_through_image_decodes(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "import io\n"
            "from matplotlib.figure import Figure\n"
            "from IPython.display import Image\n"
            "fig = Figure(figsize=(2, 1.5), dpi=50)\n"
            "fig.subplots().plot([0, 1, 4, 9])\n"
            "buffer = io.BytesIO()\n"
            "fig.savefig(buffer, format='png')\n"
            "png = buffer.getvalue()\n"
            "print(len(png))\n"
            "display(Image(data=png, retina=True))"
        )
    )
    [content] = run.of_type("display_data")
    raw = base64.b64decode(content["data"]["image/png"], validate=True)
    assert raw.startswith(PNG_SIGNATURE)
    assert len(raw) == int(run.stream_text())
    # retina=True halves the pixel size read from the PNG header: 100 x 75 pixels at dpi 50
    assert content["metadata"] == {"image/png": {"width": 50, "height": 37}}


# -- display(), display ids and clear_output ----------------------------------------------------


def test_display_id_and_update_display(kernel: Kernel) -> None:
    first = shown(
        kernel,
        (
            "from IPython.display import display, update_display, HTML\n"
            "handle = display(HTML('<i>step 1</i>'), display_id='progress-bar')\n"
            "print(type(handle).__name__, handle.display_id)"
        ),
    )
    assert first[0]["transient"] == {"display_id": "progress-bar"}
    run = ok(kernel.execute("update_display(HTML('<i>step 2</i>'), display_id='progress-bar')"))
    [updated] = run.of_type("update_display_data")
    assert updated["transient"] == {"display_id": "progress-bar"}
    assert updated["data"]["text/html"] == "<i>step 2</i>"
    assert run.of_type("display_data") == []


def test_display_id_true_makes_a_fresh_id_each_time(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "a = display('a', display_id=True)\nb = display('b', display_id=True)\n"
            "print(a.display_id == b.display_id,"
            " repr(a) == f'<DisplayHandle display_id={a.display_id}>')"
        )
    )
    ids = [c["transient"]["display_id"] for c in run.of_type("display_data")]
    assert len(ids) == 2 and ids[0] != ids[1]
    assert run.stream_text() == "False True\n"


def test_display_handle_update_and_display(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "from IPython.display import DisplayHandle, Markdown\n"
            "handle = DisplayHandle()\n"
            "handle.display(Markdown('first'))\n"
            "handle.update(Markdown('second'))\n"
            "handle.display(Markdown('again'))\n"
            "print(handle.display_id)"
        )
    )
    display_id = run.stream_text().strip()
    assert len(display_id) == 32
    kinds = [
        (m["msg_type"], m["content"]["data"]["text/markdown"], m["content"]["transient"])
        for m in run.messages
        if m["msg_type"].endswith("display_data")
    ]
    assert kinds == [
        ("display_data", "first", {"display_id": display_id}),
        ("update_display_data", "second", {"display_id": display_id}),
        ("display_data", "again", {"display_id": display_id}),
    ]


def test_display_with_only_an_id_returns_a_handle_and_shows_nothing(kernel: Kernel) -> None:
    """An empty display_data holds the id's place, as ipykernel sends it."""
    run = ok(kernel.execute("h = display(display_id='later'); print(h.display_id)"))
    assert run.of_type("display_data") == [
        {"data": {}, "metadata": {}, "transient": {"display_id": "later"}}
    ]
    assert run.stream_text() == "later\n"


def test_update_needs_a_display_id(kernel: Kernel) -> None:
    error = failure(kernel, "display('x', update=True)")
    assert error["ename"] == "TypeError"
    assert "display_id required" in error["evalue"]


def test_transient_is_passed_on(kernel: Kernel) -> None:
    content = one(kernel, "display('t', transient={'extra': 1}, display_id='d1')")
    assert content["transient"] == {"extra": 1, "display_id": "d1"}


def test_clear_output_wait(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "from IPython.display import clear_output\n"
            "print('old')\nclear_output(wait=True)\nprint('new')\nclear_output()"
        )
    )
    assert run.of_type("clear_output") == [{"wait": True}, {"wait": False}]
    kinds = [m["msg_type"] for m in run.messages if m["msg_type"] != "execute_input"]
    assert kinds == ["stream", "clear_output", "stream", "clear_output"]


def test_display_clear_true_clears_first(kernel: Kernel) -> None:
    run = ok(kernel.execute("display('frame 2', clear=True)"))
    kinds = [m["msg_type"] for m in run.messages if m["msg_type"] != "execute_input"]
    assert kinds == ["clear_output", "display_data"]
    assert run.of_type("clear_output") == [{"wait": True}]


# -- raw bundles, include/exclude, metadata -------------------------------------------------------


def test_raw_bundle_is_sent_as_is(kernel: Kernel) -> None:
    content = one(
        kernel,
        (
            "display({'text/html': '<b>raw</b>', 'text/plain': 'raw',"
            " 'application/vnd.custom+json': {'k': [1]}}, raw=True,"
            " metadata={'text/html': {'isolated': True}})"
        ),
    )
    assert content["data"] == {
        "text/html": "<b>raw</b>",
        "text/plain": "raw",
        "application/vnd.custom+json": {"k": [1]},
    }
    assert content["metadata"] == {"text/html": {"isolated": True}}


def test_raw_bytes_are_base64_encoded(kernel: Kernel) -> None:
    content = one(kernel, "display({'image/png': b'\\x89PNG\\r\\n\\x1a\\n'}, raw=True)")
    assert base64.b64decode(content["data"]["image/png"]) == PNG_SIGNATURE


def test_raw_bundle_that_is_not_a_dict_fails_clearly(kernel: Kernel) -> None:
    error = failure(kernel, "display('<b>x</b>', raw=True)")
    assert error["ename"] == "TypeError"
    assert "data must be a dict" in error["evalue"]  # ipykernel's words
    bad_value = failure(kernel, "display({'text/html': 5}, raw=True)")
    assert bad_value["ename"] == "TypeError"


def test_json_mime_types_carry_any_json_value(kernel: Kernel) -> None:
    """nbformat allows any JSON value under a JSON mime type, numbers included."""
    run = kernel.execute("display({'application/json': 5, 'text/plain': '5'}, raw=True)")
    assert run.content["status"] == "ok"
    assert run.of_type("display_data")[0]["data"]["application/json"] == 5


@pytest.mark.parametrize(
    ("call", "mime", "value"),
    [
        ("display_html('<p>h</p>', raw=True)", "text/html", "<p>h</p>"),
        ("display_markdown('*m*', raw=True)", "text/markdown", "*m*"),
        ("display_latex('$y$', raw=True)", "text/latex", "$y$"),
        ("display_json({'j': 1}, raw=True)", "application/json", {"j": 1}),
        ("display_javascript('f()', raw=True)", "application/javascript", "f()"),
        ("display_svg('<svg/>', raw=True)", "image/svg+xml", "<svg/>"),
        ("display_pretty('plain', raw=True)", "text/plain", "plain"),
        ("display_png('iVBORw0KGgo=', raw=True)", "image/png", "iVBORw0KGgo="),
    ],
)
def test_display_mimetype_helpers_raw(kernel: Kernel, call: str, mime: str, value: object) -> None:
    content = one(kernel, f"from IPython.display import *\n{call}")
    assert content["data"] == {mime: value}


def test_display_mimetype_helpers_keep_only_their_type(kernel: Kernel) -> None:
    contents = shown(
        kernel,
        (
            "from IPython.display import HTML, Markdown\n"
            "from IPython.display import display_html, display_png, display_markdown\n"
            "display_html(HTML('<u>u</u>'))\n"
            "display_png(HTML('<u>no png here</u>'))\n"
            "display_markdown(Markdown('md'), metadata={'k': 1})"
        ),
    )
    assert [c["data"] for c in contents] == [{"text/html": "<u>u</u>"}, {"text/markdown": "md"}]
    assert contents[1]["metadata"] == {"text/markdown": {"k": 1}}


RICH = (
    "class Rich:\n"
    "    def _repr_html_(self):\n        return '<b>rich</b>'\n"
    "    def _repr_markdown_(self):\n        return '**rich**'\n"
    "    def _repr_latex_(self):\n        return '$r$'\n"
    "    def __repr__(self):\n        return 'Rich()'\n"
)


def test_include_and_exclude(kernel: Kernel) -> None:
    contents = shown(
        kernel,
        RICH
        + (
            "display(Rich(), include=['text/html', 'text/plain'])\n"
            "display(Rich(), exclude=['text/html', 'text/latex'])\n"
        ),
    )
    assert contents[0]["data"] == {"text/html": "<b>rich</b>", "text/plain": "Rich()"}
    assert contents[1]["data"] == {"text/markdown": "**rich**", "text/plain": "Rich()"}


def test_metadata_argument_is_merged_over_the_objects(kernel: Kernel) -> None:
    content = one(
        kernel,
        (
            "from IPython.display import Image\n"
            "display(Image(data=b'\\x89PNG\\r\\n\\x1a\\n', width=10, height=20),"
            " metadata={'image/png': {'width': 30}, 'tag': 'fig'})"
        ),
    )
    assert content["metadata"] == {"image/png": {"width": 30, "height": 20}, "tag": "fig"}


def test_repr_mimebundle_with_include_exclude_and_metadata(kernel: Kernel) -> None:
    contents = shown(
        kernel,
        (
            "class Bundle:\n"
            "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
            "        data = {'text/html': f'<p>{include}|{exclude}</p>', 'text/markdown': 'md',\n"
            "                'application/vnd.example+json': {'n': 1}}\n"
            "        return data, {'text/html': {'isolated': True}}\n"
            "    def _repr_latex_(self):\n        return '$b$'\n"
            "display(Bundle())\n"
            "display(Bundle(), include=['text/html'])\n"
            "display(Bundle(), exclude=['text/markdown', 'text/latex'])\n"
        ),
    )
    everything, included, excluded = contents
    assert everything["data"]["text/html"] == "<p>None|None</p>"
    assert everything["data"]["text/markdown"] == "md"
    assert everything["data"]["text/latex"] == "$b$"  # _repr_*_ fill in what the bundle lacks
    assert everything["data"]["application/vnd.example+json"] == {"n": 1}
    assert everything["data"]["text/plain"].startswith("<__main__.Bundle at 0x")  # IPython's
    assert everything["metadata"] == {"text/html": {"isolated": True}}
    assert included["data"] == {"text/html": "<p>['text/html']|None</p>"}
    assert included["metadata"] == {"text/html": {"isolated": True}}
    assert "text/markdown" not in excluded["data"] and "text/latex" not in excluded["data"]
    assert excluded["data"]["text/html"] == "<p>None|['text/markdown', 'text/latex']</p>"


def test_repr_mimebundle_dict_only(kernel: Kernel) -> None:
    content = one(
        kernel,
        (
            "class Only:\n"
            "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
            "        return {'text/plain': 'custom plain',"
            " 'image/png': b'\\x89PNG\\r\\n\\x1a\\n'}\n"
            "display(Only())"
        ),
    )
    assert content["data"]["text/plain"] == "custom plain"
    assert base64.b64decode(content["data"]["image/png"]) == PNG_SIGNATURE


@pytest.mark.parametrize(
    ("method", "returned", "mime", "expected"),
    [
        ("_repr_markdown_", "'## heading'", "text/markdown", "## heading"),
        ("_repr_svg_", "'<svg><g/></svg>'", "image/svg+xml", "<svg><g/></svg>"),
        ("_repr_json_", "{'x': [1, 2]}", "application/json", {"x": [1, 2]}),
        ("_repr_latex_", "r'$\\sqrt{2}$'", "text/latex", "$\\sqrt{2}$"),
        (
            "_repr_jpeg_",
            "b'\\xff\\xd8\\xff\\xdb'",
            "image/jpeg",
            base64.b64encode(b"\xff\xd8\xff\xdb").decode(),
        ),
        ("_repr_javascript_", "'run()'", "application/javascript", "run()"),
        ("_repr_pdf_", "b'%PDF-1.4'", "application/pdf", base64.b64encode(b"%PDF-1.4").decode()),
    ],
)
def test_repr_methods(
    kernel: Kernel, method: str, returned: str, mime: str, expected: object
) -> None:
    code = (
        f"class Shape:\n    def {method}(self):\n        return {returned}\n"
        "    def __repr__(self):\n        return 'Shape()'\n"
        "display(Shape())"
    )
    content = one(kernel, code)
    assert content["data"] == {mime: expected, "text/plain": "Shape()"}


def test_repr_method_metadata_tuple(kernel: Kernel) -> None:
    content = one(
        kernel,
        (
            "class Pic:\n"
            "    def _repr_png_(self):\n"
            "        return b'\\x89PNG\\r\\n\\x1a\\n', {'width': 7}\n"
            "display(Pic())"
        ),
    )
    assert content["metadata"] == {"image/png": {"width": 7}}


def test_ipython_display_method_takes_over(kernel: Kernel) -> None:
    contents = shown(
        kernel,
        (
            "from IPython.display import display, HTML\n"
            "class Widgetish:\n"
            "    def _ipython_display_(self):\n"
            "        display(HTML('<div>custom</div>'), metadata={'via': 'hook'})\n"
            "    def _repr_html_(self):\n"
            "        return 'not used'\n"
            "display(Widgetish())"
        ),
    )
    assert [c["data"]["text/html"] for c in contents] == ["<div>custom</div>"]
    assert contents[0]["metadata"] == {"via": "hook"}


def test_unknown_object_falls_back_to_text_plain(kernel: Kernel) -> None:
    instance, cls = shown(kernel, "class Thing:\n    pass\ndisplay(Thing(), Thing)")
    assert list(instance["data"]) == ["text/plain"]
    assert instance["data"]["text/plain"].startswith("<__main__.Thing at 0x")  # IPython's
    assert instance["metadata"] == {}
    assert cls["data"] == {"text/plain": "__main__.Thing"}


def test_classes_are_shown_by_repr_not_their_repr_methods(kernel: Kernel) -> None:
    content = one(kernel, "from IPython.display import HTML\ndisplay(HTML)")
    assert content["data"] == {"text/plain": "IPython.core.display.HTML"}  # IPython's pretty


# -- import paths ---------------------------------------------------------------------------------


def test_old_and_new_import_paths(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "import IPython.display as d\n"
            "from IPython.core.display import HTML, Image, display_html\n"
            "from IPython.core.display_functions import display, update_display, clear_output\n"
            "from IPython.lib.display import IFrame\n"
            "print(HTML is d.HTML, Image is d.Image, display is d.display,"
            " update_display is d.update_display, IFrame is d.IFrame)\n"
            "display(HTML('<p>old path</p>'))"
        )
    )
    assert run.stream_text() == "True True True True True\n"
    [content] = run.of_type("display_data")
    assert content["data"]["text/html"] == "<p>old path</p>"


def test_star_import_gives_ipython_names(kernel: Kernel) -> None:
    run = ok(
        kernel.execute(
            "ns = {}\nexec('from IPython.display import *', ns)\n"
            "print(sorted(name for name in ns if not name.startswith('_')))"
        )
    )
    names = set(json.loads(run.stream_text().replace("'", '"')))
    expected = {
        "display",
        "update_display",
        "clear_output",
        "DisplayHandle",
        "publish_display_data",
        "HTML",
        "Markdown",
        "Latex",
        "Math",
        "JSON",
        "Image",
        "SVG",
        "Javascript",
        "Pretty",
        "DisplayObject",
        "TextDisplayObject",
        "Code",
        "IFrame",
        "FileLink",
        "display_html",
        "display_markdown",
        "display_png",
        "display_jpeg",
        "display_svg",
        "display_latex",
        "display_json",
        "display_javascript",
        "display_pretty",
        "display_pdf",
    }
    assert expected <= names


def test_the_shell_has_a_kernel_and_pandas_sees_it(kernel: Kernel) -> None:
    """``get_ipython().kernel`` exists, as under ipykernel, so pandas chose at import the
    notebook's layout: up to 20 columns, a wide frame's text wrapped rather than cut with
    ``...`` columns and a ``[3 rows x 8 columns]`` footer; its HTML has every column."""
    run = ok(
        kernel.execute(
            "import numpy as np, pandas as pd\n"
            "print(get_ipython().kernel.implementation, pd.get_option('display.max_columns'))\n"
            "pd.DataFrame(np.arange(24).reshape(3, 8) * 10**6,"
            " columns=[f'column_{i}' for i in range(8)])"
        )
    )
    assert run.stream_text() == "wasm-kernel 20\n"
    [result] = run.of_type("execute_result")
    text, page = result["data"]["text/plain"], result["data"]["text/html"]
    assert "..." not in text and "columns]" not in text and text.count("column_") == 8
    assert "  \\\n" in text  # wrapped, as pandas wraps for a kernel
    assert page.count("<th>column_") == 8
