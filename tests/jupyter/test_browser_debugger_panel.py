"""JupyterLab's visual debugger in headless Chromium, on the native kernel and on wasm-python.

The bug icon in the notebook's toolbar opens the debugger panel; a click in a cell's breakpoint
gutter sets a breakpoint; the cell, run, stops there: the call stack names the stopped frames
and the cell lines they are at, the variables pane shows the stopped frame's locals; Next
steps one line; Continue lets the cell finish with its output. The same flow runs on ipykernel
(``python3``, through debugpy) and on wasm-python, in one JupyterLab.

The Debug Adapter Protocol messages the page exchanges with the kernel (debug_request,
debug_reply, debug_event, read from the page's kernel websocket) are written beside the
screenshots, one JSON object a line, and the last of them are quoted when a step fails.
Uses the JupyterLab server and Chromium set-up of ``test_browser.py``.
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from lab_server import JupyterLab, running_jupyterlab
from playwright.sync_api import Browser, Locator, Page, WebSocket, expect, sync_playwright
from test_browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    KERNEL_NAME,
    RENDER_TIMEOUT_MS,
    UI_TIMEOUT_MS,
    _screenshot,
    _write_notebook,
    new_page,
)

pytestmark = pytest.mark.slow

NATIVE = "python3"  # ipykernel's kernelspec; its debugger is debugpy
CELL = (
    "def add(a, b):\n"
    "    total = a + b\n"
    "    return total\n"
    "\n"
    "result = add(40, 2)\n"
    "print('result', result)"
)
BREAKPOINT_LINE = 2  # `total = a + b`
DAP_MESSAGES = {"debug_request", "debug_reply", "debug_event"}
TRACE_TAIL = 12  # DAP messages quoted in a failure
ANSWER_MS = UI_TIMEOUT_MS  # for what the page shows once the kernel has answered


class DapTrace:
    """The DAP messages of a page's kernel websockets, in the order the page saw them."""

    def __init__(self, page: Page):
        self.messages: list[dict] = []
        page.on("websocket", self._watch)

    def _watch(self, socket: WebSocket) -> None:
        if "/api/kernels/" in socket.url:
            socket.on("framesent", lambda payload: self._record("sent", payload))
            socket.on("framereceived", lambda payload: self._record("received", payload))

    def _record(self, direction: str, payload: str | bytes) -> None:
        message = decode_frame(payload)
        if message is not None and message["header"].get("msg_type") in DAP_MESSAGES:
            self.messages.append(
                {
                    "direction": direction,
                    "msg_type": message["header"]["msg_type"],
                    "content": message["content"],
                }
            )

    def write(self, path: Path) -> None:
        path.write_text("".join(json.dumps(m) + "\n" for m in self.messages))

    def tail(self) -> str:
        lines = [json.dumps(m)[:400] for m in self.messages[-TRACE_TAIL:]]
        return "--- DAP messages (tail) ---\n" + "\n".join(lines)


def decode_frame(payload: str | bytes) -> dict | None:
    """A kernel message from a websocket frame: JSON text (the legacy protocol) or jupyter_server's
    v1 binary form (a count, that many little-endian offsets, then the channel and the parts)."""
    if isinstance(payload, str):
        return json.loads(payload)
    count = int.from_bytes(payload[:8], "little")
    if count < 6 or len(payload) < 8 * (count + 1):
        return None
    offsets = [int.from_bytes(payload[8 * i : 8 * i + 8], "little") for i in range(1, count + 1)]
    parts = [payload[start:end] for start, end in itertools.pairwise(offsets)]
    header, _parent, _metadata, content = (json.loads(part) for part in parts[1:5])
    return {"header": header, "content": content}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterLab]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    root = tmp_path_factory.mktemp("debugger-panel") / "notebooks"
    root.mkdir()
    with running_jupyterlab(root, ARTIFACTS / "jupyterlab-debugger-panel.log") as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).is_file(), f"Chromium not found at {CHROMIUM}"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kernel", [NATIVE, KERNEL_NAME])
def test_debugger_panel(kernel: str, lab: JupyterLab, browser: Browser) -> None:
    """Breakpoint from the gutter, stop, call stack, variables, Next, Continue, output."""
    display_name = KernelSpecManager().get_kernel_spec(kernel).display_name
    # a name of its own: a wasm kernel resumes the session hibernated for its notebook's path
    notebook = f"debug-panel-{kernel}-{secrets.token_hex(4)}.ipynb"
    _write_notebook(lab.root / notebook, kernel, display_name, [CELL])
    prefix = f"browser-debugger-panel-{kernel}"
    for name in ("stopped.png", "stepped.png", "finished.png", "failure.png", "dap.jsonl"):
        (ARTIFACTS / f"{prefix}-{name}").unlink(missing_ok=True)  # none from an earlier run
    page = new_page(browser, 1000, width=1400)
    trace = DapTrace(page)
    try:
        # a workspace of its own: the other kernel's notebook is not reopened here
        page.goto(f"{lab.url}/lab/workspaces/{kernel}/tree/{notebook}?token={lab.token}")
        _debug_cell(page, display_name, prefix)
    except Exception as error:
        _screenshot(page, f"{prefix}-failure.png")
        raise AssertionError(f"{type(error).__name__}: {error}\n{trace.tail()}") from error
    finally:
        trace.write(ARTIFACTS / f"{prefix}-dap.jsonl")
        page.close()


