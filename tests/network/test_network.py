"""Network through the operator's allowlist, with real servers on 127.0.0.1.

Each server counts the connections it accepts, so a refusal is checked where it matters:
nothing reached the server. HTTPS uses a test CA that the kernels trust the way an operator
would make them trust an internal CA: ``SSL_CERT_FILE`` naming a bundle that holds it. What
the sandboxed kernel fetches is compared with what the native kernel fetches, running the
same code in the same test.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import certifi
import pytest
import trustme
from conftest import Kernel, ok, plain

from wasm_kernel.network.network import Network, NetworkLimits

CSV = b"a,b\n1,2\n3,4\n"
BIG = 1 << 20  # bytes of /big: past the shared kernel's network_bytes
BUDGET = 256 << 10  # the shared kernel's network_bytes
REQUESTS = 20  # the shared kernel's network_requests
TIMEOUT = 2  # the shared kernel's network_timeout, in seconds
TRICKLE = 0.25  # seconds between the bytes /slow sends
TRICKLE_BYTES = 80  # /slow's whole body, 20 s at that pace, so the test's server stops by itself


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as servers made for keep-alive do
    server: Server

    def do_GET(self) -> None:
        self.server.requests += 1
        path, _, query = self.path.partition("?")
        if path == "/csv":
            self._send(200, CSV, [("Content-Type", "text/csv"), ("Set-Cookie", "k=v")])
        elif path == "/redirect":
            self._send(302, b"", [("Location", unquote(query))])
        elif path == "/big":  # BIG bytes, or as many as the query says
            size = int(query or BIG)
            self._send(200, b"x" * size, [("Content-Type", "application/octet-stream")])
        elif path == "/slow":
            self._trickle()
        elif path == "/headers":  # what arrived, as [name, value] pairs
            seen = json.dumps(list(self.headers.items())).encode()
            self._send(200, seen, [("Content-Type", "application/json")])
        else:
            self._send(404, b"no such page", [("Content-Type", "text/plain")])

    def do_POST(self) -> None:
        self.server.requests += 1
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(200, data, [("Content-Type", self.headers.get("Content-Type", "?"))])

    def _send(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _trickle(self) -> None:
        """A slow-loris answer: headers at once, then a byte now and then."""
        self.send_response(200)
        self.send_header("Content-Length", str(TRICKLE_BYTES))
        self.end_headers()
        try:
            for _ in range(TRICKLE_BYTES):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(TRICKLE)
        except OSError:
            self.server.cut_off += 1  # the client closed the connection before the end

    def log_message(self, *args: object) -> None:
        pass


class Server(ThreadingHTTPServer):
    """A real HTTP(S) server on 127.0.0.1 that counts every connection it accepts."""

    daemon_threads = True

    def __init__(self, tls: ssl.SSLContext | None = None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.tls = tls
        self.connections = 0  # accepted
        self.requests = 0  # answered
        self.cut_off = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def get_request(self):  # type: ignore[no-untyped-def]
        sock, address = super().get_request()
        self.connections += 1
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True)
        return sock, address

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"


def _tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    return context


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Server]]:
    """``plain`` and ``tls`` are listed by address; ``named`` only as http://localhost:PORT;
    ``unlisted`` never; ``untrusted`` is listed but its certificate is from another CA."""
    ca, stranger = trustme.CA(), trustme.CA()
    made = {
        "plain": Server(),
        "tls": Server(_tls(ca)),
        "named": Server(),
        "unlisted": Server(),
        "untrusted": Server(_tls(stranger)),
    }
    made["plain"].ca = ca  # type: ignore[attr-defined]  # for the kernels' trust bundle
    yield made
    for server in made.values():
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def trust(servers: dict[str, Server], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of both kernels: the usual CAs and the test CA, in one bundle (native
    requests reads REQUESTS_CA_BUNDLE; the sandbox's requests is the host's, which does not)."""
    bundle = tmp_path_factory.mktemp("trust") / "bundle.pem"
    ca = servers["plain"].ca  # type: ignore[attr-defined]
    bundle.write_bytes(Path(certifi.where()).read_bytes() + b"\n" + ca.cert_pem.bytes())
    return {"SSL_CERT_FILE": str(bundle), "REQUESTS_CA_BUNDLE": str(bundle)}


@pytest.fixture(scope="module")
def net(servers: dict[str, Server], trust: dict[str, str]) -> Iterator[Kernel]:
    allow = [
        servers["plain"].url,
        servers["tls"].url,
        servers["untrusted"].url,
        f"http://localhost:{servers['named'].port}",
    ]
    started = Kernel(
        [
            f"--WasmKernel.network_allow={json.dumps(allow)}",
            f"--WasmKernel.network_bytes={BUDGET}",
            f"--WasmKernel.network_requests={REQUESTS}",
            f"--WasmKernel.network_timeout={TIMEOUT}",
        ],
        env=trust,
    )
    yield started
    started.shutdown()


