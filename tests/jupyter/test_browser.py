"""End to end in a real browser: JupyterLab serves a notebook on the wasm-python kernel, headless
Chromium (driven by Playwright) runs it, and the rendered page is checked.

The other tests talk to the kernel over ZMQ; only this one shows that what the kernel sends
renders in the front end people use: the kernel's name in the toolbar, printed text, a pandas
table, Markdown with HTML (cleaned, not dropped), a Styler's colours and inline matplotlib
figures (PNG and SVG), and that the active-output policy holds in the browser: under the
default (block) a cell's script or a handler in Markdown changes
nothing on the page and sends no request; under ``allow`` (a second kernelspec written into the
server's private data folder) the same script runs. Playwright drives the system's Chromium
(``/usr/bin/chromium``, Debian's ``chromium`` package, or ``$WASM_KERNEL_CHROMIUM``); it never
downloads a browser. A full-page screenshot and JupyterLab's log are written to
``test-artifacts/`` at the repository root (or ``$WASM_KERNEL_ARTIFACTS``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from lab_server import JupyterLab, running_jupyterlab
from playwright.sync_api import Browser, Page, expect, sync_playwright
from playwright.sync_api import Error as PlaywrightError

pytestmark = pytest.mark.slow  # each test takes seconds to minutes

KERNEL_NAME = os.environ.get("WASM_KERNEL_TEST_KERNEL", "wasm-python")
CHROMIUM = os.environ.get("WASM_KERNEL_CHROMIUM", "/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("WASM_KERNEL_ARTIFACTS", REPO / "test-artifacts"))

# Flags for a root user on a machine without a GPU or outside network: no sandbox (root),
# and none of the background traffic Chromium starts on its own.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

GREETING = "hello from the sandbox on wasi"  # sys.platform is "wasi" only inside the sandbox
NOTEBOOK = "browser.ipynb"
CELLS = [
    'import sys\nprint("hello from the sandbox on", sys.platform)',
    # the CSV lies beside the notebook: the notebook profile mounts that folder read-only
    'import pandas as pd\npd.read_csv("animals.csv")',
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
]
# What a hostile cell would do in the page: mark the body and call the server's API, from an
# HTML <script>, an event handler and a Javascript display.
ACTIVE_CELL = (
    "from IPython.display import HTML, Javascript, display\n"
    'display(HTML(\'<b id="html-out">html kept</b><script>document.body.dataset.pwnedHtml = 1;'
    ' fetch("/api/contents/pwned-html")</script>'
    '<img src="missing.png" onerror="document.body.dataset.pwnedImg = 1">\'))\n'
    "display(Javascript('document.body.dataset.pwnedJs = 1; fetch(\"/api/contents/pwned-js\")'))"
)
# Markdown's HTML, which JupyterLab renders: its <sup> shows, its handlers are removed (under
# allow they run), also where Markdown's own syntax might seem to hide them (code spans opening
# a comment or an attribute value, a tag made by joining text around a removed one, an HTML
# block's raw text (which a no-break space does not end), a list item's HTML block with a
# handler that fires by itself).
PWN_MD = "document.body.dataset.pwnedMd"
HOSTILE_MARKDOWN = [
    f'E = mc<sup id="md-sup">2</sup> <img id="md-img" src="missing-md.png" onerror="{PWN_MD}=1">',
    f'`<!--` <img src="missing-md.png" onerror="{PWN_MD}=2"> `-->`',
    f'`<span title="` <img src="missing-md.png" onerror="{PWN_MD}=3"> `">`',
    f"<<b onclick=x>img src=missing-md.png onerror='{PWN_MD}=4'>",
    f"<div>\n<img/src='missing-md.png'/onerror='{PWN_MD}=5'>\n</div>",
    f'- item\n\n  <details open ontoggle="{PWN_MD}=6">\n  <summary>s</summary>\n  </details>',
    f"<div>\n\u00a0\ntext <img/src='missing-md.png'/onerror='{PWN_MD}=7'>\n</div>",
]
MARKDOWN_CELL = "from IPython.display import Markdown, display\n" + "\n".join(
    f"display(Markdown({text!r}))" for text in HOSTILE_MARKDOWN
)
PWNED = ("data-pwned-html", "data-pwned-img", "data-pwned-js")
BLOCKED_CELLS = [
    ACTIVE_CELL,
    MARKDOWN_CELL,
    'df = pd.read_csv("animals.csv")\n'
    'df.style.map(lambda v: "background-color: rgb(255, 0, 0)" if v == "owl" else "")',
    "%config InlineBackend.figure_formats = ['svg']\nplt.plot([3, 1, 2])\nplt.show()",
]
NOTICE = "[wasm-kernel] active output blocked"
ALLOW_KERNEL = "wasm-python-allow"  # KERNEL_NAME with --WasmKernel.active_output=allow
ALLOW_NOTEBOOK = "allow.ipynb"

UI_TIMEOUT_MS = 60_000  # for the page and its menus
RENDER_TIMEOUT_MS = 180_000  # for kernel start and outputs: a busy two-core machine is slow


@contextmanager
def jupyterlab_in_chromium(root: Path, log_name: str) -> Iterator[tuple[JupyterLab, Browser]]:
    """JupyterLab serving ``root``, its log in the artifacts as ``log_name``, and a headless
    Chromium; both ended on the way out."""
    assert Path(CHROMIUM).is_file(), (
        f"Chromium not found at {CHROMIUM}: install Debian's chromium package "
        "(.ci/install-system-deps does) or point WASM_KERNEL_CHROMIUM at a Chromium binary"
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with running_jupyterlab(root, ARTIFACTS / log_name) as lab, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield lab, browser
        finally:
            browser.close()


def new_page(browser: Browser, height: int, width: int = 1280) -> Page:
    """A page of ``browser`` whose waits end within the UI timeout."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(UI_TIMEOUT_MS)
    return page


