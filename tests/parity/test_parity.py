"""Parity with the native kernel: the notebooks in ``notebooks/`` run on ipykernel (the
``python3`` kernelspec) and on wasm-kernel with nbclient, in the same test, and their outputs
are compared cell by cell after normalising what legitimately varies (addresses, timings,
cell file names, colours).

Compared per output: its type, stream name and text, every mime type and its value (images
by mime type only: their bytes depend on the fonts and versions; widget views less their
model id), error name and value; and the widget state nbclient saves into the notebook,
model ids numbered in order. Every
cell that differs must be listed in ``KNOWN_DIFFERENCES`` with its reason, and every listed
cell must still differ, so the list stays the truth; the summary prints the match count.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import KERNEL_NAME, Kernel
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # each test takes seconds to minutes

NOTEBOOKS = Path(__file__).parent / "notebooks"
NATIVE = "python3"

#: (notebook, cell index) -> why wasm-kernel's output differs from ipykernel's
KNOWN_DIFFERENCES = {
    ("display", 6): "asyncio.run in a cell: ipykernel runs cells inside its own event loop, so"
    " natively it fails ('cannot be called from a running event loop'); the sandbox runs"
    " cells synchronously and it works",
    ("magics", 24): "%lsmagic: the sandbox adds %sandbox and its refusing stand-ins (%conda,"
    " %script, ...) and lacks none of IPython's",
    ("magics", 22): "ValueError value: CPython 3.15 words list.index's message differently",
}

ANSI = re.compile(r"\x1b\[[0-9;]*m")
ADDRESS = re.compile(r"0x[0-9a-f]+")
DURATION = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?\s*(?:ns|\u03bcs|\u00b5s|us|ms|s)\b")
CELL_FILE = re.compile(r"\S*/ipykernel_\d+/\d+\.py")  # a cell's file, as ipykernel names it
SITE_PACKAGES = re.compile(r"\S*/site-packages/")  # the host's venv, the guest's folder
BINARY = ("image/", "application/pdf")
#: lines %time and %timeit print only when a run was slow (spread over 4x, compiling or
#: parsing above a threshold): whether they appear depends on the machine's load
LOAD_DEPENDENT = re.compile(
    r"The slowest run took .*? times longer than the fastest\..*?\n"
    r"|^(?:Compiler time|Compiler|Parser) *: .*\n",
    re.MULTILINE,
)


def normalise(text: str) -> str:
    text = ANSI.sub("", text)
    text = LOAD_DEPENDENT.sub("", text)
    text = ADDRESS.sub("0x?", text)
    text = CELL_FILE.sub("<cell>", text)
    text = SITE_PACKAGES.sub("<site-packages>/", text)
    return DURATION.sub("<time>", text)


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PROGRESS_TIMES = re.compile(r"\d+(?:\.\d+)?(?:it/s|s/it)|\d\d:\d\d")  # tqdm's bar text
MODEL_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")  # ipywidgets' (uuid4 hex)


def value_of(mime: str, value: object) -> object:
    if mime.startswith(BINARY):
        return "<binary>"
    if mime == WIDGET_VIEW and isinstance(value, dict):
        return {**value, "model_id": "<model>"}
    if isinstance(value, str):
        return normalise(value)
    return value


def outputs_of(cell: nbformat.NotebookNode) -> list[tuple]:
    """What a cell showed, comparable across kernels (consecutive stream chunks merged)."""
    shown: list[tuple] = []
    for output in cell.get("outputs", []):
        kind = output["output_type"]
        if kind == "stream":
            if shown and shown[-1][:2] == ("stream", output["name"]):
                shown[-1] = ("stream", output["name"], shown[-1][2] + output["text"])
            else:
                shown.append(("stream", output["name"], output["text"]))
        elif kind == "error":
            shown.append(("error", output["ename"], normalise(output["evalue"])))
        else:
            data = {mime: value_of(mime, value) for mime, value in output["data"].items()}
            shown.append((kind, tuple(sorted(data.items(), key=lambda item: item[0]))))
    return [
        (item[0], item[1], normalise(item[2])) if item[0] == "stream" else item for item in shown
    ]


def saved_widgets(notebook: nbformat.NotebookNode) -> list:
    """The saved widget state, its model ids numbered in order of appearance."""
    saved = notebook.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json")
    if saved is None:
        return []
    ids: dict[str, str] = {}
    text = MODEL_ID.sub(lambda m: ids.setdefault(m.group(), f"<model {len(ids)}>"), str(saved))
    return [normalise(PROGRESS_TIMES.sub("<time>", text))]


def execute(notebook: nbformat.NotebookNode, kernel: str, folder: Path) -> nbformat.NotebookNode:
    ran = copy.deepcopy(notebook)
    client = NotebookClient(
        ran,
        kernel_name=kernel,
        timeout=300,
        allow_errors=True,
        resources={"metadata": {"path": str(folder)}},
    )
    client.execute()
    return ran


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The notebooks' folder, copied: the wasm kernel mounts it read-only as its own."""
    target = tmp_path_factory.mktemp("parity") / "notebooks"
    shutil.copytree(NOTEBOOKS, target)
    return target


