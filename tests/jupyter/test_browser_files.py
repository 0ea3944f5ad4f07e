"""The file a cell saves beside its notebook, seen where a JupyterLab user looks for it: with
``notebook_writes = "new-files"`` (a kernelspec written into the server's private data folder),
JupyterLab in headless Chromium runs a cell that saves a CSV, and the file browser lists it,
opens it and serves it for download with the bytes the cell wrote. The same cell on the
notebook profile's default (``overlay``) leaves the folder as it was, and says so in its output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from lab_server import JupyterLab
from playwright.sync_api import Page, expect
from test_browser import (
    ARTIFACTS,
    KERNEL_NAME,
    RENDER_TIMEOUT_MS,
    _write_notebook,
    jupyterlab_in_chromium,
    new_page,
)

pytestmark = pytest.mark.slow

NEW_FILES_KERNEL = "wasm-python-new-files"  # KERNEL_NAME with notebook_writes=new-files
SAVING_CELL = "import pandas as pd\npd.DataFrame({'animal': ['owl'], 'legs': [2]}).to_csv('NAME')"
WRITTEN = b",animal,legs\n0,owl,2\n"  # what pandas writes, natively too


def _write_new_files_kernelspec(data_dir: Path, base: KernelSpec) -> None:
    spec = base.to_dict()
    spec["argv"] = [*spec["argv"], "--WasmKernel.notebook_writes=new-files"]
    spec["display_name"] = f"{base.display_name} (new files written through)"
    folder = data_dir / "kernels" / NEW_FILES_KERNEL
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))


def _run_all(page: Page, lab: JupyterLab, notebook: str, workspace: str, kernel: str) -> None:
    page.goto(f"{lab.url}/lab/workspaces/{workspace}/tree/{notebook}?token={lab.token}")
    panel = page.locator(".jp-NotebookPanel:visible")
    status = page.locator(".jp-StatusBar-Widget").filter(has_text=kernel).first
    expect(status).to_contain_text("Idle", timeout=RENDER_TIMEOUT_MS)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator(".lm-Menu").get_by_text("Run All Cells", exact=True).click()
    expect(panel.locator(".jp-InputPrompt")).to_have_text(["[1]:"], timeout=RENDER_TIMEOUT_MS)
    expect(status).to_contain_text("Idle", timeout=RENDER_TIMEOUT_MS)


@pytest.mark.timeout(300)
def test_a_saved_file_shows_in_jupyterlabs_file_browser(tmp_path: Path) -> None:
    spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    root = tmp_path / "notebooks"
    root.mkdir()
    through = "new files written through"
    _write_notebook(
        root / "saves.ipynb", NEW_FILES_KERNEL, through, [SAVING_CELL.replace("NAME", "shown.csv")]
    )
    _write_notebook(
        root / "private.ipynb",
        KERNEL_NAME,
        spec.display_name,
        [SAVING_CELL.replace("NAME", "kept.csv")],
    )
    _write_new_files_kernelspec(tmp_path / "jupyter-state" / "data", spec)
    with jupyterlab_in_chromium(root, "jupyterlab-files.log") as (lab, browser):
        page = new_page(browser, 900)
        try:
            _run_all(page, lab, "saves.ipynb", "saves", through)
            listed = page.locator(".jp-DirListing-item", has_text="shown.csv")
            expect(listed).to_be_visible(timeout=RENDER_TIMEOUT_MS)  # the browser polls
            listed.dblclick()  # opens in JupyterLab's CSV viewer
            tab = page.locator(".lm-TabBar-tab", has_text="shown.csv")
            expect(tab).to_be_visible(timeout=RENDER_TIMEOUT_MS)
            download = page.request.get(f"{lab.url}/files/shown.csv?download=1&token={lab.token}")
            assert download.ok and download.body() == WRITTEN, download.status

            page = new_page(browser, 900)
            _run_all(page, lab, "private.ipynb", "private", spec.display_name)
            stderr = page.locator('[data-mime-type="application/vnd.jupyter.stderr"]')
            expect(stderr).to_contain_text("private layer", timeout=RENDER_TIMEOUT_MS)
            expect(stderr).to_contain_text("new-files")
        except Exception:
            page.screenshot(path=ARTIFACTS / "browser-files-failure.png", full_page=True)
            raise
    assert (root / "shown.csv").read_bytes() == WRITTEN
    assert not (root / "kept.csv").exists()
