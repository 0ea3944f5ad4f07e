"""An image's header and blobs checked field by field, the hostile-input half of reading an
image (``images`` reads the file and its checksum first), and what a checked image is.

Every field's type and bound is checked before anything reaches a guest; what is refused
raises ``ImageError`` with a sentence saying why (a ``ValueError`` from ``_require`` is turned
into one by the caller).
"""

from __future__ import annotations

import itertools
import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

from ..memory.live_memory import LiveMemory
from ..runtime import rewrite
from . import image_archive
from .image_archive import MAX_GUEST_PATH
from .image_pages import ImagePages, RawFile
from .names import ImageError

PAGE = rewrite.PAGE
MAX_HISTORY = 64 << 20  # bytes of input history carried (uncompressed)
MAX_HISTORY_ENTRIES = 1_000_000
MAX_PACKAGES = 1000  # %pip pins an image may name (the host parses each again)
MAX_HELD_FILES = 512  # descriptors an image may reopen (as many as a guest may hold)
MAX_HELD_PATH = 1024  # characters of a reopened file's path (512 of them fit in a header)
MAX_DESCRIPTOR = 1 << 16  # the highest descriptor number an image may name
OFLAG_DIRECTORY = 2  # the one open flag an image may carry (no create, truncate, exclusive)
MAX_RIGHTS = (1 << 30) - 1  # WASI preview1 defines 30 rights
MAX_FDFLAGS = 0x1F
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_PAGES = (1 << 32) // PAGE  # of the largest memory, a 32-bit one
MAX_RAW_RUNS = MAX_PAGES // 2  # raw extents at most (each holds a page, and one lies between)

IDENTITY_WORDS = {
    "runtime_sha256": "runtime (sha256)",
    "rewrite": "version of the runtime rewrite",
    "guest_code": "version of the kernel's guest code (sha256)",
    "wasmtime": "wasmtime version",
    "machine": "machine type",
}


@dataclass(frozen=True)
class HeldFile:
    """A descriptor the guest held open when the image was taken, reopened at the same
    number, path and offset when it is resumed (WASI's descriptor table is the host's, so
    the image's memory alone would leave every file object on a dead descriptor)."""

    fd: int
    path: str  # the guest path, as opened
    oflags: int  # only OFLAG_DIRECTORY: a reopen never creates nor truncates
    rights: int
    inheriting: int
    fdflags: int  # append, sync ...
    lookup: int  # WASI lookup flags (follow symlinks)
    offset: int | None  # None: not seekable (a folder)

    def fields(self) -> dict[str, object]:
        return {
            "fd": self.fd,
            "path": self.path,
            "oflags": self.oflags,
            "rights": self.rights,
            "inheriting": self.inheriting,
            "fdflags": self.fdflags,
            "lookup": self.lookup,
            "offset": self.offset,
        }


@dataclass
class HostState:
    """The host's part of a session, carried in the image."""

    execution_count: int = 0
    history: list[tuple[int, str]] = field(default_factory=list)
    cwd: str = "/tmp"
    clocks: dict[int, int] = field(default_factory=dict)  # clock id -> guest reading, ns
    packages: list[str] = field(default_factory=list)  # %pip pins, "name==version"
    held_files: list[HeldFile] = field(default_factory=list)  # by descriptor number


@dataclass
class Image:
    """A checked image, ready to resume: pages are decompressed, the archive is listed."""

    needs: dict[str, object]
    mounts: list[str]
    memory_size: int
    pages: ImagePages  # the stored pages, decompressed (image_pages)
    globals: dict[str, int]
    host: HostState
    scratch: bytes  # a tar archive of /tmp
    taken: str = ""
    memory_elsewhere: bool = False  # a boot image's: raw pages in a file beside it
    memory_file: Path | None = None  # that file, in this kernel's cache (see boot_memory_path)
    live: LiveMemory | None = None  # a fork's: its memory is where this says (live_memory)
    boot_file: Path | None = None  # where this kernel's boot memory file is, for ``live``
    # the sha256 of a boot image's memory file; of an image's base, where it builds on one
    memory_digest: str = ""
    based: bool = False  # its memory builds on a boot memory file (``memory_file``, once read)

    @property
    def stored_pages(self) -> int:
        return self.pages.size // PAGE


def require(condition: bool, what: str) -> None:
    if not condition:
        raise ValueError(what)


