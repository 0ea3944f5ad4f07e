"""The kernel application: ipykernel's launcher with our kernel class and config file."""

from __future__ import annotations

import logging
import os
from collections.abc import Generator
from typing import Any

from ipykernel.kernelapp import IPKernelApp, kernel_aliases, kernel_flags
from jupyter_core.paths import jupyter_config_path
from traitlets import Dict, DottedObjectName, Type
from traitlets.config import Application, Configurable
from traitlets.utils.text import indent, wrap_paragraphs

from ..settings.kernel_settings import KernelSettings
from ..settings.profiles import PROFILES
from ..settings.settings import ENV_PREFIX, FROM_PROFILE, Limit, PerProfile, Setting, _amount
from . import request_checks, termination
from .kernel import WasmKernel
from .request_checks import CheckedRequests

CONFIG_FILE = "jupyter_wasm_kernel_config"
# Configured by ipykernel's application but never created here: the kernel class is
# WasmKernel and cells run in the sandbox, not in an IPython shell.
UNUSED_CLASSES = (
    "IPythonKernel",
    "InteractiveShell",
    "ZMQInteractiveShell",
    "InteractiveShellApp",
    "ProfileDir",
)
# the kernel's own classes: their settings are listed first (CheckedRequests adds none to
# ipykernel's Kernel, which is listed as it is)
OUR_CLASSES = (WasmKernel, KernelSettings, CheckedRequests)
# what the shortcuts of ipykernel's command line may set that no class here configures
IGNORED_TARGETS = {"InteractiveShell", "PlainTextFormatter", "ProfileDir"}
SETTINGS_INTRO = (
    "Set them in the kernelspec's argv (--WasmKernel.fuel=1e11), in"
    " jupyter_wasm_kernel_config.py on the Jupyter config path (`jupyter --paths`;"
    " c.WasmKernel.fuel = 1e11) or in the WASM_KERNEL_* variable each names (argv and the config"
    " file win over variables). A profile only supplies defaults; `install` registers one"
    " kernelspec per profile, each pinning its profile in its argv. A refused value leaves the"
    " kernel up and every cell reports it."
)


def _shown(trait: Any, value: Any) -> str:
    if isinstance(trait, Limit):
        return _amount(value, trait.unit) + ("" if trait.unit == "bytes" else f" {trait.unit}")
    return repr(list(value) if isinstance(value, tuple) else value)


def _per_profile(show: Any) -> str:
    """One default per profile, or one for all when they agree."""
    values = {name: show(profile) for name, profile in PROFILES.items()}
    if len(set(values.values())) == 1:
        return f"{next(iter(values.values()))} (every profile)"
    return "; ".join(f"{value} ({name} profile)" for name, value in values.items())


def real_default(name: str, trait: Setting) -> str:
    """What the kernel uses when nothing sets ``name``, read from the setting's declaration:
    traitlets would print the trait's static default, which for profile- and
    environment-based settings is not the truth."""
    declared = trait.declared
    if trait.shown is not None:
        shown = trait.shown()
    elif declared == FROM_PROFILE:
        shown = _per_profile(lambda profile: _shown(trait, getattr(profile, name)))
    elif isinstance(declared, PerProfile):
        shown = _per_profile(declared.shown)
    else:
        shown = _shown(trait, declared)
    variable = ENV_PREFIX + name.upper()
    if trait.env and variable in os.environ:
        shown += f"; here {variable}={os.environ[variable]!r} sets it"
    return shown


def _trait_help(cls: type[Configurable], trait: Any, default: str | None = None) -> str:
    """traitlets' help for one setting, its "Default:" line replaced by ``default``."""
    lines = cls.class_get_trait_help(trait).splitlines()
    if default is not None:
        lines = [line for line in lines if not line.startswith("    Default: ")]
        lines.append(indent("\n".join(wrap_paragraphs(f"Default: {default}", 76))))
    return "\n".join(lines)


def _class_help(cls: type[Configurable]) -> str:
    """A class's settings as traitlets shows them, without the private (``_name``) ones."""
    title = f"{cls.__name__}({', '.join(base.__name__ for base in cls.__bases__)}) options"
    lines = [title, "-" * len(title)]
    for name, trait in sorted(cls.class_traits(config=True).items()):
        if not name.startswith("_"):
            lines.append(_trait_help(cls, trait))
    return "\n".join(lines)


def _applies(*targets: Any) -> bool:
    """Whether a command-line shortcut sets only classes this application configures."""
    names = [target[0] if isinstance(target, tuple) else target for target in targets]
    return not any(
        str(getattr(name, "__name__", name)).split(".")[0] in IGNORED_TARGETS for name in names
    )


def _build_only_shown_records(log: Any) -> None:
    """traitlets leaves the application's logger at DEBUG and filters at its handlers (at
    ``log_level``): each debug line ipykernel logs per message (several a cell) was built, a
    record and its caller found, then dropped. The logger now passes only what some handler
    shows."""
    shown = min((handler.level for handler in getattr(log, "handlers", ())), default=0)
    if isinstance(log, logging.Logger) and shown > log.level:
        log.setLevel(shown)


