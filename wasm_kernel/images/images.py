"""Interpreter images: a guest's whole state in one file, to resume in another kernel process.

An image holds what a resumed guest needs and nothing that grants anything:

- linear memory up to the program break, stored as extents of the pages that differ from a
  freshly instantiated module (pages equal to the fresh instance, zero pages past its end
  included, cost nothing on disk): raw, page-aligned, for a resume to map copy-on-write
  rather than read (``image_writer`` says what that costs on disk); format 1 compressed each
  extent with zstd, and such extents are still read;
- every exported mutable global (the stack pointer, the program break...);
- the host side of the session: execution count, input history, the guest's working folder,
  its clock readings (so that its clocks never run backwards), the private ``/tmp`` as a
  bounded tar archive, and the names and versions of its ``%pip`` packages (only those: the
  resuming kernel installs them again from its own package source, or says it cannot);
- a header naming what the image needs (runtime sha256, rewrite and guest-code versions,
  wasmtime version, machine) and, for information only, the mounts it was taken with: a
  resumed guest always gets the mounts of the kernel resuming it.

Layout: ``MAGIC``, the format version (u32), the header's length (u32), the header (JSON,
perhaps padded with spaces), the compressed blobs the header describes, the sha256 of
everything before it (the checked part, which a resume reads whole), then, from the next
``PAGE`` boundary, the raw extents, whose sha256 is in the header. A resume maps the raw
extents and never reads them (summing them cost more than the rest of the resume): a damaged
one is found by ``snapshot info``. Format 1 is format 2 without raw extents. ``image_writer``
writes images; this module defines the format and reads them.

An image is hostile input (anyone can write one, and compute its checksum): ``read_image``
checks the format, the checksum, every field's type and bound (memory within the kernel's
memory limit, extents inside it and not overlapping, archive members plain files and folders
under ``/tmp``), and the identity, before anything reaches a guest. Its raw extents are mapped
only from a file nobody else could change or truncate under the mapping (a truncated mapping
faults the process): this user's, writable by no one else, of one link, outside every folder
the guest reaches; any other file's are copied in. What it refuses raises
``ImageError`` with a sentence saying why. The memory and globals themselves are the guest's
own business: a guest could write any of those bytes itself.
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import platform
import struct
import tarfile
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

import zstandard

from ..files import host_files
from ..files.host_files import read_exactly
from ..runtime import guest_packages, rewrite
from ..runtime.cache import wasmtime_version
from ..runtime.runtime import manifest_dir
from .image_fields import (
    IDENTITY_WORDS,
    MAX_HISTORY,
    PAGE,
    SHA256,
    Image,
    check_memory_size,
    checked_image,
    is_int,
    raw_runs,
    require,
)
from .image_pages import RawFile
from .names import SUFFIX, ImageError

MAGIC = b"WKIMAGE\n"
FORMAT = 2  # written where an image has raw extents
FIRST_FORMAT = 1  # format 2 without raw extents: written where there are none
READABLE = (FIRST_FORMAT, FORMAT)
CHECKSUM = 32  # bytes of the trailing sha256
PREFIX = len(MAGIC) + 8  # the mark, the format version and the header's length
MAX_HEADER = 1 << 20
Buffer = bytes | bytearray | mmap.mmap | memoryview  # an image file (its checked part) read
POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux's
# what a malformed image raises while it is checked
MALFORMED = (
    ValueError,
    TypeError,
    KeyError,
    RecursionError,  # JSON nested deeper than Python recurses
    zstandard.ZstdError,
    tarfile.TarError,
)
MEMORY_SUFFIX = ".memory"


@functools.cache
def guest_code_version() -> str:
    """sha256 over the guest's own sources: an image holds them as loaded, so an image taken
    with other guest code would run that code against this host."""
    digest = hashlib.sha256()
    root = resources.files("wasm_kernel") / "guest"
    for path in sorted(Path(str(root)).rglob("*.py")):
        digest.update(str(path.relative_to(Path(str(root)))).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    # and the pinned IPython packages it loads (an image holds their modules too)
    digest.update((manifest_dir() / guest_packages.MANIFEST).read_bytes())
    return digest.hexdigest()


def identity(runtime_sha256: str) -> dict[str, object]:
    """What an image needs from the kernel that resumes it, each compared exactly."""
    return {
        "runtime_sha256": runtime_sha256,
        "rewrite": rewrite.VERSION,
        "guest_code": guest_code_version(),
        "wasmtime": wasmtime_version(),
        "machine": platform.machine(),
    }


# -- reading -----------------------------------------------------------------------------------


def raw_offset(checked_end: int) -> int:
    """Where the raw extents start in a file whose checked part ends at ``checked_end``."""
    return -(-checked_end // PAGE) * PAGE


def read_image(
    path: Path,
    *,
    needs: dict[str, object],
    memory_limit: int,
    scratch_limit: int,
    memory_file: Path | None = None,
    boot_file: Path | None = None,
    guest_folders: list[Path] | None = None,
    boot_digest: str = "",
) -> Image:
    """Read and check the image at ``path`` against this kernel; raises ImageError.
    ``memory_file`` is where a boot image's memory is (the kernel's own cache, never a name
    an image gives): an image whose memory lives elsewhere is refused without one.
    ``boot_file`` is this kernel's boot memory file, which a fork's image may map.
    ``guest_folders`` are the host folders the resuming guest reaches: the image's raw
    extents are mapped only from a file outside them (None: copied in whatever the file).
    ``boot_digest`` is the sha256 of ``boot_file``'s content: an image that builds on a boot
    memory file resumes only where it is that one."""
    try:
        fd = host_files.open_regular(path)
    except OSError as exc:
        raise ImageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data, header = _read_checked_sizes(fd, path, memory_limit, scratch_limit)
        mappable = guest_folders is not None and _nobody_else_changes(fd, path, guest_folders)
        image = parse_image(
            data,
            header,
            needs=needs,
            memory_limit=memory_limit,
            scratch_limit=scratch_limit,
            raw_file=RawFile(fd, raw_offset(len(data)), mappable),
        )
    except OSError as exc:
        raise ImageError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    image.boot_file = boot_file
    if image.based:
        _build_on(image, boot_file, boot_digest)
    if image.memory_elsewhere:
        if memory_file is None:
            raise ImageError(
                "this image keeps its memory in a file of its own, as only a boot image does"
            )
        try:
            found = memory_file.stat().st_size
        except OSError as exc:
            raise ImageError(f"cannot read {memory_file}: {exc.strerror or exc}") from None
        if found != image.memory_size:  # mapped past its end, the guest's reads would fault
            raise ImageError(
                f"{memory_file.name} holds {found} bytes, not the image's {image.memory_size}"
            )
        image.memory_file = memory_file
    return image


def _build_on(image: Image, boot_file: Path | None, boot_digest: str) -> None:
    """Point an image that builds on a boot memory file at this kernel's, if it is that one."""
    if boot_file is None or image.memory_digest != boot_digest:
        raise ImageError(
            "the image builds on another boot image than this kernel's (another installation's,"
            " or one built again since), so it cannot be resumed here"
        )
    try:
        found = boot_file.stat().st_size
    except OSError as exc:
        raise ImageError(f"cannot read {boot_file}: {exc.strerror or exc}") from None
    if found > image.memory_size:
        raise ImageError("the image's memory is smaller than the boot image's it builds on")
    image.memory_file = boot_file


