"""The kernelspecs this package registers, one per sandbox profile: their names and kernel.json.

``install`` writes them, ``run`` builds one on the fly, and ``client.Session`` finds a profile's
by its name.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

from ..settings.profiles import Profile

KERNEL_NAME = "wasm-python"
PROVISIONER = "wasm-kernel"  # our entry point in jupyter_client.kernel_provisioners
# Enterprise Gateway 3.x's process proxy for kernels on its own host: it writes the connection
# file (address 127.0.0.1, ports from its port range) and runs argv with {connection_file}
# substituted; {response_address} and {public_key} are substituted for remote proxies only
GATEWAY_PROCESS_PROXY = "enterprise_gateway.services.processproxies.processproxy.LocalProcessProxy"


def kernelspec_name(profile: Profile, base: str = KERNEL_NAME) -> str:
    """``base`` for the default profile, ``base-PROFILE`` for the others."""
    return "-".join(filter(None, (base, profile.kernel_suffix)))


def display_name(profile: Profile, base: str) -> str:
    """``base`` for the default profile; the others name their profile inside the closing
    parenthesis ("Python 3 (WASM sandbox, strict)") or in one of their own ("Mine (strict)")."""
    if not profile.kernel_suffix:
        return base
    if base.endswith(")"):
        return f"{base[:-1]}, {profile.name})"
    return f"{base} ({profile.name})"


def kernelspec(
    profile: Profile, args: argparse.Namespace, single: bool, provisioned: bool = False
) -> dict:
    """The kernel.json for one profile: this Python, its profile pinned in argv.

    With a single profile --name and --display-name are taken as written; with several they
    are bases that each profile's name is derived from, as the default names are.
    ``provisioned``: kernels come from the kernel server through our provisioner; only for
    kernelspecs in this Python's own environment, whose Jupyter has the provisioner (a
    Jupyter elsewhere would hide a kernelspec naming a provisioner it lacks)."""
    spec = json.loads((resources.files("wasm_kernel") / "kernelspec" / "kernel.json").read_text())
    spec["argv"][0] = sys.executable
    spec["argv"].append(f"--WasmKernel.profile={profile.name}")
    if not profile.mounts:  # pinned: no config file or variable can add folders to it
        spec["argv"].append("--WasmKernel.mounts=[]")
    if getattr(args, "cache_dir", None):  # kernels use the cache this install precompiled
        spec["argv"].append(f"--WasmKernel.cache_dir={Path(args.cache_dir).resolve()}")
    given = getattr(args, "display_name", None)
    if given and single:
        spec["display_name"] = given
    else:
        spec["display_name"] = display_name(profile, given or spec["display_name"])
    if getattr(args, "env", None):
        spec["env"] = dict(args.env)
    if getattr(args, "gateway", False):
        # Enterprise Gateway 3 (jupyter_client 6) knows no provisioners nor CurveZMQ
        spec["metadata"] = {
            "debugger": True,
            "process_proxy": {"class_name": GATEWAY_PROCESS_PROXY},
        }
    elif provisioned:
        spec["metadata"]["kernel_provisioner"] = {"provisioner_name": PROVISIONER}
    return spec


def write_kernelspec(folder: Path, spec: dict) -> None:
    """The kernelspec folder: our logos and ``spec`` as kernel.json."""
    folder.mkdir(parents=True, exist_ok=True)
    for item in (resources.files("wasm_kernel") / "kernelspec").iterdir():
        if item.is_file() and item.name != "kernel.json":
            (folder / item.name).write_bytes(item.read_bytes())
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))
