"""HTTP through the kernel, for a guest that has no sockets: loaded only when the operator
allows some hosts (``WasmKernel.network_allow``; the host calls ``allow_network``).

The guest's HTTP libraries keep doing everything but the exchange itself: ``http.client``
builds the request (and so do ``urllib.request`` and ``pandas.read_csv(url)``, which use it),
follows redirects, handles cookies and encodings. Only where bytes would go to a socket does
the request become one ``http`` message; the host checks it against the allowlist, makes it,
and answers with the whole response, which the library then reads as if from a socket.
``requests`` (a pure-Python package, installed with %pip) gets an adapter that does the same.
Each redirect is a new request, checked again by the host.

A request the host refuses raises ``socket.NetworkUnavailable`` with the host's reason,
wrapped as each library wraps a failed connection (``URLError``, requests'
``ConnectionError``). TLS is the host's: it always verifies certificates, whatever a
context passed here says.
"""

import base64
import errno
import http.client
import io
import sys

import _wasm_kernel_contract as contract

REQUEST_LIMIT = (32 << 20) + (1 << 20)  # a request's body (the message's bound) and its head
_CHUNKED_END = b"0\r\n\r\n"


def _kernel():
    return sys.modules["_wasm_kernel"]


def refused(detail):
    """The sandbox's NetworkUnavailable, with the host's reason."""
    unavailable = sys.modules["_wasm_kernel_sandbox"].NetworkUnavailable
    return unavailable(errno.ENETUNREACH, detail)


def exchange(method, url, headers, body=b"", timeout=None):
    """One request, made by the host: (status, reason, [(name, value)...], body)."""
    fields = {
        "method": str(method),
        "url": str(url),
        "headers": [[str(name), str(value)] for name, value in headers],
        "body": base64.b64encode(bytes(body)).decode("ascii"),
    }
    if isinstance(timeout, (int, float)) and timeout > 0:
        fields["timeout"] = float(timeout)
    _check_bounds(fields, len(body))
    try:
        reply = _kernel().call_host(contract.HTTP, **fields)
    except OSError:  # the host could not hand the answer over
        raise refused(
            "the response could not be delivered: it does not fit in the sandbox's free"
            " memory (WasmKernel.memory_limit)"
        ) from None
    error = reply.get("error")
    if error is None and isinstance(reply.get("status"), int):
        pairs = [(name, value) for name, value in reply.get("headers", ())]
        return reply["status"], reply.get("reason", ""), pairs, base64.b64decode(reply["body"])
    detail = reply.get("detail") or "network requests are made only while a cell runs"
    if error == contract.INTERRUPTED:
        raise _kernel().interruption()
    if error == contract.HTTP_TIMEOUT:
        raise TimeoutError(detail)
    raise refused(detail)


def _check_bounds(fields, body_size):
    """What the contract bounds, said plainly here rather than refused as a bad message."""
    limits = {field.name: field.limit for field in contract.HTTP.fields}
    headers = fields["headers"]
    if body_size > limits["body"]:
        raise refused(f"the request's body is larger than the {limits['body']:,} bytes allowed")
    if len(headers) > limits["headers"] or any(
        len(part) > contract.HEADER_LIMIT for pair in headers for part in pair
    ):
        raise refused("the request has too many headers, or one too long, to be sent")
    if len(fields["url"]) > limits["url"] or len(fields["method"]) > limits["method"]:
        raise refused("the request's URL or method is too long to be sent")


# -- http.client ------------------------------------------------------------------------------


def _parse_request(raw):
    """The method, target, headers and body of the request http.client wrote."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target = (lines[0].split(" ") + [""])[:2]
    headers = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t") and headers:  # a value continued (putheader's many values)
            headers[-1] = (headers[-1][0], headers[-1][1] + " " + line.strip())
        elif ":" in line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    chunked = any(n.lower() == "transfer-encoding" and "chunked" in v.lower() for n, v in headers)
    if chunked:
        rest = _unchunk(rest)
        headers = [(n, v) for n, v in headers if n.lower() != "transfer-encoding"]
    return method, target, headers, rest


def _unchunk(data):
    body, position = bytearray(), 0
    while True:
        end = data.find(b"\r\n", position)
        if end < 0:
            raise http.client.HTTPException("malformed chunked request body")
        size = int(data[position:end].split(b";")[0], 16)
        if size == 0:
            return bytes(body)
        body += data[end + 2 : end + 2 + size]
        position = end + 4 + size


def _complete(raw):
    """Whether the request written so far is all of it (its body too)."""
    head, separator, rest = raw.partition(b"\r\n\r\n")
    if not separator:
        return False
    text = head.decode("latin-1").lower()
    if "transfer-encoding:" in text and "chunked" in text:
        return rest.endswith(_CHUNKED_END)
    for line in text.split("\r\n"):
        if line.startswith("content-length:"):
            try:
                return len(rest) >= int(line.partition(":")[2])
            except ValueError:
                return True
    return True


def response_bytes(status, reason, headers, body):
    """A response as the server would have sent it, with the whole body and its length."""
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if not any(name.lower() == "content-length" for name, _ in headers):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + body


class _HostSocket:
    """What a connection holds as its socket: it gathers each request, and the host's whole
    response is what reading it gives."""

    def __init__(self, connection):
        self._connection = connection
        self._sent = bytearray()
        self._response = None

    def sendall(self, data):
        if len(self._sent) + len(data) > REQUEST_LIMIT:
            raise refused(f"the request is larger than the {REQUEST_LIMIT:,} bytes one may send")
        self._sent += data

    def send_if_complete(self):
        if self._response is None and _complete(self._sent):
            self.exchange()

    def exchange(self):
        connection = self._connection
        method, target, headers, body = _parse_request(bytes(self._sent))
        self._sent = bytearray()
        if not target.lower().startswith(("http://", "https://")):  # not a proxy's form
            host = connection._tunnel_host or connection.host
            port = connection._tunnel_port if connection._tunnel_host else connection.port
            netloc = f"[{host}]" if ":" in host else host
            target = f"{connection.scheme}://{netloc}:{port}{target}"
        timeout = connection.timeout if isinstance(connection.timeout, (int, float)) else None
        self._response = response_bytes(*exchange(method, target, headers, body, timeout))

    def makefile(self, *args, **kwargs):
        if self._response is None:
            self.exchange()
        response, self._response = self._response, None
        return io.BytesIO(response)

    def settimeout(self, timeout):
        pass

    def close(self):
        self._sent = bytearray()


class HostHTTPConnection(http.client.HTTPConnection):
    """http.client's connection, its exchanges made by the host."""

    scheme = "http"

    def connect(self):
        sys.audit("http.client.connect", self, self.host, self.port)
        self.sock = _HostSocket(self)

    def endheaders(self, message_body=None, *, encode_chunked=False):
        """Sent as soon as it is complete: its failure is then the request's, which urllib
        wraps in URLError, as it wraps a failed connection."""
        super().endheaders(message_body, encode_chunked=encode_chunked)
        if isinstance(self.sock, _HostSocket):
            self.sock.send_if_complete()