def page_failure(
    page: Page, screenshot: str, error: Exception, console: list[str], lab: JupyterLab
) -> AssertionError:
    """What a failed step in the page says: the error, the browser console's last lines and
    JupyterLab's log; the page's screenshot saved as ``screenshot``."""
    _screenshot(page, screenshot)
    recent = "\n".join(console[-20:])
    return AssertionError(
        f"{type(error).__name__}: {error}\n"
        f"--- browser console (tail) ---\n{recent}\n{lab.log_tail()}"
    )


def _screenshot(page: Page, name: str) -> None:
    """Save a full-page PNG; a page that cannot be captured must not hide the real error."""
    try:
        page.screenshot(path=ARTIFACTS / name, full_page=True)
    except PlaywrightError:
        pass


def _run_and_check(page: Page, lab: JupyterLab, display_name: str, requests: list[str]) -> None:
    """Open the notebook, run all cells from the Run menu and check what renders."""
    page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}")
    panel = page.locator(".jp-NotebookPanel:visible")
    kernel_name = panel.locator(".jp-Toolbar-kernelName")
    expect(kernel_name).to_have_text(display_name, timeout=RENDER_TIMEOUT_MS)
    status = page.locator(".jp-StatusBar-Widget").filter(has_text=display_name).first
    expect(status).to_contain_text("Idle", timeout=RENDER_TIMEOUT_MS)

    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator(".lm-Menu").get_by_text("Run All Cells", exact=True).click()

    outputs = panel.locator(".jp-Cell .jp-OutputArea")
    printed = outputs.nth(0).locator('[data-mime-type="application/vnd.jupyter.stdout"]')
    expect(printed).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    expect(printed).to_have_text(GREETING)

    table = outputs.nth(1).locator("table.dataframe")
    expect(table).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    expect(table.locator("thead th")).to_contain_text(["animal", "legs"])
    expect(table.locator("tbody th")).to_have_text(["0", "1"])
    expect(table.locator("tbody td")).to_have_text(["owl", "2", "newt", "4"])

    _expect_decoded(outputs.nth(2).locator('img[src^="data:image/png"]'), page)

    # The active cell's passive part shows (its scripts are checked below, once later cells
    # have rendered too, so that an event handler would have had its chance).
    active = outputs.nth(3)
    expect(active.locator("b#html-out")).to_have_text("html kept", timeout=RENDER_TIMEOUT_MS)
    markdown = outputs.nth(4)
    expect(markdown.locator("sup#md-sup")).to_have_text("2", timeout=RENDER_TIMEOUT_MS)
    # The Styler's <style> survived the cleaning: its colour reaches the cell.
    owl = outputs.nth(5).locator("td", has_text="owl")
    expect(owl).to_have_css("background-color", "rgb(255, 0, 0)", timeout=RENDER_TIMEOUT_MS)
    # The cleaned matplotlib SVG still decodes as an image.
    _expect_decoded(outputs.nth(6).locator('img[src^="data:image/svg+xml"]'), page)

    # Every cell finished (a prompt shows [*] while its cell runs) and the kernel is back to
    # idle under our name.
    prompts = [f"[{n}]:" for n in range(1, len(CELLS) + len(BLOCKED_CELLS) + 1)]
    expect(panel.locator(".jp-InputPrompt")).to_have_text(prompts)
    expect(status).to_contain_text("Idle")
    expect(kernel_name).to_have_text(display_name)

    # The scripts did nothing: no change to the page, no request; and the cell said why, once
    # (naming the removed <script> and the dropped Javascript).
    body = page.locator("body")
    for attribute in (*PWNED, "data-pwned-md"):
        assert body.get_attribute(attribute) is None, f"a blocked script set {attribute}"
    assert markdown.locator("img#md-img").count() == 1  # the image stays, without its handler
    pwned = [url for url in requests if "pwned" in url]
    assert not pwned, f"a blocked script sent requests: {pwned}"
    notice = active.locator('[data-mime-type="application/vnd.jupyter.stderr"]')
    expect(notice).to_contain_text(NOTICE)
    expect(notice).to_contain_text("<script>")
    expect(notice).to_contain_text("application/javascript dropped")
    expect(active).to_contain_text("<IPython.core.display.Javascript object>")
    md_notice = markdown.locator('[data-mime-type="application/vnd.jupyter.stderr"]')
    expect(md_notice).to_contain_text("removed from text/markdown: onerror")
    # Only the active cells wrote to stderr (their notices), and no cell failed.
    stderr = panel.locator('[data-mime-type="application/vnd.jupyter.stderr"]')
    texts = stderr.all_inner_texts()
    assert len(texts) == 2 and all(t.startswith(NOTICE) for t in texts), f"stderr: {texts}"
    assert panel.locator('[data-mime-type="application/vnd.jupyter.error"]').count() == 0
    sessions = lab.api("sessions")
    assert [s["kernel"]["name"] for s in sessions] == [KERNEL_NAME], f"sessions: {sessions}"


