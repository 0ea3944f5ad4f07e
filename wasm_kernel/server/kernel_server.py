"""A per-user server that hands out ready kernel processes.

A kernel started from nothing spends most of its start importing ipykernel, IPython's
messaging, wasmtime and this package, and deserializing the compiled runtime. The server
does that once, then forks one kernel process per request: the child binds everything that
belongs to the request (argv with its connection file and settings, working folder,
environment, standard streams) and runs the kernel exactly as ``python -m wasm_kernel`` would,
with the same validation. The server itself never creates a wasmtime store, so it never runs
guest code, and no request's state exists in it before it forks: a kernel carries nothing of
another request. Kernels are their own session leaders, outliving the server.

The server's lock and log live in a 0700 folder of the Jupyter runtime folder
(``runtime_folder``); its socket in a 0700 folder per user under ``$XDG_RUNTIME_DIR`` or the
system temp folder (``socket_path``), since an AF_UNIX path holds 107 bytes at most and a
runtime folder's path may be longer. It answers only its own user (peer credentials).

One request per connection: a JSON object ``{"argv", "env", "cwd"}`` sent with four
descriptors (stdin, stdout, stderr for the kernel, and a lifeline whose other end the
requester keeps: the kernel ends when it closes, as ipykernel's parent poller ends a kernel
whose launcher died). The server answers ``{"pid": N}`` and, when that kernel exits,
``{"exit": status}`` on the same connection. The kernel writes one byte on the lifeline once
it has started (``lifeline.tell_started``: its ports bound, its "starting" status sent): a
client that connects before its ports are bound waits out ZMQ's reconnect interval (100-200
ms, most of a served start), and one that subscribes as that status goes out may get it before its
iopub_welcome, so the launcher waits for the byte.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import setproctitle

from ..files import private_files
from ..files.host_files import file_stamps
from ..jupyter import lifeline as lifeline_module

REQUEST_LIMIT = 1 << 20  # bytes of one request: argv, env and cwd
REQUEST_SECONDS = 10.0  # a connection that sends no request within this is closed
WAITING_LIMIT = 64  # connections waiting for their request at once; past it, refused
DESCRIPTORS = 4  # stdin, stdout, stderr, lifeline
IDLE_SECONDS = float(os.environ.get("WASM_KERNEL_SERVER_IDLE", "600"))  # then the server exits
LOG_NAME = "server.log"  # in the runtime folder: the server's output, a line per kernel
SOCKET_PATH_LIMIT = 107  # bytes of an AF_UNIX address, its closing NUL excluded
KERNEL_COMMAND = ("-m", "wasm_kernel")  # what a kernelspec's argv runs after the interpreter


class Refused(Exception):
    """A request this server does not serve; the requester launches the kernel itself."""


def code_fingerprint(python: str) -> str:
    """Identity of the kernel's interpreter and the kernel code: a server started before an
    upgrade must never hand out kernels of the old code, so its folder is named by this.
    The code counts by content, so that a launcher importing a source tree and one importing
    the same release installed agree on the server."""
    package = Path(__file__).parents[1]  # wasm_kernel: every subpackage's code counts
    digest = hashlib.sha256(interpreter_identity(python).encode())
    sources = file_stamps(package, ".py")  # every served start asks: a stat per file
    files = tuple(sorted((name, size, mtime) for name, (size, mtime) in sources.items()))
    digest.update(_code_digest(package, files))
    return digest.hexdigest()[:16]


def interpreter_identity(python: str) -> str:
    """The interpreter and the environment it runs in. Every virtual environment's ``python``
    links to the same base interpreter, so the path resolved alone would let one environment's
    server hand out kernels to another's (its packages, its kernelspecs); the path as named
    keeps them apart, and the resolved one tells interpreters behind the same name apart."""
    named = os.path.abspath(shutil.which(python) or python)
    return f"{named}\0{os.path.realpath(named)}"


@functools.cache
def _code_digest(package: Path, files: tuple[tuple[str, int, int], ...]) -> bytes:
    """sha256 over the package's sources, read again only when a file's size or time changed."""
    digest = hashlib.sha256()
    for name, _, _ in files:
        digest.update(name.encode() + b"\0" + (package / name).read_bytes() + b"\0")
    return digest.digest()


def runtime_folder(fingerprint: str) -> Path:
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / f"wasm-kernel-server-{fingerprint}"


def socket_path(folder: Path) -> Path:
    """Where the server of runtime folder ``folder`` listens: short whatever that folder's
    path (a name derived from it, in this user's private folder of ``$XDG_RUNTIME_DIR``, else
    of the system temp folder); Refused when even that is too long for a Unix socket."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if not (os.path.isabs(base) and os.path.isdir(base)):
        base = tempfile.gettempdir()
    name = hashlib.sha256(os.fsencode(folder)).hexdigest()[:16]
    path = Path(base) / f"wasm-kernel-{os.getuid()}" / f"{name}.sock"
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_LIMIT:
        raise Refused(
            f"the kernel server's socket path {path} would be {size} bytes, more than the"
            f" {SOCKET_PATH_LIMIT} a Unix socket's path may have; set XDG_RUNTIME_DIR or TMPDIR"
            " to a shorter folder"
        )
    private_folder(path.parent)
    return path


