"""Guest side of wasm-kernel: this file runs inside the sandboxed CPython, never on the host.

The host loads it once per interpreter as the module ``_wasm_kernel``, ships the modules
beside it (``install_modules``), then calls ``boot``, which creates IPython's shell; every
cell and request then goes through the functions here, the entry points that
``_wasm_kernel_contract`` declares (the services ``serve`` runs are in
``_wasm_kernel_services``, input() and sleep() in ``_wasm_kernel_waits``). Everything that
must reach the kernel as a Jupyter message goes through ``_host.call`` as one of the messages
declared there; stdout and stderr stay ordinary file writes that the host streams.

IPython and everything a cell can reach are as untrusted as the cell: this module checks
at the end of every turn that the host can still drive it (``_intact``), and the host rolls
the interpreter back if not.
"""

import builtins
import getpass
import io
import json
import operator
import os
import sys
import time
import types

import _host

# Bytes held back from the user's code: when a cell fills memory up to the sandbox's limit and
# keeps it (a MemoryError it caught, or objects it left referenced), the reserve is given back
# so that the error can still be formatted and the next cell can run, and free that memory.
MEMORY_RESERVE = 8 << 20
MEMORY_LOW = 1 << 20  # less room than this at the end of a cell gives the reserve back

shell = None  # IPython's shell, created by boot()
_taking = False  # a turn's entry point runs (see take_turn)
_reported = False  # the running cell has reported its error
_reserve = None  # the held-back bytes; None once given back, until memory allows again


def flush_streams():
    """Flush the user's stdout and stderr, if the cell left any: print() to a None
    sys.stdout does nothing, as under the native kernel, and so does this."""
    for name in ("stdout", "stderr"):
        try:
            getattr(sys, name).flush()
        except Exception:
            pass


def call_host(message, **fields):
    """Send one message the contract declares to the kernel and return its JSON reply."""
    flush_streams()
    return _send(message, fields)


class MessageTooLarge(ValueError):
    """A message over the bound its declaration sets (``limit``), so never sent; output
    (droppable) is not refused here: the host leaves it out with a notice."""


def _send(message, fields):
    data = json.dumps({"op": message.op, **fields})  # ASCII: one byte a character
    if len(data) > message.limit and not message.droppable:
        raise MessageTooLarge(
            f"{len(data):,} bytes as sent to the host, over the bound of {message.limit:,}"
            f" bytes ({message.limit >> 20} MiB) on one {message.op} message"
        )
    reply = _host.call(data.encode())
    return json.loads(reply) if reply else {}


# -- errors ---------------------------------------------------------------------------------


def _clip(text):
    limit = contract.ERROR_TEXT_LIMIT
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit:,} more characters]"


def report(ename, evalue, traceback, publish=True):
    """Send the cell's error to the kernel, clipped so that even a huge one arrives.
    ``publish=False``: for the reply only, as ipykernel does for a UsageError, which IPython
    has already printed."""
    global _reported
    _reported = True
    lines = _clip("\n".join(traceback)).split("\n") if traceback else []
    call_host(contract.ERROR, ename=ename, evalue=_clip(evalue), traceback=lines, publish=publish)


def _report(exc):
    """Report an exception that escaped IPython (the shell broken by a cell, or a late
    KeyboardInterrupt), in plain text; if even that fails, bare."""
    import traceback

    for _ in range(3):
        try:
            tracebacks = sys.modules.get("_wasm_kernel_tracebacks")
            if tracebacks is not None:  # the user's frames only, as in IPython's tracebacks
                exc.__traceback__ = tracebacks.without_kernel_frames(exc.__traceback__)
            report(type(exc).__name__, str(exc), traceback.format_exception(exc))
            return
        except KeyboardInterrupt:
            continue
        except Exception:
            break
    try:
        evalue = _clip(str(exc))
    except Exception:
        evalue = ""
    call_host(contract.ERROR, ename=type(exc).__name__, evalue=evalue, traceback=[])


