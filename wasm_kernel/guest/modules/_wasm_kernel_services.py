"""The services ``serve`` runs for the host besides cells: completion, inspection, the
expressions of an execute_request, and the boot image's warm-up.

Split out of ``_wasm_kernel``, which owns the turn: these only answer. ``_wasm_kernel`` takes
them afresh when it is installed and checks them as its own (``_intact``).
"""

import gc
import os
import sys
import types

import _wasm_kernel_contract as contract

IMMORTALIZE_PART = 1 << 15  # addresses per message to the host (see _immortalize)


def _kernel():
    """The kernel's guest module as it is now (the host may have reinstalled it)."""
    return sys.modules["_wasm_kernel"]


def evaluate_expressions(expressions):
    """user_expressions of an execute_request, as IPython evaluates them."""
    from _wasm_kernel_display import jsonable

    results = _kernel().shell.user_expressions(expressions)
    for value in results.values():
        if value.get("status") == "ok":
            value["data"], value["metadata"] = jsonable(value["data"]), jsonable(value["metadata"])
    return results


def complete(code, cursor):
    """IPython's completions (jedi off), shaped as ipykernel's complete_reply."""
    from IPython.core.completer import provisionalcompleter, rectify_completions

    shell = _kernel().shell
    with provisionalcompleter():
        completions = list(rectify_completions(code, shell.Completer.completions(code, cursor)))
    types_ = [
        {"start": c.start, "end": c.end, "text": c.text, "type": c.type, "signature": c.signature}
        for c in completions
    ]
    start, end = (completions[0].start, completions[0].end) if completions else (cursor, cursor)
    matches = [c.text for c in completions]
    # Without jedi, IPython completes `math.sq` as `.sqrt` from the dot; jedi (and so
    # ipykernel by default) as `sqrt` after it: drop the dotted part all matches share.
    shared = os.path.commonprefix([code[start:cursor], *matches])  # noqa: RUF071 (text)
    dotted = shared[: shared.rfind(".") + 1]
    if dotted:
        start += len(dotted)
        matches = [match[len(dotted) :] for match in matches]
        for item in types_:
            item["start"], item["text"] = start, item["text"][len(dotted) :]
    return {
        "matches": matches,
        "cursor_start": start,
        "cursor_end": end,
        "metadata": {"_jupyter_types_experimental": types_},
    }


def inspect_object(code, cursor, detail_level, omit_sections=()):
    """IPython's inspector, shaped as ipykernel's inspect_reply."""
    from IPython.utils.tokenutil import token_at_cursor

    shell = _kernel().shell
    name = token_at_cursor(code, cursor)
    try:
        data = shell.object_inspect_mime(
            name, detail_level=detail_level, omit_sections=omit_sections
        )
    except KeyError:
        return {"found": False, "data": {}}
    if not shell.enable_html_pager:
        data.pop("text/html", None)
    return {"found": True, "data": data}


def is_complete(code):
    status, indent = _kernel().shell.input_transformer_manager.check_complete(code)
    reply = {"status": status}
    if status == "incomplete":
        reply["indent"] = " " * (indent or 0)
    return reply


def comm_info(target_name=None):
    """The open comms, for comm_info_request."""
    return sys.modules["_wasm_kernel_comms"].info(target_name)


def debug(request):
    """A visual debugger's request while no cell runs (see _wasm_kernel_visual_debugger)."""
    return sys.modules["_wasm_kernel_visual_debugger"].serve(request)


def image_state(descriptors):
    """Where the session is, for an image of it: its working folder, and where each open
    descriptor stands ([fd, offset]; None for one that cannot seek, such as a folder)."""
    offsets = []
    for fd in descriptors:
        try:
            offsets.append([fd, os.lseek(fd, 0, os.SEEK_CUR)])
        except OSError:
            offsets.append([fd, None])
    return {"cwd": os.getcwd(), "offsets": offsets}


def warm_up():
    """Work done once, for the boot image, so that kernels started from it need not:

    - import numpy and pandas (most of a second in the guest): the image's memory is mapped, so a
      kernel pays only for the pages it touches, and a first `import pandas` is immediate;
    - run a failing cell, and one that stores no history and shows nothing: the first cell
      paid about 10 ms for what IPython sets up on first use, and a session's first traceback
      0.3-0.6 s more than later ones (IPython's traceback machinery and syntax highlighting on
      first use, and ``inspect.getmodule`` finding the file of every module imported so far,
      numpy's and pandas' included), which could outlast an interrupt's grace time;
    - freeze what exists then, so that the garbage collector never visits it: a full
      collection wrote to every page of objects, turning ~25 MiB of the image's shared pages
      into each kernel's private copies;
    - have the host make it immortal (see the host's ``immortal`` module), so that using an
      object no longer writes its reference count: half the pages a bare cell wrote.
    """
    shell = _kernel().shell
    # Imported as in a cell, where get_ipython() exists: pandas asks it, once, whether a
    # kernel runs it (see the shell module), and would otherwise fit wide frames to a terminal.
    with shell.builtin_trap:
        import numpy  # noqa: F401
        import pandas  # noqa: F401

    shell.run_cell("1 / 0", store_history=False)
    # As if no cell had failed (as a fresh native kernel): no traceback kept for %tb, the
    # debugger or the shell, nor its frames in the image.
    sys.modules["_wasm_kernel_debugging"].forget_failure(shell)
    shell.run_cell("None", store_history=False)
    gc.collect()
    _immortalize()
    gc.freeze()
    return {}


def _immortalize():
    """Ask the host to make immortal every object the garbage collector tracks and what they
    refer to directly (strings, numbers, code), except the memory reserve, which must be
    freed when memory runs out. The host sets the counts while each call waits, and every
    object named is still alive then. Sent in parts, so that the image keeps little of the
    memory the lists took."""
    import array
    import base64

    kernel = _kernel()

    def send(addresses):
        reserve = id(kernel._reserve)  # untracked: only ever among the referents
        if reserve in addresses:
            addresses = array.array("I", (a for a in addresses if a != reserve))
        if sys.byteorder != "little":
            addresses.byteswap()
        encoded = base64.b64encode(addresses.tobytes()).decode("ascii")
        kernel.call_host(contract.IMMORTALIZE, addresses=encoded)

    objects = gc.get_objects()
    addresses = array.array("I")
    for obj in objects:
        addresses.append(id(obj))
        addresses.extend(map(id, gc.get_referents(obj)))
        if len(addresses) >= IMMORTALIZE_PART:
            send(addresses)
            addresses = array.array("I")
    send(addresses)


SERVICES = types.MappingProxyType(  # read-only: _wasm_kernel._intact checks it is still this one
    {
        contract.IMAGE_STATE: image_state,
        contract.COMPLETE: complete,
        contract.INSPECT: inspect_object,
        contract.IS_COMPLETE: is_complete,
        contract.EVALUATE_EXPRESSIONS: evaluate_expressions,
        contract.WARM_UP: warm_up,
        contract.COMM_INFO: comm_info,
        contract.DEBUG: debug,
    }
)