def private_folder(folder: Path) -> Path:
    """``folder``, made if absent (missing parents 0700, whatever the umask), refused unless
    it is this user's and no one else's (in a shared place such as /tmp, one that was open
    to others may hold what they put there: it is not narrowed)."""
    private_files.make_parents(folder)
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    status = os.lstat(folder)
    if os.path.islink(folder) or not os.path.isdir(folder):
        raise Refused(f"{folder} is a link or not a folder")
    if status.st_uid != os.getuid() or status.st_mode & 0o077:
        raise Refused(f"{folder} is not private to this user")
    return folder


def peer_uid(connection: socket.socket) -> int:
    credentials = connection.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
    )
    return struct.unpack("3i", credentials)[1]


def _preload() -> None:
    """Everything a kernel start spends before its request matters: imports, the compiled
    runtime of the default cache (kept by ``cache``'s in-process memo) and the boot image's
    file, the guest packages' record, and the probe of copy-on-write checkpoints (cached, so
    forks inherit its answer).
    Nothing here creates a store or a thread, or compiles: wasmtime compiles on a thread pool
    that a forked kernel would inherit without its threads, and wait on forever."""
    import ipykernel.kernelapp  # noqa: F401
    import tornado.platform.asyncio  # noqa: F401  (imported by the kernel's first IOLoop)

    from .. import __main__  # noqa: F401
    from ..jupyter import app  # noqa: F401
    from ..memory.cow import copy_on_write_missing
    from ..runtime.cache import RuntimeCache
    from ..runtime.guest_packages import preload as preload_packages
    from ..runtime.runtime import load_runtime

    copy_on_write_missing()
    cache = RuntimeCache()
    with contextlib.suppress(Exception):  # a kernel reports it properly, or builds it
        compiled = cache.preload(load_runtime(cache_dir=cache.directory))
        if compiled is not None:
            preload_packages(compiled)


