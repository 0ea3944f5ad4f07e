"""Widgets end to end in JupyterLab, in headless Chromium, on the wasm-python kernel.

JupyterLab with ``jupyterlab_widgets`` (the front end people install for ipywidgets) runs a
notebook whose cells use ``interact``, a ``Button`` with ``on_click``, a ``tqdm.auto`` loop
and an ``HTML`` widget holding a script and an event handler. The slider is dragged with the
mouse and the output below it must change; the button is clicked and its handler's output
must appear in its ``Output`` widget; the progress bar must be a widget; and under the
default policy (block) the hostile widget's markup shows while its script and handler run
nothing (under allow, on a second kernelspec, its handler runs: the check is real). The
server's log must not say it saw comm messages it did not know. The JupyterLab
helpers are ``test_browser``'s; a screenshot goes to ``test-artifacts/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from lab_server import JupyterLab
from playwright.sync_api import Page, expect
from test_browser import (
    ALLOW_KERNEL,
    KERNEL_NAME,
    RENDER_TIMEOUT_MS,
    _screenshot,
    _write_allow_kernelspec,
    _write_notebook,
    jupyterlab_in_chromium,
    new_page,
    page_failure,
)

pytestmark = pytest.mark.slow

NOTEBOOK = "widgets.ipynb"
ALLOW_NOTEBOOK = "widgets-allow.ipynb"
CELLS = [
    "from ipywidgets import interact\n"
    "@interact(x=(0, 10))\n"
    "def show(x=5):\n"
    "    print('value is', x)",
    "import ipywidgets as w\n"
    "button, out = w.Button(description='press me'), w.Output()\n"
    "def clicked(_):\n"
    "    with out:\n"
    "        print('clicked', len(out.outputs) + 1)\n"
    "button.on_click(clicked)\n"
    "display(button, out)",
    "from tqdm.auto import tqdm\nfor _ in tqdm(range(3), desc='looping'):\n    pass",
    'w.HTML(\'<b id="widget-bold">kept</b>'
    '<img src="missing-widget.png" onerror="document.body.dataset.pwnedWidget = 1">'
    "<script>document.body.dataset.pwnedWidgetScript = 1</script>')",
]


def _run_widgets(page: Page, lab: JupyterLab, display_name: str) -> None:
    page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}")
    panel = page.locator(".jp-NotebookPanel:visible")
    status = page.locator(".jp-StatusBar-Widget").filter(has_text=display_name).first
    expect(status).to_contain_text("Idle", timeout=RENDER_TIMEOUT_MS)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator(".lm-Menu").get_by_text("Run All Cells", exact=True).click()
    # each code cell's own output area (an Output widget holds one more inside)
    outputs = panel.locator(".jp-CodeCell .jp-Cell-outputArea")

    # interact: a slider and its output; dragging the handle changes the output
    slider = outputs.nth(0).locator(".widget-slider")
    expect(slider).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    shown = outputs.nth(0).locator(".widget-output")
    expect(shown).to_contain_text("value is 5", timeout=RENDER_TIMEOUT_MS)
    handle = slider.locator(".noUi-handle")
    box = handle.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + 200, box["y"] + box["height"] / 2, steps=10)
    page.mouse.up()
    expect(shown).not_to_contain_text("value is 5", timeout=RENDER_TIMEOUT_MS)
    expect(shown).to_contain_text("value is", timeout=RENDER_TIMEOUT_MS)

    # a button whose handler prints into its Output widget
    button = outputs.nth(1).get_by_role("button", name="press me")
    expect(button).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    button.click()
    expect(outputs.nth(1).locator(".widget-output")).to_contain_text(
        "clicked 1", timeout=RENDER_TIMEOUT_MS
    )

    # tqdm.auto draws a widget bar, full at the end
    bar = outputs.nth(2).locator(".widget-hprogress")
    expect(bar).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    expect(outputs.nth(2)).to_contain_text("looping", timeout=RENDER_TIMEOUT_MS)
    expect(outputs.nth(2)).to_contain_text("3/3", timeout=RENDER_TIMEOUT_MS)

    # the hostile HTML widget: its markup shows, its script and handler ran nothing
    expect(outputs.nth(3).locator("b#widget-bold")).to_have_text("kept", timeout=RENDER_TIMEOUT_MS)
    prompts = [f"[{n}]:" for n in range(1, len(CELLS) + 1)]
    expect(panel.locator(".jp-InputPrompt")).to_have_text(prompts, timeout=RENDER_TIMEOUT_MS)
    expect(status).to_contain_text("Idle")
    page.wait_for_timeout(1000)  # a handler on a missing image fires as it fails to load
    body = page.locator("body")
    for attribute in ("data-pwned-widget", "data-pwned-widget-script"):
        assert body.get_attribute(attribute) is None, f"a widget's script set {attribute}"
    assert outputs.nth(3).locator("script").count() == 0
    assert panel.locator('[data-mime-type="application/vnd.jupyter.error"]').count() == 0


def _run_allowed(page: Page, lab: JupyterLab) -> None:
    """The hostile widget on a kernel with active_output=allow: its handler runs (so the
    check above would have caught it)."""
    page.goto(f"{lab.url}/lab/workspaces/allow/tree/{ALLOW_NOTEBOOK}?token={lab.token}")
    status = page.locator(".jp-StatusBar-Widget").filter(has_text="active output allowed").first
    expect(status).to_contain_text("Idle", timeout=RENDER_TIMEOUT_MS)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator(".lm-Menu").get_by_text("Run All Cells", exact=True).click()
    panel = page.locator(".jp-NotebookPanel:visible")
    expect(panel.locator("b#widget-bold")).to_have_text("kept", timeout=RENDER_TIMEOUT_MS)
    expect(page.locator("body")).to_have_attribute(
        "data-pwned-widget", "1", timeout=RENDER_TIMEOUT_MS
    )


@pytest.mark.timeout(300)
def test_widgets_work_in_jupyterlab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the kernel hibernates when the server stops: into this test's folder, not the user's
    monkeypatch.setenv("WASM_KERNEL_SNAPSHOT_DIR", str(tmp_path / "images"))
    display_name = KernelSpecManager().get_kernel_spec(KERNEL_NAME).display_name
    root = tmp_path / "notebooks"
    root.mkdir()
    _write_notebook(root / NOTEBOOK, KERNEL_NAME, display_name, CELLS)
    _write_notebook(
        root / ALLOW_NOTEBOOK, ALLOW_KERNEL, "allow", ["import ipywidgets as w", CELLS[-1]]
    )
    spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    _write_allow_kernelspec(tmp_path / "jupyter-state" / "data", spec)
    console: list[str] = []
    with jupyterlab_in_chromium(root, "jupyterlab-widgets.log") as (lab, browser):
        page = new_page(browser, 1200)
        page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
        page.on("pageerror", lambda error: console.append(f"pageerror: {error}"))
        try:
            _run_widgets(page, lab, display_name)
            _screenshot(page, "browser-widgets.png")
            page = new_page(browser, 900)
            _run_allowed(page, lab)
        except Exception as error:
            failure = page_failure(page, "browser-widgets-failure.png", error, console, lab)
            raise failure from error
    log = lab.log_path.read_text(errors="replace")
    assert "Unknown message type" not in log, log[-3000:]
    assert not lab.leftover_kernels
