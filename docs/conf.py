"""Sphinx configuration of wasm-kernel's documentation (``pip install '.[docs]'``, then
``sphinx-build -W --keep-going -b html docs build/docs``).

The pages are Markdown (MyST), so they read the same on GitHub. Two parts are generated from
the code at build time by ``_ext/wasm_kernel_docs.py``: the settings reference (from
``KernelSettings`` and the profiles) and the package map (from the subpackages' docstrings).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]  # document this checkout, not an installed copy

from wasm_kernel import __version__  # noqa: E402

project = "wasm-kernel"
author = "the wasm-kernel developers"
copyright = "the wasm-kernel developers, Apache License 2.0"
release = version = __version__

extensions = ["myst_parser", "wasm_kernel_docs"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "examples"]

# Warnings are errors in CI (-W): a link to a page or heading that does not exist, a
# {confval} that names no setting, a page left out of every toctree all fail the build.
nitpicky = True
myst_heading_anchors = 3  # [text](page.md#a-heading) works here as on GitHub
myst_enable_extensions = ["colon_fence", "deflist"]
smartquotes = False  # values such as 'data:/data:ro' are copied as written

html_theme = "pydata_sphinx_theme"
html_title = f"wasm-kernel {release}"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_sidebars = {"**": []}  # the header and the page's own contents suffice