def _expect_decoded(image, page: Page) -> None:
    """An <img> output is shown and its data decoded to a picture of some size."""
    expect(image).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    page.wait_for_function("img => img.complete", arg=image.element_handle())
    size = image.evaluate("img => [img.naturalWidth, img.naturalHeight]")
    assert size[0] > 0 and size[1] > 0, f"the figure did not decode: natural size {size}"


def _run_allowed(page: Page, lab: JupyterLab, requests: list[str]) -> None:
    """The same active cell on a kernel with active_output=allow: its scripts run (the control
    that shows the blocked run above would have been caught). A page of its own, in a
    workspace of its own: leaving the first notebook would ask whether to discard its outputs."""
    page.goto(f"{lab.url}/lab/workspaces/allow/tree/{ALLOW_NOTEBOOK}?token={lab.token}")
    panel = page.locator(".jp-NotebookPanel:visible")
    status = page.locator(".jp-StatusBar-Widget").filter(has_text="active output allowed").first
    expect(status).to_contain_text("Idle", timeout=RENDER_TIMEOUT_MS)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator(".lm-Menu").get_by_text("Run All Cells", exact=True).click()
    expect(panel.locator("b#html-out")).to_have_text("html kept", timeout=RENDER_TIMEOUT_MS)
    body = page.locator("body")
    for attribute in PWNED:
        expect(body).to_have_attribute(attribute, "1", timeout=RENDER_TIMEOUT_MS)
    # one of the Markdown handlers ran: they are real, and blocked above
    expect(body).to_have_attribute("data-pwned-md", re.compile("."), timeout=RENDER_TIMEOUT_MS)
    deadline = time.monotonic() + 30
    while not {"pwned-html", "pwned-js"} <= {url.rsplit("/", 1)[-1] for url in requests}:
        assert time.monotonic() < deadline, f"the allowed scripts sent no request: {requests}"
        page.wait_for_timeout(100)
    stderr = panel.locator('[data-mime-type="application/vnd.jupyter.stderr"]')
    assert stderr.count() == 0, f"stderr under allow: {stderr.all_inner_texts()}"