@pytest.fixture(scope="module")
def native(trust: dict[str, str]) -> Iterator[Kernel]:
    started = Kernel(kernel_name="python3", env=trust)
    yield started
    started.shutdown()


def refused(run, *texts: str) -> str:  # type: ignore[no-untyped-def]
    """The cell failed with NetworkUnavailable (perhaps wrapped), saying each of ``texts``."""
    content = run.content
    assert content["status"] == "error", run.stream_text()
    told = content["evalue"] + "\n".join(content["traceback"])
    assert "NetworkUnavailable" in told, told
    for text in texts:
        assert text in told, told
    return told


def still_answers(kernel: Kernel) -> None:
    assert ok(kernel.execute("40 + 2")).result_text() == "42"


FETCHES = """
import http.client, urllib.request
import pandas as pd
for base in {bases!r}:
    with urllib.request.urlopen(base + "/csv") as response:
        print(response.status, response.reason, response.headers["Content-Type"], response.read())
    print(pd.read_csv(base + "/csv").to_dict())
    posted = urllib.request.Request(base + "/echo", data=b"payload", method="POST",
                                    headers={{"Content-Type": "text/x-test"}})
    print(urllib.request.urlopen(posted).read())
    print(urllib.request.urlopen(base + "/redirect?" + base + "/csv").read())
connection = http.client.HTTPConnection("127.0.0.1", {port})
for path in ("/csv", "/missing", "/csv"):
    connection.request("GET", path)
    answer = connection.getresponse()
    print(answer.status, answer.getheader("Content-Length"), answer.read())
"""


def test_urlopen_pandas_and_http_client_fetch_as_natively(net, native, servers):
    """HTTP and HTTPS (the test CA trusted through SSL_CERT_FILE), a POST, a redirect within
    the list, a 404 and a kept-alive connection: the same output as the native kernel's."""
    code = FETCHES.format(
        bases=[servers["plain"].url, servers["tls"].url], port=servers["plain"].port
    )
    sandboxed = ok(net.execute(code)).stream_text()
    assert sandboxed == ok(native.execute(code)).stream_text()
    assert "200 OK text/csv b'a,b\\n1,2\\n3,4\\n'" in sandboxed
    assert "{'a': {0: 1, 1: 3}, 'b': {0: 2, 1: 4}}" in sandboxed
    assert "b'payload'" in sandboxed and "404 12 b'no such page'" in sandboxed


def test_redirect_to_an_unlisted_host_is_refused(net, servers):
    before = servers["plain"].requests
    elsewhere = servers["unlisted"].url + "/csv"
    hop = servers["plain"].url + "/redirect?" + elsewhere
    run = net.execute(f"import urllib.request\nurllib.request.urlopen({hop!r})")
    refused(
        run, "URLError", f"{elsewhere.rsplit('/', 1)[0]} is not on this kernel's network allowlist"
    )
    assert servers["plain"].requests == before + 1  # the first hop was made
    assert servers["unlisted"].connections == 0  # the second never was
    still_answers(net)


def test_a_name_that_resolves_to_loopback_is_refused_unless_the_address_is_listed(net, servers):
    """http://localhost:PORT is listed, but not 127.0.0.1:PORT: a listed name grants only
    public addresses, as when an allowed name's DNS answer is turned to 127.0.0.1."""
    port = servers["named"].port
    run = net.execute(
        f"import urllib.request\nurllib.request.urlopen('http://localhost:{port}/csv')"
    )
    refused(run, "localhost resolves to 127.0.0.1, a loopback address", f"http://127.0.0.1:{port}")
    assert servers["named"].connections == 0
    still_answers(net)


def test_a_response_larger_than_the_budget_is_refused(net, servers):
    big = servers["plain"].url + "/big"
    run = net.execute(f"import urllib.request\nurllib.request.urlopen({big!r}).read()")
    refused(run, "over budget", f"{BIG:,} bytes", "WasmKernel.network_bytes")
    # the budget is the cell's: the next one fetches again
    small = servers["plain"].url + "/csv"
    assert ok(net.execute(f"len(urllib.request.urlopen({small!r}).read())")).result_text() == "12"