def is_int(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def raw_runs(memory: dict) -> list[tuple[int, int]]:
    """The raw extents a header's memory lists, (first page, count) each, their shape checked
    (format 1 has none); ``checked_image`` places them."""
    runs = memory.get("raw", [])
    require(isinstance(runs, list) and len(runs) <= MAX_RAW_RUNS, "bad raw memory extents")
    checked = []
    for entry in runs:
        require(
            isinstance(entry, list)
            and len(entry) == 2
            and is_int(entry[0], 0, MAX_PAGES - 1)
            and is_int(entry[1], 1, MAX_PAGES),
            "bad raw memory extent",
        )
        checked.append((entry[0], entry[1]))
    return checked


def checked_image(
    header: dict,
    body: memoryview,
    offset: int,
    needs: dict[str, object],
    memory_limit: int,
    scratch_limit: int,
    raw_file: RawFile,
) -> Image:
    found = header["needs"]
    require(isinstance(found, dict), "'needs' is not an object")
    for key, wanted in needs.items():
        if found.get(key) != wanted:
            raise ImageError(
                f"the image was taken with another {IDENTITY_WORDS.get(key, key)},"
                f" {str(found.get(key))[:80]!r}; this kernel has {str(wanted)[:80]!r}"
            )
    mounts = header["mounts"]
    require(
        isinstance(mounts, list) and all(isinstance(m, str) for m in mounts) and len(mounts) < 256,
        "'mounts' is not a list of strings",
    )
    memory = header["memory"]
    memory_size = memory["size"]
    check_memory_size(memory_size, memory_limit)
    separate = memory.get("separate", False)  # images from before boot images were mapped
    runs = raw_runs(memory)
    stored = memory["extents"] or runs
    require(isinstance(separate, bool) and not (separate and stored), "bad memory")
    file_digest = memory.get("file_sha256", "")  # a boot image's (none before they were summed)
    based_on = memory.get("base", "")  # an image's that builds on a boot memory file
    require(
        all(
            digest == "" or (isinstance(digest, str) and SHA256.fullmatch(digest))
            for digest in (file_digest, based_on)
        ),
        "bad memory digest",
    )
    require(not (based_on and (separate or "live" in memory)), "bad memory")
    require(not (file_digest and not separate), "bad memory")
    live = None
    if "live" in memory:  # a fork's, whose memory stays in the kernel that forked
        require(not separate and not stored, "bad memory")
        try:
            live = LiveMemory.from_header(memory["live"], memory_size)
        except ValueError as exc:
            raise ImageError(str(exc)) from None
    frames: list[tuple[int, int, memoryview]] = []  # decompressed once all else is checked
    next_free = 0
    pages = memory_size // PAGE
    for entry in memory["extents"]:
        require(isinstance(entry, list) and len(entry) == 3, "bad memory extent")
        first, count, length = entry
        require(is_int(first, next_free, pages - 1), "memory extents overlap or are unordered")
        require(is_int(count, 1, pages - first), "a memory extent passes the memory's end")
        require(is_int(length, 1, len(body) - offset), "a memory extent passes the file's end")
        frames.append((first * PAGE, (first + count) * PAGE, body[offset : offset + length]))
        offset += length
        next_free = first + count
    raw: list[tuple[int, int, int]] = []  # start, end, offset in the file
    stored_at, next_free = raw_file.offset, 0
    for first, count in runs:
        require(is_int(first, next_free, pages - 1), "raw extents overlap or are unordered")
        require(is_int(count, 1, pages - first), "a raw extent passes the memory's end")
        raw.append((first * PAGE, (first + count) * PAGE, stored_at))
        stored_at += count * PAGE
        next_free = first + count
    spans = sorted([(start, end) for start, end, _ in frames] + [(s, e) for s, e, _ in raw])
    require(
        all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)),
        "raw and compressed memory extents overlap",
    )
    globals_ = header["globals"]
    require(
        isinstance(globals_, dict)
        and len(globals_) < 4096
        and all(
            isinstance(k, str) and is_int(v, -(1 << 63), (1 << 64) - 1) for k, v in globals_.items()
        ),
        "bad globals",
    )
    host = header["host"]
    cwd = host["cwd"]
    require(isinstance(cwd, str) and 0 < len(cwd) <= MAX_GUEST_PATH, "bad working folder")
    count = host["execution_count"]
    require(is_int(count, 0, 1 << 62), "bad execution count")
    clocks = host["clocks"]
    require(
        isinstance(clocks, dict)
        and all(k in ("1", "2", "3") and is_int(v, 0, 1 << 63) for k, v in clocks.items()),
        "bad clock readings",
    )
    packages = host.get("packages", [])  # images from before %pip was carried have none
    require(
        isinstance(packages, list)
        and len(packages) <= MAX_PACKAGES
        and all(isinstance(pin, str) and 0 < len(pin) <= 300 for pin in packages),
        "bad package list",
    )
    held_files = checked_held_files(host.get("held_files", []))  # none before they were kept
    history_size, scratch_size = header["history"], header["scratch"]
    require(is_int(history_size, 1, len(body) - offset), "history passes the file's end")
    history = json.loads(inflate(body[offset : offset + history_size], MAX_HISTORY, exact=False))
    offset += history_size
    require(
        isinstance(history, list)
        and len(history) <= MAX_HISTORY_ENTRIES
        and all(
            isinstance(item, list)
            and len(item) == 2
            and is_int(item[0], 0, 1 << 62)
            and isinstance(item[1], str)
            for item in history
        ),
        "bad history",
    )
    require(scratch_size == len(body) - offset, "the archive does not end the file")
    scratch = inflate(body[offset:], (scratch_limit or memory_limit) + (16 << 20), exact=False)
    try:
        image_archive.check_archive(scratch, scratch_limit)
    except image_archive.TooLarge as exc:
        raise ImageError(str(exc)) from None
    return Image(
        needs=found,
        mounts=mounts,
        memory_size=memory_size,
        pages=ImagePages(memory_size, frames, raw, raw_file),
        globals=globals_,
        host=HostState(
            execution_count=count,
            history=[(line, source) for line, source in history],
            cwd=cwd,
            clocks={int(k): v for k, v in clocks.items()},
            packages=packages,
            held_files=held_files,
        ),
        scratch=scratch,
        taken=str(header.get("taken", ""))[:64],
        memory_elsewhere=separate,
        live=live,
        memory_digest=file_digest or based_on,
        based=bool(based_on),
    )


