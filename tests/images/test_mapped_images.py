"""Images whose memory a resume maps: raw, page-aligned extents (format 2).

A resume maps an image's raw extents copy-on-write straight from the image file, only where
nobody else can change or truncate that file under the mapping (this user's, writable by no
one else, one link, outside the folders the guest reaches); anywhere else they are copied in.
Checked here on real mappings (``/proc/self/maps``, and a kernel's own), and what the reader
refuses of a crafted header; format 1 images (zstd frames) still read; a damaged raw page,
which a resume does not read, is found by ``snapshot info``. An image of a session started
from the boot image leaves out the pages still equal to the boot memory file, names that file
by its sha256, and resumes only on that very file.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import struct
from pathlib import Path

import pytest
import zstandard
from conftest import Kernel, ok, plain

from wasm_kernel.images import image_fields, image_writer, images
from wasm_kernel.images.image_folder import ImageFolder
from wasm_kernel.images.names import ImageError
from wasm_kernel.runtime.cache import RuntimeCache
from wasm_kernel.runtime.runtime import load_runtime

PAGE = image_fields.PAGE
NEEDS: dict[str, object] = {"runtime_sha256": "test"}
LIMITS = {"memory_limit": 1 << 30, "scratch_limit": 1 << 30}


def memory_of_pages() -> bytes:
    memory = bytearray(16 * PAGE)
    memory[PAGE : 3 * PAGE] = os.urandom(2 * PAGE)
    memory[8 * PAGE] = 7
    return bytes(memory)


def written(folder: Path, memory: bytes) -> Path:
    scratch = folder / "scratch"
    scratch.mkdir(exist_ok=True)
    path = folder / ("image" + images.SUFFIX)
    with image_writer.staged(path, 0o600) as out:
        image_writer.write_image(
            out,
            needs=NEEDS,
            mounts=[],
            memory=memory,
            base=bytes(PAGE),
            globals_={"__stack_pointer": 1},
            host=image_fields.HostState(),
            scratch=image_writer.ScratchArchive.of(scratch, 0),
            taken="now",
        )
    return path


def mapped_from(path: Path, memory: bytes, guest_folders: list[Path] | None) -> tuple[bool, bytes]:
    """Whether resuming ``path`` maps it (as a kernel would, over an area of guest memory's
    size), and what that area then holds."""
    image = images.read_image(path, needs=NEEDS, guest_folders=guest_folders, **LIMITS)
    area = mmap.mmap(-1, len(memory))
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    try:
        image.pages.map_into(base)
        image.pages.close()
        maps = Path("/proc/self/maps").read_text()
        return str(path) in maps, ctypes.string_at(base, len(memory))
    finally:
        ctypes.CDLL(None).munmap(ctypes.c_void_p(base), ctypes.c_size_t(len(memory)))


@pytest.mark.nokernel
def test_raw_pages_are_mapped_only_from_a_file_nobody_else_can_change(tmp_path):
    memory = memory_of_pages()
    path = written(tmp_path, memory)
    data = path.read_bytes()
    assert struct.unpack_from("<I", data, len(images.MAGIC))[0] == images.FORMAT
    header, body, _ = images.verified_header(data)
    assert header["memory"]["raw"] == [[1, 2], [8, 1]] and header["memory"]["extents"] == []
    assert (len(body) + images.CHECKSUM) <= images.raw_offset(len(body) + images.CHECKSUM)
    assert images.raw_offset(len(body) + images.CHECKSUM) % PAGE == 0
    assert mapped_from(path, memory, []) == (True, memory)
    # in a folder the guest reaches, with another name, or writable by others: copied
    assert mapped_from(path, memory, [tmp_path]) == (False, memory)
    assert mapped_from(path, memory, None) == (False, memory)
    os.link(path, tmp_path / "other-name")
    assert mapped_from(path, memory, []) == (False, memory)
    os.unlink(tmp_path / "other-name")
    path.chmod(0o620)
    assert mapped_from(path, memory, []) == (False, memory)
    path.chmod(0o600)
    assert mapped_from(path, memory, []) == (True, memory)


def _crafted(data: bytes, change) -> bytes:
    """The image with its header changed by ``change``, its checksum sound again."""
    header, body, offset = images.verified_header(data)
    raw = data[images.raw_offset(len(body) + images.CHECKSUM) :]
    change(header)
    encoded = json.dumps(header).encode()
    new = images.MAGIC + struct.pack("<II", images.FORMAT, len(encoded)) + encoded
    new += bytes(body[offset:])
    new += hashlib.sha256(new).digest()
    return new.ljust(images.raw_offset(len(new)), b"\0") + raw


def _overlapping_frame(header: dict) -> None:
    """A one-byte zstd frame over the first raw extent's first page (the history's first
    byte, the history one byte shorter: the sizes still add up)."""
    header["memory"]["extents"].append([1, 1, 1])
    header["history"] -= 1


CRAFTED = {
    "unordered": (
        lambda header: header["memory"]["raw"].reverse(),
        "raw extents overlap or are unordered",
    ),
    "past-the-end": (
        lambda header: header["memory"].update(raw=[[8, 1], [15, 2]]),
        "passes the memory's end",
    ),
    "overlapping-a-frame": (_overlapping_frame, "raw and compressed memory extents overlap"),
    "malformed": (lambda header: header["memory"]["raw"].append([1]), "bad raw memory extent"),
}


@pytest.mark.nokernel
@pytest.mark.parametrize("kind", CRAFTED)
def test_crafted_raw_extents_are_refused(tmp_path, kind):
    path = written(tmp_path, memory_of_pages())
    change, reason = CRAFTED[kind]
    path.write_bytes(_crafted(path.read_bytes(), change))
    with pytest.raises(ImageError, match=reason):
        images.read_image(path, needs=NEEDS, guest_folders=[], **LIMITS)


@pytest.mark.nokernel
def test_a_cut_raw_area_is_refused_and_a_damaged_raw_page_is_found_by_info(tmp_path):
    memory = memory_of_pages()
    path = written(tmp_path, memory)
    data = path.read_bytes()
    path.write_bytes(data[:-PAGE])
    with pytest.raises(ImageError, match="damaged or truncated"):
        images.read_image(path, needs=NEEDS, guest_folders=[], **LIMITS)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ImageError, match="raw memory pages are damaged"):
        images.describe_file(path, NEEDS)
    path.write_bytes(data)
    shown = images.describe_file(path, NEEDS)
    assert "needs runtime (sha256): test (ok)" in shown
    assert f"stored raw:      {3 * PAGE} bytes" in shown
    assert "builds on:       a fresh instance" in shown


@pytest.mark.nokernel
def test_a_format_1_image_of_zstd_frames_still_reads(tmp_path):
    """What the kernel before format 2 wrote: each extent a zstd frame, the checksum last."""
    memory = memory_of_pages()
    frames = [(1, 2), (8, 1)]
    blobs = [
        zstandard.ZstdCompressor().compress(memory[f * PAGE : (f + c) * PAGE]) for f, c in frames
    ]
    history = zstandard.ZstdCompressor().compress(b"[]")
    scratch = zstandard.ZstdCompressor().compress(bytes(1024))  # an empty tar archive
    header = {
        "needs": NEEDS,
        "mounts": [],
        "taken": "before",
        "memory": {
            "size": len(memory),
            "extents": [[f, c, len(b)] for (f, c), b in zip(frames, blobs, strict=True)],
            "separate": False,
        },
        "globals": {"__stack_pointer": 1},
        "host": {"execution_count": 3, "cwd": "/tmp", "clocks": {}},
        "history": len(history),
        "scratch": len(scratch),
    }
    encoded = json.dumps(header).encode()
    new = images.MAGIC + struct.pack("<II", 1, len(encoded)) + encoded
    new += b"".join(blobs) + history + scratch
    path = tmp_path / ("old" + images.SUFFIX)
    path.write_bytes(new + hashlib.sha256(new).digest())
    assert mapped_from(path, memory, []) == (False, memory)


STATE = "import numpy as np\nnoise = np.random.default_rng(7).random(2 << 20)\nfloat(noise.sum())"


def test_a_kernel_resumes_a_saved_session_by_mapping_its_image(tmp_path):
    folder = tmp_path / "images"
    kernel = Kernel(env={"WASM_KERNEL_SNAPSHOT_DIR": str(folder)})
    try:
        total = plain(ok(kernel.execute(STATE)))
        ok(kernel.execute("%snapshot save noisy"))
    finally:
        kernel.shutdown()
    image = folder / ("noisy" + images.SUFFIX)
    resumed = Kernel(
        ["--WasmKernel.resume_from=noisy"], env={"WASM_KERNEL_SNAPSHOT_DIR": str(folder)}
    )
    try:
        assert plain(ok(resumed.execute("float(noise.sum())"))) == total
        pid = resumed.manager.provisioner.process.pid
        assert str(image) in Path(f"/proc/{pid}/maps").read_text()
        # a later cell's writes stay the kernel's own: the file is as it was saved
        before = image.read_bytes()
        ok(resumed.execute("noise[:] = 0"))
        assert plain(ok(resumed.execute("float(noise.sum())"))) == 0.0
        assert image.read_bytes() == before
    finally:
        resumed.shutdown()


def boot_memory_file() -> Path:
    """The installed cache's boot memory file, which kernels start from."""
    cache = RuntimeCache()
    return images.boot_memory_path(images.boot_image_path(cache.entry_dir(load_runtime())))


