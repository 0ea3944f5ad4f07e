"""What pip answered: the wheels its report plans, and its refusals said for this sandbox."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import InvalidVersion, Version

from .pip_driver import Pip, requirement_text
from .wheel_cache import plain_name
from .wheels import Distribution, PackageError

if TYPE_CHECKING:
    from packaging.requirements import Requirement

MAX_REPORT = 64 << 20  # bytes of pip's resolution report read
MAX_PIP_ERRORS = 4000  # characters of pip's error lines passed on
NOT_FOUND = re.compile(
    r"Could not find a version that satisfies the requirement (\S+)(?: \(from ([^)]*)\))?"
    r" \(from versions: ([^)]*)\)"
)


@dataclass(frozen=True)
class Planned:
    """A wheel pip chose: what the guest will get, as pip's report names it."""

    name: NormalizedName
    version: Version
    filename: str
    sha256: str | None
    url: str


def read_plan(report: Path) -> list[Planned]:
    """The wheels pip's ``--report`` says it would install."""
    try:
        with open(report, "rb") as source:
            items = json.loads(source.read(MAX_REPORT))["install"]
        return [planned(item) for item in items]
    except (OSError, ValueError, KeyError, TypeError, InvalidVersion) as exc:
        raise PackageError(f"pip's answer could not be read ({exc})") from None


def planned(item: dict) -> Planned:
    metadata, download = item["metadata"], item["download_info"]
    hashes = download.get("archive_info", {}).get("hashes", {})
    filename = unquote(urlsplit(str(download["url"])).path.rsplit("/", 1)[-1])
    if not plain_name(filename) or not filename.endswith(".whl"):
        raise PackageError(f"the package source named a file {filename!r}, not a wheel")
    sha256 = hashes.get("sha256")
    return Planned(
        canonicalize_name(str(metadata["name"])),
        Version(str(metadata["version"])),
        filename,
        sha256 if isinstance(sha256, str) else None,
        str(download["url"]),
    )


def explain(pip: Pip, errors: str, wanted: list[str], shipped: dict[str, Distribution]) -> str:
    """pip's refusal, said for this sandbox: a shipped package that would have to be
    replaced, a compiled-only package, wheels refused, or pip's own last word."""
    from packaging.requirements import InvalidRequirement, Requirement

    match = NOT_FOUND.search(errors)
    requirement = None
    if match:
        try:
            requirement = Requirement(match.group(1))
        except InvalidRequirement:
            pass
    if requirement is not None:
        key = canonicalize_name(requirement.name)
        dist = shipped.get(key)
        if dist is not None:
            needed_by = match.group(2) if match and match.group(2) else "the packages asked for"
            return (
                f"{needed_by} needs {requirement}, but the runtime ships"
                f" {dist.name} {dist.version}, which cannot be replaced."
                " Nothing was installed."
            )
        report = pip.work / "compiled.json"
        if pip.resolve_for_host_platform(requirement_text(requirement), report) == 0:
            return compiled_only(requirement, report)
        if match and match.group(3).strip() != "none":
            return (
                f"{requirement.name} {match.group(3)} is in {pip.source}, but pip could use"
                " none of its wheels (their metadata does not match their name, or they"
                " need another Python). Nothing was installed."
            )
        return (
            f"no wheel of {requirement} that runs in the sandbox was found in"
            f" {pip.source}. Only pure-Python wheels (py3-none-any) can be installed;"
            " packages published only as source are never built here."
        )
    if "DO NOT MATCH THE HASHES" in errors:
        return (
            f"the package source answered {', '.join(wanted)} with a file whose sha256 is not"
            " the one it announced, so pip refused it. Nothing was installed."
        )
    kept = [line for line in errors.splitlines() if line.startswith("ERROR:")]
    last = next((line for line in reversed(errors.splitlines()) if line.strip()), "")
    if kept == ["ERROR: Exception:"] or not kept:  # pip crashed: its last line says on what
        reason = re.sub(r"<[^>]*>", "", last.split(": ", 1)[-1]).replace("  ", " ")
        kept = [f"pip failed on {', '.join(wanted)} from {pip.source}: {reason.strip()}"]
    return "\n".join(kept).replace(str(pip.work), "")[:MAX_PIP_ERRORS]


def compiled_only(requirement: Requirement, report: Path) -> str:
    try:
        item = json.loads(report.read_bytes()[:MAX_REPORT])["install"][0]
        filename = planned(item).filename
    except (OSError, ValueError, KeyError, IndexError, TypeError, InvalidVersion):
        filename = "a platform-specific wheel"
    return (
        f"{requirement.name} is published only as compiled wheels ({filename}): compiled"
        " extensions cannot run in the WebAssembly sandbox, only pure-Python wheels"
        " (py3-none-any). `%pip list` shows the compiled packages the runtime ships."
    )