def _read_request(connection: socket.socket) -> tuple[dict, list[int]]:
    """The request a connection sent (it is readable: this does not wait)."""
    payload, descriptors, _flags, _address = socket.recv_fds(connection, REQUEST_LIMIT, DESCRIPTORS)
    if len(descriptors) != DESCRIPTORS:
        for descriptor in descriptors:
            os.close(descriptor)
        raise Refused(f"a request carries {DESCRIPTORS} descriptors")
    try:
        request = json.loads(payload)
        argv, env, cwd = request["argv"], request["env"], request["cwd"]
        if not (
            isinstance(argv, list)
            and all(isinstance(word, str) for word in argv)
            and isinstance(env, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
            and isinstance(cwd, str)
        ):
            raise Refused("malformed request")
        if interpreter_identity(argv[0]) != interpreter_identity(sys.executable):
            raise Refused("the kernel's interpreter is not this server's")
        rest = kernel_arguments(argv)
        if _interpreter_settings(env) != _interpreter_settings(os.environ):
            raise Refused("the request sets the interpreter's PYTHON* variables otherwise")
    except (ValueError, KeyError, TypeError, Refused) as exc:
        for descriptor in descriptors:
            os.close(descriptor)
        raise Refused(str(exc)) from None
    return {"argv": rest, "env": env, "cwd": cwd}, descriptors


def kernel_arguments(argv: list[str]) -> list[str]:
    """The kernel's own arguments in a kernelspec's argv (``PYTHON [-P] -m wasm_kernel ...``);
    Refused for any other command (a wrapper such as unshare, another kernel)."""
    rest = argv[2:] if argv[1:2] == ["-P"] else argv[1:]
    if len(argv) < 3 or tuple(rest[:2]) != KERNEL_COMMAND:
        raise Refused("not a wasm-kernel command")
    return rest[2:]


def _interpreter_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The variables CPython reads at its start (PYTHONPATH, PYTHONHASHSEED ...): a forked
    kernel has the server's, so a request asking for others is launched the ordinary way."""
    return {name: value for name, value in env.items() if name.startswith("PYTHON")}


def _become_kernel(request: dict, descriptors: list[int]) -> None:
    """In the forked child: take the request's streams, folder and environment, then run
    the kernel as ``python -m wasm_kernel`` would. Never returns."""
    status = 1
    try:
        os.setsid()  # signals to the group reach this kernel only, as Popen's new session
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        *streams, lifeline = descriptors
        # above the standard numbers first: a received descriptor may itself be 0, 1 or 2
        streams = [fcntl.fcntl(stream, fcntl.F_DUPFD, 3) for stream in streams]
        for descriptor in descriptors[:3]:
            os.close(descriptor)
        for target, stream in enumerate(streams):
            os.dup2(stream, target)
            os.close(stream)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # read again from TMPDIR when first needed
        time.tzset()
        lifeline_module.watch(lifeline)
        # seen by ps and pkill as the kernel it now is, not as another server
        setproctitle.setproctitle(" ".join([sys.executable, *KERNEL_COMMAND, *request["argv"]]))
        from ..__main__ import main

        # The lifeline watches the launcher instead of ipykernel's parent poller, which would
        # watch the server (our parent) and end the kernel when the server exits; 1 turns the
        # poller off and keeps a launched kernel's quiet start (ipykernel read JPY_PARENT_PID
        # when the server imported it, so it is given here).
        status = main([*request["argv"], "--IPKernelApp.parent_handle=1"]) or 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


class Server:
    """The accept loop: one fork per request, each child's exit told to its requester.
    Connections wait for their request side by side (up to WAITING_LIMIT, each at most
    REQUEST_SECONDS), so one that sends nothing holds no other back."""

    def __init__(self, folder: Path, lock: int, path: Path):
        self.folder = private_folder(folder)
        private_folder(path.parent)
        self.path = path
        self.children: dict[int, socket.socket] = {}  # pid -> its requester's connection
        self.waiting: dict[socket.socket, float] = {}  # accepted, no request yet -> deadline
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # descriptors of the server's own that a forked kernel must not keep: the lock would
        # outlive a killed server in its kernels and keep a new server from starting
        self.own = [lock]

    def bind(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a dead server's socket; the folder lock says none runs
        self.listener.bind(str(self.path))
        self.listener.listen(64)

    def serve(self) -> None:
        wake_reader, wake_writer = os.pipe()
        self.own += [wake_reader, wake_writer]
        os.set_blocking(wake_writer, False)
        signal.set_wakeup_fd(wake_writer)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
        last = time.monotonic()
        watched: list[Any] = [self.listener, wake_reader]
        while self.children or self.waiting or time.monotonic() - last < IDLE_SECONDS:
            now = time.monotonic()
            wait = min([5.0, *(deadline - now for deadline in self.waiting.values())])
            ready, _, _ = select.select([*watched, *self.waiting], [], [], max(wait, 0))
            if wake_reader in ready:
                os.read(wake_reader, 512)
            self._reap()
            if self.listener in ready:
                last = time.monotonic()
                self._accept()
            for connection in ready:
                if self.waiting.pop(connection, None) is not None:
                    self._answer(connection)
            self._drop_late()

    def _accept(self) -> None:
        connection, _ = self.listener.accept()
        if peer_uid(connection) != os.getuid():  # another user's waits for nothing here
            _refuse(connection, "this server answers its own user only")
            return
        if len(self.waiting) >= WAITING_LIMIT:
            _refuse(connection, f"{WAITING_LIMIT} connections already wait to send their request")
            return
        connection.setblocking(False)
        self.waiting[connection] = time.monotonic() + REQUEST_SECONDS

    def _drop_late(self) -> None:
        now = time.monotonic()
        for connection, deadline in list(self.waiting.items()):
            if deadline <= now:
                del self.waiting[connection]
                why = f"the connection sent no request within {REQUEST_SECONDS:g} s"
                print(f"wasm-kernel server: {why}: closed", file=sys.stderr, flush=True)
                _refuse(connection, why)

    def _answer(self, connection: socket.socket) -> None:
        try:
            request, descriptors = _read_request(connection)
        except (Refused, OSError) as exc:
            _refuse(connection, str(exc))
            return
        connection.setblocking(True)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.listener.close()
            connection.close()
            for other in [*self.children.values(), *self.waiting]:
                other.close()
            for descriptor in self.own:
                os.close(descriptor)
            _become_kernel(request, descriptors)
        for descriptor in descriptors:
            os.close(descriptor)
        try:
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:
            pass  # the requester is gone; its lifeline ends the kernel
        print(f"wasm-kernel server: kernel {pid} handed out", file=sys.stderr, flush=True)
        self.children[pid] = connection

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            connection = self.children.pop(pid, None)
            if connection is not None:
                with contextlib.suppress(OSError):
                    code = os.waitstatus_to_exitcode(status)
                    connection.sendall(json.dumps({"exit": code}).encode() + b"\n")
                connection.close()


def _refuse(connection: socket.socket, why: str) -> None:
    with contextlib.suppress(OSError):
        connection.sendall(json.dumps({"refused": why}).encode() + b"\n")
    connection.close()


def main(folder: str, path: str) -> int:
    """Run the server for ``folder``, listening at ``path``, unless another already does
    (the folder's lock is held)."""
    lock = os.open(
        private_folder(Path(folder)) / "server.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return 0  # another server serves this folder
        raise
    # setproctitle finds the memory it may rewrite on its first call, which must come before
    # a forked kernel clears the environment; the server's own title stays what it was
    setproctitle.setproctitle(" ".join(sys.orig_argv))
    _preload()
    if threading.active_count() != 1:  # forking a process with threads would copy locks held
        print("wasm-kernel server: threads running after preload; not serving", file=sys.stderr)
        return 1
    server = Server(Path(folder), lock, Path(path))
    server.bind()
    try:
        server.serve()
    finally:
        with contextlib.suppress(OSError):
            server.path.unlink()
    return 0


if __name__ == "__main__":
    # the kernels it forks import this module by its name: let them find this one
    sys.modules.setdefault("wasm_kernel.server.kernel_server", sys.modules[__name__])
    sys.exit(main(sys.argv[1], sys.argv[2]))
