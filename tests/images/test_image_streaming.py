"""Saving an image streams it into its file: a save costs the kernel process a small, fixed
amount of host memory, not a multiple of the guest's state (its memory and its ``/tmp``).

The kernel test measures the process's peak resident memory (``VmHWM``, reset through
``/proc/PID/clear_refs``) around a save of 200 MiB of guest memory and 200 MiB of ``/tmp``,
neither of which compresses; the image built in memory took about 1.5 GiB more at its peak.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import ok, plain

from wasm_kernel.images import image_archive, image_fields, image_writer, images

STATE = """
import hashlib, os
noise = os.urandom(200 << 20)
with open('/tmp/noise', 'wb') as file:
    for _ in range(25):
        file.write(os.urandom(8 << 20))
def digests():
    with open('/tmp/noise', 'rb') as file:
        return hashlib.sha256(noise).digest(), hashlib.file_digest(file, 'sha256').digest()
"""
PEAK_ALLOWED = 128 << 20  # what a save may add to the process's peak, whatever the state


def memory_of(pid: int) -> dict[str, int]:
    """The process's memory counters from /proc, in bytes."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            found[key] = int(value.split()[0]) << 10
    return found


def test_a_save_costs_the_host_a_bounded_amount_of_memory(start_kernel, tmp_path):
    kernel = start_kernel(env={"WASM_KERNEL_SNAPSHOT_DIR": str(tmp_path)})
    pid = kernel.manager.provisioner.process.pid
    ok(kernel.execute(STATE))
    digests = plain(kernel.execute("digests()"))
    # A first save reads all of guest memory, which brings pages the rollback checkpoint holds
    # into the process's resident set (memory in use already, now counted): measure the next.
    ok(kernel.execute("%snapshot save first"))
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts again from here
    before = memory_of(pid)
    saved = ok(kernel.execute("%snapshot save second"))
    after = memory_of(pid)
    growth = after["VmHWM"] - before["VmRSS"]
    size = (tmp_path / ("second" + images.SUFFIX)).stat().st_size
    print(f"{saved.stream_text().strip()} peak growth {growth >> 20} MiB, image {size >> 20} MiB")
    assert size > 400 << 20  # the state was saved, uncompressed as it is
    assert growth < PEAK_ALLOWED, f"a save of {size >> 20} MiB grew the kernel by {growth >> 20}"
    # and the image streamed that way is whole: it restores what was saved
    ok(kernel.execute("del noise; os.remove('/tmp/noise')"))
    ok(kernel.execute("%snapshot restore second"))
    assert plain(kernel.execute("digests()")) == digests


# -- the writer alone ---------------------------------------------------------------------------

NEEDS: dict[str, object] = {"runtime_sha256": "test"}


def write(path: Path, memory: bytes, scratch: Path, **host: object) -> None:
    archive = image_writer.ScratchArchive.of(scratch, 0)
    with image_writer.staged(path, 0o600) as out:
        image_writer.write_image(
            out,
            needs=NEEDS,
            mounts=[],
            memory=memory,
            base=bytes(image_fields.PAGE),
            globals_={"__stack_pointer": 1234},
            host=image_fields.HostState(**host),  # type: ignore[arg-type]
            scratch=archive,
            taken="now",
        )


@pytest.mark.nokernel
def test_a_streamed_image_reads_back_whole(tmp_path):
    page = image_fields.PAGE
    memory = bytearray(64 * page)
    memory[page : 3 * page] = os.urandom(2 * page)  # an extent of two pages
    memory[10 * page] = 7  # and one of a page
    memory[63 * page :] = b"\xff" * page  # the last page
    scratch = tmp_path / "tmp"
    (scratch / "folder").mkdir(parents=True)
    (scratch / "folder" / "data.bin").write_bytes(os.urandom(100_000))
    (scratch / "empty").write_bytes(b"")
    (scratch / "link").symlink_to("/etc/passwd")  # left out, never followed
    path = tmp_path / ("image" + images.SUFFIX)
    write(path, bytes(memory), scratch, execution_count=5, history=[(1, "x = 1")])
    assert not list(tmp_path.glob(".*.partial"))
    image = images.read_image(path, needs=NEEDS, memory_limit=1 << 30, scratch_limit=1 << 30)
    restored = bytearray(len(memory))
    for start, end in image.pages.extents:
        restored[start:end] = image.pages.read(start, end)
    assert restored == memory and len(image.pages.extents) == 3
    assert image.globals == {"__stack_pointer": 1234}
    assert (image.host.execution_count, image.host.history) == (5, [(1, "x = 1")])
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    image_archive.unpack_checked(image.scratch, unpacked, 1 << 30)
    assert sorted(str(p.relative_to(unpacked)) for p in unpacked.rglob("*")) == [
        "empty",
        "folder",
        "folder/data.bin",
    ]
    assert (unpacked / "folder" / "data.bin").read_bytes() == (
        scratch / "folder" / "data.bin"
    ).read_bytes()


@pytest.mark.nokernel
def test_a_staging_link_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / (".image" + images.SUFFIX + ".partial")).symlink_to(outside)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    write(folder / ("image" + images.SUFFIX), bytes(image_fields.PAGE), scratch)
    assert outside.read_bytes() == b"keep"
    assert (folder / ("image" + images.SUFFIX)).stat().st_mode & 0o777 == 0o600
    assert [p.name for p in folder.iterdir()] == ["image" + images.SUFFIX]


@pytest.mark.nokernel
def test_a_scratch_folder_that_changes_while_saved_is_refused(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    (scratch / "grows").write_bytes(b"x" * 1000)
    archive = image_writer.ScratchArchive.of(scratch, 0)
    (scratch / "grows").write_bytes(b"x" * 2000)
    target = tmp_path / "image.wkimg"
    changed = pytest.raises(images.ImageError, match="changed while it was being saved")
    with changed, image_writer.staged(target, 0o600) as out:
        archive.write(out)
    assert not target.exists() and not list(tmp_path.glob(".*.partial"))