def _debug_cell(page: Page, display_name: str, prefix: str) -> None:
    panel = page.locator(".jp-NotebookPanel:visible")
    status = page.locator(".jp-StatusBar-Widget").filter(has_text=display_name).first
    expect(status).to_contain_text("Idle", timeout=RENDER_TIMEOUT_MS)

    # The bug icon is enabled for a kernelspec that announces the debugger; pressed, it starts
    # a debug session, and the kernel's `initialized` event opens the debugger's sidebar.
    bug = panel.locator(".jp-DebuggerBugButton")
    announced = "the bug icon stays disabled: the kernelspec does not announce the debugger"
    expect(bug, announced).to_have_attribute("aria-disabled", "false")
    bug.click()
    expect(bug).to_have_attribute("aria-pressed", "true", timeout=ANSWER_MS)
    sidebar = page.locator("#jp-debugger-sidebar")
    expect(sidebar).to_be_visible(timeout=ANSWER_MS)

    # One gutter element a line, after CodeMirror's hidden spacer; a mousedown sets the
    # breakpoint, which the Breakpoints pane lists once the kernel has accepted it.
    cell = panel.locator(".jp-Cell").first
    gutter = cell.locator(".cm-breakpoint-gutter .cm-gutterElement:visible")
    expect(gutter).to_have_count(CELL.count("\n") + 1, timeout=ANSWER_MS)
    gutter.nth(BREAKPOINT_LINE - 1).click()
    expect(sidebar.locator(".jp-DebuggerBreakpoint-line")).to_have_text(
        [str(BREAKPOINT_LINE)], timeout=ANSWER_MS
    )

    # Run the cell in place: it stops at the breakpoint, in add() called from the cell.
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    frames = sidebar.locator(".jp-DebuggerCallstackFrame")
    expect(frames.locator(".jp-DebuggerCallstackFrame-name")).to_have_text(
        ["add", "<module>"], timeout=RENDER_TIMEOUT_MS
    )
    # the frames' files are the cell's, as named from the hash debugInfo announced
    locations = frames.locator(".jp-DebuggerCallstackFrame-location")
    expect(locations).to_have_text(["Cell [*]:2", "Cell [*]:5"], timeout=ANSWER_MS)
    current = cell.locator(".jp-DebuggerEditor-highlight")
    expect(current).to_have_text("    total = a + b", timeout=ANSWER_MS)
    expect(_variable(sidebar, "a")).to_have_text("40", timeout=ANSWER_MS)
    expect(_variable(sidebar, "b")).to_have_text("2", timeout=ANSWER_MS)
    _screenshot(page, f"{prefix}-stopped.png")

    # Next: one line on, where the new local shows.
    sidebar.locator('[data-command="debugger:next"]').click()
    expect(locations.first).to_have_text("Cell [*]:3", timeout=ANSWER_MS)
    expect(current).to_have_text("    return total", timeout=ANSWER_MS)
    expect(_variable(sidebar, "total")).to_have_text("42", timeout=ANSWER_MS)
    _screenshot(page, f"{prefix}-stepped.png")

    # Continue: the cell runs to its end and prints; nothing is left stopped.
    sidebar.locator('[data-command="debugger:continue"]').click()
    printed = cell.locator('.jp-OutputArea [data-mime-type="application/vnd.jupyter.stdout"]')
    expect(printed).to_have_text("result 42", timeout=RENDER_TIMEOUT_MS)
    expect(cell.locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=ANSWER_MS)
    expect(frames).to_have_count(0, timeout=ANSWER_MS)
    expect(current).to_have_count(0, timeout=ANSWER_MS)
    expect(status).to_contain_text("Idle", timeout=ANSWER_MS)
    # idle, the pane shows the notebook's globals (inspectVariables)
    expect(_variable(sidebar, "result")).to_have_text("42", timeout=ANSWER_MS)
    _screenshot(page, f"{prefix}-finished.png")


def _variable(sidebar: Locator, name: str) -> Locator:
    """The value the variables pane's tree shows for the top-level variable ``name``."""
    name_span = sidebar.page.locator(".jp-DebuggerVariables-name").filter(
        has_text=re.compile(f"^{re.escape(name)}$")
    )
    item = sidebar.locator(".jp-DebuggerVariables-body:visible > jp-tree-view > jp-tree-item")
    return item.filter(has=name_span).locator(
        "xpath=./span[contains(@class, 'jp-DebuggerVariables-detail')]"
    )