def test_a_hibernated_session_leaves_out_the_pages_its_boot_image_holds(tmp_path):
    folder = tmp_path / "images"
    env = {"WASM_KERNEL_SNAPSHOT_DIR": str(folder), "JPY_SESSION_NAME": "notes.ipynb"}
    kernel = Kernel(env=env)
    try:
        ok(kernel.execute("kept = list(range(1000))"))
        ok(kernel.execute("%snapshot save whole"))
    finally:
        kernel.shutdown()  # as a notebook is closed: the session hibernates
    folder_images = ImageFolder(folder, 0)
    hibernated = folder_images.path(folder_images.hibernation_name("notes.ipynb"))
    data = hibernated.read_bytes()
    header, body, _ = images.verified_header(data)
    boot = boot_memory_file().read_bytes()
    assert header["memory"]["base"] == hashlib.sha256(boot).hexdigest()
    stored = data[images.raw_offset(len(body) + images.CHECKSUM) :]
    pages = [
        page for first, count in header["memory"]["raw"] for page in range(first, first + count)
    ]
    assert len(stored) == len(pages) * PAGE and pages
    for index, page in enumerate(pages):  # none is the boot file's own page
        assert stored[index * PAGE : (index + 1) * PAGE] != boot[page * PAGE : (page + 1) * PAGE]
    # a snapshot, which may outlive this boot image, holds all it needs
    whole, _, _ = images.verified_header((folder / ("whole" + images.SUFFIX)).read_bytes())
    assert "base" not in whole["memory"]
    print(f"hibernated {len(data) >> 20} MiB, snapshot {whole['memory']['raw']}")
    resumed = Kernel(env=env)
    try:
        assert plain(ok(resumed.execute("sum(kept)"))) == sum(range(1000))
        assert plain(ok(resumed.execute("import numpy, pandas; pandas.__name__"))) == "pandas"
    finally:
        resumed.shutdown()


@pytest.mark.nokernel
def test_an_image_resumes_only_on_the_boot_image_it_builds_on(tmp_path):
    memory = memory_of_pages()
    path = written(tmp_path, memory)
    boot = tmp_path / "boot.memory"
    boot.write_bytes(memory[: 4 * PAGE])
    digest = hashlib.sha256(boot.read_bytes()).hexdigest()
    path.write_bytes(
        _crafted(path.read_bytes(), lambda header: header["memory"].update(base=digest))
    )
    image = images.read_image(path, needs=NEEDS, boot_file=boot, boot_digest=digest, **LIMITS)
    assert image.memory_file == boot and image.based
    image.pages.close()
    for boot_file, boot_digest in ((boot, "0" * 64), (None, digest), (boot, "")):
        with pytest.raises(ImageError, match="builds on another boot image than this kernel's"):
            images.read_image(
                path, needs=NEEDS, boot_file=boot_file, boot_digest=boot_digest, **LIMITS
            )
    boot.write_bytes(bytes(17 * PAGE))  # larger than the image's memory
    with pytest.raises(ImageError, match="smaller than the boot image's it builds on"):
        images.read_image(path, needs=NEEDS, boot_file=boot, boot_digest=digest, **LIMITS)
