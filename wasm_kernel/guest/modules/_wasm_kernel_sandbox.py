"""What the sandbox lacks, said plainly, and open files kept honest across a rollback.

Loaded at boot, before anything imports socket, threading or asyncio.
"""

import _socket
import _thread
import builtins
import errno
import functools
import io
import os
import sys
import weakref

# -- what the sandbox lacks, said plainly: network and threads ---------------------------------
# The runtime's _socket has no resolver and its sockets cannot be created, and threads cannot
# start; left alone, users meet "unknown url type: https", an AttributeError about
# _socket.getaddrinfo or "can't start new thread". Each of these now ends in one clear error.

NO_NETWORK = "there is no network in this sandbox"  # _wasm_kernel_tracebacks keys a hint on it
NO_THREADS = (
    "can't start new thread: threads are not available in this sandbox (its"
    " interpreter runs on a single thread); call the function directly instead"
)


class TimeLimitExceeded(KeyboardInterrupt):
    """Raised inside a cell that runs past its wall-clock limit. A KeyboardInterrupt, so
    ``except Exception`` does not swallow it; a cell that ignores it is stopped hard."""


class NetworkUnavailable(_socket.gaierror, ConnectionError):
    """Raised by every attempt to use the network. A gaierror and a ConnectionError (so an
    OSError), so code written for an offline machine handles it as it would there."""


NetworkUnavailable.__module__ = "socket"


def _no_network(host=None, port=None):
    message = f"Network is unreachable: {NO_NETWORK}"
    if isinstance(host, str) and host:
        message += f" (connecting to {host!r}" + (f", port {port})" if port is not None else ")")
    return NetworkUnavailable(errno.ENETUNREACH, message)


def _refuse_lookup(host=None, port=None, *args, **kwargs):
    """_socket's resolver functions (getaddrinfo, gethostbyname...), which the runtime lacks."""
    raise _no_network(host, port)


class _NoSocket(_socket.socket):
    """_socket.socket as the socket module sees it: creating a socket says why it cannot."""

    __slots__ = ()

    def __init__(self, *args, **kwargs):
        raise _no_network()


def _no_threads(*args, **kwargs):
    """_thread's thread starters: the same RuntimeError as before, with the reason."""
    raise RuntimeError(NO_THREADS)


def _https_open(handler, request):
    """urllib.request without ssl has no https handler ("unknown url type: https"): say that
    there is no network, wrapped in URLError as urllib wraps a failed connection."""
    import urllib.error

    raise urllib.error.URLError(_no_network(request.host))


def _fix_urllib_request(module):
    if not hasattr(module, "HTTPSHandler"):
        module.UnknownHandler.https_open = _https_open


def _fix_tqdm(module):
    """tqdm's monitor thread cannot start: without this every bar warns TqdmMonitorWarning."""
    module.tqdm.monitor_interval = 0


def _no_self_pipe(loop):
    """Stands for both making and closing the self-pipe: there is none."""
    loop._ssock = loop._csock = None


def _fix_asyncio(module):
    """asyncio's event loop wakes itself through a socket pair, which the sandbox cannot
    make; one thread never needs that wake-up, so loops (top-level await) do without it."""
    module.BaseSelectorEventLoop._make_self_pipe = _no_self_pipe
    module.BaseSelectorEventLoop._close_self_pipe = _no_self_pipe


IMPORT_FIXUPS = {
    "urllib.request": _fix_urllib_request,
    "tqdm.std": _fix_tqdm,
    "asyncio.selector_events": _fix_asyncio,
}


class ImportFixups:
    """Import finder that adjusts a few runtime modules right after they are imported, so
    nothing is imported at boot that a cell may never use."""

    def find_spec(self, name, path=None, target=None):
        if name not in IMPORT_FIXUPS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _FixingLoader(spec.loader, IMPORT_FIXUPS[name])
                return spec
        return None


