"""Cells that break the kernel's own plumbing inside the guest must not cost earlier state.

The kernel's guest code is ordinary Python in the same interpreter as the cell, so a cell can
replace or remove it, its streams, or the import system. Whatever it does, the cells before it
keep their results: the kernel either tolerates the change as the native kernel does, or
rolls the cell back to the checkpoint of the cell before.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from conftest import Kernel, ok

SETUP = "sentinel = {'kept': [1, 2, 3]}\nballast = []"
SENTINEL = "{'kept': [1, 2, 3]}"


@dataclass(frozen=True)
class Breakage:
    id: str
    code: str
    prints_afterwards: bool = True  # False: the cell left print() without a stream, as natively


BREAKAGES = [
    Breakage("stdout-none", "import sys\nsys.stdout = None", prints_afterwards=False),
    Breakage("del-stderr", "import sys\ndel sys.stderr"),
    Breakage("del-both-streams", "import sys\ndel sys.stdout, sys.stderr"),
    Breakage("close-fd-1-and-2", "import os\nos.close(1)\nos.close(2)"),
    Breakage("del-guest-module", "import sys\ndel sys.modules['_wasm_kernel']"),
    Breakage("guest-module-none", "import sys\nsys.modules['_wasm_kernel'] = None"),
    Breakage("call-host-none", "import _wasm_kernel\n_wasm_kernel.call_host = None"),
    Breakage("run-cell-replaced", "import _wasm_kernel\n_wasm_kernel.run_cell = print"),
    Breakage("guest-function-deleted", "import _wasm_kernel\ndel _wasm_kernel.report"),
    Breakage("declaration-replaced", "import _wasm_kernel_contract as c\nc.RESULT = c.ERROR"),
    Breakage("declaration-deleted", "import _wasm_kernel_contract as c\ndel c.DAMAGED"),
    Breakage("import-none", "import builtins\nbuiltins.__import__ = None"),
    # IPython's shell is the guest's too: rewiring it would silence every later cell
    Breakage("shell-run-cell-none", "get_ipython().run_cell = None"),
    Breakage("shell-display-pub-none", "get_ipython().display_pub = None"),
    Breakage("shell-displayhook-replaced", "get_ipython().displayhook = print"),
    Breakage("shell-wiring-module-gone", "import sys\ndel sys.modules['_wasm_kernel_shell']"),
    # the visual debugger's guest side: every later cell goes through it
    Breakage("debugger-module-gone", "import sys\ndel sys.modules['_wasm_kernel_visual_debugger']"),
    Breakage(
        "debugger-breakpoints-none",
        "import _wasm_kernel_visual_debugger as d\nd.set_breakpoints = None",
    ),
]


@pytest.fixture(scope="module")
def shared() -> Kernel:
    started = Kernel(["--WasmKernel.memory_limit=268435456"])
    ok(started.execute(SETUP))
    yield started
    started.shutdown()


@pytest.mark.parametrize("breakage", BREAKAGES, ids=[b.id for b in BREAKAGES])
def test_state_survives(shared: Kernel, breakage: Breakage) -> None:
    run = shared.execute(breakage.code, timeout=60)
    assert run.content["status"] in ("ok", "error")
    if run.content["status"] == "error":
        assert run.content["ename"] == "KernelSupportDamaged", run.content
        assert "rolled back" in run.content["evalue"]
    assert shared.execute("sentinel").result_text() == SENTINEL
    if breakage.prints_afterwards:
        assert shared.execute("print('after')").stream_text() == "after\n"
    else:  # put the stream back, as a user would
        ok(shared.execute("import sys\nsys.stdout = sys.__stdout__"))
    assert shared.execute("1 + 1").result_text() == "2"


@pytest.mark.slow
def test_running_out_of_memory_keeps_state(shared: Kernel) -> None:
    """The README's promise: state survives running out of memory."""
    run = shared.execute("for i in range(5 * 10**7):\n    ballast.append([ballast])", timeout=120)
    assert run.content["status"] == "error"
    assert run.content["ename"] == "MemoryLimitExceeded", run.content
    assert shared.execute("sentinel").result_text() == SENTINEL
    ok(shared.execute("ballast.clear()"))
    assert shared.execute("len(ballast), 1 + 1").result_text() == "(0, 2)"