class WasmKernelApp(IPKernelApp):
    name = "wasm-kernel"
    description = "A Jupyter kernel running Python in a WebAssembly sandbox."
    # Without the unused IPython classes: traitlets turned their few hundred settings into
    # command-line options at every start (~20 ms). Options naming them still parse, as ever to
    # no effect; their shortcuts (--colors, --pdb, --profile-dir...) are ignored like any unknown
    # option.
    classes = [*(c for c in IPKernelApp.classes if c.__name__ not in UNUSED_CLASSES), WasmKernel]
    aliases = Dict({name: alias for name, alias in kernel_aliases.items() if _applies(alias)})
    flags = Dict({name: flag for name, flag in kernel_flags.items() if _applies(*flag[0])})
    kernel_class = Type(WasmKernel, klass="ipykernel.kernelbase.Kernel").tag(  # type: ignore[assignment]
        config=True
    )
    subcommands: dict = {}  # ours (install, precompile, run) are python -m wasm_kernel's
    # The process's own stdout and stderr stay the kernel log: cells' output never passes
    # through them, and ipykernel's OutStream would send whatever host code writes there to
    # every client as the notebook's output (and make each flush around a cell a round trip
    # to the IOPub thread).
    outstream_class = DottedObjectName(None, allow_none=True)

    def initialize(self, argv: Any = None) -> None:
        """Note when this kernel began, before its sockets exist (see request_checks)."""
        request_checks.note_start()
        super().initialize(argv)
        _build_only_shown_records(self.log)

    def init_poller(self) -> None:
        """Watch the launcher as ipykernel does, but end through SIGTERM, so that the session
        hibernates (``termination``), where ipykernel's poller ends the process at once."""
        termination.watch_parent(self.parent_handle)

    def emit_help(self, classes: bool = False) -> Generator[str, None, None]:
        """Our commands and settings first, with their real defaults; ipykernel's after.

        traitlets would list our settings last, after some 900 lines of IPython's, with
        static defaults (0, []) and private settings among them."""
        from ..commands import HELP_ALL, SUBCOMMANDS

        yield from self.emit_description()
        title = "Commands (python -m wasm_kernel COMMAND --help for each)"
        yield title
        yield "=" * len(title)
        for command, summary in SUBCOMMANDS.items():
            yield f"{command}"
            yield indent("\n".join(wrap_paragraphs(summary, 76)))
        yield ""
        if not classes:
            yield from self.emit_options_help()
            yield f"Every WasmKernel setting, with its default: {HELP_ALL}"
            return
        title = "WasmKernel settings (the sandbox: profile, mounts, limits)"
        yield title
        yield "=" * len(title)
        yield from wrap_paragraphs(SETTINGS_INTRO, 80)
        yield ""
        for name, trait in sorted(KernelSettings.class_own_traits(config=True).items()):
            assert isinstance(trait, Setting)
            yield _trait_help(WasmKernel, trait, real_default(name, trait))
        yield ""
        title = "ipykernel settings (the kernel process: connection, ports, logging, session)"
        yield title
        yield "=" * len(title)
        yield from wrap_paragraphs(
            "The kernel runs in ipykernel's application. IPython's shell settings (and flags"
            " such as --pylab) have no effect: cells run in the sandbox, not in an IPython"
            " shell; their classes and their shortcuts are left out below.",
            80,
        )
        yield ""
        yield from self.emit_options_help()
        for cls in self._classes_with_config_traits():
            if cls not in OUR_CLASSES and cls.__name__ not in UNUSED_CLASSES:
                yield _class_help(cls)
                yield ""

    def start(self) -> None:
        """Run the kernel; once its loop ends, let the control thread finish first.

        After a shutdown_request the control thread still flushes stdout through the iopub
        thread. At exit ipykernel stops the iopub thread before joining the control thread,
        so a late flush would wait out its 10 s timeout (or block): join it while iopub runs.
        """
        super().start()
        if self.control_thread and self.control_thread.is_alive():
            self.control_thread.stop()
            self.control_thread.join()

    def init_sockets(self) -> None:
        """Bind the kernel's ports; warn about unencrypted TCP only where it matters.

        ipykernel warns at every start that TCP without CurveZMQ can be eavesdropped, and
        Jupyter shows that in its log for every kernel. On a loopback address only accounts on
        this machine can reach the ports: there it goes to the info level, saying how to turn
        encryption on. Any other address keeps ipykernel's warning.
        """
        import ipaddress

        try:
            loopback = ipaddress.ip_address(self.ip).is_loopback
        except ValueError:
            loopback = self.ip == "localhost"
        if self.transport != "tcp" or self.curve_secretkey is not None or not loopback:
            super().init_sockets()
            return

        def quiet(record: object) -> bool:
            return not str(getattr(record, "msg", "")).startswith(
                "Kernel is running over TCP without encryption"
            )

        self.log.addFilter(quiet)
        try:
            super().init_sockets()
        finally:
            self.log.removeFilter(quiet)
        self.log.info(
            "Kernel ports on %s are not encrypted: other accounts on this machine could read"
            " its messages. To encrypt them, start Jupyter with"
            " --KernelManager.transport_encryption=auto (this kernelspec supports CurveZMQ).",
            self.ip,
        )

    def init_pdb(self) -> None:
        """Nothing: ipykernel makes the host's pdb interruptible, for cells that debug in the
        kernel process; here none runs there, and importing pdb cost ~15 ms of every start."""

    def init_profile_dir(self) -> None:
        """No IPython profile: settings live in the Jupyter config file, and IPython would
        write a profile folder to HOME (a fresh temporary one at every start if HOME is
        read-only)."""
        self.profile_dir = None

    def load_config_file(self, suppress_errors: object = None) -> None:  # type: ignore[override]
        """Read ``jupyter_wasm_kernel_config.py`` from the Jupyter config path only, never from
        the working folder: a config file is Python that runs on the host."""
        Application.load_config_file(self, CONFIG_FILE, path=jupyter_config_path())