def checked_held_files(entries: object) -> list[HeldFile]:
    """The image's open descriptors, each field bounded; ordered by number, each once."""
    require(isinstance(entries, list) and len(entries) <= MAX_HELD_FILES, "bad open files")
    assert isinstance(entries, list)
    held: list[HeldFile] = []
    for entry in entries:
        require(isinstance(entry, dict) and len(entry) == 8, "bad open file")
        fd, path, offset = entry.get("fd"), entry.get("path"), entry.get("offset")
        require(is_int(fd, 3, MAX_DESCRIPTOR), "bad open file's descriptor")
        require(not held or held[-1].fd < fd, "open files unordered or repeated")
        require(
            isinstance(path, str) and path.startswith("/") and len(path) <= MAX_HELD_PATH,
            "bad open file's path",
        )
        require("\0" not in path and posixpath.normpath(path) == path, "bad open file's path")
        require(offset is None or is_int(offset, 0, 1 << 62), "bad open file's offset")
        require(entry.get("oflags") in (0, OFLAG_DIRECTORY), "bad open file's flags")
        require(is_int(entry.get("rights"), 0, MAX_RIGHTS), "bad open file's rights")
        require(is_int(entry.get("inheriting"), 0, MAX_RIGHTS), "bad open file's rights")
        require(is_int(entry.get("fdflags"), 0, MAX_FDFLAGS), "bad open file's flags")
        require(is_int(entry.get("lookup"), 0, 1), "bad open file's lookup flags")
        held.append(HeldFile(**entry))
    return held


def inflate(data: memoryview, size: int, exact: bool = True) -> bytes:
    """Decompress one frame of at most ``size`` bytes (exactly ``size`` when ``exact``)."""
    declared = zstandard.frame_content_size(data)
    require(0 <= declared <= size, "compressed data of unknown or too large a size")
    require(not exact or declared == size, "a memory extent has the wrong size")
    out = zstandard.ZstdDecompressor().decompress(data)
    require(len(out) == declared, "compressed data shorter than it says")
    return out


def check_memory_size(memory_size: object, memory_limit: int) -> None:
    if not isinstance(memory_size, int):
        raise ValueError("bad memory size")
    require(is_int(memory_size, PAGE, 1 << 32) and memory_size % PAGE == 0, "bad memory size")
    if memory_size > memory_limit:
        raise ImageError(
            f"the image holds {memory_size >> 20} MiB of memory, more than this kernel's memory"
            f" limit of {memory_limit >> 20} MiB (--WasmKernel.memory_limit)"
        )
