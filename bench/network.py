"""One HTTP request through the sandbox against the same request made on the host, in one run.

    python bench/network.py [--requests N] [--reps R]

A server on 127.0.0.1 answers GET /data with 1 KiB. The same loop of N ``urllib.request
.urlopen(URL).read()`` calls runs three ways, each timed around the loop only: directly in
this process (the host), in a cell of the native ipykernel, and in a cell of wasm-kernel
started with ``--WasmKernel.network_allow=URL`` (every request then goes guest -> kernel ->
urllib3 -> server and back). Prints min / median milliseconds per request over R repetitions
and the ratios against the host and against the native kernel.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from startup_roundtrip import KERNELS, started

BODY = b"x" * 1024
LOOP = """
import time, urllib.request
began = time.perf_counter()
for _ in range({n}):
    urllib.request.urlopen({url!r}).read()
(time.perf_counter() - began) / {n}
"""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # as servers made for keep-alive do: else each answer on a kept connection waits for the
    # client's delayed ACK (40 ms) between its head and its body
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args: object) -> None:
        pass


def host_loop(url: str, n: int) -> float:
    began = time.perf_counter()
    for _ in range(n):
        with urllib.request.urlopen(url) as response:
            response.read()
    return (time.perf_counter() - began) / n


def kernel_loop(client, code: str) -> float:  # type: ignore[no-untyped-def]
    values: list[str] = []

    def keep(message: dict) -> None:
        if message["msg_type"] == "execute_result":
            values.append(message["content"]["data"]["text/plain"])

    reply = client.execute_interactive(code, timeout=600, output_hook=keep)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(reply["content"].get("evalue"))
    return float(ast.literal_eval(values[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    url = origin + "/data"
    allow = [
        "--WasmKernel.network_allow=" + json.dumps([origin]),
        f"--WasmKernel.network_requests={args.requests + 1}",
    ]
    kernels = {"native": (KERNELS["native"], []), "wasm": (KERNELS["wasm"], allow)}
    clients, managers = {}, []
    samples: dict[str, list[float]] = {"host": [], "native": [], "wasm": []}
    code = LOOP.format(n=args.requests, url=url)
    try:
        for label, (name, arguments) in kernels.items():
            manager, clients[label] = started(name, arguments)
            managers.append(manager)
            kernel_loop(clients[label], LOOP.format(n=2, url=url))  # imports, first connection
        host_loop(url, 2)
        for rep in range(args.reps):
            order = ("host", "native", "wasm") if rep % 2 == 0 else ("wasm", "native", "host")
            for label in order:
                if label == "host":
                    samples[label].append(host_loop(url, args.requests))
                else:
                    samples[label].append(kernel_loop(clients[label], code))
    finally:
        for client in clients.values():
            client.stop_channels()
        for manager in managers:
            manager.shutdown_kernel(now=True)
        server.shutdown()
    print(f"{args.requests} requests of 1 KiB per repetition, {args.reps} repetitions")
    print(f"{'where':<8}{'min ms':>10}{'median ms':>12}")
    for label, values in samples.items():
        print(f"{label:<8}{min(values) * 1e3:>10.3f}{statistics.median(values) * 1e3:>12.3f}")
    wasm = statistics.median(samples["wasm"])
    print(
        f"wasm/host {wasm / statistics.median(samples['host']):.2f},"
        f" wasm/native {wasm / statistics.median(samples['native']):.2f} (medians)"
    )


if __name__ == "__main__":
    main()