def _write_allow_kernelspec(data_dir: Path, base: KernelSpec) -> None:
    """A kernelspec like ``base`` but with active output allowed, where only this server looks."""
    spec = base.to_dict()
    spec["argv"] = [*spec["argv"], "--WasmKernel.active_output=allow"]
    spec["display_name"] = f"{base.display_name} (active output allowed)"
    folder = data_dir / "kernels" / ALLOW_KERNEL
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))


def _write_notebook(path: Path, kernel: str, display_name: str, cells: list[str]) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {
        "name": kernel,
        "display_name": display_name,
        "language": "python",
    }
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(notebook, path)


@pytest.mark.timeout(300)
def test_notebook_renders_in_jupyterlab(tmp_path: Path) -> None:
    """Run a notebook on wasm-python in Chromium and check the kernel name, text, table,
    figures and that a cell's script is blocked; then check the same script runs under allow."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name in ("browser-notebook.png", "browser-failure.png", "browser-console.log"):
        (ARTIFACTS / name).unlink(missing_ok=True)  # no stale pictures from an earlier run

    spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    display_name = spec.display_name
    root = tmp_path / "notebooks"
    root.mkdir()
    _write_notebook(root / NOTEBOOK, KERNEL_NAME, display_name, CELLS + BLOCKED_CELLS)
    _write_notebook(root / ALLOW_NOTEBOOK, ALLOW_KERNEL, "allow", [ACTIVE_CELL, MARKDOWN_CELL])
    (root / "animals.csv").write_text("animal,legs\nowl,2\nnewt,4\n")
    _write_allow_kernelspec(tmp_path / "jupyter-state" / "data", spec)  # JupyterLab's data dir

    console: list[str] = []
    requests: list[str] = []
    with jupyterlab_in_chromium(root, "jupyterlab.log") as (lab, browser):
        specs = lab.api("kernelspecs")["kernelspecs"]  # type: ignore[index]
        assert KERNEL_NAME in specs, f"no {KERNEL_NAME} in {sorted(specs)}\n{lab.log_tail()}"
        assert specs[KERNEL_NAME]["spec"]["display_name"] == display_name
        try:
            page = new_page(browser, 1400)
            page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
            page.on("pageerror", lambda error: console.append(f"pageerror: {error}"))
            page.on("request", lambda request: requests.append(request.url))
            try:
                _run_and_check(page, lab, display_name, requests)
                _screenshot(page, "browser-notebook.png")
                page = new_page(browser, 900)
                page.on("pageerror", lambda error: console.append(f"pageerror: {error}"))
                page.on("request", lambda request: requests.append(request.url))
                _run_allowed(page, lab, requests)
            except Exception as error:
                raise page_failure(page, "browser-failure.png", error, console, lab) from error
            assert (ARTIFACTS / "browser-notebook.png").is_file(), "no screenshot was saved"
        finally:
            (ARTIFACTS / "browser-console.log").write_text("\n".join(console) + "\n")
    assert not lab.leftover_kernels, (
        f"kernel processes outlived their shutdown: {lab.leftover_kernels}\n{lab.log_tail()}"
    )
