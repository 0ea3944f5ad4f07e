"""The kernel's own code inside the guest: its module and the modules it ships, and the one
turn that installs them (the module must exist before the host can call any entry point)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ..guest.modules import _wasm_kernel_contract as declared
from .contract import guest_call


def kernel_module_source() -> str:
    return (resources.files("wasm_kernel") / "guest" / f"{declared.GUEST_MODULE}.py").read_text()


def shipped_modules() -> dict[str, tuple[str, bool, str]]:
    """The kernel's guest modules under ``guest/modules``: dotted name -> (source, is_package,
    the file name its frames show, hidden from tracebacks as the kernel's)."""
    root = Path(str(resources.files("wasm_kernel") / "guest" / "modules"))
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = (path.read_text(), is_package, f"{declared.KERNEL_FILES}:{name}>")
    return modules


def install_source(packages: str, import_paths: list[str], plain_tracebacks: bool) -> str:
    """The turn that (re)installs the guest's kernel module and boots it (IPython's shell and
    all: one call, so that a boot image can capture it): used at start and to repair it."""
    module = declared.GUEST_MODULE
    return (
        "import sys as _sys, types as _types\n"
        f"_module = _types.ModuleType({module!r})\n"
        f"exec(compile({kernel_module_source()!r}, {declared.GUEST_FILE!r}, 'exec'),"
        " _module.__dict__)\n"
        f"_sys.modules[{module!r}] = _module\n"
        "del _sys, _types, _module\n"
        f"{guest_call(declared.INSTALL_MODULES, shipped_modules())}\n"
        + guest_call(declared.BOOT, packages, import_paths, plain_tracebacks)
    )