RESULTS: dict[tuple[str, int], bool] = {}


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_matches_native_kernel(name: str, folder: Path) -> None:
    notebook = nbformat.read(folder / f"{name}.ipynb", as_version=4)
    native = execute(notebook, NATIVE, folder)
    sandboxed = execute(notebook, KERNEL_NAME, folder)
    unexplained, stale = [], []
    for index, (want, got) in enumerate(zip(native.cells, sandboxed.cells, strict=True)):
        same = outputs_of(want) == outputs_of(got)
        RESULTS[(name, index)] = same
        if not same and (name, index) not in KNOWN_DIFFERENCES:
            unexplained.append(
                f"cell {index}: {want.source!r}\n  native: {outputs_of(want)}\n"
                f"  wasm:   {outputs_of(got)}"
            )
        if same and (name, index) in KNOWN_DIFFERENCES:
            stale.append(f"cell {index} now matches: drop it from KNOWN_DIFFERENCES")
    # the widgets' state nbclient saved into the notebook, as JupyterLab saves it
    assert saved_widgets(native) == saved_widgets(sandboxed)
    matched = sum(RESULTS[(name, i)] for i in range(len(notebook.cells)))
    print(f"\n{name}: {matched} of {len(notebook.cells)} cells match the native kernel")
    assert not unexplained and not stale, "\n".join(unexplained + stale)


DOCUMENTED = 'def documented(x, y=2):\n    "Say what x is."\n    return x\n'


@pytest.mark.parametrize("code", ["len?", "documented?", "documented??", "%pinfo documented"])
def test_question_mark_page_matches_native_kernel(code: str, start_kernel) -> None:
    """``?`` and ``??`` come back as a page payload of the execute_reply, as natively."""
    pages = []
    for kernel_name in (NATIVE, KERNEL_NAME):
        kernel: Kernel = start_kernel(kernel_name=kernel_name)
        assert kernel.execute(DOCUMENTED).content["status"] == "ok"
        reply = kernel.execute(code).content
        assert reply["status"] == "ok", reply
        [page] = [p for p in reply["payload"] if p["source"] == "page"]
        pages.append(page)
    native, sandboxed = pages
    assert set(native["data"]) == set(sandboxed["data"])
    # the cell's file is named by the compiler: compare what the page says, not where
    strip = re.compile(r"^File:.*$", re.MULTILINE)
    text = [strip.sub("", normalise(page["data"]["text/plain"])) for page in pages]
    assert text[0] == text[1]


WIDE = (
    "import numpy as np, pandas as pd\n"
    "columns = [f'column_{i}' for i in range(8)]\n"
    "print(pd.DataFrame(np.arange(24).reshape(3, 8) * 1_000_000, columns=columns))\n"
    "pd.get_option('display.max_columns')"
)


def test_pandas_sees_a_kernel_with_or_without_the_boot_image(start_kernel, tmp_path) -> None:
    """pandas decides once, at import, whether a kernel or a terminal runs it (a terminal gets
    wide frames cut to its width, with ``...`` columns). The boot image imports it outside any
    cell, a kernel booted without the image in its first cell: both print as natively. The
    test's own copy of the compiled-runtime cache (hard links) boots without a boot image,
    then with the one ``precompile`` builds into it from this checkout's guest code."""
    from wasm_kernel.runtime.cache import RuntimeCache

    cache = tmp_path / "cache"
    subprocess.run(["cp", "-al", str(RuntimeCache().directory), str(cache)], check=True)
    for boot in cache.rglob("boot-*"):
        boot.unlink()
    own = ([f"--WasmKernel.cache_dir={cache}"], {"WASM_KERNEL_CACHE_DIR": str(cache)})

    def printed(kernel: Kernel, how: str) -> tuple[str, str | None]:
        if how != "native":
            described = kernel.execute("%sandbox").stream_text()
            assert f"Interpreter: {how}" in described, described
        run = kernel.execute(WIDE)
        assert run.content["status"] == "ok", run.content
        return run.stream_text(), run.result_text()

    native = printed(start_kernel(kernel_name=NATIVE), "native")
    assert native[1] == "20" and "column_7" in native[0] and "..." not in native[0]
    assert printed(start_kernel(*own), "from a fresh boot") == native
    built = subprocess.run(
        [sys.executable, "-m", "wasm_kernel", "precompile", "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    assert printed(start_kernel(*own), "from the boot image") == native
