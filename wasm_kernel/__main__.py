"""Command line: run the kernel, install its kernelspecs, precompile the runtime, run a notebook.

``python -m wasm_kernel --help`` lists the subcommands; ``--help-all`` every kernel setting.
Anything that is not one of our subcommands goes to the kernel application (that is what
Jupyter runs: ``python -m wasm_kernel -f CONNECTION_FILE [--WasmKernel.fuel=N ...]``).
The subcommands and their arguments are declared in commands.py; this module runs them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .commands import SUBCOMMANDS, parser
from .install_hints import pip_install
from .jupyter.kernelspecs import KERNEL_NAME, kernelspec, kernelspec_name, write_kernelspec
from .settings.profiles import DEFAULT_PROFILE, PROFILES, Profile

if TYPE_CHECKING:
    from .images.image_folder import ImageFolder

# boot images kept per cache entry, the newest one included: installations with other guest
# code that share the cache (a development checkout, a CI copy) keep theirs (~55 MiB each)
BOOT_IMAGES_KEPT = 3


@contextlib.contextmanager
def progress(description: str) -> Iterator[None]:
    """A live elapsed-time indicator on a terminal (wasmtime's compile gives no progress of
    its own); elsewhere (a log, CI) one whole line when the step is done, no carriage return."""
    from tqdm import tqdm

    started = time.monotonic()
    if not sys.stderr.isatty():
        yield
        elapsed = tqdm.format_interval(time.monotonic() - started)
        print(f"{description}: done in {elapsed}", file=sys.stderr, flush=True)
        return
    bar = tqdm(total=None, desc=description, bar_format="{desc}: {elapsed}", file=sys.stderr)
    done = threading.Event()

    def tick() -> None:
        while not done.wait(0.5):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        bar.close()


def precompile(cache_dir: str | None, seed: bool = False) -> Path:
    """Fetch, compile and check everything kernels load, into ``cache_dir`` (default: the
    kernels' default cache), each step only if its result is missing, saying which were
    there already. ``seed``: first take what the installing user's own cache already built
    (a shared cache then costs seconds, not minutes)."""
    from .runtime import guest_packages, runtime_files, runtime_sources
    from .runtime.cache import RuntimeCache
    from .runtime.runtime import RuntimeUnavailable, load_runtime

    cache = RuntimeCache(Path(cache_dir) if cache_dir else None)
    runtime = load_runtime(cache_dir=cache.directory)
    if seed:
        _seed_from_own_cache(cache, runtime)
    absent = runtime_files.missing(runtime)
    if absent:
        with progress(f"downloading the runtime ({runtime.wheel})"):
            runtime_files.fetch(runtime, absent)
    else:
        print(f"the runtime {runtime.wheel} is already in the cache", file=sys.stderr)
    if runtime_sources.sources_zip(runtime).is_file() or not runtime.source_wheels:
        sources = None
    else:
        with progress("downloading the sources of the runtime's packages (for tracebacks)"):
            try:
                sources = runtime_sources.fetch(runtime)
            except (RuntimeUnavailable, OSError, zipfile.BadZipFile) as exc:
                sources = None
                print(f"warning: tracebacks will show no library source: {exc}", file=sys.stderr)
    if sources is not None:
        print(f"sources of {sources} library modules ready", file=sys.stderr)
    compiled = cache.load(runtime, progress=progress)
    entry = cache.entry_dir(runtime)
    print(f"compiled runtime {runtime.name} ready in {entry}", file=sys.stderr)
    packages = guest_packages.load_manifest()
    try:
        site = guest_packages.locate(packages, cache.directory, compiled)
    except guest_packages.PackagesUnavailable:
        with progress(f"downloading and precompiling the guest's packages ({packages.name})"):
            site = guest_packages.prepare(packages, cache.directory, compiled)
    print(f"guest packages {packages.name} ready in {site.parent}", file=sys.stderr)
    if runtime.restorable:
        make_boot_image(compiled, entry)
    compiled.close()
    compile_host_code()
    return entry


def _seed_from_own_cache(cache: Any, runtime: Any) -> None:
    """Take into ``cache`` what the installing user's kernels load today (their default
    cache, or their own per-user one), where ``cache`` lacks it."""
    from .runtime import guest_packages, shared_cache
    from .runtime.runtime import default_cache_dir, user_cache_dir

    packages = guest_packages.load_manifest()
    cache.directory.mkdir(parents=True, exist_ok=True)
    for own in dict.fromkeys((default_cache_dir(), user_cache_dir())):
        if not own.is_dir():
            continue
        names = [
            cache.entry_dir(runtime).name,
            runtime.module.path.parent.name,
            *(path.name for path in own.glob(f"guest-{packages.name}-*")),
        ]
        taken = shared_cache.seed(cache.directory, own, names)
        if taken:
            print(f"took {', '.join(taken)} from {own}, to be checked", file=sys.stderr)


def compile_host_code() -> None:
    """Write the bytecode of the kernel's own modules, where they are writable: an editable
    install under PYTHONDONTWRITEBYTECODE never writes it, and compiling them from source
    again cost each kernel start about 90 ms (a wheel install has it from pip already).
    The guest's modules are left out: the guest interpreter compiles those for itself."""
    import compileall
    import re

    from .runtime.cache import writable

    package = Path(__file__).resolve().parent
    if writable(package):
        compileall.compile_dir(package, quiet=2, rx=re.compile(r"[/\\]guest[/\\]"))


