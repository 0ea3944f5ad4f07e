"""Inline matplotlib figures, checked over ZMQ through jupyter_client.

As with IPython's inline backend, every figure a cell leaves open is sent as display_data when
the cell ends (or at ``plt.show()``) and then closed. The images are decoded here, so a test
only passes when the kernel really rendered a picture of the expected kind and size. Tests
share the module's kernel and put the figure format and rcParams back when they change them.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator

import pytest
from conftest import CellRun, Kernel, ok

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURE_TEXT = re.compile(r"<Figure size \d+x\d+ with \d+ Axes>")
PLT = "import matplotlib.pyplot as plt\n"


# -- helpers ------------------------------------------------------------------------------------


def figures(run: CellRun) -> list[dict]:
    return run.of_type("display_data")


def png_size(encoded: str) -> tuple[int, int]:
    """Width and height from the IHDR chunk of a base64 PNG (which must be a PNG)."""
    raw = base64.b64decode(encoded)
    assert raw[:8] == PNG_SIGNATURE, raw[:16]
    assert raw[12:16] == b"IHDR"
    return int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")


def one_png(run: CellRun) -> tuple[dict, tuple[int, int]]:
    """The cell's only display_data, checked to be a figure PNG; returns it and its size."""
    shown = figures(ok(run))
    assert len(shown) == 1, [sorted(d["data"]) for d in shown]
    data = shown[0]["data"]
    assert FIGURE_TEXT.fullmatch(data["text/plain"]), data["text/plain"]
    return shown[0], png_size(data["image/png"])


@pytest.fixture
def restore_format(kernel: Kernel) -> Iterator[None]:
    """Put the inline figure format back to PNG, whatever the test did."""
    yield
    ok(
        kernel.execute(
            "from matplotlib_inline.backend_inline import set_matplotlib_formats\n"
            "set_matplotlib_formats('png')\nimport matplotlib.pyplot as plt\n"
            "plt.close('all')"
        )
    )


# -- one figure per cell ------------------------------------------------------------------------


@pytest.mark.slow
def test_plot_without_show_sends_one_png(kernel: Kernel) -> None:
    """`plt.plot` alone is enough: one PNG of a plausible size, with a Figure text/plain."""
    _, (width, height) = one_png(kernel.execute(PLT + "plt.plot([1, 2, 3], [4, 1, 9])"))
    assert width > 100 and height > 100


def test_figures_are_closed_after_the_cell(kernel: Kernel) -> None:
    """Shown figures are closed: the next cell sees none, and sends nothing again."""
    ok(kernel.execute(PLT + "plt.plot([1, 2]);"))
    run = ok(kernel.execute(PLT + "plt.get_fignums()"))
    assert run.result_text() == "[]"
    assert figures(run) == []


def test_show_sends_figure_before_later_output(kernel: Kernel) -> None:
    """plt.show() mid-cell publishes the figure right away, between the prints."""
    code = PLT + "print('before')\nplt.plot([1, 2])\nplt.show()\nprint('after')"
    run = ok(kernel.execute(code))
    order = []
    for message in run.messages:
        if message["msg_type"] == "stream":
            order.extend(message["content"]["text"].split())
        elif message["msg_type"] == "display_data":
            order.append("FIGURE")
    assert order == ["before", "FIGURE", "after"]


def test_two_figures_two_displays(kernel: Kernel) -> None:
    """Each open figure is its own display_data."""
    code = PLT + "plt.figure()\nplt.plot([1, 2])\nplt.figure()\nplt.bar([1, 2], [3, 4]);"
    shown = figures(ok(kernel.execute(code)))
    assert len(shown) == 2
    for item in shown:
        width, height = png_size(item["data"]["image/png"])
        assert width > 100 and height > 100


def test_cell_without_figure_sends_no_display(kernel: Kernel) -> None:
    """A cell that draws nothing gets no image, even after matplotlib was imported."""
    run = ok(kernel.execute(PLT + "values = [1, 2, 3]\nprint(sum(values))"))
    assert figures(run) == []
    assert run.stream_text() == "6\n"


