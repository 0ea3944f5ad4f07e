"""%debug in JupyterLab, in headless Chromium: the debugger's prompts appear as JupyterLab's
input boxes below the cell, the commands typed there run, and the cell finishes.

Uses the JupyterLab server and Chromium set-up of ``test_browser.py``.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from playwright.sync_api import expect
from test_browser import (
    KERNEL_NAME,
    RENDER_TIMEOUT_MS,
    _screenshot,
    _write_notebook,
    jupyterlab_in_chromium,
    new_page,
)

pytestmark = pytest.mark.slow

CELLS = ["def f(v):\n    w = v + 1\n    return w / 0\n\nf(41)", "%debug"]


@pytest.mark.timeout(300)
def test_debug_in_jupyterlab(tmp_path: Path) -> None:
    """Run a failing cell, then %debug: answer `p w` and `q` in JupyterLab's input boxes."""
    display_name = KernelSpecManager().get_kernel_spec(KERNEL_NAME).display_name
    root = tmp_path / "notebooks"
    root.mkdir()
    # a name of its own: a kernel resumes the session hibernated for its notebook's path
    notebook = f"debug-{secrets.token_hex(4)}.ipynb"
    _write_notebook(root / notebook, KERNEL_NAME, display_name, CELLS)
    with jupyterlab_in_chromium(root, "jupyterlab-debugger.log") as (lab, browser):
        page = new_page(browser, 1000)
        try:
            page.goto(f"{lab.url}/lab/tree/{notebook}?token={lab.token}")
            panel = page.locator(".jp-NotebookPanel:visible")
            status = page.locator(".jp-StatusBar-Widget").filter(has_text=display_name).first
            expect(status).to_contain_text("Idle", timeout=RENDER_TIMEOUT_MS)
            cells = panel.locator(".jp-Cell")
            # Run All stops at the failing cell, as it should: run the two one by one
            cells.nth(0).locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            expect(cells.nth(0).locator(".jp-OutputArea")).to_contain_text(
                "ZeroDivisionError", timeout=RENDER_TIMEOUT_MS
            )
            cells.nth(1).locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            debugged = cells.nth(1).locator(".jp-OutputArea")
            for command, shown in (("p w", "42"), ("q", None)):
                box = debugged.locator("input.jp-Stdin-input").last  # answered ones stay
                expect(box).to_be_visible(timeout=RENDER_TIMEOUT_MS)
                expect(debugged.locator(".jp-Stdin-prompt").last).to_have_text("ipdb>")
                box.fill(command)
                box.press("Enter")
                if shown is not None:
                    expect(debugged).to_contain_text(shown, timeout=RENDER_TIMEOUT_MS)
            # both ran to the end (a running cell's prompt shows [*]), numbered in order
            expect(cells.nth(0).locator(".jp-InputPrompt")).to_have_text("[1]:")
            expect(cells.nth(1).locator(".jp-InputPrompt")).to_have_text("[2]:")
            expect(debugged).to_contain_text("return w / 0")
            # the two answered prompts, and no third: `q` ended the debugger
            expect(debugged.locator(".jp-Stdin-input")).to_have_count(2)
            _screenshot(page, "browser-debugger.png")
        except Exception:
            _screenshot(page, "browser-debugger-failure.png")
            raise