@pytest.mark.slow
def test_a_slow_loris_server_is_cut_off_at_the_request_deadline(net, servers):
    slow = servers["plain"].url + "/slow"
    cut_before = servers["plain"].cut_off
    run = net.execute(f"import urllib.request\nurllib.request.urlopen({slow!r}).read()")
    refused(run, f"took longer than the {TIMEOUT} s a request may take", "network_timeout")
    still_answers(net)
    deadline = time.monotonic() + 10
    while servers["plain"].cut_off == cut_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert servers["plain"].cut_off > cut_before  # the host closed the connection early


def test_the_cells_own_timeout_raises_timeout_error(net, servers):
    """Shorter than network_timeout, the caller's timeout is a timeout as natively, not a
    refusal: TimeoutError (urllib wraps it in URLError, as it wraps a failed connection)."""
    slow = servers["plain"].url + "/slow"
    code = (
        "import urllib.error, urllib.request\n"
        f"try:\n    urllib.request.urlopen({slow!r}, timeout=0.5).read()\n"
        "except urllib.error.URLError as error:\n    print(type(error.reason).__name__)"
    )
    assert ok(net.execute(code)).stream_text() == "TimeoutError\n"


def test_an_interrupt_stops_a_waiting_request(net, servers):
    slow = servers["plain"].url + "/slow"
    msg_id = net.client.execute(f"import urllib.request\nurllib.request.urlopen({slow!r}).read()")
    time.sleep(0.5)
    net.manager.interrupt_kernel()
    run = net.collect(msg_id)
    assert run.content["status"] == "error"
    assert run.content["ename"] == "KeyboardInterrupt", run.content
    still_answers(net)


def test_a_hostile_request_cannot_steer_the_host(net, servers):
    """The guest's own message (not through http.client): a Host header naming another site
    and hop-by-hop headers are replaced by the host's; a header that would smuggle a second
    line is refused before anything is sent; a URL naming a user is refused."""
    headers = servers["plain"].url + "/headers"
    sent = net.execute(
        "import json, _wasm_kernel_network as net\n"
        f"status, _, _, body = net.exchange('GET', {headers!r}, [('Host', 'evil.example'),"
        " ('Connection', 'upgrade'), ('X-Kept', 'yes')])\n"
        "{name.lower(): value for name, value in json.loads(body)}"
    )
    seen = plain(ok(sent))
    assert seen["host"] == f"127.0.0.1:{servers['plain'].port}"
    assert seen["x-kept"] == "yes" and seen.get("connection") != "upgrade"
    before = servers["plain"].requests
    injected = net.execute(
        "import _wasm_kernel_network as net\n"
        f"net.exchange('GET', {headers!r}, [('X-A', '1\\r\\nX-Injected: yes')])"
    )
    refused(injected, "not valid HTTP")
    with_user = servers["plain"].url.replace("http://", "http://user:pw@") + "/csv"
    refused(net.execute(f"net.exchange('GET', {with_user!r}, [])"), "a URL with credentials in it")
    assert servers["plain"].requests == before
    still_answers(net)


def test_connections_the_server_keeps_open_are_reused(net, servers):
    """GETs to the same checked address share one connection (for https, one handshake); a
    POST, which a server must not receive twice, always gets its own."""
    for name in ("plain", "tls"):
        server = servers[name]
        url = server.url + "/csv"
        ok(net.execute(f"import urllib.request\nurllib.request.urlopen({url!r}).read()"))
        before = server.connections
        ok(net.execute(f"for _ in range(5): urllib.request.urlopen({url!r}).read()"))
        assert server.connections == before
        post = f"urllib.request.urlopen(urllib.request.Request({url!r}, data=b'x')).read()"
        ok(net.execute(f"for _ in range(2): {post}"))
        assert server.connections == before + 2


def test_tls_is_verified(net, servers):
    untrusted = servers["untrusted"].url + "/csv"
    run = net.execute(f"import urllib.request\nurllib.request.urlopen({untrusted!r})")
    refused(run, "TLS certificate verification failed")
    still_answers(net)


def test_requests_per_cell_are_bounded(net, servers):
    url = servers["plain"].url + "/csv"
    run = net.execute(
        f"import urllib.request\nfor _ in range({REQUESTS + 1}): urllib.request.urlopen({url!r})"
    )
    refused(run, f"this cell has made its {REQUESTS} network requests", "network_requests")
    still_answers(net)


@pytest.mark.slow
def test_a_response_the_guest_has_no_room_for_is_refused_and_loses_nothing(start_kernel, servers):
    """Within the network budget but past the guest's free memory: the host never writes the
    answer where it has no room (it would land on the guest's own data), the cell gets
    NetworkUnavailable, and what earlier cells made is intact."""
    kernel = start_kernel(
        [
            f"--WasmKernel.network_allow={json.dumps([servers['plain'].url])}",
            f"--WasmKernel.memory_limit={256 << 20}",
            f"--WasmKernel.network_bytes={100 << 20}",
        ]
    )
    ok(kernel.execute("kept = list(range(10))\nballast = bytearray(150 << 20)"))
    huge = servers["plain"].url + f"/big?{64 << 20}"
    run = kernel.execute(f"import urllib.request\nurllib.request.urlopen({huge!r}).read()")
    refused(run, "does not fit in the sandbox's free memory")
    assert plain(ok(kernel.execute("kept"))) == list(range(10))
    still_answers(kernel)


