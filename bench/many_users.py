"""Memory of idle kernels on a node shared by several users: PSS per idle kernel.

Run as root (``python bench/many_users.py``, from an environment where wasm-kernel was
installed for every user, as root, with ``install --sys-prefix``): it makes real local users
(tests/local_users.py: useradd with fresh homes, setpriv to act as them), removes them after,
and has each user start kernels through jupyter_client, as a notebook server of theirs would:
``wasm-python`` (the default provisioner, so the user's kernel server hands them out) and
the native ipykernel (``python3``) the same way, in the same run. Each kernel runs one
cell (``x = 1``), then sits idle; after ``--settle`` seconds the memory of every process of
each user, but the one holding the kernels, is read from ``/proc/PID/smaps_rollup`` (PSS,
private pages, RSS; see memory_use.py). Not a test: it measures, and says the machine's load.

A user's first wasm kernel is launched the ordinary way while their kernel server loads (as
happens when a user opens their first notebook); the others are handed out by the server once
it answers. Both kinds are shown apart.

PSS shares a page among every process that maps it, on the whole machine: other people's
kernels mapping the same compiled runtime would lower these kernels' share. So the kernels
load a copy of the installed runtime cache made for the run (``cp -a``: same files, new
inodes) unless ``--installed-cache`` is given; the private figure (pages no other process
maps) does not depend on that.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from memory_use import process_kib, unmapped_checkpoint_kib

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # real-user helpers
from local_users import LocalUser, end_processes, local_users

WASM, NATIVE = "wasm-python", "python3"
SERVER_MODULE = "wasm_kernel.server.kernel_server"
START_LIMIT = 600.0  # seconds for one user's kernels to be started on a loaded machine

# Run as each user: start the kernels, run a cell in each, say their pids, wait for a line on
# stdin, shut them down. After the first wasm kernel it waits for the kernel server to answer,
# as a user's later notebooks would find it.
_HOLD_KERNELS = """
import json, socket, sys, time
from jupyter_client.manager import KernelManager

kernel, count, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def start():
    manager = KernelManager(kernel_name=kernel)
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=limit)
    reply = client.execute_interactive("x = 1", timeout=limit)
    client.stop_channels()
    if reply["content"]["status"] != "ok":
        sys.exit(f"a cell failed in {kernel}: {reply['content']}")
    served = type(manager.provisioner.process).__name__ == "ServedKernel"
    return manager, {"pid": manager.provisioner.pid, "served": served}

def server_answers():
    from wasm_kernel.server import kernel_server
    fingerprint = kernel_server.code_fingerprint(sys.executable)
    folder = kernel_server.private_folder(kernel_server.runtime_folder(fingerprint))
    path = str(kernel_server.socket_path(folder))
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(path)
                return
            except OSError:
                time.sleep(0.5)
    sys.exit("the kernel server never answered")

managers, kernels = [], []
for number in range(count):
    manager, described = start()
    managers.append(manager)
    kernels.append(described)
    if number == 0 and kernel != "python3":
        server_answers()
print(json.dumps(kernels), flush=True)
sys.stdin.readline()
for manager in managers:
    manager.shutdown_kernel(now=False)
"""


@dataclass
class Holder:
    """A user's process holding their kernels, and what it said of them."""

    user: LocalUser
    process: subprocess.Popen[str]
    kernels: list[dict] = field(default_factory=list)


