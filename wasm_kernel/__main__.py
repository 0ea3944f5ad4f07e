"""Command line: run the kernel, install its kernelspec, precompile the runtime, run a notebook.

    python -m wasm_kernel -f CONNECTION_FILE [--WasmKernel.fuel=N ...]   (what Jupyter runs)
    python -m wasm_kernel --help-all                                     (every setting)
    python -m wasm_kernel install [--profile notebook|strict ...] [--user | --prefix DIR]
                                  [--name NAME] [--no-precompile] [--cache-dir DIR]
    python -m wasm_kernel precompile [--cache-dir DIR]
    python -m wasm_kernel run NOTEBOOK                                  (execute, print outputs)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from .profiles import PROFILES, Profile

KERNEL_NAME = "wasm-python"
SUBCOMMANDS = ("install", "precompile", "run")


@contextlib.contextmanager
def progress(description: str) -> Iterator[None]:
    """A live elapsed-time indicator: wasmtime's compile gives no progress of its own."""
    from tqdm import tqdm

    bar = tqdm(total=None, desc=description, bar_format="{desc}: {elapsed}", file=sys.stderr)
    done = threading.Event()

    def tick() -> None:
        while not done.wait(interval):
            bar.refresh()

    interval = 0.5 if sys.stderr.isatty() else 15.0  # a log file gets a line now and then
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        bar.close()


def precompile(cache_dir: str | None) -> Path:
    from .cache import RuntimeCache
    from .runtime import load_runtime

    cache = RuntimeCache(Path(cache_dir) if cache_dir else None)
    runtime = load_runtime()
    compiled = cache.load(runtime, progress=progress)
    entry = cache.entry_dir(runtime)
    print(f"compiled runtime {runtime.name} ready in {entry}", file=sys.stderr)
    del compiled
    return entry


def kernelspec_name(profile: Profile) -> str:
    return "-".join(filter(None, (KERNEL_NAME, profile.kernel_suffix)))


def install(args: argparse.Namespace) -> None:
    """Register one kernelspec per chosen profile (each fixes its profile in its argv)."""
    for name in args.profile or PROFILES:
        install_kernelspec(PROFILES[name], args)
    if not args.no_precompile:
        precompile(args.cache_dir)


def install_kernelspec(profile: Profile, args: argparse.Namespace) -> None:
    from jupyter_client.kernelspec import KernelSpecManager

    name = args.name or kernelspec_name(profile)
    source = resources.files("wasm_kernel") / "kernelspec"
    with tempfile.TemporaryDirectory() as staging:
        for item in source.iterdir():
            if item.is_file():
                (Path(staging) / item.name).write_bytes(item.read_bytes())
        spec = json.loads((Path(staging) / "kernel.json").read_text())
        spec["argv"][0] = sys.executable
        spec["argv"].append(f"--WasmKernel.profile={profile.name}")
        if not profile.mounts:  # pinned: no config file or variable can add folders to it
            spec["argv"].append("--WasmKernel.mounts=[]")
        if args.cache_dir:  # kernels use the cache this install precompiled
            spec["argv"].append(f"--WasmKernel.cache_dir={Path(args.cache_dir).resolve()}")
        if args.display_name:
            spec["display_name"] = args.display_name
        elif profile.kernel_suffix:
            spec["display_name"] = f"{spec['display_name'].removesuffix(')')}, {profile.name})"
        (Path(staging) / "kernel.json").write_text(json.dumps(spec, indent=1))
        in_venv = sys.prefix != sys.base_prefix
        prefix = args.prefix or (sys.prefix if in_venv and not args.user else None)
        path = KernelSpecManager().install_kernel_spec(
            staging, name, user=prefix is None, prefix=prefix
        )
    print(f"installed kernelspec {name!r} (profile {profile.name}) in {path}", file=sys.stderr)


def run_notebook(args: argparse.Namespace) -> int:
    """Execute a notebook on this kernel and print each cell's outputs as text."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = nbformat.read(args.notebook, as_version=4)
    client = NotebookClient(
        notebook, kernel_name=args.kernel_name, timeout=args.timeout,
        resources={"metadata": {"path": str(Path(args.notebook).parent)}},
    )
    status = 0
    try:
        client.execute()
    except CellExecutionError as exc:
        print(exc, file=sys.stderr)
        status = 1
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        print(f"In [{cell.get('execution_count') or ' '}]:")
        print("    " + cell.source.replace("\n", "\n    "))
        for output in cell.get("outputs", []):
            print(_describe_output(output))
        print()
    return status


def _describe_output(output: dict) -> str:
    kind = output["output_type"]
    if kind == "stream":
        return output["text"].rstrip("\n")
    if kind == "error":
        return f"{output['ename']}: {output['evalue']}"
    data = output.get("data", {})
    if "text/plain" in data:
        return data["text/plain"]
    return ", ".join(f"[{mime}: {len(str(value))} characters]" for mime, value in data.items())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in SUBCOMMANDS:
        from .app import WasmKernelApp

        WasmKernelApp.launch_instance(argv=argv)
        return 0
    parser = argparse.ArgumentParser(prog="python -m wasm_kernel")
    commands = parser.add_subparsers(dest="command", required=True)
    cmd_install = commands.add_parser("install", help="register the kernelspec and precompile")
    cmd_install.add_argument(
        "--profile", choices=sorted(PROFILES), action="append",
        help="register this profile's kernelspec (repeatable; default: every profile). "
        + "; ".join(f"{p.name}: {p.summary}" for p in PROFILES.values()),
    )
    cmd_install.add_argument(
        "--name", help=f"kernelspec name, with one --profile (default: {KERNEL_NAME}[-PROFILE])"
    )
    cmd_install.add_argument("--display-name")
    cmd_install.add_argument("--user", action="store_true", help="install for this user")
    cmd_install.add_argument("--prefix", help="install under this prefix (default: the venv)")
    cmd_install.add_argument("--no-precompile", action="store_true")
    cmd_install.add_argument("--cache-dir")
    cmd_pre = commands.add_parser("precompile", help="build the compiled-runtime cache entry")
    cmd_pre.add_argument("--cache-dir", help="cache folder (default: per-user cache)")
    cmd_run = commands.add_parser("run", help="execute a notebook and print its outputs")
    cmd_run.add_argument("notebook")
    cmd_run.add_argument("--kernel-name", default=KERNEL_NAME)
    cmd_run.add_argument("--timeout", type=int, default=600)
    args = parser.parse_args(argv)
    if args.command == "install" and (args.name or args.display_name) and (
        len(args.profile or PROFILES) != 1
    ):
        parser.error("--name and --display-name need exactly one --profile")
    if args.command == "install":
        install(args)
    elif args.command == "precompile":
        precompile(args.cache_dir)
    else:
        return run_notebook(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