def make_boot_image(compiled: Any, entry: Path) -> None:
    """The image of a freshly booted guest, which kernels start from (see images.py)."""
    from .images import images
    from .runtime.cache import writable
    from .sandbox.limits import Limits
    from .sandbox.sandbox import build_boot_image
    from .settings.profiles import PROFILES

    path = images.boot_image_path(entry)
    if path.exists() and images.boot_memory_path(path).exists():
        return
    if not writable(entry):
        print(f"{entry} is read-only: no boot image; kernels boot without one", file=sys.stderr)
        return
    _remove_old_boot_images(entry)
    limits = Limits.of(PROFILES[DEFAULT_PROFILE])  # the boot turn has budgets of its own
    try:
        with progress("building the boot image"):
            size = build_boot_image(compiled, limits, path)
    except (OSError, images.ImageError, RuntimeError) as exc:
        print(f"could not build the boot image ({exc}); kernels boot without one", file=sys.stderr)
        return
    print(f"boot image {path.name} ({size / (1 << 20):.1f} MiB) ready", file=sys.stderr)


def _remove_old_boot_images(entry: Path) -> None:
    """Make room for a new boot image: those of other guest code stay (other installations
    sharing this cache start from theirs), BOOT_IMAGES_KEPT in all with the new one, the
    least recently built removed (a kernel mapping one keeps reading it)."""
    from .images import images

    built = []
    for path in entry.glob("boot-*" + images.SUFFIX):
        with contextlib.suppress(FileNotFoundError):  # another install's removal
            built.append((path.stat().st_mtime_ns, path))
    newest = [path for _, path in sorted(built)[-(BOOT_IMAGES_KEPT - 1) :]]
    kept = {*newest, *(images.boot_memory_path(path) for path in newest)}
    for path in entry.glob("boot-*"):
        if path not in kept:
            path.unlink(missing_ok=True)


def chosen_profiles(args: argparse.Namespace) -> list[Profile]:
    names = args.sandbox_profile or list(PROFILES)
    return [PROFILES[name] for name in dict.fromkeys(names)]


def install(args: argparse.Namespace) -> None:
    """Register one kernelspec per chosen profile (each fixes its profile in its argv)."""
    profiles = chosen_profiles(args)
    prefix = install_prefix(args)
    if prefix is None:  # for this user only: as it always was
        _install(args, profiles, None, args.cache_dir)
        return
    from .runtime.shared_cache import publish, readable_by_all, shared_cache_dir

    shared = shared_cache_dir(prefix)
    if args.cache_dir is None and Path(prefix).resolve() != Path(sys.prefix).resolve():
        args.cache_dir = str(shared)  # found by no kernel unless its kernelspec names it
    with readable_by_all():
        _install(args, profiles, prefix, args.cache_dir or str(shared))
    if shared.is_dir():
        publish(shared.parent)


