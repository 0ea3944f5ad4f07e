"""Post-mortem debugging in the sandbox, as under ipykernel.

``%debug`` and ``%pdb`` are IPython's own: the debugger reads its commands with ``input()``,
which the kernel turns into input_requests on the stdin channel, and an interrupt (or the
cell's time limit) ends it, as ipykernel's interruptible debugger does. What the sandbox adds:
the failing cell's frames, which IPython keeps for ``%debug`` (``sys.last_traceback``), count
against the memory limit, so when a cell ends with memory nearly full they are let go, and
``%debug`` then says why it has nothing to open.
"""

import gc
import sys

import _wasm_kernel_tracebacks as tracebacks
from IPython.core.error import UsageError

FRAMES_RELEASED = (
    "%debug: the failing cell's frames were let go when it ended, to give their memory back"
    " (memory was nearly full: the sandbox's memory limit). Run the failing code again after"
    " %pdb on to debug it as it fails."
)
#: where IPython keeps the last failure: sys.last_* and the traceback printer's own reference
KEPT_FAILURE = ("last_exc", "last_type", "last_value", "last_traceback")

_released = False  # the last failure's frames were let go for memory


def use_interruptible_pdb():
    """``pdb.set_trace()`` and ``breakpoint()`` open IPython's debugger, which an interrupt
    leaves, as ipykernel arranges (``%debug`` and ``%pdb`` use it already): pdb's own would
    answer an interrupt with another prompt, holding the cell until the kernel stops it hard."""
    import pdb

    from IPython.core import debugger

    debugger.Pdb = debugger.InterruptiblePdb
    pdb.Pdb = debugger.Pdb
    pdb.set_trace = debugger.set_trace


def forget_failure(shell):
    """Drop the last failure IPython keeps (for ``%debug``, ``%tb``) and collect its frames,
    which may hold much of memory (a cell's locals, the objects of a MemoryError). The
    exceptions lose their tracebacks too: IPython's last execution result still holds them."""
    failure = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    for exc in tracebacks.exception_tree(failure):
        exc.__traceback__ = None
    kept = [(sys, name) for name in KEPT_FAILURE] + [(shell.InteractiveTB, "tb")]
    for owner, name in kept:
        if hasattr(owner, name):
            delattr(owner, name)
    shell._last_traceback = None
    gc.collect()


def release_frames_for_memory(shell):
    """At the end of a cell with memory nearly full: let the kept failure go; True if there
    was one."""
    global _released
    if getattr(sys, "last_traceback", None) is None:
        return False
    forget_failure(shell)
    _released = True
    return True


def install(shell):
    """``%debug`` (and ``%%debug``) as IPython's, saying why when the frames were let go."""
    # IPython registers its execution magics lazily: loading them now, before the stand-in is
    # registered, keeps a later load from replacing it (and the stand-in from calling itself)
    original = shell.magics_manager.registry["ExecutionMagics"].debug

    def debug(line="", cell=None):
        if cell is None and not line.strip() and _released and not hasattr(sys, "last_exc"):
            raise UsageError(FRAMES_RELEASED)
        return original(line, cell)

    debug.__doc__ = original.__doc__
    shell.register_magic_function(debug, "line_cell", "debug")
    use_interruptible_pdb()
