"""Every notebook shipped in ``notebooks/`` must run top to bottom on the wasm-python kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from served_kernels import handed_out, server_answering

KERNEL_NAME = os.environ.get("WASM_KERNEL_TEST_KERNEL", "wasm-python")
NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    """An empty folder would make the parametrized test below silently vanish."""
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
@pytest.mark.slow
def test_notebook_runs_without_errors(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        kernel_name=KERNEL_NAME,
        timeout=600,
        startup_timeout=120,
        allow_errors=False,  # a cell error raises, except in cells tagged raises-exception
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    code_cells = [c for c in notebook.cells if c.cell_type == "code" and c.source.strip()]
    assert code_cells, f"{path.name} has no code to run"
    assert all(cell.execution_count is not None for cell in code_cells)
    unexpected = [
        output
        for cell in code_cells
        if "raises-exception" not in cell.metadata.get("tags", [])
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert unexpected == []


@pytest.mark.slow
def test_papermill_runs_the_tour_on_this_kernel(tmp_path: Path) -> None:
    """papermill picks the kernel by name (its -k / --kernel option) and records the outputs;
    its kernel comes from the kernel server, through the provisioner."""
    output = tmp_path / "tour-out.ipynb"
    server_answering()
    before = handed_out()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "papermill",
            str(NOTEBOOK_DIR / "tour.ipynb"),
            str(output),
            "-k",
            KERNEL_NAME,
            "--cwd",
            str(NOTEBOOK_DIR),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    assert len(handed_out()) == len(before) + 1, "papermill's kernel was not served"
    executed = nbformat.read(output, as_version=4)
    texts = [
        out.get("text", "") + str(out.get("data", {}).get("text/plain", ""))
        for cell in executed.cells
        if cell.cell_type == "code"
        for out in cell.outputs
    ]
    assert any("3.15" in text for text in texts), "the first cell prints the guest's sys.version"
    assert executed.metadata.papermill.get("exception") in (None, False)
