"""The kernel's magics: %sandbox, %pip and %snapshot, which ask the host, and one clear line
for the magics and shell features that need processes or a GUI, which the sandbox has none of.
"""

import sys

import _wasm_kernel_contract as contract
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class

NO_PROCESSES = (
    "this kernel runs Python in a WebAssembly sandbox, which cannot start processes or shell"
    " commands. Use Python instead (os, pathlib, shutil work on the sandbox's own files)."
)
NO_GUI = "there is no GUI in this sandbox: figures are shown inline, as images"


def _kernel():
    """The kernel's guest module as it is now (the host may have reinstalled it)."""
    return sys.modules["_wasm_kernel"]


@magics_class
class SandboxMagics(Magics):
    """%sandbox, and one clear line for the magics that need processes or a GUI."""

    @line_magic
    def sandbox(self, line):
        """Show what the sandbox grants: profile, host folders, limits, runtime, and where
        writes beside the notebook go (WasmKernel.notebook_writes: 'overlay' keeps them in a
        private layer, listed here; 'new-files' also copies new data files to the folder on
        disk after each cell; 'refuse')."""
        print(_kernel().call_host(contract.DESCRIBE).get("text", "(not available here)"))

    @line_magic
    def pip(self, line):
        """%pip install|uninstall|list|show: the host's pip does the work, where the kernel
        allows it; the sandbox sends package names only (and reads ``-r`` files itself)."""
        import importlib
        import shlex

        words, names, upgrade = shlex.split(line), [], False
        command = words.pop(0) if words else ""
        if command not in contract.PIP_COMMANDS:
            raise UsageError(
                f"%pip {command}: the commands here are install, uninstall, list, show"
            )
        while words:
            word = words.pop(0)
            if word in ("-r", "--requirement") and words:
                with open(words.pop(0)) as requirements:
                    names += [row.split("#")[0].strip() for row in requirements]
            elif word in ("-U", "--upgrade"):
                upgrade = True
            elif word not in ("-y", "--yes", "-q", "--quiet"):
                names.append(word)
        names = [name for name in names if name]
        reply = _kernel().call_host(contract.PIP, command=command, args=names, upgrade=upgrade)
        importlib.invalidate_caches()
        if reply.get("error") == contract.INTERRUPTED:
            raise KeyboardInterrupt
        if reply.get("text"):
            print(reply["text"])
        if reply.get("error"):
            raise UsageError(reply["error"])

    @line_magic
    def conda(self, line):
        """conda needs processes; %pip installs pure-Python packages where allowed."""
        raise UsageError(
            "%conda: conda cannot run in this sandbox (no processes); %pip install takes"
            " pure-Python packages where the kernel allows it. `%pip list` shows what the runtime"
            " ships."
        )

    @line_magic
    def snapshot(self, line):
        """%snapshot save|restore|list|delete NAME: images of this session, kept by the kernel
        (save and restore happen when the cell ends). %snapshot forget: this notebook's session
        is not kept (hibernated) when it is closed; it opens with a fresh interpreter."""
        action, _, name = line.strip().partition(" ")
        reply = _kernel().call_host(contract.SNAPSHOT, action=action, name=name.strip())
        if "error" in reply:
            raise UsageError(reply["error"])
        if reply.get("text"):
            print(reply["text"])

    @line_magic
    def gui(self, line):
        """There is no GUI event loop in the sandbox; only ``inline`` (a no-op) is taken."""
        name = line.strip()
        if name not in ("", "inline"):
            raise UsageError(f"%gui {name}: {NO_GUI}.")

    @line_cell_magic
    def script(self, line, cell=None):
        """Scripts run in processes, which the sandbox has none of."""
        raise UsageError(f"%%script {line}".rstrip() + f": {NO_PROCESSES}")


PROCESS_MAGICS = ("bash", "sh", "system", "sx", "perl", "ruby", "python2", "python3", "pypy")


def _no_process_magic(name):
    def refuse(line, cell=None):
        raise UsageError(f"%{name}: {NO_PROCESSES}")

    refuse.__doc__ = "Not in the sandbox: it cannot start processes."
    return refuse


def install(shell):
    """The magics above, and the process magics refused, in the shell."""
    shell.magics_manager.register(SandboxMagics)
    for name in PROCESS_MAGICS:
        shell.register_magic_function(_no_process_magic(name), "line_cell", name)
