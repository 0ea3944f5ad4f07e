"""The command line's shape: its subcommands and their arguments (``__main__`` runs them).

The table of subcommands is also the kernel application's help (app.py), so it lives here
rather than in ``__main__``, which nothing imports.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .jupyter.kernelspecs import KERNEL_NAME, kernelspec_name
from .settings.profiles import DEFAULT_PROFILE, PROFILES

SUBCOMMANDS = {
    "install": "register the kernelspecs (one per sandbox profile) and precompile the runtime",
    "precompile": "compile the runtime to native code once, and download and precompile the"
    " guest's pinned IPython packages, into the cache (1-4 minutes)",
    "run": "execute a notebook in the sandbox, from any folder, and print its outputs",
    "mcp": "serve sandboxed Python to AI agents over MCP (stdio, or --transport streamable-http);"
    " needs the [agents] extra",
    "snapshot": "list, inspect or delete saved interpreter images (%snapshot, hibernation)",
    "kernel": "the kernel itself, as Jupyter starts it: kernel -f CONNECTION_FILE"
    " [--WasmKernel.SETTING=VALUE ...] (the word 'kernel' may be left out)",
}
HELP_ALL = "python -m wasm_kernel --help-all"


def _help(text: str) -> str:
    """``text`` as an argparse help string, which argparse formats with %: '%snapshot'
    would otherwise be read as a format code."""
    return text.replace("%", "%%")


class _OldProfileFlag(argparse.Action):
    """``install --profile NAME``, our spelling before --sandbox-profile: still taken, with a
    note, since ipykernel's --profile names an IPython profile, which this kernel never uses."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values not in PROFILES:
            parser.error(
                f"--profile {values}: ipykernel's --profile names an IPython profile, which this"
                " kernel does not use; choose a sandbox profile with --sandbox-profile"
                f" ({' or '.join(sorted(PROFILES))})"
            )
        print(
            f"note: --profile is deprecated here, use --sandbox-profile {values}", file=sys.stderr
        )
        namespace.sandbox_profile = [*(namespace.sandbox_profile or []), values]


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m wasm_kernel",
        description="wasm-kernel: a Jupyter kernel whose Python cells run in a CPython sandboxed"
        " in WebAssembly.",
        epilog=f"Every kernel setting (limits, mounts, profiles) with its default: {HELP_ALL}."
        " Settings go in the kernelspec's argv (--WasmKernel.fuel=1e11), in"
        " jupyter_wasm_kernel_config.py on the Jupyter config path, or in WASM_KERNEL_*"
        " variables (install --env).",
    )
    commands = top.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    profiles_help = _help("; ".join(f"{p.name}: {p.summary}" for p in PROFILES.values()))

    cmd = commands.add_parser(
        "install",
        help=_help(SUBCOMMANDS["install"]),
        description=SUBCOMMANDS["install"] + ". An install for every user (--sys-prefix,"
        " --prefix, or as root) leaves kernelspecs and a compiled runtime that every user reads"
        " and only the installer may change (0755 folders, 0644 files, whatever the umask);"
        " their kernels find the runtime with no step of theirs. A per-user install (--user)"
        " keeps both in the user's own folders.",
        epilog="Default names: "
        + ", ".join(f"{kernelspec_name(p)} for {p.name}" for p in PROFILES.values())
        + ". With several profiles, --name and --display-name are bases: the notebook profile"
        " takes them as given, the others add their profile (--name mine gives mine and"
        " mine-strict; --display-name 'Mine' gives 'Mine' and 'Mine (strict)', 'Mine (x)' gives"
        " 'Mine (x, strict)').",
    )
    cmd.add_argument(
        "--sandbox-profile",
        choices=sorted(PROFILES),
        action="append",
        metavar="PROFILE",
        help=f"register this profile's kernelspec (repeatable; default: every profile). "
        f"{profiles_help}",
    )
    cmd.add_argument(
        "--profile", action=_OldProfileFlag, dest="sandbox_profile", help=argparse.SUPPRESS
    )
    cmd.add_argument("--name", help=f"kernelspec name (default: {KERNEL_NAME}[-PROFILE])")
    cmd.add_argument(
        "--display-name", metavar="TEXT", help="name shown in the launcher and kernel menus"
    )
    where = cmd.add_mutually_exclusive_group()
    where.add_argument(
        "--user",
        action="store_true",
        help="install for the current user only: kernelspecs in their Jupyter folder, the"
        " runtime in their cache (default for a non-root user outside a virtual env)",
    )
    where.add_argument(
        "--sys-prefix",
        action="store_true",
        help=f"install for every user of this Python: kernelspecs and runtime under its prefix,"
        f" {sys.prefix}/share (default inside a virtual env, and for root)",
    )
    where.add_argument(
        "--prefix",
        metavar="DIR",
        help="install for every user under DIR: DIR/share/jupyter/kernels, the runtime in"
        " DIR/share/wasm-kernel/cache (named in the kernelspecs)",
    )
    cmd.add_argument(
        "--env",
        nargs=2,
        action="append",
        metavar=("NAME", "VALUE"),
        help="set an environment variable for the kernel (repeatable), e.g."
        " --env WASM_KERNEL_FUEL 1e11",
    )
    cmd.add_argument(
        "--gateway",
        action="store_true",
        help="write kernelspecs that Jupyter Enterprise Gateway 3.x runs as they are, on its"
        " own host (its LocalProcessProxy); see docs/deployment.md",
    )
    cmd.add_argument(
        "--no-precompile",
        action="store_true",
        help="skip downloading and compiling the runtime (run precompile before a kernel)",
    )
    cmd.add_argument(
        "--cache-dir", metavar="DIR", help="compile into DIR and point the kernelspecs at it"
    )

    cmd = commands.add_parser(
        "precompile",
        help=_help(SUBCOMMANDS["precompile"]),
        description=SUBCOMMANDS["precompile"] + ".",
    )
    cmd.add_argument("--cache-dir", metavar="DIR", help="cache folder (default: per-user cache)")

    cmd = commands.add_parser(
        "run",
        help=_help(SUBCOMMANDS["run"]),
        description=SUBCOMMANDS["run"] + ". The kernel starts"
        " in the notebook's folder, as under Jupyter: the notebook profile mounts it read-only"
        " at /notebook.",
    )
    cmd.add_argument("notebook", metavar="NOTEBOOK")
    cmd.add_argument(
        "--sandbox-profile",
        choices=sorted(PROFILES),
        default=DEFAULT_PROFILE,
        metavar="PROFILE",
        help=f"sandbox profile (default: {DEFAULT_PROFILE})",
    )
    cmd.add_argument(
        "--kernel-name",
        help="use this installed kernelspec (and its --env,"
        " --cache-dir) instead of one built for this Python",
    )
    cmd.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")

    cmd = commands.add_parser(
        "mcp",
        help=_help(SUBCOMMANDS["mcp"]),
        description=SUBCOMMANDS["mcp"] + ". One kernel per MCP session; its profile and limits"
        " are set here, never by the model.",
    )
    from .agents.mcp_server import add_arguments

    add_arguments(cmd)

    cmd = commands.add_parser(
        "snapshot",
        help=_help(SUBCOMMANDS["snapshot"]),
        description=SUBCOMMANDS["snapshot"] + ". The folder is WasmKernel.snapshot_dir's"
        " default unless --snapshot-dir (or WASM_KERNEL_SNAPSHOT_DIR) names another. forget"
        " removes every notebook's hibernated session: each opens with a fresh interpreter.",
    )
    cmd.add_argument("action", choices=["list", "info", "delete", "forget"])
    cmd.add_argument("name", nargs="?", help="snapshot name (info also takes an image's path)")
    cmd.add_argument("--snapshot-dir", metavar="DIR", help="folder of the images")

    commands.add_parser("kernel", help=_help(SUBCOMMANDS["kernel"]), add_help=False)
    return top