# -- formats ------------------------------------------------------------------------------------


def test_svg_format(kernel: Kernel, restore_format: None) -> None:
    """`%config InlineBackend.figure_format = 'svg'` sends SVG markup, not PNG."""
    code = "%config InlineBackend.figure_format = 'svg'\n" + PLT + "plt.plot([1, 2]);"
    shown = figures(ok(kernel.execute(code)))
    assert len(shown) == 1
    data = shown[0]["data"]
    assert "<svg" in data["image/svg+xml"]
    assert "image/png" not in data


def test_retina_format_metadata_is_half_size(kernel: Kernel, restore_format: None) -> None:
    """'retina' renders at twice the dpi and tells the frontend to show it at half size."""
    ok(kernel.execute("%config InlineBackend.figure_format = 'png'"))
    _, (normal_width, _) = one_png(kernel.execute(PLT + "plt.plot([1, 2]);"))
    ok(kernel.execute("%config InlineBackend.figure_format = 'retina'"))
    shown, (width, height) = one_png(kernel.execute(PLT + "plt.plot([1, 2]);"))
    assert shown["metadata"]["image/png"] == {"width": width // 2, "height": height // 2}
    assert width > 1.5 * normal_width


def test_set_matplotlib_formats(kernel: Kernel, restore_format: None) -> None:
    """set_matplotlib_formats picks the inline format; JPEG, which the runtime's Pillow cannot
    encode, is refused with a clear error instead of failing at the end of every cell."""
    setter = "from matplotlib_inline.backend_inline import set_matplotlib_formats\n"
    run = ok(kernel.execute(setter + "set_matplotlib_formats('svg')\n" + PLT + "plt.plot([1, 2]);"))
    shown = figures(run)
    assert len(shown) == 1 and "<svg" in shown[0]["data"]["image/svg+xml"]
    assert "image/png" not in shown[0]["data"]

    refused = kernel.execute(setter + "set_matplotlib_formats('jpeg')")
    assert refused.content["status"] == "error"
    assert refused.content["ename"] == "ValueError"
    assert "JPEG" in refused.content["evalue"] and "Pillow" in refused.content["evalue"]
    still_svg = figures(ok(kernel.execute(PLT + "plt.plot([1, 2]);")))
    assert "image/svg+xml" in still_svg[0]["data"]


# -- plotting libraries and settings ------------------------------------------------------------


def test_pandas_plot(kernel: Kernel) -> None:
    """DataFrame.plot() draws through matplotlib and is shown inline."""
    code = "import pandas as pd\npd.DataFrame({'a': [1, 2, 3], 'b': [3, 1, 2]}).plot();"
    _, (width, height) = one_png(kernel.execute(code))
    assert width > 100 and height > 100


@pytest.mark.slow
def test_seaborn_plot(kernel: Kernel) -> None:
    """A seaborn plot is shown inline like any matplotlib figure."""
    code = "import seaborn as sns\nsns.histplot([1, 2, 2, 3, 3, 3, 4]);"
    _, (width, height) = one_png(kernel.execute(code))
    assert width > 100 and height > 100


def test_rcparams_figsize_changes_image(kernel: Kernel) -> None:
    """rcParams['figure.figsize'] sets the size of later figures and of their images."""
    ok(kernel.execute(PLT + "saved_figsize = tuple(plt.rcParams['figure.figsize'])"))
    try:
        default, (default_w, default_h) = one_png(kernel.execute(PLT + "plt.plot([1, 2]);"))
        ok(kernel.execute(PLT + "plt.rcParams['figure.figsize'] = (3, 2)"))
        small, (small_w, small_h) = one_png(kernel.execute(PLT + "plt.plot([1, 2]);"))
    finally:
        ok(kernel.execute(PLT + "plt.rcParams['figure.figsize'] = saved_figsize"))
    assert small["data"]["text/plain"].startswith("<Figure size 300x200 ")
    assert default["data"]["text/plain"] != small["data"]["text/plain"]
    assert small_w < 0.75 * default_w and small_h < 0.75 * default_h
