"""The Jupyter community's protocol conformance suite (jupyter_kernel_test) against wasm-python.

Every message the kernel sends is validated against the messaging spec by the base class;
the samples below say what a Python kernel should answer.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import jupyter_kernel_test
from jupyter_client.manager import start_new_kernel

KERNEL_NAME = os.environ.get("WASM_KERNEL_TEST_KERNEL", "wasm-python")

HTML_CLASS = "class Bold:\n    def _repr_html_(self):\n        return '<b>bold</b>'\n"
PNG_CLASS = (
    "class Pixel:\n    def _repr_png_(self):\n        return b'\\x89PNG\\r\\n\\x1a\\n' + bytes(8)\n"
)


class _PrivateHistory:
    """Start the suite's kernel with its own history file.

    History is shared by every kernel using the same SQLite file, so a kernel started by
    another test run at the same time would otherwise show up in the tail/search checks.
    """

    kernel_name = KERNEL_NAME

    @classmethod
    def setUpClass(cls) -> None:
        cls._history_dir = tempfile.mkdtemp(prefix="wasm-kernel-spec-")
        env = {**os.environ, "WASM_KERNEL_HISTORY_FILE": os.path.join(cls._history_dir, "h.sqlite")}
        cls.km, cls.kc = start_new_kernel(kernel_name=cls.kernel_name, env=env, startup_timeout=120)

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()  # type: ignore[misc]
        shutil.rmtree(cls._history_dir, ignore_errors=True)


class WasmKernelSpecTests(_PrivateHistory, jupyter_kernel_test.KernelTests):
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('something went sideways', file=sys.stderr)"

    # The suite completes at the end of the text; each set is exactly what Python offers.
    completion_samples = [
        {"text": "zi", "matches": {"zip"}},
        {"text": "prin", "matches": {"print"}},
        {"text": "whi", "matches": {"while"}},
        {"text": "str.isdig", "matches": {"isdigit"}},
        {"text": "list.app", "matches": {"append"}},
    ]

    complete_code_samples = [
        "1",
        "print('hello, world')",
        "def double(x):\n    return x * 2\n",
        "if True:\n    x = 1\n",
        "import sys",
    ]
    incomplete_code_samples = [
        "print('''hello",
        "for i in range(3):",
        "def double(x):",
        "values = [1,\n",
        "total = (1 +",
        "class A:\n    def f(self):",
    ]
    invalid_code_samples = [
        "print('hello",
        "def broken(:",
        "1 +* 2",
        "x = )",
    ]

    code_generate_error = "raise ValueError('this cell fails on purpose')"

    code_execute_result = [
        {"code": "1 + 2", "result": "3"},
        {"code": "'wasm-history-sample'.upper()", "result": "'WASM-HISTORY-SAMPLE'"},
        {"code": "[i * i for i in range(4)]", "result": "[0, 1, 4, 9]"},
        {"code": "import sys; sys.version_info[:2]", "result": "(3, 15)"},
        {"code": HTML_CLASS + "Bold()", "mime": "text/html", "result": "<b>bold</b>"},
        {"code": "import pandas as pd; pd.DataFrame({'a': [1, 2]})", "mime": "text/html"},
    ]

    code_display_data = [
        {"code": "display('hello')", "mime": "text/plain"},
        {"code": HTML_CLASS + "display(Bold())", "mime": "text/html"},
        {"code": PNG_CLASS + "display(Pixel())", "mime": "image/png"},
        {"code": "display({'text/markdown': '# Title'}, raw=True)", "mime": "text/markdown"},
        {
            "code": "from IPython.display import HTML; display(HTML('<i>html</i>'))",
            "mime": "text/html",
        },
        {
            "code": "from IPython.display import Image; "
            "display(Image(data=b'\\x89PNG\\r\\n\\x1a\\n' + bytes(8)))",
            "mime": "image/png",
        },
        {
            "code": "from IPython.display import Markdown; display(Markdown('**md**'))",
            "mime": "text/markdown",
        },
        {
            "code": "from IPython.display import Latex; display(Latex(r'$\\alpha$'))",
            "mime": "text/latex",
        },
        {"code": "from IPython.display import Math; display(Math('x^2'))", "mime": "text/latex"},
    ]

    # Matches exactly one of the code_execute_result sources (the suite checks unique=True).
    code_history_pattern = "*wasm-history-sample*"
    supported_history_operations = ("tail", "range", "search")

    code_inspect_sample = "print"

    code_clear_output = "from IPython.display import clear_output; clear_output()"


class WasmKernelIopubWelcomeTests(jupyter_kernel_test.IopubWelcomeTests):
    """ipykernel 7 greets each iopub subscriber (JEP 65); the kernel inherits that."""

    kernel_name = KERNEL_NAME
    support_iopub_welcome = True
