"""The rich-output notebook, executed by nbclient: the outputs a notebook user would see."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

KERNEL_NAME = os.environ.get("WASM_KERNEL_TEST_KERNEL", "wasm-python")
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "rich-output.ipynb"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cells() -> list:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, kernel_name=KERNEL_NAME, timeout=300, startup_timeout=120).execute()
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def cell_with(cells: list, text: str):
    matches = [cell for cell in cells if text in cell.source]
    assert len(matches) == 1, f"expected one cell containing {text!r}"
    return matches[0]


def png_size(encoded: str) -> tuple[int, int]:
    raw = base64.b64decode(encoded)
    assert raw.startswith(PNG_SIGNATURE)
    return int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")


def assert_cropped_to_content(size: tuple[int, int]) -> None:
    """A 4x3-inch figure at 100 dpi, cut to what it draws: matplotlib-inline crops
    (bbox_inches='tight') with the settings it had when pyplot loaded, and the notebook's
    later `%config InlineBackend.print_figure_kwargs = {}` does not change that, under
    ipykernel too (373x274 there and here for the sine plot; rotated tick labels can make
    the cut taller than the figure)."""
    width, height = size
    assert 300 < width <= 400 and 200 < height < 400, size


@pytest.mark.slow
def test_matplotlib_figure_is_a_png_of_the_configured_size(cells: list) -> None:
    outputs = cell_with(cells, "np.sin(x)").outputs
    figures = [out for out in outputs if out.output_type == "display_data"]
    assert len(figures) == 1
    assert_cropped_to_content(png_size(figures[0].data["image/png"]))
    assert figures[0].data["text/plain"] == "<Figure size 400x300 with 1 Axes>"
    assert not [out for out in outputs if out.output_type == "execute_result"], "`;` suppresses"


@pytest.mark.parametrize("marker", ["kind='bar'", "sns.histplot"])
def test_pandas_and_seaborn_plots_are_pngs(cells: list, marker: str) -> None:
    figures = [out for out in cell_with(cells, marker).outputs if out.output_type == "display_data"]
    assert len(figures) == 1
    assert_cropped_to_content(png_size(figures[0].data["image/png"]))


def test_dataframe_is_an_html_table(cells: list) -> None:
    (result,) = cell_with(cells, "df.head()").outputs
    assert result.output_type == "execute_result"
    assert "<table" in result.data["text/html"]
    assert "sales" in result.data["text/plain"]


def test_sympy_expression_is_latex(cells: list) -> None:
    (result,) = cell_with(cells, "sympy.integrate").outputs
    assert result.data["text/latex"].startswith("$")
    assert "sin" in result.data["text/latex"]


def test_display_handle_ends_with_its_last_update(cells: list) -> None:
    outputs = cell_with(cells, "display_id=True").outputs
    assert len(outputs) == 1, "updates replace the displayed output, they add none"
    assert outputs[0].data["text/html"] == "<b>done</b>"


def test_timeit_and_magics_print(cells: list) -> None:
    assert "per loop (mean ± std. dev. of 3 runs, 100 loops each)" in "".join(
        out.text for out in cell_with(cells, "%timeit").outputs
    )
    assert "df" in "".join(out.text for out in cell_with(cells, "%who DataFrame").outputs)
    listing = "".join(out.text for out in cell_with(cells, "%pip list").outputs)
    assert "numpy" in listing and "pandas" in listing