# -- turns ----------------------------------------------------------------------------------


def take_turn(value):
    """``sys.displayhook`` between turns, and so the host's way in (its ``guest_turn``): a
    turn's source is one string literal, a JSON list of an entry point's name and arguments,
    which the interpreter hands to the display hook as the turn's value. Compiling that one
    token costs a fraction of compiling a call's text (every token of which cost ~40,000
    fuel). Any other value, or one shown while an entry point runs (a comm handler's code
    run interactively), is shown as Python's own display hook shows it.

    It puts itself back as the display hook last, after the entry point and whatever user
    code that ran (IPython's display traps can leave None: a debugger failing under %pdb;
    a cell's post_run_cell callback can set anything)."""
    global _taking
    if type(value) is not str or _taking:
        return sys.__displayhook__(value)
    name, *arguments = json.loads(value)
    if name not in contract.TURN_ENTRY_POINTS:
        raise ValueError(f"{name!r} is not an entry point of a turn")
    _taking = True
    try:
        globals()[name](*arguments)
    finally:
        _taking = False
        sys.displayhook = take_turn


# -- cells ----------------------------------------------------------------------------------


def run_cell(
    source, execution_count, source_hash, store_history=True, silent=False, breakpoints=None
):
    """Run one notebook cell through IPython; report its outcome through the host.
    ``source_hash`` names its file (see _wasm_kernel_cell_files); ``breakpoints``: the visual
    debugger's (see _wasm_kernel_visual_debugger).

    Ends the turn with status DAMAGED when the cell broke what the host relies on in here,
    so that the host rolls the cell back instead of keeping a kernel that cannot run cells.
    """
    global _reported
    _reported = False
    try:
        shell.execution_count = execution_count
        sys.modules["_wasm_kernel_sandbox"].tell_lost_files()
        _refresh_tools()
        _cell_hashed(source, source_hash)
        visual_debugger.set_breakpoints(breakpoints or {})
        try:
            result = shell.run_cell(source, store_history=store_history, silent=silent)
        finally:
            visual_debugger.cell_ended()
        error = result.error_before_exec or result.error_in_exec
        if error is not None and not _reported:  # shown by IPython already (a UsageError)
            report(type(error).__name__, str(error), [], publish=False)
    except BaseException as exc:
        if isinstance(exc, MemoryError):
            release_reserve()
        _report(exc)
    try:
        payloads = shell.payload_manager.read_payload()
        if payloads:  # clearing an empty list would cost every cell a trait change
            shell.payload_manager.clear_payload()
            call_host(contract.PAYLOAD, payload=payloads)
    except BaseException as exc:
        _report(exc)
    _end_turn()


def comm_received(message):
    """A comm message from the front end (see _wasm_kernel_comms), in a turn of its own that
    ends as a cell's does: what escapes the comm's handlers is shown as a cell's error is."""
    global _reported
    _reported = False
    try:
        sys.modules["_wasm_kernel_comms"].received(message)
    except BaseException as exc:
        if isinstance(exc, MemoryError):
            release_reserve()
        try:
            shell.showtraceback((type(exc), exc, exc.__traceback__))
        except BaseException:
            if not _reported:
                _report(exc)
    _end_turn()


def _end_turn():
    """What every turn that ran the user's code ends with."""
    try:
        flush_streams()
        sys.modules["_wasm_kernel_sandbox"].note_new_files()
    except BaseException:
        pass
    for name in ("stdout", "stderr"):
        if not hasattr(sys, name):  # deleted: the interpreter's end of turn cannot do without
            setattr(sys, name, getattr(sys, f"__{name}__"))
    try:
        keep_room()
    except KeyboardInterrupt:  # see _still_intact
        keep_room()
    if not _still_intact():
        raise SystemExit(contract.DAMAGED)