def hold_kernels(user: LocalUser, kernel: str, count: int, env: dict[str, str]) -> Holder:
    command = [
        "setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", "--",
        "env", "-i", *(f"{k}={v}" for k, v in user.env(**env).items()),
        sys.executable, "-c", _HOLD_KERNELS, kernel, str(count), str(START_LIMIT),
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd=user.home / "project",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Holder(user, process)


def wait_ready(holder: Holder) -> None:
    assert holder.process.stdout is not None
    line = holder.process.stdout.readline()  # bounded by START_LIMIT inside the holder
    if not line:
        raise SystemExit(
            f"{holder.user.name}'s kernels did not start (exit {holder.process.wait()})"
        )
    holder.kernels = json.loads(line)


def release(holder: Holder) -> None:
    assert holder.process.stdin is not None
    with contextlib.suppress(OSError):  # a holder that already ended
        holder.process.stdin.write("\n")
        holder.process.stdin.close()
    try:
        holder.process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        holder.process.kill()


def memory_of(holder: Holder, runtimes: set[str]) -> dict[str, dict[str, int]]:
    """KiB (Pss, private, Rss) of each kind of the user's processes but the holder; the
    compiled runtimes they map are added to ``runtimes``."""
    served = {k["pid"] for k in holder.kernels if k["served"]}
    launched = {k["pid"] for k in holder.kernels if not k["served"]}
    totals: dict[str, dict[str, int]] = {}
    for process in psutil.process_iter(["uids", "cmdline"]):
        if process.info["uids"] is None or process.info["uids"].real != holder.user.uid:
            continue
        if process.pid == holder.process.pid:
            continue
        if process.pid in served:
            kind = "served kernels"
        elif process.pid in launched:
            kind = "launched kernels"
        elif SERVER_MODULE in " ".join(process.info["cmdline"] or []):
            kind = "kernel server"
        else:
            kind = "other"
        try:
            kib = process_kib(process.pid)
            kib["Private"] = private_kib(process.pid)
            runtimes.update(mapped_runtimes(process.pid))
        except OSError:  # ended meanwhile
            continue
        bucket = totals.setdefault(kind, {"count": 0, "Pss": 0, "Private": 0, "Rss": 0})
        bucket["count"] += 1
        for key in ("Pss", "Private", "Rss"):
            bucket[key] += kib[key]
    return totals


def mapped_runtimes(pid: int) -> set[str]:
    """The compiled runtime files a process maps, to show which cache the kernels loaded."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split(maxsplit=5)[-1] for line in maps if line.endswith(".cwasm")}


def private_kib(pid: int) -> int:
    """Pages only this process maps (its USS), plus the wasm checkpoint's unmapped pages."""
    private = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Private_Clean", "Private_Dirty"):
            private += int(value.split()[0])
    return private + unmapped_checkpoint_kib(pid)


def measure(
    users: list[LocalUser], kernel: str, per_user: int, settle: float, env: dict[str, str]
) -> dict:
    holders = [hold_kernels(user, kernel, per_user, env) for user in users]
    try:
        began = time.monotonic()
        for holder in holders:
            wait_ready(holder)
        started = time.monotonic() - began
        time.sleep(settle)
        load = os.getloadavg()
        kinds: dict[str, dict[str, int]] = {}
        runtimes: set[str] = set()
        for holder in holders:
            for kind, bucket in memory_of(holder, runtimes).items():
                summed = kinds.setdefault(kind, dict.fromkeys(bucket, 0))
                for key, value in bucket.items():
                    summed[key] += value
    finally:
        for holder in holders:
            release(holder)
            end_processes(holder.user)  # the kernel server, before the next measure
    kernels = len(users) * per_user
    everything = {key: sum(b[key] for b in kinds.values()) for key in ("Pss", "Private", "Rss")}
    return {
        "kernel": kernel,
        "kernels": kernels,
        "start_seconds": round(started, 1),
        "load_average": [round(x, 2) for x in load],
        "kinds": kinds,
        "runtimes_mapped": sorted(runtimes),
        "per_idle_kernel_mib": {k: round(v / kernels / 1024, 1) for k, v in everything.items()},
    }


def report(results: list[dict], users: int, per_user: int, settle: float) -> str:
    lines = [
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs,"
        f" {psutil.virtual_memory().total / 2**30:.1f} GiB; {users} users x {per_user} kernels,"
        f" each ran `x = 1`, then {settle:.0f} s idle",
        "",
        "| kernel | per idle kernel: PSS | private | RSS | load average (1, 5, 15 min) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for result in results:
        mib = result["per_idle_kernel_mib"]
        load = ", ".join(f"{x:.2f}" for x in result["load_average"])
        lines.append(
            f"| {result['kernel']} | {mib['Pss']} MiB | {mib['Private']} MiB | {mib['Rss']} MiB"
            f" | {load} |"
        )
    lines += ["", "| kernel | processes | count | PSS MiB | private MiB | RSS MiB |"]
    lines.append("| --- | --- | --- | --- | --- | --- |")
    for result in results:
        for kind, bucket in sorted(result["kinds"].items()):
            lines.append(
                f"| {result['kernel']} | {kind} | {bucket['count']}"
                + "".join(f" | {bucket[key] / 1024:.0f}" for key in ("Pss", "Private", "Rss"))
                + " |"
            )
    for result in results:
        if result["runtimes_mapped"]:
            lines.append(
                f"\n{result['kernel']} kernels mapped: {', '.join(result['runtimes_mapped'])}"
            )
    return "\n".join(lines)


def runtime_copy(stack: contextlib.ExitStack) -> Path:
    """A copy of this environment's shared runtime cache, root's and readable by all,
    removed after the run."""
    installed = Path(sys.prefix) / "share" / "wasm-kernel" / "cache"
    if not installed.is_dir():
        raise SystemExit(f"no runtime cache at {installed}: run `python -m wasm_kernel install`")
    place = Path(tempfile.mkdtemp(prefix="wasm-kernel-bench-"))
    stack.callback(shutil.rmtree, place, ignore_errors=True)
    place.chmod(0o755)
    copy = place / "cache"
    subprocess.run(["cp", "-a", str(installed), str(copy)], check=True)
    return copy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--kernels-per-user", type=int, default=5)
    parser.add_argument("--settle", type=float, default=30.0, help="idle seconds before reading")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--installed-cache",
        action="store_true",
        help="load the installed runtime cache itself, shared with whatever else maps it",
    )
    options = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: it makes (and removes) real local users")
    results = []
    with contextlib.ExitStack() as stack:
        env = {} if options.installed_cache else {"WASM_KERNEL_CACHE_DIR": str(runtime_copy(stack))}
        users = stack.enter_context(local_users(options.users))
        for kernel in (NATIVE, WASM):
            results.append(measure(users, kernel, options.kernels_per_user, options.settle, env))
    print(report(results, options.users, options.kernels_per_user, options.settle))
    if options.json:
        options.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