class _FixingLoader:
    """Runs the real loader, then the fixup; the module keeps the real loader."""

    def __init__(self, loader, fixup):
        self.loader, self.fixup = loader, fixup

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            self.fixup(module)
        except Exception:
            pass

    def __getattr__(self, name):
        return getattr(self.loader, name)


def install():
    """Put the refusals in the builtin modules everything else reaches the network and
    threads through, before socket or threading is imported."""
    for name in (
        "getaddrinfo",
        "getnameinfo",
        "gethostbyname",
        "gethostbyname_ex",
        "gethostbyaddr",
    ):
        if not hasattr(_socket, name):
            setattr(_socket, name, _refuse_lookup)
    _socket.socket = _NoSocket
    _socket.NetworkUnavailable = NetworkUnavailable  # socket's `from _socket import *` shows it
    for name in ("start_new_thread", "start_new", "start_joinable_thread"):
        setattr(_thread, name, _no_threads)
    threading = sys.modules.get("threading")
    if threading is not None and hasattr(threading, "_start_joinable_thread"):
        threading._start_joinable_thread = _no_threads
    sys.meta_path.insert(0, ImportFixups())
    builtins.open = io.open = _RememberingOpen(io.open)


# -- files across a rollback -------------------------------------------------------------------
# A rollback puts back the guest's memory, but the host's table of open descriptors stays as
# the trapped cell left it. A file object from before that cell may then hold a descriptor the
# cell closed, and that number may now belong to a file the cell opened. So files opened
# through open() are remembered, and at the end of each cell (before the checkpoint) each new
# one gets the identity (device, inode) of what it opened. After a rollback the host calls
# close_stale_files(): a file whose descriptor now leads elsewhere is closed, a clear "I/O
# operation on closed file" instead of writes into another file.

_file_identities = weakref.WeakKeyDictionary()  # io.FileIO -> (st_dev, st_ino), or None: new
_lost_files = []  # paths of files an image held that did not come back, for the next cell


def _identity(raw):
    try:
        status = os.fstat(raw.fileno())
    except (OSError, ValueError):
        return None
    return (status.st_dev, status.st_ino)


class _RememberingOpen:
    """open() that remembers the files it opens. A callable object rather than a function
    so that, like the builtin, it does not turn into a method as a class attribute."""

    def __init__(self, real_open):
        self._real_open = real_open
        functools.update_wrapper(self, real_open)

    def __call__(self, *args, **kwargs):
        file = self._real_open(*args, **kwargs)
        raw = getattr(getattr(file, "buffer", file), "raw", file)
        if isinstance(raw, io.FileIO):
            _file_identities[raw] = None  # fstat waits for the cell's end: opens stay cheap
        return file

    def __repr__(self):
        return repr(self._real_open)


def note_new_files():
    for raw, identity in list(_file_identities.items()):
        if identity is None and not raw.closed:
            _file_identities[raw] = _identity(raw)


def close_stale_files():
    for raw, identity in list(_file_identities.items()):
        if identity is not None and not raw.closed and _identity(raw) != identity:
            try:
                raw.close()  # marks it closed even when the descriptor is already gone
            except OSError:
                pass


# -- files across an image ---------------------------------------------------------------------
# A resumed image's open files were opened again by the host, at the same descriptors, paths
# and offsets (the host's held_files): the files an image held are the same files, though a
# copied /tmp gives them new identities. One that could not come back (removed meanwhile)
# keeps its descriptor on a placeholder that refuses every read and write with an OSError;
# the next cell says which paths those were.


def files_resumed(lost):
    """After a resume: remember the identities the reopened files have now, and the lost."""
    for raw in list(_file_identities.keys()):
        if not raw.closed:
            _file_identities[raw] = _identity(raw)
    _lost_files[:] = sorted(set(lost.values()))


def tell_lost_files():
    """Once, at the start of the first cell after a resume: the files that did not come back."""
    if not _lost_files:
        return
    names = ", ".join(_lost_files)
    _lost_files.clear()
    print(
        f"wasm-kernel: files open in the saved session are gone ({names}); the objects that"
        " held them raise OSError when used",
        file=sys.stderr,
    )