def boot_image_digest(path: Path) -> str:
    """The sha256 its header gives of a boot image's memory file ("" where it gives none:
    built before they were summed, or unreadable). The image is the kernel's own cache's."""
    try:
        fd = host_files.open_regular(path)
        try:
            _, head = _read_head(fd)
        finally:
            os.close(fd)
        digest = _decoded_header(head)["memory"]["file_sha256"]
    except (OSError, ImageError, KeyError, TypeError):
        return ""
    return digest if isinstance(digest, str) and SHA256.fullmatch(digest) else ""


def _nobody_else_changes(fd: int, path: Path, guest_folders: list[Path]) -> bool:
    """Whether the open image file ``fd`` (at ``path``) can be mapped: only this user may
    write it, no other name reaches it, and it lies outside every folder the guest reaches.
    Otherwise its raw pages are copied in: a file truncated under a mapping faults the
    process at the next read of a page past its new end."""
    status = os.fstat(fd)
    if status.st_uid != os.geteuid() or status.st_mode & 0o022 or status.st_nlink != 1:
        return False
    where = Path(os.path.realpath(path.parent))
    return not any(where.is_relative_to(os.path.realpath(folder)) for folder in guest_folders)


def _read_checked_sizes(
    fd: int, path: Path, memory_limit: int, scratch_limit: int
) -> tuple[mmap.mmap, dict]:
    """The file's checked part (all but its raw extents) and its decoded header, read only
    once the header has been read and the sizes it declares fit this kernel's limits and add
    up to the file's size. A refusal of the header is given only for a file whose checksum
    holds: a damaged file is called damaged."""
    size = os.fstat(fd).st_size
    # the largest sound image: all memory and all of /tmp barely compressible, and history
    if size > memory_limit + (scratch_limit or memory_limit) + MAX_HISTORY + (64 << 20):
        raise ImageError(
            f"{path.name} is {size >> 20} MiB, larger than any image this kernel could have written"
        )
    prefix = bytearray(min(size, PREFIX))
    read_exactly(fd, memoryview(prefix))
    header_size = _header_size(prefix, size)
    head = bytearray(header_size)
    read_exactly(fd, memoryview(head))
    checked = size  # where the checksum is, as far as can be told without a header
    try:
        header = _decoded_header(head)
        checked = min(_checked_end(header, PREFIX + header_size, size), size)
        _check_declared(header, checked, size, memory_limit)
    except ImageError:
        if not _checksum_holds(fd, checked):
            raise _damaged() from None
        raise
    # populated at once: faster than a fault per page as the file is read into it
    data = mmap.mmap(-1, checked, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | POPULATE)
    data[: PREFIX + header_size] = prefix + head
    read_exactly(fd, memoryview(data)[PREFIX + header_size :])
    return data, header


