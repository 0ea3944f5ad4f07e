"""Hostile cells: code that tries to reach the host, break the kernel or confuse its protocol.

Every cell here is run against a real kernel over ZMQ. For each one the test checks

(a) the guest-side outcome (an ordinary Python exception, a trap that is rolled back, or a
    harmless success inside the sandbox),
(b) the host side, wherever it can be observed from the test process: a canary file in the
    host's /tmp keeps its content, timestamps and link count; files the cell tries to create
    on the host (in the real home folder, in the host's /tmp) do not appear; a real TCP server
    and a UDP socket on 127.0.0.1 see no traffic; the kernel process keeps its pid and its
    environment block, and has no child processes,
(c) the kernel's iopub traffic: nothing is published outside the cell's own messages (no host
    log lines, no host tracebacks, no host paths),
(d) the kernel answers the next cells correctly, with the state set up before the module's
    first cell intact.

``test_sandbox_boundary`` covers the basic probes (reading /etc/passwd, listing /, the host
environment as a whole, a TCP connect, subprocess.run, os.system, the private /tmp, the
read-only stdlib); the cells here go further. Kernels are shared per setting: ``shared`` (a
secret in its host environment, a known output limit), ``limited`` (3 s per cell, 256 MiB of
guest memory); cells that tamper with the bootstrap each get a fresh kernel.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import string
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import CellRun, Kernel

import wasm_kernel

SECRET_NAME = "WASM_KERNEL_HOSTILE_SECRET"
SECRET_VALUE = f"hostile-secret-{uuid.uuid4().hex}"
TOKEN = uuid.uuid4().hex
SETUP_CELL = f"SENTINEL = {{'token': {TOKEN!r}, 'items': [1, 2, 3]}}"
SENTINEL_CHECK = "SENTINEL['token'], SENTINEL['items']"
SENTINEL_REPR = repr((TOKEN, [1, 2, 3]))
OUTPUT_LIMIT = 4 << 20  # bytes of output per cell on the kernels of this module
TIME_LIMIT = 3
MEMORY_LIMIT = 256 << 20
OUTPUT_NOTICE = "[wasm-kernel] output limit reached"
CANARY_TEXT = f"host canary {uuid.uuid4().hex}\n"
HOST_TMP = Path(tempfile.gettempdir())
# text that only the host side of the kernel knows: it must never reach a client through iopub
HOST_LEAKS = (str(Path(wasm_kernel.__file__).parent), "refused a guest message", "host.call failed")

FS_ERRORS = (
    "FileNotFoundError",
    "PermissionError",
    "OSError",
    "NotADirectoryError",
    "IsADirectoryError",
    "FileExistsError",
)
NO_PROCESS_ERRORS = (
    "AttributeError",
    "OSError",
    "NotImplementedError",
    "ModuleNotFoundError",
    "ImportError",
    "RuntimeError",
    "PermissionError",
    "FileNotFoundError",
)
TRAPS = (
    "GuestCrashed",
    "GuestExited",
    "StackOverflow",
    "TimeLimitExceeded",
    "MemoryLimitExceeded",
    "FuelExhausted",
)


# -- observing a kernel ----------------------------------------------------------------------


def describe(run: CellRun) -> str:
    content = run.content
    lines = [
        f"status={content.get('status')} ename={content.get('ename')}",
        f"evalue={str(content.get('evalue'))[:500]}",
        f"messages={[m['msg_type'] for m in run.messages][:20]}",
        f"stdout={run.stream_text()[:300]!r}",
        f"stderr={run.stream_text('stderr')[:500]!r}",
    ]
    if run.strays:
        lines.append(f"strays={[(m['msg_type'], str(m['content'])[:300]) for m in run.strays]}")
    return "\n".join(lines)


def assert_no_host_leak(runs: list[CellRun]) -> None:
    """Nothing but the cells' own messages on iopub, and no host-only text in any of them."""
    strays = [m for run in runs for m in run.strays]
    assert not strays, "iopub carried messages no request caused (host logs?): " + repr(
        [(m["msg_type"], str(m["content"])[:400]) for m in strays]
    )
    for run in runs:
        published = json.dumps([m["content"] for m in run.messages])
        for leak in HOST_LEAKS:
            assert leak not in published, f"host-side text {leak!r} reached iopub:\n{describe(run)}"


def ready(kernel: Kernel) -> Kernel:
    """Settle a new kernel (drop stale replies) and give it the state later cells check."""
    run = kernel.execute(SETUP_CELL)
    assert run.content["status"] == "ok", describe(run)
    return kernel


def kernel_pid(kernel: Kernel) -> int:
    return kernel.manager.provisioner.process.pid


def child_pids(pid: int) -> set[int]:
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            pass  # the thread ended meanwhile
    return children