class NoInterrupts:
    def take(self) -> bool:
        return False


@pytest.mark.nokernel
def test_a_closed_port_is_a_failed_connection_not_a_timeout():
    """The host's side alone: nothing listens, the reply says so at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the block ends
    network = Network([f"http://127.0.0.1:{port}"], NetworkLimits(5, 1 << 20, 30.0))
    message = {"method": "GET", "url": f"http://127.0.0.1:{port}/", "headers": [], "body": b""}
    reply = network.cell().fetch(message | {"timeout": 0.0}, NoInterrupts())  # type: ignore[arg-type]
    assert reply == {"error": "failed", "detail": f"http://127.0.0.1:{port}: connection refused"}


REQUESTS_CODE = """
import requests
answer = requests.get({base!r} + "/csv")
print(answer.status_code, answer.headers["Content-Type"], answer.text, answer.cookies.get_dict())
print(requests.post({base!r} + "/echo", json={{"a": 1}}).json())
session = requests.Session()
print([session.get({base!r} + "/redirect?" + {base!r} + "/csv").history[0].status_code])
try:
    requests.get({unlisted!r})
except requests.ConnectionError as error:
    print(type(error).__name__)
"""


@pytest.mark.slow
def test_requests_installed_with_pip_works_through_the_host(net, native, servers):
    """requests (pure Python, from the package index through %pip): a GET with a cookie, a
    JSON POST, a redirect, and a refusal raised as requests' ConnectionError, as a failed
    connection is natively (the native kernel cannot reach a closed port: the same type)."""
    ok(net.execute("%pip install requests"))
    for base in (servers["plain"].url, servers["tls"].url):
        closed = "http://127.0.0.1:9/"  # the discard port: nothing listens, and not listed
        code = REQUESTS_CODE.format(base=base, unlisted=closed)
        sandboxed = ok(net.execute(code)).stream_text()
        assert sandboxed == ok(native.execute(code)).stream_text()
        assert "200 text/csv a,b" in sandboxed and "{'k': 'v'}" in sandboxed
        assert "{'a': 1}" in sandboxed and "[302]" in sandboxed and "ConnectionError" in sandboxed


@pytest.mark.slow
def test_waiting_on_the_network_counts_against_the_time_limit(start_kernel, servers):
    slow = servers["plain"].url + "/slow"
    kernel = start_kernel(
        [
            f"--WasmKernel.network_allow={json.dumps([servers['plain'].url])}",
            "--WasmKernel.network_timeout=60",
            "--WasmKernel.time_limit=2",
        ]
    )
    run = kernel.execute(f"import urllib.request\nurllib.request.urlopen({slow!r}).read()")
    assert run.content["status"] == "error"
    assert run.content["ename"] == "TimeLimitExceeded", run.content
    still_answers(kernel)


NO_NETWORK_CELLS = (
    "urllib.request.urlopen({url!r} + '/csv')",
    "urllib.request.urlopen({tls!r} + '/csv')",
    "pd.read_csv({url!r} + '/csv')",
    "http.client.HTTPConnection('127.0.0.1', {port}).request('GET', '/')",
    "socket.create_connection(('127.0.0.1', {port}))",
)
CAUGHT = """
import http.client, socket, urllib.error, urllib.request
import pandas as pd
try:
    {cell}
except urllib.error.URLError as error:
    print("URLError", type(error.reason).__name__, error.reason)
except OSError as error:
    print(type(error).__name__, error)
"""


@pytest.mark.parametrize("cell", NO_NETWORK_CELLS)
def test_without_the_setting_nothing_reaches_a_socket(kernel, servers, cell):
    """The default kernel (no network_allow): every way out raises NetworkUnavailable as
    before, and the servers accept no connection at all."""
    plain, tls = servers["plain"], servers["tls"]
    before = (plain.connections, tls.connections)
    code = CAUGHT.format(cell=cell.format(url=plain.url, tls=tls.url, port=plain.port))
    told = ok(kernel.execute(code)).stream_text()
    assert "NetworkUnavailable" in told and "there is no network in this sandbox" in told
    assert (plain.connections, tls.connections) == before
    assert "Network: none" in ok(kernel.execute("%sandbox")).stream_text()