def _checksum_holds(fd: int, size: int) -> bool:
    """Whether the sha256 at ``size - CHECKSUM`` matches the bytes before it, read a piece at
    a time (``size``: the end of the checked part, the file's size where it has no raw
    extents, or the header is not believed)."""
    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    left = size - CHECKSUM
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return False
        digest.update(chunk)
        left -= len(chunk)
    return os.read(fd, CHECKSUM) == digest.digest()


def _raw_digest_holds(fd: int, header: dict, checked: int) -> bool:
    """Whether the raw extents after the checked part match the header's sha256 of them."""
    memory = header["memory"]
    left = sum(count for _, count in raw_runs(memory)) * PAGE
    if not left:
        return True
    digest = hashlib.sha256()
    os.lseek(fd, raw_offset(checked), os.SEEK_SET)
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return False
        digest.update(chunk)
        left -= len(chunk)
    return digest.hexdigest() == memory.get("raw_sha256")


def _damaged() -> ImageError:
    return ImageError("the image is damaged or truncated (its checksum does not match)")


def _checked_end(header: dict, header_end: int, size: int) -> int:
    """Where the header says the checked part ends (past its checksum)."""
    try:
        memory = header["memory"]
        lengths = [extent[2] for extent in memory["extents"]]
        lengths += [header["history"], header["scratch"]]
        require(all(is_int(length, 0, size) for length in lengths), "bad blob sizes")
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise ImageError(f"the image is malformed: {exc}") from None
    return header_end + sum(lengths) + CHECKSUM


def _check_declared(header: dict, checked: int, size: int, memory_limit: int) -> None:
    """The header's sizes against the file's size and the memory limit, before reading on
    (``checked``: where it says the checked part ends)."""
    try:
        memory = header["memory"]
        raw_pages = sum(count for _, count in raw_runs(memory))
        declared = raw_offset(checked) + raw_pages * PAGE if raw_pages else checked
        check_memory_size(memory["size"], memory_limit)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise ImageError(f"the image is malformed: {exc}") from None
    if declared != size:
        raise ImageError(
            f"the image is damaged or truncated: its header declares {declared} bytes, the"
            f" file holds {size}"
        )


def parse_image(
    data: Buffer,
    header: dict,
    *,
    needs: dict[str, object],
    memory_limit: int,
    scratch_limit: int,
    raw_file: RawFile,
) -> Image:
    """The checked image whose checked part is ``data``, whose ``header`` the caller has
    decoded, and whose raw extents are in ``raw_file``. Its checksum is summed while the
    rest is checked and decompressed (hashlib lets go of the GIL): it tells a damaged file
    from a malformed one, and nothing more, since a crafted image carries a correct
    checksum."""
    body, offset = _body(data)
    with ThreadPoolExecutor(1, thread_name_prefix="image-checksum") as pool:
        sound = pool.submit(_checksum_matches, data)
        try:
            image = checked_image(
                header, body, offset, needs, memory_limit, scratch_limit, raw_file
            )
        except (ImageError, *MALFORMED) as exc:
            if not sound.result():
                raise _damaged() from None
            if isinstance(exc, ImageError):
                raise
            raise ImageError(f"the image is malformed: {exc}") from None
        except OSError as exc:  # no memory for its decompressed pages
            raise ImageError(f"cannot hold the image's pages: {exc.strerror or exc}") from None
        if not sound.result():
            image.pages.close()
            raise _damaged()
    return image


def _header_size(prefix: Buffer, size: int) -> int:
    """The header's length from the file's first bytes (mark and format version checked)."""
    prefix = bytes(prefix[:PREFIX])
    if not prefix.startswith(MAGIC):
        raise ImageError("this is not a wasm-kernel image (it does not start with one's mark)")
    if size < PREFIX + CHECKSUM:
        raise ImageError("the image is truncated (shorter than its own header)")
    version, header_size = struct.unpack_from("<II", prefix, len(MAGIC))
    if version not in READABLE:
        raise ImageError(
            f"the image is in format version {version}; this kernel reads versions"
            f" {', '.join(map(str, READABLE))}"
        )
    if header_size > MAX_HEADER or PREFIX + header_size > size - CHECKSUM:
        raise ImageError("the image's header is larger than allowed")
    return header_size


