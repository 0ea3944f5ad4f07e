"""Tenants behind a gateway: whose data a kernel keeps, and which folder is the notebook's.

Jupyter Enterprise Gateway (and gateway_provisioners) start every tenant's kernels as one
service account and name the tenant in ``KERNEL_USERNAME``. What the kernel keeps "per user"
(input history, snapshots and hibernated sessions with their quotas, downloaded wheels and
the %pip lock) would then be one pile for all tenants, and one tenant could list, restore and
resume another's sessions. So when ``KERNEL_USERNAME`` names someone other than the process's
own user, each of those lives in a folder of that tenant's own below the one it would use
otherwise (``FOLDER/tenants/NAME-HASH``, created 0700): the name is readable but sanitized,
and the hash of the exact name keeps two names that sanitize alike apart.

A gateway also starts kernels in its own working folder, where its logs and token files are,
not in the notebook's: ``notebook_folder`` says which folder the profile's '.' mount may mean.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import stat
from collections.abc import Mapping
from pathlib import Path

import psutil

TENANT_ENV = "KERNEL_USERNAME"  # the tenant, as the gateway (or its client) names it
WORKING_DIR_ENV = "KERNEL_WORKING_DIR"  # the notebook's folder, as the gateway's client names it
# set by Enterprise Gateway for every kernel (KERNEL_GATEWAY), by it and gateway_provisioners
# (KERNEL_ID), and by their clients (KERNEL_USERNAME); Jupyter Server alone sets none
GATEWAY_ENV = ("KERNEL_GATEWAY", "KERNEL_ID", TENANT_ENV)
TENANTS = "tenants"
READABLE_CHARS = 40  # of the tenant's name in its folder's name; the hash tells them apart


class ForeignFolder(OSError):
    """Where a tenant's folder goes there is a link, or a folder of another user's."""


def under_gateway(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return any(environ.get(name) for name in GATEWAY_ENV)


def process_user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid with no name (a container's): only a number names it
        return str(os.geteuid())


def tenant(environ: Mapping[str, str] | None = None) -> str | None:
    """The tenant this kernel works for, when that is not the process's own user."""
    environ = os.environ if environ is None else environ
    name = environ.get(TENANT_ENV, "")
    return name if name and name != process_user() else None


def folder_name(name: str) -> str:
    """A tenant's folder name: safe on any file system, distinct for distinct names."""
    readable = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:READABLE_CHARS] or "_"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{readable}-{digest}"


def keyed(folder: Path, name: str | None) -> Path:
    """``folder`` itself for the process's own user; else the tenant's own folder below it,
    made (0700, as is ``tenants``) when possible. A link or someone else's folder there is
    never used: ForeignFolder."""
    if name is None:
        return folder
    place = folder / TENANTS / folder_name(name)
    for path in (folder / TENANTS, place):
        try:
            path.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            pass
        except OSError:  # a read-only home: the caller falls back as it would without tenants
            return place
        status = path.lstat()
        if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid():
            raise ForeignFolder(f"{path} is not a folder of this user's; remove it")
        if status.st_mode & 0o077:
            path.chmod(0o700)
    return place


def keyed_file(path: str, name: str | None) -> str:
    """A per-user file (``:memory:`` stays itself) in the tenant's own folder beside it."""
    if name is None or path == ":memory:":
        return path
    file = Path(path).expanduser()
    return str(keyed(file.parent, name) / file.name)


def _gateway_folders(here: Path, notebook: Path) -> list[Path]:
    """Folders that are the gateway's: its working folder (the kernel's parent's), and the
    kernel's own unless the gateway started it in the notebook's."""
    found = [] if here == notebook else [here]
    try:
        found.append(Path(psutil.Process(os.getppid()).cwd()).resolve())
    except (psutil.Error, OSError):
        pass
    return found


def notebook_folder(
    here: Path, environ: Mapping[str, str] | None = None
) -> tuple[Path | None, str]:
    """The folder the notebook profile mounts, or None and why none is: the kernel's working
    folder (``here``) under Jupyter; under a gateway, the folder ``KERNEL_WORKING_DIR``
    names, unless it is (or holds) the gateway's own folder."""
    environ = os.environ if environ is None else environ
    if not under_gateway(environ):
        return here, ""
    here = here.resolve()
    named = environ.get(WORKING_DIR_ENV, "")
    if not named:
        return None, (
            f"under a gateway ({', '.join(GATEWAY_ENV)} set) the kernel's working folder is"
            f" the gateway's, and the gateway named no notebook folder ({WORKING_DIR_ENV}),"
            " so no folder is mounted"
        )
    try:
        folder = Path(named).resolve(strict=True)
        if not Path(named).is_absolute() or not folder.is_dir():
            raise NotADirectoryError(named)
    except (OSError, RuntimeError):
        return None, (
            f"the notebook folder the gateway named ({WORKING_DIR_ENV}={named!r}) is not an"
            " absolute path to a folder on this host, so no folder is mounted"
        )
    if any(folder == path or folder in path.parents for path in _gateway_folders(here, folder)):
        return None, (
            f"the notebook folder the gateway named ({WORKING_DIR_ENV}={named!r}) is, or"
            " holds, the gateway's own working folder, so no folder is mounted"
        )
    return folder, ""