class HostHTTPSConnection(HostHTTPConnection):
    """https, with TLS made and verified by the host: ``context`` and ``check_hostname``
    are accepted and have no effect (the host always verifies)."""

    scheme = "https"
    default_port = http.client.HTTPS_PORT

    def __init__(self, host, port=None, *args, context=None, check_hostname=None, **kwargs):
        super().__init__(host, port, *args, **kwargs)


def _no_tls_context(*args, **kwargs):
    """urllib's HTTPSHandler asks http.client for a default context; TLS is the host's, so
    there is none (None)."""


def response_object(status, reason, headers, body, method="GET"):
    """An http.client response read from the host's answer (requests keeps one for cookies)."""

    class _Reader:
        def makefile(self, *args, **kwargs):
            return io.BytesIO(response_bytes(status, reason, headers, body))

    response = http.client.HTTPResponse(_Reader(), method=method)
    response.begin()
    return response


# -- urllib.request, requests -------------------------------------------------------------------


def _fix_urllib_request(module):
    """Imported before the network was allowed, urllib.request has no https handler (and the
    sandbox's refusal stands in): give it one, and a default opener that has it."""
    if not hasattr(module, "HTTPSHandler"):

        class HTTPSHandler(module.AbstractHTTPHandler):
            def https_open(self, request):
                return self.do_open(http.client.HTTPSConnection, request)

            https_request = module.AbstractHTTPHandler.do_request_

        module.HTTPSHandler = HTTPSHandler
    if "https_open" in vars(module.UnknownHandler):
        del module.UnknownHandler.https_open
    opener = module._opener
    if opener is not None and "https" not in opener.handle_open:
        module.install_opener(None)


def _body_bytes(body):
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if hasattr(body, "read"):
        data = body.read(REQUEST_LIMIT + 1)
    else:  # an iterable of chunks
        data = b""
        for chunk in body:
            data += chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)
            if len(data) > REQUEST_LIMIT:
                break
    data = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if len(data) > REQUEST_LIMIT:
        raise refused(f"the request is larger than the {REQUEST_LIMIT:,} bytes one may send")
    return data


def _requests_timeout(timeout):
    if isinstance(timeout, tuple):  # (connect, read): the host bounds the whole request
        given = [part for part in timeout if isinstance(part, (int, float))]
        return sum(given) if given else None
    return timeout


def send_through_host(
    adapter, request, stream=False, timeout=None, verify=True, cert=None, proxies=None
):
    """requests' HTTPAdapter.send, made by the host."""
    from requests import exceptions
    from urllib3 import HTTPHeaderDict, HTTPResponse

    try:
        status, reason, headers, body = exchange(
            request.method,
            request.url,
            request.headers.items(),
            _body_bytes(request.body),
            _requests_timeout(timeout),
        )
    except TimeoutError as exc:
        raise exceptions.ReadTimeout(exc, request=request) from exc
    except OSError as exc:
        raise exceptions.ConnectionError(exc, request=request) from exc
    raw = HTTPResponse(
        body=io.BytesIO(body),
        headers=HTTPHeaderDict(headers),
        status=status,
        reason=reason,
        version=11,
        version_string="HTTP/1.1",
        preload_content=False,
        decode_content=True,
        original_response=response_object(status, reason, headers, b"", request.method),
        request_method=request.method,
        request_url=request.url,
    )
    return adapter.build_response(request, raw)


def _fix_requests_adapters(module):
    module.HTTPAdapter.send = send_through_host


# -- switching it on ----------------------------------------------------------------------------


def install():
    """Route the guest's HTTP libraries through the host, now and as they are imported."""
    try:
        import ssl  # noqa: F401
    except ImportError:
        http.client._create_https_context = _no_tls_context
    http.client.HTTPConnection = HostHTTPConnection
    http.client.HTTPSConnection = HostHTTPSConnection
    sandbox = sys.modules["_wasm_kernel_sandbox"]
    for name, fixup in (
        ("urllib.request", _fix_urllib_request),
        ("requests.adapters", _fix_requests_adapters),
    ):
        sandbox.IMPORT_FIXUPS[name] = fixup
        if name in sys.modules:
            fixup(sys.modules[name])