def _read_head(fd: int) -> tuple[int, bytearray]:
    """An image file's size and its header's bytes, read from its start (bounded by
    ``_header_size``)."""
    size = os.fstat(fd).st_size
    prefix = bytearray(min(size, PREFIX))
    read_exactly(fd, memoryview(prefix))
    head = bytearray(_header_size(prefix, size))
    read_exactly(fd, memoryview(head))
    return size, head


def _decoded_header(encoded: bytes | bytearray | memoryview) -> dict:
    try:
        header = json.loads(bytes(encoded))
    except (ValueError, RecursionError) as exc:
        raise ImageError(f"the image's header is malformed: {exc}") from None
    if not isinstance(header, dict):
        raise ImageError("the image's header is not an object")
    return header


def verified_header(data: Buffer) -> tuple[dict, memoryview, int]:
    """The header of a sound image file (read whole), the checked part's body (less its
    checksum) and where the blobs start; the raw extents are in ``data`` past the body."""
    header_size = _header_size(data[:PREFIX], len(data))
    header = _decoded_header(data[PREFIX : PREFIX + header_size])
    end = _checked_end(header, PREFIX + header_size, len(data))
    _check_declared(header, end, len(data), 1 << 32)
    checked = memoryview(data)[:end]
    if not _checksum_matches(checked):
        raise _damaged()
    return (header, *_body(checked))


def _body(data: Buffer) -> tuple[memoryview, int]:
    """An image file less its checksum, and where its blobs start (past the header)."""
    return memoryview(data)[:-CHECKSUM], PREFIX + _header_size(data[:PREFIX], len(data))


def _checksum_matches(data: Buffer) -> bool:
    """Whether the file's trailing sha256 matches the rest, in memory."""
    with memoryview(data) as whole:
        return hashlib.sha256(whole[:-CHECKSUM]).digest() == whole[-CHECKSUM:]


def describe_file(path: Path, needs: dict[str, object]) -> str:
    """What ``python -m wasm_kernel snapshot info`` shows: the header, and whether this
    installation can resume the image. Reads the header, and the rest only to check it (the
    raw extents too, which a resume does not check)."""
    try:
        fd = host_files.open_regular(path)
        try:
            size, head = _read_head(fd)
            checked = size  # as far as can be told without a header
            try:
                header = _decoded_header(head)
                checked = min(_checked_end(header, PREFIX + len(head), size), size)
                _check_declared(header, checked, size, 1 << 32)
            except ImageError:
                if not _checksum_holds(fd, checked):
                    raise _damaged() from None
                raise
            if not _checksum_holds(fd, checked):
                raise _damaged()
            if not _raw_digest_holds(fd, header, checked):
                raise ImageError(
                    "the image's raw memory pages are damaged (their sha256 does not match)"
                )
        finally:
            os.close(fd)
    except OSError as exc:
        raise ImageError(f"cannot read {path}: {exc.strerror or exc}") from None

    def part(key: str) -> dict:
        value = header.get(key)
        return value if isinstance(value, dict) else {}

    found, memory, host = part("needs"), part("memory"), part("host")
    raw_pages = sum(count for _, count in raw_runs(memory))  # checked with the sizes above
    lines = [
        f"image:           {path} ({size / (1 << 20):.1f} MiB on disk)",
        f"taken:           {str(header.get('taken'))[:64]}",
        f"guest memory:    {str(memory.get('size'))[:24]} bytes",
        f"stored raw:      {raw_pages * PAGE} bytes (a resume maps them; checked here)",
        f"builds on:       {_base_text(memory)}",
        f"execution count: {str(host.get('execution_count'))[:24]}",
        f"taken with mounts (not carried): {str(header.get('mounts'))[:400]}",
    ]
    for key, wanted in needs.items():
        have = found.get(key)
        verdict = "ok" if have == wanted else f"differs: this installation has {wanted}"
        lines.append(f"needs {IDENTITY_WORDS[key]}: {str(have)[:80]} ({verdict})")
    return "\n".join(lines)


def _base_text(memory: dict) -> str:
    """What the omitted pages of an image's memory are, for ``describe_file``."""
    if memory.get("base"):
        return f"the boot image whose memory file's sha256 is {str(memory['base'])[:64]}"
    return "a fresh instance of the runtime"


def boot_image_path(entry: Path) -> Path:
    """Where the boot image of a compiled-runtime cache entry lives: named by the guest code's
    version, so that a change of guest code needs (and finds) a new one."""
    return entry / f"boot-{guest_code_version()[:24]}{SUFFIX}"


def boot_memory_path(image_path: Path) -> Path:
    """The raw memory file beside a boot image: every kernel maps it copy-on-write, so a
    start reads only the pages its guest touches, and the page cache holds them once."""
    return image_path.with_suffix(MEMORY_SUFFIX)
