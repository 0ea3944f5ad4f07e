"""HTTP for the guest, made by the host, only where the operator's allowlist lets it.

The guest has no sockets. When ``WasmKernel.network_allow`` lists hosts, its HTTP libraries
hand each request to the kernel as one ``http`` message (see the guest's
``_wasm_kernel_network``), and ``CellNetwork.fetch`` makes it with urllib3, after
``network_rules`` checked the URL and every address the name resolves to. The connection goes
to the address that was checked, with TLS verified against the name. Redirects are not
followed here: they go back to the guest's library, whose next request is checked again.

Each cell has a budget of requests and bytes (sent and received); each request a deadline. A
request waits on a thread of its own while the guest thread watches the cell's interrupts
(its time limit among them: waiting costs the cell time, not fuel) and the deadline, and
closes the connection when either comes first.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..guest.modules import _wasm_kernel_contract as declared
from ..sandbox.stops import set_by_operator
from .network_rules import Allowlist, IPAddress, RuleError, Target, as_address

if TYPE_CHECKING:  # imported when a cell first makes a request: kernels start without them
    import ssl

    import urllib3
    from urllib3.connection import HTTPConnection

    from ..sandbox.interrupts import Interrupts

POLL = 0.05  # seconds between looks at the cell's interrupts while a request runs
CHUNK = 64 << 10
MAX_WAITING = 8  # requests abandoned (interrupted, past their deadline) still ending
KEPT_CONNECTIONS = 8  # connections kept open for the next request to the same address
KEPT_SECONDS = 30.0  # longest a kept connection waits for one
# a request a server may receive twice: only these go on a kept connection, which the server
# may have closed meanwhile (then the request is sent again on a new one)
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
TIMED_OUT = "deadline"  # an exchange past its deadline: the waiting thread says whose
NO_NETWORK = "there is no network in this sandbox"  # the guest's words: its hint keys on them
# not passed on: the host makes its own connection, and the guest gets whole bodies (a
# response's Content-Length stays, unless its body came in chunks)
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
SET_BY_HOST = HOP_BY_HOP | {"content-length", "host"}  # of a request


@dataclass(frozen=True)
class NetworkLimits:
    """What one cell may do on the network, named as the settings that give it."""

    network_requests: int  # requests per cell
    network_bytes: int  # bytes per cell, request and response bodies together
    network_timeout: float  # seconds per request, from its start to its last byte

    @classmethod
    def of(cls, settings: Any) -> NetworkLimits:
        return cls(settings.network_requests, settings.network_bytes, settings.network_timeout)


class Refusal(Exception):
    """A request the host will not make, or that did not complete; ``kind`` is the reply's
    ``error`` (see the contract's HTTP message)."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


class Network:
    """The kernel's network: its allowlist, limits and TLS trust, shared by all its cells."""

    def __init__(self, allow: list[str] | tuple[str, ...], limits: NetworkLimits):
        self.allowlist = Allowlist(allow)
        self.limits = limits
        self._tls: ssl.SSLContext | None = None  # made on first use: loading trust costs
        self.waiting = threading.BoundedSemaphore(MAX_WAITING)  # see _Exchange.abort
        self.kept = KeptConnections()

    def cell(self) -> CellNetwork:
        return CellNetwork(self)

    def tls(self) -> ssl.SSLContext:
        """The host's trust store (OpenSSL's defaults: SSL_CERT_FILE, SSL_CERT_DIR or the
        system's certificates), with hostname checks: what every https request is held to."""
        if self._tls is None:
            import ssl

            self._tls = ssl.create_default_context()
        return self._tls


class KeptConnections:
    """Connections left open after a complete exchange, each keyed by what was checked for
    it (scheme, address, port, name): a later request reuses one only when its own checks
    chose the same address, so a new DNS answer is judged before any connection is reused.
    It saves a TLS handshake per request to the same server."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple, tuple[float, HTTPConnection]] = {}

    def take(self, key: tuple) -> HTTPConnection | None:
        with self._lock:
            kept = self._kept.pop(key, None)
        if kept is None:
            return None
        since, connection = kept
        if time.monotonic() - since < KEPT_SECONDS and connection.is_connected:
            return connection
        connection.close()
        return None

    def keep(self, key: tuple, connection: HTTPConnection) -> None:
        with self._lock:
            dropped = [self._kept.pop(key, (0.0, None))[1]]
            if len(self._kept) >= KEPT_CONNECTIONS:
                oldest = min(self._kept, key=lambda k: self._kept[k][0])
                dropped.append(self._kept.pop(oldest)[1])
            self._kept[key] = (time.monotonic(), connection)
        for old in dropped:
            if old is not None:
                old.close()


class CellNetwork:
    """One cell's requests, counted against its budget."""

    def __init__(self, network: Network):
        self.network = network
        self.requests = 0
        self.bytes = 0

    def fetch(self, message: dict, interrupts: Interrupts) -> dict:
        """One checked ``http`` message in, the reply for the guest out."""
        try:
            return self._fetch(message, interrupts)
        except Refusal as refusal:
            return {"error": refusal.kind, "detail": refusal.reason}

    def _fetch(self, message: dict, interrupts: Interrupts) -> dict:
        network, limits = self.network, self.network.limits
        if not network.allowlist:
            raise Refusal(declared.HTTP_REFUSED, f"Network is unreachable: {NO_NETWORK}")
        self.requests += 1
        if self.requests > limits.network_requests:
            raise Refusal(
                declared.HTTP_REFUSED,
                f"over budget: this cell has made its {limits.network_requests:,} network"
                f" requests. {set_by_operator('network_requests')}",
            )
        try:
            target = network.allowlist.target(message["url"])
        except RuleError as exc:
            raise Refusal(declared.HTTP_REFUSED, f"{exc}. {ALLOWLIST_HINT}") from None
        body: bytes = message["body"]
        self._spend(len(body))
        own_timeout = message["timeout"]
        seconds = limits.network_timeout
        if own_timeout and own_timeout < seconds:
            seconds = own_timeout
        exchange = _Exchange(network, target, message, self._left(), time.monotonic() + seconds)
        if not network.waiting.acquire(blocking=False):
            raise Refusal(
                declared.HTTP_FAILED,
                "too many earlier requests of this kernel are still being closed; try again",
            )
        threading.Thread(target=exchange.run, name="wasm-kernel-http", daemon=True).start()
        while not exchange.done.wait(POLL):
            if interrupts.take():
                exchange.abort()
                raise Refusal(declared.INTERRUPTED, "interrupted")
            if time.monotonic() >= exchange.deadline:
                exchange.abort()
                break
        outcome = exchange.outcome
        if outcome is None or (isinstance(outcome, Refusal) and outcome.kind == TIMED_OUT):
            if own_timeout and own_timeout <= limits.network_timeout:
                raise Refusal(declared.HTTP_TIMEOUT, f"timed out after {own_timeout:g} s")
            raise Refusal(
                declared.HTTP_REFUSED,
                f"{target.host_header} took longer than the {limits.network_timeout:g} s a"
                f" request may take. {set_by_operator('network_timeout')}",
            )
        if isinstance(outcome, Refusal):
            raise outcome
        status, reason, headers, content = outcome
        self._spend(len(content))
        return {
            "status": status,
            "reason": reason,
            "headers": headers,
            "body": base64.b64encode(content).decode("ascii"),
            "url": message["url"],
        }

    def _left(self) -> int:
        return max(0, self.network.limits.network_bytes - self.bytes)

    def _spend(self, size: int) -> None:
        if size > self._left():
            raise Refusal(declared.HTTP_REFUSED, self._over_bytes(size))
        self.bytes += size

    def _over_bytes(self, size: int) -> str:
        return (
            f"over budget: {size:,} bytes would go past the {self._left():,} bytes left of"
            f" this cell's {self.network.limits.network_bytes:,}."
            f" {set_by_operator('network_bytes')}"
        )


def describe(settings: Any) -> str:
    """The network a kernel's settings grant, in a line, for %sandbox and the banner."""
    allowlist = Allowlist(settings.network_allow)
    if not allowlist:
        return "none"
    return (
        f"HTTP made by the host, only to {allowlist}; per cell {settings.network_requests:,}"
        f" requests and {settings.network_bytes:,} bytes, {settings.network_timeout:g} s a"
        " request"
    )


ALLOWLIST_HINT = (
    "Cells reach only the hosts of WasmKernel.network_allow, which whoever set up this kernel"
    " chooses (%sandbox lists them)"
)


class _Exchange:
    """One request on a thread of its own: resolve, check each address, connect to the one
    checked, send, read at most ``room`` bytes. ``abort`` (from the waiting thread) closes
    the connection, so a server that trickles its answer cannot hold the thread long."""

    def __init__(self, network: Network, target: Target, message: dict, room: int, deadline: float):
        self.network, self.target, self.message = network, target, message
        self.room, self.deadline = room, deadline
        self.done = threading.Event()
        self.outcome: Refusal | tuple[int, str, list[list[str]], bytes] | None = None
        self._connection: HTTPConnection | None = None
        self._key: tuple = ()  # what the connection was checked for (see KeptConnections)
        self._reusable = False  # its response was read whole, and the server keeps it open
        self._aborted = False

    def run(self) -> None:
        import urllib3

        try:
            self.outcome = self._exchange()
        except Refusal as refusal:
            self.outcome = refusal
        except (TimeoutError, urllib3.exceptions.TimeoutError):
            self.outcome = Refusal(TIMED_OUT, "timed out")
        except Exception as exc:  # the server's or the network's failure, said plainly
            self.outcome = Refusal(declared.HTTP_FAILED, _failure(self.target, exc))
        finally:
            self._close()
            self.network.waiting.release()
            self.done.set()

    def abort(self) -> None:
        self._aborted = True
        connection = self._connection
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0 or self._aborted:
            raise Refusal(TIMED_OUT, "timed out")
        return left

    def _exchange(self) -> tuple[int, str, list[list[str]], bytes]:
        response = self._respond()
        declared_length = response.length_remaining
        if declared_length is not None and declared_length > self.room:
            raise Refusal(declared.HTTP_REFUSED, self._too_large(declared_length))
        content = bytearray()
        for chunk in response.stream(CHUNK, decode_content=False):
            content += chunk
            if len(content) > self.room:
                raise Refusal(declared.HTTP_REFUSED, self._too_large(None))
            self._left()
        self._reusable = True
        skipped = HOP_BY_HOP | ({"content-length"} if response.chunked else set())
        headers = [
            [name, value] for name, value in response.headers.items() if name.lower() not in skipped
        ]
        return response.status, response.reason or "", headers, bytes(content)

    def _respond(self) -> urllib3.BaseHTTPResponse:
        """The response's head: on a kept connection to a checked address where there is one
        (an idempotent request only), else on a new connection."""
        import http.client

        import urllib3

        addresses = self._addresses()
        if self.message["method"] in IDEMPOTENT:
            for address in addresses:
                key = self._key_of(address)
                kept = self.network.kept.take(key)
                if kept is None:
                    continue
                self._connection, self._key = kept, key
                kept.timeout = self._left()
                if kept.sock is not None:
                    kept.sock.settimeout(kept.timeout)
                try:
                    self._request(kept)
                    return kept.getresponse()
                except (ConnectionError, http.client.HTTPException, urllib3.exceptions.HTTPError):
                    kept.close()  # the server dropped it meanwhile: a new one below
                    if self._aborted:
                        raise
                break
        return self._send(addresses).getresponse()

    def _key_of(self, address: IPAddress) -> tuple:
        return (self.target.scheme, address, self.target.port, self.target.host)

    def _request(self, connection: HTTPConnection) -> None:
        connection.request(
            self.message["method"],
            self.target.path,
            body=self.message["body"] or None,
            headers=_request_headers(self.message["headers"], self.target),
            preload_content=False,
            decode_content=False,
        )

    def _send(self, addresses: list[IPAddress]) -> HTTPConnection:
        """The request, sent to the first allowed address that takes a connection (a name may
        resolve to addresses this machine cannot reach, IPv6 ones on an IPv4 network). http.
        client checks the method, path and headers before it connects: one it refuses never
        reaches the server."""
        import urllib3
        from urllib3.connection import HTTPConnection, HTTPSConnection

        target, failure = self.target, None
        for address in addresses:
            timeout = self._left()  # for connecting, then for each read
            if target.scheme == "https":
                connection: HTTPConnection = HTTPSConnection(
                    str(address),
                    target.port,
                    timeout=timeout,
                    server_hostname=target.host,
                    ssl_context=self.network.tls(),
                    cert_reqs="CERT_REQUIRED",
                )
            else:
                connection = HTTPConnection(str(address), target.port, timeout=timeout)
            self._connection, self._key = connection, self._key_of(address)
            try:
                self._request(connection)
                return connection
            except urllib3.exceptions.NewConnectionError as exc:  # refused, unreachable:
                failure = exc.__cause__ or exc  # nothing was sent, so the next may take it
        assert failure is not None  # _addresses returns at least one
        raise failure

    def _addresses(self) -> list[IPAddress]:
        """The target's addresses that may be reached, in the resolver's order; else why
        none may."""
        target = self.target
        literal = as_address(target.host)
        if literal is not None:
            candidates = [literal]
        else:
            try:
                found = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
            except socket.gaierror as exc:
                raise Refusal(
                    declared.HTTP_FAILED, f"could not resolve {target.host}: {exc.strerror}"
                ) from None
            candidates = []
            for *_, sockaddr in found:
                address = as_address(str(sockaddr[0]).split("%")[0])
                if address is not None and address not in candidates:
                    candidates.append(address)
        allowed, refusals = [], []
        for address in candidates:
            refusal = self.network.allowlist.address_refusal(target, address)
            if refusal is None:
                allowed.append(address)
            else:
                refusals.append(refusal)
        if allowed:
            return allowed
        raise Refusal(
            declared.HTTP_REFUSED,
            (refusals[0] if refusals else f"{target.host} has no address") + f". {ALLOWLIST_HINT}",
        )

    def _too_large(self, size: int | None) -> str:
        told = f" ({size:,} bytes)" if size is not None else ""
        limit = self.network.limits.network_bytes
        return (
            f"over budget: the response{told} is larger than the {self.room:,} bytes left of"
            f" this cell's {limit:,}. {set_by_operator('network_bytes')}"
        )

    def _close(self) -> None:
        """Keep the connection for the next request if the server keeps it open, else close."""
        connection = self._connection
        if connection is None:
            return
        if self._reusable and not self._aborted and connection.is_connected:
            self.network.kept.keep(self._key, connection)
            return
        with contextlib.suppress(Exception):
            connection.close()


def _request_headers(pairs: list[list[str]], target: Target) -> urllib3.HTTPHeaderDict:
    """The guest's headers, less those about the connection, which the host sets itself."""
    import urllib3
    from urllib3.util import SKIP_HEADER

    headers = urllib3.HTTPHeaderDict()
    for name, value in pairs:
        if name.lower() not in SET_BY_HOST:
            headers.add(name, value)
    headers["Host"] = target.host_header
    if "user-agent" not in {name.lower() for name in headers}:
        headers["User-Agent"] = SKIP_HEADER  # the guest's request, not urllib3's
    return headers


def _failure(target: Target, exc: Exception) -> str:
    """A failed exchange in a line: which server, and what happened."""
    import http.client
    import ssl

    import urllib3

    where = f"{target.scheme}://{target.host_header}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"{where}: TLS certificate verification failed ({exc.verify_message})"
    if isinstance(exc, (ssl.SSLError, urllib3.exceptions.SSLError)):
        return f"{where}: TLS failed ({exc})"
    if isinstance(exc, ConnectionRefusedError):
        return f"{where}: connection refused"
    if isinstance(exc, (http.client.HTTPException, urllib3.exceptions.HTTPError)):
        return f"{where}: HTTP failed ({type(exc).__name__}: {exc})"
    if isinstance(exc, (ValueError, TypeError)):  # a header or method http.client refuses
        return f"the request is not valid HTTP: {exc}"
    return f"{where}: {type(exc).__name__}: {exc}"