def _refresh_tools():
    """sandbox_tools, once imported, holds the tools of the cell that runs (see the module
    _wasm_kernel_tools); a cell that broke that module loses its tools, not its cells."""
    tools = sys.modules.get("_wasm_kernel_tools")
    try:
        if tools is not None:
            tools.refresh()
    except Exception:
        pass


def _cell_hashed(source, source_hash):
    """The cell's file name without hashing it here; a cell that broke that module loses
    only the shortcut."""
    cell_files = sys.modules.get("_wasm_kernel_cell_files")
    try:
        if cell_files is not None:
            cell_files.cell_hashed(source, source_hash)
    except Exception:
        pass


def _still_intact():
    """``_intact`` at the end of a turn. An interrupt that arrives as the turn ends lands in
    these last steps; the host sends one per turn, so the step runs again once, and the
    turn's own outcome stands."""
    try:
        return _intact()
    except KeyboardInterrupt:
        return _intact()


def release_reserve():
    """Memory ran out (the shell formats a MemoryError, or a cell ended with memory nearly
    full): give the reserve back, for the error and the next cell."""
    global _reserve
    _reserve = None


def keep_room():
    """At the end of a cell: the reserve (see hold_reserve); if memory is still nearly full,
    the last failure's frames, kept for %debug, are let go and the reserve taken again."""
    hold_reserve()
    if _reserve is None:
        try:
            released = sys.modules["_wasm_kernel_debugging"].release_frames_for_memory(shell)
        except Exception:  # a cell broke that module: only this memory rule is lost
            return
        if released:
            hold_reserve()


def hold_reserve():
    """At the end of a cell: give the reserve back if memory is nearly full (a cell that caught
    its MemoryError, or keeps what filled memory; it is done here, in a turn that is running
    already, since a new turn could not even compile its source), or take it again where twice
    its size is free, so that memory still full keeps the room it was given."""
    global _reserve
    if _reserve is not None:
        if not _room_for(MEMORY_LOW):
            release_reserve()
        return
    if not _room_for(2 * MEMORY_RESERVE):
        return
    try:
        _reserve = bytearray(MEMORY_RESERVE)
    except MemoryError:
        pass


def _room_for(size):
    """Whether ``size`` bytes can be allocated now, asked without writing them: a buffered
    reader's buffer is allocated and not filled, where a bytearray would be zeroed (pages a
    checkpoint then has to save)."""
    try:
        io.BufferedReader(io.BytesIO(), buffer_size=size)
    except MemoryError:
        return False
    return True


# -- interrupts -----------------------------------------------------------------------------


def interruption(reply=None):
    """What an interrupt raises: TimeLimitExceeded when the cell's time limit asked for it,
    else KeyboardInterrupt. Asks without flushing streams: it may run in a signal handler."""
    reply = _send(contract.INTERRUPTION, {}) if reply is None else reply
    text = reply.get("time_limit")
    if isinstance(text, str):
        return sys.modules["_wasm_kernel_sandbox"].TimeLimitExceeded(text)
    return KeyboardInterrupt()


def _on_sigint(_signum, frame):
    reply = _send(contract.INTERRUPTION, {})
    if reply.get("pause"):  # the visual debugger's: stop at the next line of the user's code
        visual_debugger.pause(frame)
        return
    raise interruption(reply)


# -- service requests and the host's own turns ----------------------------------------------


def serve(name, *args):
    """Run the service function ``name`` for the host (completion, inspection...). These run
    the user's code too (properties, ``__dir__``, reprs): if that raises, the reply is empty;
    if it broke the kernel's code, the turn ends DAMAGED, as a cell's would."""
    try:
        call_host(contract.REPLY, content=SERVICES[name](*args))
    except BaseException:
        call_host(contract.REPLY, content={})
    if not _still_intact():
        raise SystemExit(contract.DAMAGED)


def allow_network():
    """The operator allows some hosts: the guest's HTTP libraries send through the kernel."""
    import _wasm_kernel_network

    _wasm_kernel_network.install()