class KernelWatch:
    """A kernel with what the host knows about its process when it was started."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.pid = kernel_pid(kernel)
        self.environ = Path(f"/proc/{self.pid}/environ").read_bytes()

    def assert_process_untouched(self) -> None:
        assert self.kernel.manager.is_alive(), "the kernel process died"
        assert kernel_pid(self.kernel) == self.pid, "the kernel process was replaced"
        assert Path(f"/proc/{self.pid}/environ").read_bytes() == self.environ, (
            "the kernel process's environment block changed"
        )
        assert not child_pids(self.pid), f"the kernel process has children: {child_pids(self.pid)}"

    def assert_answers(self) -> list[CellRun]:
        """The next cells run normally and the module's earlier state is intact."""
        state = self.kernel.execute(SENTINEL_CHECK, timeout=60)
        assert state.content["status"] == "ok", describe(state)
        assert state.result_text() == SENTINEL_REPR, describe(state)
        arithmetic = self.kernel.execute("1 + 1", timeout=60)
        assert arithmetic.content["status"] == "ok", describe(arithmetic)
        assert arithmetic.result_text() == "2", describe(arithmetic)
        return [state, arithmetic]


# -- the host side: canary, markers, listening servers --------------------------------------


class RecordingHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.connections: list[Any] = []
        super().__init__(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        self.connections.append(client_address)
        return False  # record and drop: nothing is ever served


class HostWatch:
    """Everything on the host that hostile cells aim at, and the checks that it is untouched."""

    def __init__(self) -> None:
        self.canary = HOST_TMP / f"wasm-kernel-canary-{uuid.uuid4().hex}"
        self.canary.write_text(CANARY_TEXT)
        self.canary_stat = self.canary.stat()
        self.http = RecordingHTTPServer()
        self.port = self.http.server_address[1]
        threading.Thread(
            target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.setblocking(False)
        self.udp_port = self.udp.getsockname()[1]
        self.markers: list[Path] = []

    def context(self, watch: KernelWatch) -> dict[str, str]:
        """Substitutions for a cell template, with markers unique to this cell."""
        tag = uuid.uuid4().hex[:12]
        home_marker = Path.home() / f".wasm-kernel-hostile-{tag}"
        tmp_marker = HOST_TMP / f"wasm-kernel-hostile-{tag}"
        self.markers += [home_marker, tmp_marker]
        return {
            "tag": tag,
            "port": str(self.port),
            "udp_port": str(self.udp_port),
            "canary": str(self.canary),
            "canary_name": self.canary.name,
            "home": str(Path.home()),
            "home_marker": str(home_marker),
            "tmp_marker": str(tmp_marker),
            "tmp_marker_name": tmp_marker.name,
            "kernel_pid": str(watch.pid),
            "secret_name": SECRET_NAME,
        }

    def assert_untouched(self) -> None:
        assert self.canary.read_text() == CANARY_TEXT, "the host canary was modified"
        now = self.canary.stat()
        before = self.canary_stat
        assert (now.st_ino, now.st_nlink, now.st_size, now.st_mtime_ns, now.st_mode) == (
            before.st_ino,
            before.st_nlink,
            before.st_size,
            before.st_mtime_ns,
            before.st_mode,
        ), "the host canary's inode changed (link count, size, time or mode)"
        created = [str(marker) for marker in self.markers if os.path.lexists(marker)]
        assert not created, f"the cell created files on the host: {created}"
        connections = self.http.connections
        assert not connections, f"the host server saw connections: {connections}"
        try:
            datagram = self.udp.recvfrom(65536)
        except BlockingIOError:
            datagram = None
        assert datagram is None, f"the host UDP socket received {datagram!r}"

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.udp.close()
        self.canary.unlink(missing_ok=True)
        for marker in self.markers:  # only there if a test failed: leave no litter behind
            if os.path.lexists(marker):
                marker.unlink()


@pytest.fixture(scope="module")
def host() -> Iterator[HostWatch]:
    watch = HostWatch()
    yield watch
    watch.close()


@pytest.fixture(scope="module")
def history_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A private history file: hostile cells stay out of the user's real history."""
    return str(tmp_path_factory.mktemp("history") / "history.sqlite")


def common_arguments(history_file: str) -> list[str]:
    return [
        f"--WasmKernel.output_limit={OUTPUT_LIMIT}",
        f"--WasmKernel.history_file={history_file}",
    ]


@pytest.fixture(scope="module")
def shared(history_file: str) -> Iterator[KernelWatch]:
    """The kernel most cells run in; its host process carries a secret environment variable."""
    kernel = Kernel(common_arguments(history_file), env={SECRET_NAME: SECRET_VALUE})
    try:
        yield KernelWatch(ready(kernel))
    finally:
        kernel.shutdown()


@pytest.fixture(scope="module")
def limited(history_file: str) -> Iterator[KernelWatch]:
    """A kernel with a short wall-clock limit and little memory, for runaway cells."""
    kernel = Kernel(
        common_arguments(history_file)
        + [
            f"--WasmKernel.time_limit={TIME_LIMIT}",
            f"--WasmKernel.memory_limit={MEMORY_LIMIT}",
        ]
    )
    try:
        yield KernelWatch(ready(kernel))
    finally:
        kernel.shutdown()


# -- expectations on the guest side ----------------------------------------------------------

Expect = Callable[[CellRun, dict[str, str]], None]


def raises(*enames: str) -> Expect:
    """The cell ends in an error whose name is one of ``enames``."""

    def check(run: CellRun, ctx: dict[str, str]) -> None:
        assert run.content["status"] == "error", describe(run)
        assert run.content["ename"] in enames, describe(run)

    return check


def guest_json(run: CellRun) -> Any:
    assert run.content["status"] == "ok", describe(run)
    return json.loads(run.stream_text().strip().splitlines()[-1])


def prints_json(expected: Any) -> Expect:
    def check(run: CellRun, ctx: dict[str, str]) -> None:
        assert guest_json(run) == expected, describe(run)

    return check


def only_streams(run: CellRun, stdout: str, stderr: str = "") -> None:
    """The cell published plain stream text, exactly as written, and nothing else."""
    assert run.content["status"] == "ok", describe(run)
    kinds = {m["msg_type"] for m in run.messages} - {"execute_input"}
    assert kinds <= {"stream"}, f"forged output became {kinds}:\n{describe(run)}"
    for message in run.messages:
        assert message["header"]["msg_type"] == message["msg_type"]
    assert run.stream_text("stdout") == stdout
    assert run.stream_text("stderr") == stderr


def host_call_refused(run: CellRun, ctx: dict[str, str]) -> None:
    """A bad host.call is an ordinary exception in the cell, and nothing else is published."""
    assert run.content["status"] == "error", describe(run)
    refusals = ("OSError", "ValueError", "TypeError", "RuntimeError")
    assert run.content["ename"] in refusals, describe(run)
    kinds = [m["msg_type"] for m in run.messages]
    assert kinds == ["execute_input", "error"], f"published {kinds}:\n{describe(run)}"


def trapped(*enames: str) -> Expect:
    """The cell was stopped by the host and the interpreter rolled back (never restarted)."""

    def check(run: CellRun, ctx: dict[str, str]) -> None:
        assert run.content["status"] == "error", describe(run)
        assert run.content["ename"] in enames, describe(run)
        if run.content["ename"] in TRAPS and run.content["ename"] != "MemoryLimitExceeded":
            assert "rolled back" in run.content["evalue"], describe(run)

    return check


def output_bounded(run: CellRun, notice: bool) -> None:
    published = sum(
        len(json.dumps(m["content"]).encode())
        for m in run.messages
        if m["msg_type"] != "execute_input"
    )
    stdout = run.stream_text().encode()
    assert len(stdout) <= OUTPUT_LIMIT, f"{len(stdout):,} bytes of stdout passed the limit"
    # JSON escaping and message framing add a little; megabytes more would be a leak
    assert published <= OUTPUT_LIMIT + (256 << 10), f"{published:,} bytes were published"
    if notice:
        assert OUTPUT_NOTICE in run.stream_text("stderr"), describe(run)


def gigabyte_printed(run: CellRun, ctx: dict[str, str]) -> None:
    assert run.content["status"] == "ok", describe(run)
    output_bounded(run, notice=True)
    assert run.stream_text().startswith("x" * 1000)


def time_limited(run: CellRun, ctx: dict[str, str]) -> None:
    """Stopped by the time limit: interrupted (effects kept), or, ignoring that, rolled back."""
    assert run.content["ename"] == "TimeLimitExceeded", describe(run)
    if "interrupted" not in run.content["evalue"]:
        trapped("TimeLimitExceeded")(run, ctx)


def printed_forever(run: CellRun, ctx: dict[str, str]) -> None:
    time_limited(run, ctx)
    output_bounded(run, notice=False)
    assert run.stream_text().startswith("0\n1\n2\n")
    assert run.seconds < TIME_LIMIT + 20, f"the time limit took {run.seconds:.1f} s"


def stopped_in_time(run: CellRun, ctx: dict[str, str]) -> None:
    time_limited(run, ctx)
    assert run.seconds < TIME_LIMIT + 20, f"the time limit took {run.seconds:.1f} s"


def replacement_characters(run: CellRun, ctx: dict[str, str]) -> None:
    assert run.content["status"] == "ok", describe(run)
    assert run.stream_text() == "\ufffd\ufffd\ufffd(", describe(run)


def oversized_payload_dropped(run: CellRun, ctx: dict[str, str]) -> None:
    """Past the largest message the host reads: not read at all and left out, so the
    output-limit notice shows; the call's small return value, which fits, is still shown."""
    assert OUTPUT_NOTICE in run.stream_text("stderr"), describe(run)
    assert not run.of_type("display_data"), describe(run)
    assert run.result_text() == "b'{}'", describe(run)


def huge_display_dropped(run: CellRun, ctx: dict[str, str]) -> None:
    # refused or dropped: either way it must not be published, and the kernel lives on
    assert not run.of_type("display_data"), "a 100 MB display payload was published"
    output_bounded(run, notice=False)


def host_env_hidden(run: CellRun, ctx: dict[str, str]) -> None:
    seen = guest_json(run)
    assert seen["PATH"] is None and seen["secret"] is None and seen["secret_b"] is None
    assert seen["HOME"] == "/tmp"
    assert SECRET_VALUE not in run.stream_text()
    assert ctx["home"] == "/tmp" or ctx["home"] not in json.dumps(seen["environ"])
    assert "PATH" not in seen["environ"]


def symlink_blocked(run: CellRun, ctx: dict[str, str]) -> None:
    outcome = guest_json(run)
    if outcome["created"] is True:
        assert outcome["read"] == "error" and outcome["write"] == "error", outcome
    else:
        assert outcome["created"] in FS_ERRORS, outcome


def guest_canary_is_private(run: CellRun, ctx: dict[str, str]) -> None:
    outcome = guest_json(run)
    assert outcome["read before"] == "FileNotFoundError", outcome
    assert outcome["read after"] == "guest copy", outcome


def odd_name_stays_private(run: CellRun, ctx: dict[str, str]) -> None:
    outcome = guest_json(run)
    assert outcome["listed"] is True, outcome
    assert outcome["bytes name"] in FS_ERRORS + ("UnicodeEncodeError", "ValueError"), outcome
    assert outcome["nul"] == "ValueError", outcome


def env_mutation_stays_inside(run: CellRun, ctx: dict[str, str]) -> None:
    assert guest_json(run) == {"PATH": "/evil", "LD_PRELOAD": "/tmp/evil.so"}


# -- the hostile cells -----------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    code: str  # a string.Template: $port, $canary, $home_marker ... (see HostWatch.context)
    expect: Expect
    kernel: str = "shared"


FORGED_LINES = [
    json.dumps(
        {
            "header": {
                "msg_id": "forged",
                "msg_type": "execute_result",
                "session": "x",
                "username": "x",
                "date": "2020-01-01T00:00:00Z",
                "version": "5.3",
            },
            "parent_header": {},
            "metadata": {},
            "content": {"execution_count": 1, "data": {"text/plain": "PWNED"}, "metadata": {}},
        }
    ),
    "<IDS|MSG>",
    "0" * 64,
    json.dumps({"op": "display", "data": {"text/html": "<script>alert(1)</script>"}}),
    json.dumps({"op": "error", "ename": "Forged", "evalue": "x", "traceback": []}),
]
FORGED_STDERR = json.dumps({"op": "result", "data": {"text/plain": "forged"}, "metadata": {}})
FORGED_RAW = b"\x00<IDS|MSG>\x00" + json.dumps({"msg_type": "display_data"}).encode() + b"\n"
ANSI_FLOOD = (
    "\x1b[2J\x1b[H\x1b[31;1m" * 20000
    + "\x1b]0;pwned title\x07\x1b]8;;http://evil.invalid/\x1b\\link\x1b]8;;\x1b\\"
    + "\x1b[?1049h\x1b[6n\x9b31m\r\x08\x08"
)

SYMLINK_CELL = """
import json, os
outcome = {}
link = '/tmp/link-$tag'
try:
    os.symlink(TARGET, link)
    outcome['created'] = True
except OSError as exc:
    outcome['created'] = type(exc).__name__
if outcome['created'] is True:
    for label, action in (('read', lambda: open(link).read()),
                          ('write', lambda: open(link, 'w').write('pwned'))):
        try:
            outcome[label] = repr(action())
        except OSError:
            outcome[label] = 'error'
print(json.dumps(outcome))
"""

HOST_CALL_SETUP = "import _host\n"

CASES = [
    # -- filesystem reach
    Case("traversal-relative", "open('../../../etc/passwd').read()", raises(*FS_ERRORS)),
    Case("traversal-to-host-canary", "open('../$canary_name').read()", raises(*FS_ERRORS)),
    Case("traversal-deep", "open('/tmp/' + '../' * 64 + 'etc/passwd').read()", raises(*FS_ERRORS)),
    Case(
        "traversal-from-readonly-preopen",
        "open('/usr/local/lib/../../../etc/passwd').read()",
        raises(*FS_ERRORS),
    ),
    Case("proc-self-environ", "open('/proc/self/environ', 'rb').read()", raises(*FS_ERRORS)),
    Case(
        "proc-kernel-environ", "open('/proc/$kernel_pid/environ', 'rb').read()", raises(*FS_ERRORS)
    ),
    Case("etc-shadow", "open('/etc/shadow').read()", raises(*FS_ERRORS)),
    Case("host-home-listing", "import os\nos.listdir('$home')", raises(*FS_ERRORS)),
    Case("host-home-write", "open('$home_marker', 'w').write('pwned')", raises(*FS_ERRORS)),
    Case(
        "host-canary-absolute-path-is-private",
        """
import json
outcome = {}
try:
    outcome['read before'] = open('$canary').read()
except OSError as exc:
    outcome['read before'] = type(exc).__name__
with open('$canary', 'w') as f:
    f.write('guest copy')
outcome['read after'] = open('$canary').read()
import os
os.remove('$canary')
print(json.dumps(outcome))
""",
        guest_canary_is_private,
    ),
    Case(
        "symlink-absolute-etc-passwd",
        SYMLINK_CELL.replace("TARGET", "'/etc/passwd'"),
        symlink_blocked,
    ),
    Case(
        "symlink-relative-etc-passwd",
        SYMLINK_CELL.replace("TARGET", "'../' * 8 + 'etc/passwd'"),
        symlink_blocked,
    ),
    Case(
        "symlink-to-host-tmp-canary",
        SYMLINK_CELL.replace("TARGET", "'../$canary_name'"),
        symlink_blocked,
    ),
    Case(
        "symlink-to-host-tmp-folder",
        """
import os
try:
    os.symlink('..', '/tmp/up-$tag')
except OSError:
    pass
os.listdir('/tmp/up-$tag')
""",
        raises(*FS_ERRORS),
    ),
    Case(
        "hardlink-to-host-canary",
        "import os\nos.link('../$canary_name', '/tmp/hl-$tag')",
        raises(*FS_ERRORS),
    ),
    Case(
        "hardlink-to-etc-passwd",
        "import os\nos.link('/etc/passwd', '/tmp/hp-$tag')",
        raises(*FS_ERRORS),
    ),
    Case(
        "os-open-creat-etc",
        "import os\nos.open('/etc/wasm-kernel-$tag', os.O_CREAT | os.O_WRONLY | os.O_EXCL)",
        raises(*FS_ERRORS),
    ),
    Case(
        "os-open-creat-host-home",
        "import os\nos.open('$home_marker', os.O_CREAT | os.O_WRONLY | os.O_EXCL)",
        raises(*FS_ERRORS),
    ),
    Case(
        "os-open-creat-host-tmp-by-traversal",
        "import os\nos.open('../$tmp_marker_name', os.O_CREAT | os.O_WRONLY | os.O_EXCL)",
        raises(*FS_ERRORS),
    ),
    Case(
        "os-open-root-folder",
        "import os\nos.open('/', os.O_RDONLY | os.O_DIRECTORY)",
        raises(*FS_ERRORS),
    ),
    Case(
        "os-open-above-preopen",
        "import os\nos.open('/usr/local/lib/..', os.O_RDONLY)",
        raises(*FS_ERRORS),
    ),
    Case("scandir-etc", "import os\nlist(os.scandir('/etc'))", raises(*FS_ERRORS)),
    Case(
        "chdir-above-preopen",
        """
import os
os.chdir('/usr/local/lib')
try:
    os.listdir('..')
finally:
    os.chdir('/tmp')
""",
        raises(*FS_ERRORS),
    ),
    Case("very-long-name", "open('/tmp/' + 'a' * 5000, 'w')", raises(*FS_ERRORS)),
    Case("very-long-path", "open('/tmp/' + 'd/' * 50000 + 'x', 'w')", raises(*FS_ERRORS)),
    Case(
        "odd-bytes-in-names",
        r"""
import json, os
outcome = {}
name = '/tmp/odd-$tag\n\x1b[31m\u202e\U0001f4a3 ..'
open(name, 'w').write('x')
outcome['listed'] = name[5:] in os.listdir('/tmp')
os.remove(name)
try:
    open(b'/tmp/\xff\xfe-$tag', 'w')
    outcome['bytes name'] = 'created'
except (OSError, ValueError) as exc:
    outcome['bytes name'] = type(exc).__name__
try:
    open('/tmp/a\x00/../../etc/passwd')
    outcome['nul'] = 'opened'
except (OSError, ValueError) as exc:
    outcome['nul'] = type(exc).__name__
print(json.dumps(outcome))
""",
        odd_name_stays_private,
    ),
    # -- host environment
    Case(
        "host-env-vars",
        """
import json, os
print(json.dumps({'PATH': os.environ.get('PATH'), 'HOME': os.getenv('HOME'),
                  'secret': os.getenv('$secret_name'),
                  'secret_b': (os.environb.get(b'$secret_name') or b'').decode() or None,
                  'environ': dict(os.environ)}))
""",
        host_env_hidden,
    ),
    Case(
        "host-env-mutation",
        """
import json, os
os.environ['PATH'] = '/evil'
os.environ['LD_PRELOAD'] = '/tmp/evil.so'
os.putenv('$secret_name', 'overwritten')
seen = {'PATH': os.environ['PATH'], 'LD_PRELOAD': os.environ['LD_PRELOAD']}
del os.environ['PATH'], os.environ['LD_PRELOAD']
os.unsetenv('$secret_name')
print(json.dumps(seen))
""",
        env_mutation_stays_inside,
    ),
    # -- network
    Case(
        "urllib-to-host-server",
        "import urllib.request\n"
        "urllib.request.urlopen('http://127.0.0.1:$port/', timeout=5).read()",
        raises("URLError"),
    ),
    Case(
        "http-client-to-host-server",
        """
import http.client
connection = http.client.HTTPConnection('127.0.0.1', $port, timeout=5)
connection.request('GET', '/')
connection.getresponse().read()
""",
        raises("NetworkUnavailable"),
    ),
    Case(
        "socket-create-connection",
        "import socket\nsocket.create_connection(('127.0.0.1', $port), timeout=5)",
        raises("NetworkUnavailable"),
    ),
    Case(
        "udp-sendto-host",
        """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b'knock knock', ('127.0.0.1', $udp_port))
""",
        raises("NetworkUnavailable"),
    ),
    Case(
        "socket-listen",
        """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(('127.0.0.1', 0))
s.listen()
""",
        raises("NetworkUnavailable"),
    ),
    Case(
        "dns-lookup",
        "import socket\nsocket.getaddrinfo('localhost', $port)",
        raises("NetworkUnavailable"),
    ),
    # -- processes
    Case(
        "subprocess-shell",
        "import subprocess\nsubprocess.Popen('touch $home_marker', shell=True)",
        raises(*NO_PROCESS_ERRORS),
    ),
    Case(
        "os-popen", "import os\nos.popen('touch $home_marker').read()", raises(*NO_PROCESS_ERRORS)
    ),
    Case("os-fork", "import os\nos.fork()", raises(*NO_PROCESS_ERRORS)),
    Case(
        "os-execv",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'touch $home_marker'])",
        raises(*NO_PROCESS_ERRORS),
    ),
    Case(
        "os-spawnv",
        "import os\nos.spawnv(os.P_WAIT, '/bin/sh', ['sh', '-c', 'touch $home_marker'])",
        raises(*NO_PROCESS_ERRORS),
    ),
    Case(
        "os-posix-spawn",
        "import os\nos.posix_spawn('/bin/sh', ['sh', '-c', 'touch $home_marker'], {})",
        raises(*NO_PROCESS_ERRORS),
    ),
    Case(
        "pty-spawn",
        "import pty\npty.spawn(['/bin/sh', '-c', 'touch $home_marker'])",
        raises(*NO_PROCESS_ERRORS),
    ),
    Case(
        "multiprocessing",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()",
        raises(*NO_PROCESS_ERRORS),
    ),
    Case("ctypes-cdll-none", "import ctypes\nctypes.CDLL(None)", raises("OSError")),
    Case(
        "ctypes-libc-system",
        "import ctypes\nctypes.CDLL('libc.so.6').system(b'touch $home_marker')",
        raises("OSError"),
    ),
    # -- threads
    Case(
        "thread-start",
        "import threading\nthreading.Thread(target=print, args=('x',)).start()",
        raises("RuntimeError"),
    ),
    Case(
        "thread-low-level",
        "import _thread\n_thread.start_new_thread(print, ('x',))",
        raises("RuntimeError"),
    ),
    # -- signals and exits
    Case(
        "raise-sigterm",
        "import signal\nsignal.raise_signal(signal.SIGTERM)",
        trapped("GuestCrashed", "GuestExited"),
    ),
    Case(
        "raise-sigkill",
        "import signal\nsignal.raise_signal(signal.SIGKILL)",
        trapped("GuestCrashed", "GuestExited"),
    ),
    Case(
        "kill-own-pid",
        "import os\nos.kill(os.getpid(), 9)",
        raises("AttributeError", "OSError", "PermissionError", "GuestCrashed", "GuestExited"),
    ),
    Case(
        "kill-kernel-pid",
        "import os\nos.kill($kernel_pid, 9)",
        raises("AttributeError", "OSError", "PermissionError", "ProcessLookupError"),
    ),
    Case("os-abort", "import os\nos.abort()", trapped("GuestCrashed", "GuestExited")),
    Case(
        "segfault",
        "import faulthandler\nfaulthandler._sigsegv()",
        trapped("GuestCrashed", "GuestExited"),
    ),
    Case("os-exit", "import os\nos._exit(3)", trapped("GuestExited", "GuestCrashed")),
    # -- memory
    Case(
        "bytearray-4gib",
        "x = bytearray(4 * 2**30)",
        raises("OverflowError", "MemoryError", "MemoryLimitExceeded"),
    ),
    Case(
        "numpy-empty-2-31",
        "import numpy as np\na = np.empty(2**31)",
        raises("ValueError", "MemoryError", "MemoryLimitExceeded"),
    ),
    Case("bytearray-2gib", "x = bytearray(2**31 - 1)", raises("MemoryLimitExceeded"), "limited"),
    Case(
        "memory-bomb",
        """
def bomb():
    hoard = []
    while True:
        hoard.append(bytearray(10**7))
bomb()
""",
        raises("MemoryLimitExceeded"),
        "limited",
    ),
    # -- recursion
    Case("deep-recursion", "def f():\n    return f()\nf()", raises("RecursionError")),
    Case(
        "deep-recursion-raised-limit",
        """
import sys
def f():
    return f()
saved = sys.getrecursionlimit()
sys.setrecursionlimit(10**7)
try:
    f()
finally:
    sys.setrecursionlimit(saved)
""",
        trapped("StackOverflow", "RecursionError", "TimeLimitExceeded", "MemoryLimitExceeded"),
        "limited",
    ),
    Case(
        "deeply-nested-list",
        """
def nest():
    item = []
    for _ in range(10**5):
        item = [item]
    return repr(item)
nest()
""",
        trapped("StackOverflow", "RecursionError"),
    ),
    Case(
        "deeply-nested-json",
        "import json\njson.loads('[' * 10**6)",
        trapped("StackOverflow", "RecursionError", "JSONDecodeError"),
    ),
    Case(
        "deeply-nested-source",
        "eval('(' * 200000 + ')' * 200000)",
        raises(
            "SyntaxError", "RecursionError", "MemoryError", "MemoryLimitExceeded", "StackOverflow"
        ),
    ),
    # -- time
    Case(
        "infinite-generator-printing",
        """
def numbers():
    n = 0
    while True:
        yield n
        n += 1
for n in numbers():
    print(n)
""",
        printed_forever,
        "limited",
    ),
    Case("sleep-forever", "import time\ntime.sleep(10**6)", stopped_in_time, "limited"),
    Case(
        "loop-swallowing-everything",
        """
while True:
    try:
        while True:
            pass
    except BaseException:
        pass
""",
        stopped_in_time,
        "limited",
    ),
    # -- output
    Case("gigabyte-of-output", "for _ in range(1000):\n    print('x' * 10**6)", gigabyte_printed),
    Case(
        "invalid-utf8-on-stdout",
        "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\xc3(');",
        replacement_characters,
    ),
    Case("display-100-mb", "display({'text/plain': 'x' * 10**8}, raw=True)", huge_display_dropped),
    Case(
        "forged-message-frames",
        "\n".join(
            ["import os, sys"]
            + [f"print({line!r})" for line in FORGED_LINES]
            + [
                f"sys.stderr.write({FORGED_STDERR + chr(10)!r})",
                "sys.stderr.flush()",
                f"os.write(1, {FORGED_RAW!r});",
            ]
        ),
        lambda run, ctx: only_streams(
            run, "\n".join(FORGED_LINES) + "\n" + FORGED_RAW.decode(), FORGED_STDERR + "\n"
        ),
    ),
    Case(
        "ansi-escape-flood",
        f"print({ANSI_FLOOD!r})",
        lambda run, ctx: only_streams(run, ANSI_FLOOD + "\n"),
    ),
    # -- the raw host-call channel
    Case("host-call-garbage", HOST_CALL_SETUP + "_host.call(b'\\x00garbage')", host_call_refused),
    Case(
        "host-call-wrong-field-type",
        HOST_CALL_SETUP + '_host.call(b\'{"op": "display", "data": 5}\')',
        host_call_refused,
    ),
    Case(
        "host-call-deep-brackets", HOST_CALL_SETUP + "_host.call(b'[' * 100000)", host_call_refused
    ),
    Case(
        "host-call-70-mb",
        HOST_CALL_SETUP + "_host.call(b' ' * (70 << 20))",
        oversized_payload_dropped,
    ),
    Case(
        "host-call-unknown-op",
        HOST_CALL_SETUP + '_host.call(b\'{"op": "exec", "code": "import os"}\')',
        host_call_refused,
    ),
    Case(
        "host-call-not-an-object",
        HOST_CALL_SETUP + '_host.call(b\'["op", "display"]\')',
        host_call_refused,
    ),
    Case(
        "host-call-deep-metadata",
        HOST_CALL_SETUP + '_host.call(b\'{"op": "display", "data": {"text/plain": "x"}, "metadata":'
        " {\"m\": ' + b'[' * 5000 + b']' * 5000 + b'}}')",
        host_call_refused,
    ),
    Case(
        "host-call-bad-input-prompt",
        HOST_CALL_SETUP + '_host.call(b\'{"op": "input", "prompt": 5}\')',
        host_call_refused,
    ),
    Case(
        "host-call-infinite-sleep",
        HOST_CALL_SETUP + '_host.call(b\'{"op": "sleep", "seconds": Infinity}\')',
        host_call_refused,
    ),
    Case(
        "host-call-huge-sleep",
        HOST_CALL_SETUP + '_host.call(b\'{"op": "sleep", "seconds": 1e300}\')',
        host_call_refused,
    ),
    Case(  # only the boot image's build may make objects immortal (never freed)
        "host-call-immortalize",
        HOST_CALL_SETUP + "import base64, json, struct, sys\n"
        "x = object()\n"
        "addresses = base64.b64encode(struct.pack('<I', id(x))).decode()\n"
        "reply = _host.call(json.dumps({'op': 'immortalize', 'addresses': addresses}).encode())\n"
        "print(json.dumps([json.loads(reply), sys._is_immortal(x)]))",
        prints_json([{"immortal": 0}, False]),
    ),
    Case("host-call-str", HOST_CALL_SETUP + '_host.call(\'{"op": "clear"}\')', host_call_refused),
    Case("host-call-none", HOST_CALL_SETUP + "_host.call(None)", host_call_refused),
    Case("host-call-int", HOST_CALL_SETUP + "_host.call(12345)", host_call_refused),
    Case("host-call-no-args", HOST_CALL_SETUP + "_host.call()", host_call_refused),
    Case("host-call-two-args", HOST_CALL_SETUP + "_host.call(b'{}', b'{}')", host_call_refused),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
@pytest.mark.slow
def test_hostile_cell(case: Case, host: HostWatch, request: pytest.FixtureRequest) -> None:
    watch: KernelWatch = request.getfixturevalue(case.kernel)
    ctx = host.context(watch)
    code = string.Template(case.code).substitute(ctx)
    run = watch.kernel.execute(code, timeout=300)
    case.expect(run, ctx)
    host.assert_untouched()
    watch.assert_process_untouched()
    later = watch.assert_answers()
    assert_no_host_leak([run, *later])
    host.assert_untouched()


def test_case_ids_are_unique() -> None:
    assert len({case.id for case in CASES}) == len(CASES) >= 40


# -- documented behaviour at the edges -------------------------------------------------------


def test_display_over_the_output_limit_is_dropped_with_the_notice(shared: KernelWatch) -> None:
    """The README: output past the limit (streams and display data) is dropped with a notice.
    A 100 MB display payload is past it whatever its size, so the user must see that notice,
    not an unrelated error."""
    run = shared.kernel.execute("display({'text/plain': 'x' * 10**8}, raw=True)", timeout=300)
    huge_display_dropped(run, {})
    assert OUTPUT_NOTICE in run.stream_text("stderr"), describe(run)
    shared.assert_answers()


def test_forged_reply_in_a_cell_cannot_poison_completion(shared: KernelWatch) -> None:
    """A cell may send the 'reply' op the service functions use; a later completion request
    must still get its own answer."""
    run = shared.kernel.execute(
        HOST_CALL_SETUP + '_host.call(b\'{"op": "reply", "content": {"matches": ["pwned"],'
        ' "cursor_start": 0, "cursor_end": 0}}\');'
    )
    assert run.content["status"] == "ok", describe(run)
    client = shared.kernel.client
    msg_id = client.complete("SENTIN", 6)
    while True:
        reply = client.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    assert reply["content"]["matches"] == ["SENTINEL"], reply["content"]
    shared.assert_answers()


# -- tampering with the bootstrap: a fresh kernel each -----------------------------------------


@dataclass(frozen=True)
class Tamper:
    id: str
    code: str
    may_break_guest: bool  # True: later cells may fail with an error reply (not a wrong answer)
    expect_stdout: str | None = None


TAMPERS = [
    Tamper("del-bootstrap-displayhook", "import _wasm_kernel\ndel _wasm_kernel.displayhook", False),
    Tamper("sys-displayhook-none", "import sys\nsys.displayhook = None", True),
    # the display hook between cells is the host's way in (take_turn): taken after every cell
    Tamper(
        "displayhook-taken-after-each-cell",
        "import sys\nget_ipython().events.register("
        "'post_run_cell', lambda result: setattr(sys, 'displayhook', print))",
        False,
    ),
    Tamper("take-turn-none", "import _wasm_kernel\n_wasm_kernel.take_turn = None", True),
    Tamper(
        "stdout-stringio-restored",
        """
import io, sys
saved = sys.stdout
sys.stdout = io.StringIO()
print('hidden')
sys.stdout = saved
print('shown')
""",
        False,
        expect_stdout="shown\n",
    ),
    Tamper("monkeypatch-input", "import builtins\nbuiltins.input = lambda *args: 'forged'", False),
    Tamper("del-bootstrap-module", "import sys\ndel sys.modules['_wasm_kernel']", True),
    Tamper("bootstrap-module-none", "import sys\nsys.modules['_wasm_kernel'] = None", True),
    Tamper("call-host-none", "import _wasm_kernel\n_wasm_kernel.call_host = None", True),
    Tamper("builtins-import-none", "import builtins\nbuiltins.__import__ = None", True),
    Tamper("close-stdout", "import sys\nsys.stdout.close()", True),
    Tamper("close-fd-1", "import os\nos.close(1)", True),
]

LATER_CELLS = [
    ("1 + 1", lambda run: run.result_text() == "2"),
    (SENTINEL_CHECK, lambda run: run.result_text() == SENTINEL_REPR),
    ("print('after')", lambda run: run.stream_text() == "after\n"),
]


@pytest.mark.parametrize("tamper", TAMPERS, ids=[tamper.id for tamper in TAMPERS])
def test_tampering_with_the_bootstrap(tamper: Tamper, start_kernel: Any, history_file: str) -> None:
    kernel = ready(start_kernel(common_arguments(history_file)))
    watch = KernelWatch(kernel)
    run = kernel.execute(tamper.code, timeout=60)  # a reply arrives: no hang, no death
    assert run.content["status"] in ("ok", "error"), describe(run)
    if tamper.expect_stdout is not None:
        assert run.content["status"] == "ok", describe(run)
        assert run.stream_text() == tamper.expect_stdout, describe(run)
    later = []
    for code, correct in LATER_CELLS:
        after = kernel.execute(code, timeout=60)
        later.append(after)
        if after.content["status"] == "error" and tamper.may_break_guest:
            # the guest module is broken: a clear error is acceptable, a wrong answer is not
            assert after.content.get("ename"), describe(after)
            continue
        assert after.content["status"] == "ok" and correct(after), (
            f"after the tamper, {code!r} neither answered correctly nor failed with an error"
            f" reply:\n{describe(after)}"
        )
    watch.assert_process_untouched()
    assert_no_host_leak([run, *later])