def install_prefix(args: argparse.Namespace) -> str | None:
    """Where the kernelspecs go: a prefix, for every user of it (--prefix, --sys-prefix,
    the default in a virtual env or as root), or None, for this user only (--user, the
    default otherwise)."""
    if args.prefix:
        return str(Path(args.prefix).resolve())
    in_venv = sys.prefix != sys.base_prefix
    if args.sys_prefix or ((in_venv or os.geteuid() == 0) and not args.user):
        return sys.prefix
    return None


def _install(
    args: argparse.Namespace, profiles: list[Profile], prefix: str | None, cache_dir: str | None
) -> None:
    """Write the kernelspecs and precompile into ``cache_dir`` (None: the kernels' default);
    for a prefix, what the installing user's cache already built is taken first."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_core.paths import jupyter_config_dir, jupyter_path

    from .server.server_config import write_server_config

    single = len(profiles) == 1
    installed = []
    for profile in profiles:
        name = (
            args.name
            if args.name and single
            else kernelspec_name(profile, args.name or KERNEL_NAME)
        )
        spec = kernelspec(profile, args, single, provisioned=prefix == sys.prefix)
        with tempfile.TemporaryDirectory() as staging:
            if prefix is not None:  # copied with its mode: readable by every user
                os.chmod(staging, 0o755)
            write_kernelspec(Path(staging), spec)
            path = KernelSpecManager().install_kernel_spec(
                staging, name, user=prefix is None, prefix=prefix
            )
        installed.append((name, spec["display_name"], profile))
        print(
            f"Installed kernelspec {name} ({spec['display_name']!r}, profile {profile.name})"
            f" in {path}"
        )
    config = write_server_config(
        Path(prefix) / "etc" / "jupyter" if prefix is not None else Path(jupyter_config_dir())
    )
    print(f"Jupyter Server: renamed notebooks keep their hibernated sessions ({config})")
    searched = {str(Path(folder).resolve()) for folder in jupyter_path("kernels")}
    if str(Path(path).parent.resolve()) not in searched:
        share = Path(path).parent.parent.resolve()
        print(
            f"Jupyter does not look in {share} by default: start it with"
            f" JUPYTER_PATH={share} (or install with --user or --sys-prefix)."
        )
    if not args.no_precompile:
        precompile(cache_dir, seed=prefix is not None)
    print()
    _how_to_start(installed)


def _how_to_start(installed: list[tuple[str, str, Profile]]) -> None:
    """Where to go next: the launcher tile to pick, and the command-line clients (by full
    path when this environment's are not the ones on PATH, e.g. a venv not activated)."""
    here = Path(sys.executable).parent

    def command(name: str) -> str:
        found = shutil.which(name)
        return name if found and Path(found).parent == here else str(here / name)

    jupyter, python = command("jupyter"), command("python")
    if importlib.util.find_spec("jupyterlab") is None:
        print(f"JupyterLab is not installed here; add it, with widgets: {pip_install('[lab]')}")
    elif importlib.util.find_spec("jupyterlab_widgets") is None:
        print(
            "JupyterLab shows widgets (sliders, tqdm's bars) as text without"
            f" jupyterlab_widgets; add it: {pip_install('[lab]')}"
        )
    print(f"Start JupyterLab with `{jupyter} lab` and pick in its launcher:")
    for name, title, profile in installed:
        print(f"  {title}  (kernel {name}, profile {profile.name})")
    print(
        f"Or, without a browser: {jupyter} console --kernel {installed[0][0]},"
        f" or {python} -m wasm_kernel run NOTEBOOK.ipynb"
    )


def run_notebook(args: argparse.Namespace) -> int:
    """Execute a notebook on this kernel and print each cell's outputs as text.

    The kernel starts in the notebook's own folder, as Jupyter starts it, so the notebook
    profile mounts that folder wherever this command is run from. Without --kernel-name the
    kernelspec is built for this Python on the fly, so no installed one is needed."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = Path(args.notebook).expanduser().resolve()
    if not path.is_file():
        print(f"error: no notebook at {path}", file=sys.stderr)
        return 2
    notebook = nbformat.read(path, as_version=4)
    status = 0
    with tempfile.TemporaryDirectory() as specs:
        if args.kernel_name:
            try:
                KernelSpecManager().get_kernel_spec(args.kernel_name)
            except NoSuchKernel:
                print(
                    f"error: no kernelspec named {args.kernel_name!r}; `jupyter kernelspec"
                    " list` shows the installed ones",
                    file=sys.stderr,
                )
                return 2
            manager = KernelManager(kernel_name=args.kernel_name)
        else:
            profile = PROFILES[args.sandbox_profile]
            name = kernelspec_name(profile)
            write_kernelspec(Path(specs) / name, kernelspec(profile, args, single=True))
            manager = KernelManager(
                kernel_name=name, kernel_spec_manager=KernelSpecManager(kernel_dirs=[specs])
            )
        client = NotebookClient(
            notebook,
            km=manager,
            timeout=args.timeout,
            resources={"metadata": {"path": str(path.parent)}},
        )
        try:
            client.execute()
        except CellExecutionError as exc:
            print(exc, file=sys.stderr)
            status = 1
        finally:  # nbclient shuts down only kernels it made; left running, ours would warn
            if manager.has_kernel:
                manager.shutdown_kernel(now=False)
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


def snapshot_command(args: argparse.Namespace) -> int:
    """Manage the images folder without a kernel; info also says whether this installation
    can resume an image."""
    from traitlets import TraitError

    from .images import images
    from .images.image_folder import ImageFolder
    from .runtime.runtime import load_runtime
    from .settings.kernel_settings import KernelSettings, default_snapshot_dir

    given = args.snapshot_dir
    if given is None:
        given = os.environ.get("WASM_KERNEL_SNAPSHOT_DIR") or default_snapshot_dir()
    try:  # as the kernel checks it: a relative or empty folder is refused, not replaced
        directory = KernelSettings.snapshot_dir.validate(None, given)
    except TraitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    folder = ImageFolder(Path(directory), 0)
    try:
        if args.action == "list":
            print(folder.describe())
            return 0
        if args.action == "forget":
            return _forget_hibernated(folder, args.name)
        if not args.name:
            print(f"error: snapshot {args.action} needs a NAME", file=sys.stderr)
            return 2
        if args.action == "delete":
            folder.delete(args.name)
            print(f"Deleted snapshot {args.name!r}.")
            return 0
        path = Path(args.name).expanduser()
        if not path.exists():
            path = folder.path(args.name)
        needs = images.identity(load_runtime().module.sha256)
        print(images.describe_file(path, needs))
    except images.ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _forget_hibernated(folder: ImageFolder, name: str | None) -> int:
    """``snapshot forget``: remove every notebook's hibernated session."""
    from .jupyter.hibernation import hibernated, remove

    if name:
        print(
            "error: snapshot forget takes no NAME: it forgets every notebook's hibernated"
            " session (snapshot delete NAME removes one image)",
            file=sys.stderr,
        )
        return 2
    found = hibernated(folder)
    freed = remove(found)
    print(
        f"Forgot {len(found)} hibernated session(s), {freed / (1 << 20):.1f} MiB, in"
        f" {folder.directory}: those notebooks open with a fresh interpreter."
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "kernel":
        argv = argv[1:]
    elif argv and (argv[0] in SUBCOMMANDS or argv[0] in ("-h", "--help")):
        args = parser().parse_args(argv)
        if args.command == "install":
            install(args)
        elif args.command == "precompile":
            precompile(args.cache_dir)
        elif args.command == "run":
            return run_notebook(args)
        elif args.command == "mcp":
            from .agents.mcp_server import serve

            return serve(args)
        elif args.command == "snapshot":
            return snapshot_command(args)
        return 0
    from .jupyter.app import WasmKernelApp

    WasmKernelApp.launch_instance(argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