def close_stale_files():
    """After a rollback (see _wasm_kernel_sandbox): files whose descriptor leads elsewhere."""
    sys.modules["_wasm_kernel_sandbox"].close_stale_files()
    layer = sys.modules.get("_wasm_kernel_layer")
    if layer is not None:
        layer.reload()


def settle(cwd, start, paths, offsets, lost):
    """After the host resumed an image: this kernel's import paths and folders (the image's
    working folder if this kernel has it, else the starting one), fresh random seeds, the
    open files the host opened again put back at their offsets, and those it could not
    (``lost``: [fd, path]) told to the next cell."""
    import random

    sys.path += [path for path in paths if path not in sys.path]
    if start != "/tmp" and start not in sys.path:  # modules beside the notebook
        sys.path.insert(0, start)
    for folder in (cwd, start):
        try:
            os.chdir(folder)
            break
        except (OSError, ValueError):
            pass
    os.environ["PWD"] = os.getcwd()
    random.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    for fd, offset in offsets:
        if offset is not None:
            try:
                os.lseek(fd, offset, os.SEEK_SET)
            except OSError:
                pass
    sys.modules["_wasm_kernel_sandbox"].files_resumed(dict(lost))
    layer = sys.modules.get("_wasm_kernel_layer")
    if layer is not None:
        layer.reload()


def layer_writes(folders, layer):
    """Where writes beside the notebook go: see _wasm_kernel_layer."""
    import _wasm_kernel_layer

    _wasm_kernel_layer.activate(folders, layer)


# -- guest-only modules ---------------------------------------------------------------------


class ShippedModules:
    """Import finder for the kernel's guest modules, which the host ships as source."""

    def __init__(self, sources):
        self.sources = sources  # dotted name -> (source, is_package, file name)

    def find_spec(self, name, path=None, target=None):
        if name not in self.sources:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, self, is_package=self.sources[name][1])

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        source, _, filename = self.sources[module.__name__]
        exec(compile(source, filename, "exec"), module.__dict__)


def install_modules(sources):
    """Called by the host once this module is registered: ship the guest-only modules (the
    contract first, which every message names, then the parts split out of this module) and
    remember the pieces the host drives, for ``_intact``."""
    global _self, _originals, _declared, contract, services, waits, SERVICES, visual_debugger
    sys.meta_path.insert(0, ShippedModules(sources))
    for name in ("_wasm_kernel_contract", "_wasm_kernel_services", "_wasm_kernel_waits"):
        sys.modules.pop(name, None)  # a repair takes them afresh, as shipped
    import _wasm_kernel_contract as contract
    import _wasm_kernel_services as services
    import _wasm_kernel_visual_debugger as visual_debugger  # the shell's compiler holds it too
    import _wasm_kernel_waits as waits

    SERVICES = services.SERVICES
    _self = sys.modules[__name__]
    parts = (_self, services, waits, visual_debugger)
    _originals = {module: _snapshot(_held(module)) for module in parts}
    _declared = _snapshot(vars(contract))


def _held(module):
    """What ``_intact`` checks in ``module``: the functions, classes, tables and modules it
    holds (the parts' as this module's own, since they run in its turns)."""
    return {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, (type, types.FunctionType, types.MappingProxyType, types.ModuleType))
    }


def _snapshot(namespace):
    """What ``_unchanged`` compares a namespace with: a function that reads these names'
    values from it, as a tuple, in one call (an ``itemgetter``: it costs half of reading them
    one by one, at every turn's end), and the values now."""
    names = tuple(namespace)
    if len(names) == 1:  # an itemgetter of one name gives the value, not a tuple
        return (lambda now: (now[names[0]],)), tuple(namespace.values())
    return operator.itemgetter(*names), tuple(namespace.values())


