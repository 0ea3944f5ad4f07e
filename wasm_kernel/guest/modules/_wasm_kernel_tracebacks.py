"""What the user sees of an error: the traceback without the kernel's own frames, and one
line saying how the sandbox caused it (a refused path, no network, a module not shipped).
"""

import itertools
import sys

import _wasm_kernel_contract as contract
import _wasm_kernel_sandbox

REFUSED_HINTS = (
    # (exception class, start of its message, the hint shown under the traceback)
    (
        PermissionError,
        "[Errno 63] ",  # EPERM: what WASI answers outside the grants, or for read-only paths
        (
            "(The sandbox refused this path: only its mounted folders are reachable, and only /tmp"
            " and read-write mounts can be changed. %sandbox lists them.)"
        ),
    ),
    (
        OSError,
        "[Errno 19] ",  # EDQUOT: the private /tmp is over its size limit
        (
            "(The private /tmp is over its size limit, so nothing there can grow: delete files in"
            " it to write again. Files that were open for writing there have become read-only.)"
        ),
    ),
    (
        OSError,
        "[Errno 60] ",  # ENXIO: a FIFO, socket or device (see sandbox/descriptors.py)
        (
            "(The sandbox opens only regular files and folders: a FIFO, socket or device could"
            " keep a cell waiting past every limit.)"
        ),
    ),
    (
        OSError,
        "[Errno 33] ",  # EMFILE: the sandbox's cap on open descriptors
        (
            "(The sandbox limits how many files a kernel may hold open at once: close the ones you"
            " no longer need, for example by opening them in a `with` block.)"
        ),
    ),
)
NETWORK_HINT = (
    "(The sandbox has no network. To use data, put the files in the notebook's folder (the"
    " notebook profile mounts it read-only at /notebook) or in a folder the operator mounts,"
    " or upload them there with Jupyter, then read them by path. %sandbox lists the folders.)"
)
NETWORK_MODULES = {"ssl", "_ssl", "requests", "httpx", "aiohttp", "urllib3"}


def exception_tree(exc, seen=None):
    """``exc`` and every exception chained to it or grouped in it."""
    seen = set() if seen is None else seen
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        for member in getattr(exc, "exceptions", None) or ():
            if isinstance(member, BaseException):
                yield from exception_tree(member, seen)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)


def without_kernel_frames(tb):
    """The traceback less the frames of the kernel's own guest code."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(contract.KERNEL_FILES):
            kept.append(tb)
        tb = tb.tb_next
    for earlier, later in itertools.pairwise(kept):
        earlier.tb_next = later
    if kept:
        kept[-1].tb_next = None
    return kept[0] if kept else None


def sandbox_hint(exc):
    """One line saying how the sandbox caused this error, or None."""
    text = str(exc)
    if any(_wasm_kernel_sandbox.NO_NETWORK in str(e) for e in exception_tree(exc)):
        return NETWORK_HINT
    if isinstance(exc, ModuleNotFoundError):
        return _missing_module_hint(exc.name or "")
    for kind, start, hint in REFUSED_HINTS:
        if isinstance(exc, kind) and text.startswith(start):
            return hint
    return None


def _missing_module_hint(name):
    """Whether the runtime ships the module, and how to see what it ships."""
    top = name.partition(".")[0]
    listing = "help('modules') lists the modules it ships."
    if top in NETWORK_MODULES:
        return (
            f"(The sandbox's runtime does not ship {top}: the sandbox has no network for it"
            f" to use. {listing})"
        )
    if top != name and _ships(top):
        return f"(The sandbox's runtime ships {top}, but not {name}. {listing})"
    if top in sys.stdlib_module_names:
        return (
            "(The sandbox's runtime, a WASI build of CPython, leaves out this part of the"
            f" standard library. {listing})"
        )
    return (
        f"(The sandbox's runtime does not ship {name or 'this module'}. `%pip install NAME`"
        f" adds pure-Python packages where the kernel allows it. {listing})"
    )


def _ships(name):
    try:
        import importlib.util

        return importlib.util.find_spec(name) is not None
    except Exception:
        return False
