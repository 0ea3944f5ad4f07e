"""%pip list and %pip show, printed as pip prints them, from the guest's distributions."""

from __future__ import annotations

import re
from collections.abc import Iterable
from email.message import Message

from packaging.utils import canonicalize_name

from .wheels import Distribution


def pip_list(distributions: Iterable[Distribution]) -> str:
    """The table ``pip list`` prints, sorted as pip sorts it."""
    rows = sorted(((d.name, d.version) for d in distributions), key=lambda row: row[0].lower())
    width = max([len("Package")] + [len(name) for name, _ in rows])
    version_width = max([len("Version")] + [len(version) for _, version in rows])
    lines = [f"{'Package':<{width}} Version", f"{'-' * width} {'-' * version_width}"]
    lines += [f"{name:<{width}} {version}" for name, version in rows]
    return "\n".join(lines)


def pip_show(
    dist: Distribution, everything: dict[str, Distribution], markers: dict[str, str]
) -> str:
    """One distribution as ``pip show`` prints it."""
    meta = dist.metadata
    homepage = meta.get("Home-page", "")
    for url in meta.get_all("Project-URL") or []:
        label, _, address = url.partition(",")
        if not homepage and re.sub(r"[^a-z]", "", label.lower()) == "homepage":
            homepage = address.strip()
    license_line = f"License: {meta.get('License', '')}"
    if _metadata_version(meta) >= (2, 4) and meta.get("License-Expression"):
        license_line = f"License-Expression: {meta['License-Expression']}"
    required_by = sorted(
        (
            other.name
            for other in everything.values()
            if dist.key in {canonicalize_name(name) for name in other.requires(markers)}
        ),
        key=str.lower,
    )
    return "\n".join(
        [
            f"Name: {dist.name}",
            f"Version: {dist.version}",
            f"Summary: {meta.get('Summary', '')}",
            f"Home-page: {homepage}",
            f"Author: {meta.get('Author', '')}",
            f"Author-email: {meta.get('Author-email', '')}",
            license_line,
            f"Location: {dist.location}",
            f"Requires: {', '.join(dist.requires(markers))}",
            f"Required-by: {', '.join(required_by)}",
        ]
    )


def _metadata_version(metadata: Message) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in str(metadata.get("Metadata-Version", "")).split("."))
    except ValueError:
        return ()