def _intact():
    """Whether the host can still drive this module: a cell may have removed it from
    sys.modules, replaced its functions or broken the import system."""
    try:
        module = builtins.__import__(__name__)
    except KeyboardInterrupt:
        raise  # an interrupt, not damage: the caller checks again
    except BaseException:
        return False
    return (
        module is _self
        and sys.modules.get(visual_debugger.__name__) is visual_debugger
        and all(_unchanged(vars(part), held) for part, held in _originals.items())
        and _unchanged(vars(contract), _declared)
        and _shell_intact(module.shell)
    )


def _unchanged(namespace, snapshot):
    """Whether every name of ``snapshot`` (see ``_snapshot``) still holds the same object."""
    read, values = snapshot
    try:
        now = read(namespace)
    except KeyError:  # a name deleted
        return False
    return all(map(operator.is_, now, values))


def _shell_intact(candidate):
    """Whether IPython's shell still reports to the host: the cell may have replaced its
    run_cell, display hook or publisher (what it does inside IPython otherwise is its own)."""
    wiring = sys.modules.get("_wasm_kernel_shell")
    try:
        return (
            wiring is not None
            and type(candidate) is wiring.ZMQInteractiveShell
            and "run_cell" not in vars(candidate)
            and type(candidate.displayhook) is wiring.HostDisplayHook
            and type(candidate.display_pub) is wiring.HostDisplayPublisher
        )
    except KeyboardInterrupt:
        raise
    except BaseException:
        return False


# -- boot -------------------------------------------------------------------------------------


def whole_version(version):
    """CPython cuts its compiler's description at 80 characters (Py_GetVersion), and the
    runtime's clang describes itself with its repository's URL and commit: sys.version ended
    mid-word, its bracket open. The compiler's name and version, as native builds show them."""
    head, bracket, compiler = version.partition(" [")
    if not bracket or compiler.endswith("]"):
        return version
    return f"{head} [{compiler.split(' (', 1)[0].strip()}]"


def boot(packages, import_paths, plain_tracebacks):
    """Make this interpreter a kernel's: the sandbox's refusals, streams, input, IPython's
    shell. Everything a kernel start costs in the guest happens here, in one call, so that a
    boot image can capture its result. Run again to repair this module, it keeps the shell
    and the user's names."""
    global shell
    sys.path += [path for path in import_paths if path not in sys.path]
    first = "_wasm_kernel_sandbox" not in sys.modules
    import _wasm_kernel_sandbox

    if first:
        sys.version = whole_version(sys.version)
        _wasm_kernel_sandbox.install()
        __import__("_wasm_kernel_sources").install()
        __import__("_wasm_kernel_tools").install()
        sys.path.insert(0, packages)
    # Line-buffered, write-through streams: output reaches the kernel as it is printed.
    for stream in (sys.__stdout__, sys.__stderr__):
        stream.reconfigure(line_buffering=True, write_through=True)
    builtins.input = waits.input
    getpass.getpass = waits.getpass_
    time.sleep = waits.sleep
    # The host trips CPython's signal flags (see its snapshot.SignalFlags) to interrupt a cell:
    # this handler raises KeyboardInterrupt there, or TimeLimitExceeded.
    import signal

    signal.signal(signal.SIGINT, _on_sigint)
    sys.displayhook = take_turn  # every later turn comes in through it

    hold_reserve()
    import _wasm_kernel_comms

    _wasm_kernel_comms.install()  # before anything imports ipywidgets
    from _wasm_kernel_shell import ZMQInteractiveShell, create_shell

    if ZMQInteractiveShell.initialized():
        shell = ZMQInteractiveShell.instance()
    else:
        shell = create_shell(sys.modules["__main__"], plain_tracebacks=plain_tracebacks)
    if first:
        # Start where the host says (the notebook's mounted folder, or the private /tmp), so
        # relative paths just work; modules beside the notebook import, as natively (only
        # now: nothing from that folder runs while the kernel boots).
        start = os.environ.get("PWD", "/tmp")
        os.chdir(start)
        if start != "/tmp":
            sys.path.insert(0, start)
