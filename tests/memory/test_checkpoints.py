"""Copy-on-write checkpoints restore exactly what the copy did, and cost what a cell wrote.

Through jupyter_client, in both checkpoint modes ('auto', copy-on-write where the OS allows
it, and 'copy'): every value of large arrays is checked after traps (a page the dirty-page
scan missed, or one dropped that should have been kept, shows up as a wrong value); memory a
rolled-back cell grew into is forgotten, memory a kept cell grew into comes back with its
contents; memory held stays flat over trap and rollback cycles; %sandbox names the method.

In process (a real Sandbox, no kernel): memory past the break reads as zeros after a rollback
(inside the guest its own calloc would hide a miss); whole guest memory is byte for byte the
same after a checkpoint and after a rollback, with wasmtime's file-mapped pages kept shared or
copied and with either way of finding written pages; a checkpoint after a one-line cell
writes a few pages, against the whole heap when copying; a guest mapped copy-on-write from a
file (the boot-image primitive) runs the interpreter saved in it; restarts leak no file.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from pathlib import Path

import pytest
from conftest import Kernel, ok

from wasm_kernel.images import images
from wasm_kernel.memory import cow, written_pages
from wasm_kernel.memory.checkpoints import COPY, COPY_ON_WRITE, checkpoint_method, memory_address
from wasm_kernel.memory.cow import copy_on_write_missing, map_copy_on_write, page_up
from wasm_kernel.memory.page_ranges import merged_across_gaps
from wasm_kernel.runtime.cache import RuntimeCache
from wasm_kernel.runtime.rewrite import BRK_EXPORT
from wasm_kernel.runtime.runtime import load_runtime
from wasm_kernel.sandbox.limits import Limits
from wasm_kernel.sandbox.sandbox import Sandbox
from wasm_kernel.sandbox.stops import CellStopped

FUEL = 6_000_000_000  # numpy's import fits; a busy loop runs out in about a second
COW_MISSING = copy_on_write_missing()
MODES = ["auto", "copy"]
ROLLED_BACK = "rolled back to its state before this cell"

SETUP = (
    "import numpy as np, hashlib\n"
    "N = 12_000_000\n"
    "a = np.arange(N, dtype=np.int64)  # 96 MB\n"
    "blob = bytes(range(256)) * (64 << 10)  # 16 MiB\n"
    "blob_digest = hashlib.sha256(blob).hexdigest()\n"
)
# every value of every object the trapping cells touch, checked in the guest
INTACT = (
    "wrong = np.flatnonzero(a != np.arange(N, dtype=np.int64))\n"
    "assert not wrong.size, (wrong.size, wrong[:5], a[wrong[:5]])\n"
    "assert hashlib.sha256(blob).hexdigest() == blob_digest\n"
    "assert 'lost' not in globals()\n"
    "print('intact')\n"
)


def trap(kernel: Kernel, code: str) -> None:
    """Run ``code`` then a loop that burns the cell's fuel; the kernel must roll back."""
    run = kernel.execute(code + "\nwhile True:\n    pass\n", timeout=300)
    assert run.content["status"] == "error", run.content
    assert run.content["ename"] == "FuelExhausted", run.content
    assert ROLLED_BACK in run.content["evalue"], run.content["evalue"]


@pytest.fixture(params=MODES)
def mode_kernel(request, start_kernel) -> Kernel:
    kernel = start_kernel(
        [f"--WasmKernel.fuel={FUEL}", "--WasmKernel.memory_limit=2147483648"],
        {"WASM_KERNEL_CHECKPOINT_MODE": request.param},
    )
    ok(kernel.execute(SETUP, timeout=300))
    return kernel


@pytest.mark.slow
def test_sandbox_magic_names_the_checkpoint_method(start_kernel) -> None:
    default = start_kernel()
    shown = ok(default.execute("%sandbox")).stream_text()
    expected = checkpoint_method("auto")
    assert expected.startswith(COPY_ON_WRITE if COW_MISSING is None else COPY)
    assert f"Rollback: to the state after the last cell; checkpoints by {expected}" in shown
    forced = start_kernel(env={"WASM_KERNEL_CHECKPOINT_MODE": "copy"})
    assert f"checkpoints by {COPY} (checkpoint_mode 'copy')" in (
        ok(forced.execute("%sandbox")).stream_text()
    )
    off = start_kernel(["--WasmKernel.rollback=False"])
    assert (
        "Rollback: off (a trap restarts the interpreter)"
        in ok(off.execute("%sandbox")).stream_text()
    )


@pytest.mark.slow
def test_partly_modified_array_comes_back_whole(mode_kernel: Kernel) -> None:
    """Scattered and contiguous writes into a large array, all undone; kept writes stay."""
    trap(mode_kernel, "a[::997] = -1\na[3_000_000:4_000_000] = 7\nlost = a.copy()\nblob = b''")
    assert "intact" in ok(mode_kernel.execute(INTACT)).stream_text()
    ok(mode_kernel.execute("a[::1001] = -5\nkept = a.copy()"))  # the next checkpoint has it
    trap(mode_kernel, "a[:] = 0\nkept[:] = 0")
    check = "expected = np.arange(N, dtype=np.int64); expected[::1001] = -5\n"
    check += "assert np.array_equal(a, expected) and np.array_equal(kept, expected)\nprint('kept')"
    assert "kept" in ok(mode_kernel.execute(check)).stream_text()


@pytest.mark.slow
def test_growth_in_a_rolled_back_cell_is_forgotten(mode_kernel: Kernel) -> None:
    """A cell grows memory by 500 MiB, fills it and traps; the same memory serves the next
    cells (see also test_memory_past_the_break_is_zero_after_a_rollback)."""
    trap(mode_kernel, "lost = bytearray(b'\\xa5') * (500 << 20)\na[:] = -3")
    assert "intact" in ok(mode_kernel.execute(INTACT)).stream_text()
    ok(
        mode_kernel.execute(
            "again = bytearray(b'\\x5a') * (500 << 20)\nassert again.count(0x5a) == 500 << 20"
        )
    )
    assert "intact" in ok(mode_kernel.execute(INTACT)).stream_text()


@pytest.mark.slow
def test_growth_kept_by_one_cell_survives_a_trap_in_the_next(mode_kernel: Kernel) -> None:
    """Memory grown and filled by a successful cell is part of the next checkpoint (in
    copy-on-write mode: mapped from the file after being written to it)."""
    ok(mode_kernel.execute("grown = np.full(30_000_000, 9, dtype=np.int64)  # 240 MB"))
    trap(mode_kernel, "grown[::3] = 0\ngrown[-1_000_000:] = 1\nmore = bytearray(100 << 20)")
    check = "assert (grown == 9).all() and 'more' not in globals()\nprint('grown')"
    assert "grown" in ok(mode_kernel.execute(check)).stream_text()
    assert "intact" in ok(mode_kernel.execute(INTACT)).stream_text()


# -- in process ----------------------------------------------------------------------------------


class Quiet:
    def __init__(self) -> None:
        self.text: list[str] = []

    def stream(self, name: str, text: str) -> None:
        self.text.append(text)

    def message(self, message: dict, verdict: object, interrupts: object) -> dict:
        return {}


@pytest.fixture(scope="module")
def compiled():
    return RuntimeCache().load(load_runtime())


def sandbox(compiled, mode: str = "auto") -> Sandbox:
    limits = Limits(fuel=10**12, time_limit=0, memory_limit=1 << 30, output_limit=1 << 20)
    return Sandbox(compiled, limits, checkpoint_mode=mode)


@pytest.mark.skipif(COW_MISSING is not None, reason=str(COW_MISSING))
@pytest.mark.slow
def test_checkpoint_cost_follows_the_pages_a_cell_wrote(compiled) -> None:
    cow, copy = sandbox(compiled), sandbox(compiled, "copy")
    try:
        for box in (cow, copy):
            box.run_cell("import numpy\nballast = bytearray(b'x') * (200 << 20)", 1, Quiet())
            box.checkpoint()
            box.run_cell("y = 1", 2, Quiet())
            box.checkpoint()
        assert cow.checkpoint_method.startswith(COPY_ON_WRITE)
        held = cow.checkpoint_stats.bytes
        assert held > 200 << 20
        assert cow.checkpoint_stats.written < 8 << 20, cow.checkpoint_stats
        assert copy.checkpoint_stats.written == copy.checkpoint_stats.bytes >= held
    finally:
        cow.close()
        copy.close()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.slow
def test_memory_past_the_break_is_zero_after_a_rollback(compiled, mode: str) -> None:
    """sbrk promises zeroed memory, and a rollback must make memory the trapped cell grew
    into and filled read as zeros again (the guest's own calloc would hide a miss)."""
    box = sandbox(compiled, mode)
    try:
        box.run_cell("x = 1", 1, Quiet())
        box.checkpoint()
        brk = box._interpreter.state.global_values(box._interpreter.store)[BRK_EXPORT]
        box.limits = Limits(
            fuel=2 * 10**9, time_limit=0, memory_limit=1 << 30, output_limit=1 << 20
        )
        with pytest.raises(CellStopped):
            box.run_cell("lost = bytearray(b'\\xa5') * (300 << 20)\nwhile True: pass", 2, Quiet())
        assert box._interpreter.state.global_values(box._interpreter.store)[BRK_EXPORT] == brk
        base, end = (
            memory_address(box._interpreter.memory, box._interpreter.store),
            box._interpreter.memory.data_len(box._interpreter.store),
        )
        assert end - brk > 250 << 20  # memory never shrinks
        past = (ctypes.c_char * (end - brk)).from_address(base + brk)
        assert bytes(past).count(0) == end - brk
    finally:
        box.close()


@pytest.mark.skipif(COW_MISSING is not None, reason=str(COW_MISSING))
@pytest.mark.slow
def test_guest_memory_mapped_from_a_file_runs_the_interpreter_saved_in_it(
    compiled, tmp_path: Path
) -> None:
    """The boot-image primitive: memory and globals of one interpreter, saved to a file and
    mapped into another (which had checkpointed state of its own), carry its names; writes stay
    private to the new guest, and a rollback there returns to the state after the image."""
    source = sandbox(compiled)
    target = sandbox(compiled)
    try:
        source.run_cell("import numpy\nsaved = numpy.arange(1000).sum()", 1, Quiet())
        source.checkpoint()
        values = source._interpreter.state.global_values(source._interpreter.store)
        size = values[BRK_EXPORT]
        image = tmp_path / "image"
        base = memory_address(source._interpreter.memory, source._interpreter.store)
        image.write_bytes(ctypes.string_at(base, page_up(size)))
        before = image.read_bytes()

        target.run_cell("other = bytearray(b'o') * (20 << 20)", 1, Quiet())
        target.checkpoint()  # memory the target's own checkpoint maps, below and past the image
        map_copy_on_write(
            target._interpreter.memory, target._interpreter.store, str(image), 0, size
        )
        target._interpreter.state.forget()
        target._interpreter.state.set_global_values(target._interpreter.store, values)
        out = Quiet()
        target.run_cell("print(saved, numpy.ones(3).sum())", 2, out)
        assert "".join(out.text).split() == ["499500", "3.0"]
        target.run_cell("saved = -1\nbig = bytearray(b'z') * (50 << 20)", 3, Quiet())
        target.checkpoint()  # the first checkpoint copies the file's pages in
        with pytest.raises(CellStopped):
            target.limits = Limits(
                fuel=2 * 10**9, time_limit=0, memory_limit=1 << 30, output_limit=1 << 20
            )
            target.run_cell("saved = 5\nbig[:] = bytes(len(big))\nwhile True: pass", 4, Quiet())
        target.limits = source.limits
        out = Quiet()
        target.run_cell("print(saved, big.count(b'z'))", 5, out)
        assert "".join(out.text).split() == ["-1", str(50 << 20)]
        assert image.read_bytes() == before  # the guest never wrote through to the file
    finally:
        source.close()
        target.close()


def open_checkpoint_files() -> int:
    return sum(
        1
        for fd in os.listdir("/proc/self/fd")
        if os.path.exists(f"/proc/self/fd/{fd}")
        and os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:wasm-kernel-checkpoint")
    )


@pytest.mark.skipif(COW_MISSING is not None, reason=str(COW_MISSING))
@pytest.mark.slow
def test_restarts_and_close_leave_no_checkpoint_file_open(compiled) -> None:
    before = open_checkpoint_files()
    box = sandbox(compiled)
    try:
        for _ in range(3):
            box.run_cell("x = 1", 1, Quiet())
            box.checkpoint()
            assert open_checkpoint_files() == before + 1
            box.restart()
        assert box.checkpoint_method.startswith(COPY_ON_WRITE)
    finally:
        box.close()
    assert open_checkpoint_files() == before


@pytest.mark.skipif(COW_MISSING is not None, reason=str(COW_MISSING))
@pytest.mark.parametrize("finder", ["PAGEMAP_SCAN", "/proc/self/pagemap"])
@pytest.mark.parametrize("foreign_parts", [0, 10_000])
def test_pages_of_another_file_are_kept_or_copied_exactly(
    compiled, monkeypatch: pytest.MonkeyPatch, foreign_parts: int, finder: str
) -> None:
    """wasmtime maps the module's data from its file; those pages stay shared until written,
    or (past MAX_FOREIGN_PARTS pieces) are copied into the checkpoint. Either way, memory
    reads the same after the first checkpoint and after a rollback, whether written pages
    are found with PAGEMAP_SCAN or by reading /proc/self/pagemap (kernels before 6.7)."""
    monkeypatch.setattr(cow, "MAX_FOREIGN_PARTS", foreign_parts)
    if finder != "PAGEMAP_SCAN":
        monkeypatch.setattr(written_pages, "pagemap_scan_works", lambda: False)
    box = sandbox(compiled)
    try:
        box.run_cell("import numpy\nkept = numpy.arange(100_000)", 1, Quiet())
        base, size = (
            memory_address(box._interpreter.memory, box._interpreter.store),
            box._interpreter.memory.data_len(box._interpreter.store),
        )
        before = ctypes.string_at(base, size)
        box.checkpoint()
        assert ctypes.string_at(base, size) == before
        assert bool(box._interpreter.state._cow._foreign) == (foreign_parts > 0)
        assert finder in box.checkpoint_method
        box.limits = Limits(
            fuel=2 * 10**9, time_limit=0, memory_limit=1 << 30, output_limit=1 << 20
        )
        with pytest.raises(CellStopped):
            box.run_cell("kept[:] = -1\nimport json, wave\nwhile True: pass", 2, Quiet())
        box._interpreter.state.restore(
            box._interpreter.store
        )  # again: the kernel's repair turn ran since
        assert ctypes.string_at(base, size) == before
    finally:
        box.close()


@pytest.mark.nokernel
def test_the_file_behind_memory_is_found_and_an_empty_range_finds_nothing() -> None:
    """``mapped_files`` names the file, and the offset in it, behind a range of memory. An
    empty range (every checkpoint asks about the memory grown since the last, mostly none)
    finds nothing, where it found a zero-length piece of the mapping around it after reading
    all of ``/proc/self/maps``."""
    fd = os.memfd_create("wasm-kernel-test", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 4 * cow.PAGE)
        area = mmap.mmap(fd, 4 * cow.PAGE)
        anchor = ctypes.c_char.from_buffer(area)
        try:
            base, status = ctypes.addressof(anchor), os.fstat(fd)
            key = (status.st_dev, status.st_ino)
            assert cow.mapped_files(base, [(cow.PAGE, 2 * cow.PAGE)]) == [
                (cow.PAGE, 2 * cow.PAGE, key, cow.PAGE)
            ]
            assert cow.mapped_files(base, [(cow.PAGE, cow.PAGE)]) == []
            assert cow.file_mapped(base, 2 * cow.PAGE, 2 * cow.PAGE) == []
        finally:
            del anchor
            area.close()
    finally:
        os.close(fd)


@pytest.mark.skipif(not cow.write_protect_works(), reason="no userfaultfd write-protection here")
def test_pages_left_in_place_are_dropped_beside_pages_mapped_anew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checkpoint that goes past KEPT_LIMIT drops the pages left in place and protects
    them again; where two of them lie either side of a page of another file written in the
    same cell (mapped from the checkpoint file by that checkpoint), the range protected spans
    the new mapping too, which must be tracked by then. Memory as in a guest started from a
    boot image: pages 4-7 of 16 a copy-on-write view of another file."""
    monkeypatch.setattr(cow, "KEPT_LIMIT", 2 * cow.PAGE)
    pages = 16
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    area = mmap.mmap(-1, pages * cow.PAGE, flags=flags)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    image = os.memfd_create("boot-image-like")
    memory = cow.CopyOnWriteMemory()
    try:
        os.write(image, bytes([7]) * (4 * cow.PAGE))
        cow.map_file(base + 4 * cow.PAGE, 4 * cow.PAGE, image, 0)
        memory.take(base, pages * cow.PAGE)

        def cell(*written: int) -> None:
            for page in written:
                area[page * cow.PAGE] = page + 10
            memory.take(base, pages * cow.PAGE)

        cell(5)  # page 5 moves into the checkpoint file
        cell(5)  # left in place
        cell(3)  # left in place: the limit is reached
        assert memory._kept == 2 * cow.PAGE
        cell(4, 12)  # past it: 3 and 5 dropped, 4 moves into the file between them
        assert memory._kept == 0
        area[4 * cow.PAGE + 1] = 99  # written after the checkpoint: rolled back
        memory.restore(base, pages * cow.PAGE)
        expected = {3: 13, 4: 14, 5: 15, 6: 7, 12: 22}
        assert {page: area[page * cow.PAGE] for page in expected} == expected
        assert area[4 * cow.PAGE + 1] == 7
    finally:
        memory.close()
        os.close(image)
        area.close()


def _writable_pages(memory: cow.CopyOnWriteMemory, base: int, pages: int) -> set[int]:
    """The pages userfaultfd reports written (not protected again), without changing that."""
    assert memory._tracker is not None
    found = merged_across_gaps(memory._tracker.found(base, base + pages * cow.PAGE))
    return {
        page
        for low, high in found
        for page in range((low - base) // cow.PAGE, (high - base) // cow.PAGE)
    }


@pytest.mark.skipif(not cow.write_protect_works(), reason="no userfaultfd write-protection here")
def test_pages_written_checkpoint_after_checkpoint_stay_writable_and_roll_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page found written by two checkpoints in a row is left writable: every checkpoint
    saves it from then on, written or not, a rollback puts it back exactly, and every
    HOT_REVIEW checkpoints it is protected again until it is written twice more."""
    monkeypatch.setattr(written_pages, "HOT_REVIEW", 5)
    pages = 16
    area = mmap.mmap(-1, pages * cow.PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    memory = cow.CopyOnWriteMemory()
    try:
        memory.take(base, pages * cow.PAGE)  # checkpoint 1

        def cell(value: int, *written: int) -> int:
            for page in written:
                area[page * cow.PAGE] = value
            return memory.take(base, pages * cow.PAGE)

        cell(1, 3, 12)  # 2: found once, protected again
        assert _writable_pages(memory, base, pages) == set()
        cell(2, 3, 12)  # 3: found twice in a row: left writable
        assert {3, 12} <= _writable_pages(memory, base, pages)
        assert cell(3) >= 2 * cow.PAGE  # 4: nothing written, the writable pages saved anyway
        area[3 * cow.PAGE + 1] = 5
        area[12 * cow.PAGE] = 9
        memory.restore(base, pages * cow.PAGE)
        assert (area[3 * cow.PAGE], area[3 * cow.PAGE + 1], area[12 * cow.PAGE]) == (2, 0, 2)
        assert _writable_pages(memory, base, pages) == set()  # rolled back: all protected
        cell(4, 3)  # 5: the review: protected again
        assert _writable_pages(memory, base, pages) == set()
        cell(5, 3)  # 6
        cell(6, 3)  # 7: twice in a row again
        assert 3 in _writable_pages(memory, base, pages)
        area[3 * cow.PAGE] = 7
        memory.restore(base, pages * cow.PAGE)
        assert area[3 * cow.PAGE] == 6
    finally:
        memory.close()
        area.close()


@pytest.mark.skipif(not cow.write_protect_works(), reason="no userfaultfd write-protection here")
def test_pages_left_writable_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past HOT_LIMIT, pages written checkpoint after checkpoint are protected again."""
    monkeypatch.setattr(written_pages, "HOT_LIMIT", 4 * cow.PAGE)
    pages = 64
    area = mmap.mmap(-1, pages * cow.PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    memory = cow.CopyOnWriteMemory()
    try:
        memory.take(base, pages * cow.PAGE)
        for value in (1, 2):
            area[2 * cow.PAGE] = value  # fits
            memory.take(base, pages * cow.PAGE)
        for value in (1, 2):
            area[30 * cow.PAGE : 40 * cow.PAGE] = bytes([value]) * (10 * cow.PAGE)  # does not
            memory.take(base, pages * cow.PAGE)
        assert _writable_pages(memory, base, pages) == {2}
    finally:
        memory.close()
        area.close()


@pytest.mark.skipif(not cow.write_protect_works(), reason="no userfaultfd write-protection here")
@pytest.mark.slow
def test_a_long_session_from_the_boot_image_keeps_copy_on_write(
    compiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guest started from the boot image (its memory a copy-on-write view of the cache's
    file) writes some of those pages in each cell; every so often the pages left in place go
    past KEPT_LIMIT and are dropped, in the same checkpoint that maps freshly written pages
    from the checkpoint file. Checkpoints must stay copy-on-write through that (they once fell
    back to copying all memory after every cell), pages rewritten by every cell count once
    towards the limit, and a trap still rolls back exactly."""
    boot = images.boot_image_path(RuntimeCache().entry_dir(compiled.runtime))
    assert boot.exists(), "run `python -m wasm_kernel precompile`"
    image = images.read_image(
        boot,
        needs=images.identity(compiled.runtime.module.sha256),
        memory_limit=1 << 30,
        scratch_limit=0,
        memory_file=images.boot_memory_path(boot),
    )
    image.host.cwd = "/tmp"
    limits = Limits(fuel=10**12, time_limit=0, memory_limit=1 << 30, output_limit=1 << 20)
    box = Sandbox(compiled, limits, image=image)
    quiet = Quiet()
    cell = "x = {}\nimport pandas\npandas.DataFrame({{'a': [x]}})"
    try:
        box.checkpoint()
        kept = []
        for count in range(1, 30):
            # pandas' pages came from the boot image: each cell writes a few more of them, so
            # what is left in place grows slowly; the limit is set to be reached soon
            box.run_cell(cell.format(count), count, quiet)
            box.checkpoint()
            kept.append(box._interpreter.state._cow._kept)
            if count == 3:
                monkeypatch.setattr(cow, "KEPT_LIMIT", kept[-1] + (64 << 10))
        assert box.checkpoint_method.startswith(COPY_ON_WRITE), box.checkpoint_method
        assert 0 in kept[3:] and max(kept) <= cow.KEPT_LIMIT, kept  # reached, and dropped
        monkeypatch.setattr(cow, "KEPT_LIMIT", 1 << 30)
        box.run_cell("x = 1", 40, quiet)
        box.checkpoint()
        before = box._interpreter.state._cow._kept
        box.run_cell("x = 1", 41, quiet)
        box.checkpoint()
        # the pages the same cell rewrites are not counted twice
        assert box._interpreter.state._cow._kept - before < box.checkpoint_stats.written / 4
        box.limits = Limits(
            fuel=2 * 10**9, time_limit=0, memory_limit=1 << 30, output_limit=1 << 20
        )
        with pytest.raises(CellStopped):
            box.run_cell("x = -1\nwhile True: pass", 42, quiet)
        box.limits = limits
        quiet.text.clear()
        box.run_cell("print(x, pandas.DataFrame({'a': [x]}).a.sum())", 43, quiet)
        assert "".join(quiet.text).split() == ["1", "1"], quiet.text
    finally:
        box.close()


def held_bytes(pid: int) -> int:
    """Memory a kernel process holds: its RSS, plus the pages of its checkpoint file that no
    mapping shows (RSS counts only mapped pages)."""
    rss, checkpoint_rss, in_checkpoint = 0, 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if "-" in line.split(" ", 1)[0]:  # a mapping's header line
            in_checkpoint = "/memfd:wasm-kernel-checkpoint" in line
        elif line.startswith("Rss:"):
            kib = int(line.split()[1])
            rss += kib << 10
            checkpoint_rss += (kib << 10) if in_checkpoint else 0
    allocated = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd).startswith("/memfd:wasm-kernel-checkpoint"):
                allocated += fd.stat().st_blocks * 512
    return rss + max(allocated - checkpoint_rss, 0)


CYCLES = 10
HELD_SLACK = 120 << 20


@pytest.mark.slow
def test_memory_held_stays_flat_over_trap_and_rollback_cycles(mode_kernel: Kernel) -> None:
    """Each cycle keeps a cell that rewrites 50 MiB (so checkpoints have work), then traps in
    one that rewrites it again and grows memory by 200 MiB. Neither the process nor its
    checkpoint file may grow from cycle to cycle."""
    pid = mode_kernel.manager.provisioner.process.pid
    ok(mode_kernel.execute("work = np.zeros(50 << 20, dtype=np.uint8)"))
    held = []
    for cycle in range(CYCLES):
        ok(mode_kernel.execute(f"work[:] = {cycle}"))
        trap(mode_kernel, "work[:] = 255\nlost = np.ones(200 << 20, dtype=np.uint8)")
        held.append(held_bytes(pid))
    check = f"assert (work == {CYCLES - 1}).all() and 'lost' not in globals()\nprint('flat')"
    assert "flat" in ok(mode_kernel.execute(check)).stream_text()
    assert "intact" in ok(mode_kernel.execute(INTACT)).stream_text()
    print(f"\nheld after each cycle (MiB): {[h >> 20 for h in held]}")
    assert max(held) < held[0] + HELD_SLACK, [h >> 20 for h in held]


@pytest.mark.skipif(not cow.write_protect_works(), reason="no userfaultfd write-protection here")
@pytest.mark.slow
def test_written_pages_left_in_place_roll_back_exactly(compiled) -> None:
    """With write-protection a checkpoint leaves the pages a cell wrote in place, up to
    KEPT_LIMIT, and drops them past it. Cells that each rewrite memory kept that way, or
    enough to go past the limit, then trap, must find every byte of the last checkpoint."""
    box = sandbox(compiled)
    quiet = Quiet()
    try:
        box.run_cell("import hashlib\nkept = bytearray(8 << 20)\nbulk = bytearray(1)", 1, quiet)
        box.checkpoint()
        sizes = [1 << 20, 1 << 20, cow.KEPT_LIMIT + (16 << 20), 1 << 20]
        for value, size in enumerate(sizes, start=1):
            box.run_cell(
                f"kept[::4096] = bytes([{value}]) * len(kept[::4096])\n"
                f"bulk = bytearray([{value}]) * {size}\n"
                "digest = hashlib.sha256(kept + bulk).hexdigest()",
                value + 1,
                quiet,
            )
            box.checkpoint()
            if size < cow.KEPT_LIMIT:  # pages left in place are saved only once written again
                assert box.checkpoint_stats.written < 32 << 20, box.checkpoint_stats
            box.limits = Limits(
                fuel=2 * 10**9, time_limit=0, memory_limit=1 << 30, output_limit=1 << 20
            )
            with pytest.raises(CellStopped):
                box.run_cell(
                    "kept[:] = bytes(len(kept))\nbulk[:] = bytes(len(bulk))\nwhile True: pass",
                    9,
                    quiet,
                )
            box.limits = Limits(
                fuel=10**12, time_limit=0, memory_limit=1 << 30, output_limit=1 << 20
            )
            quiet.text.clear()
            box.run_cell(
                f"assert set(kept[::4096]) == {{{value}}} and set(bulk) == {{{value}}}\n"
                "assert hashlib.sha256(kept + bulk).hexdigest() == digest\n"
                "print('exact')",
                10,
                quiet,
            )
            assert "exact" in "".join(quiet.text), quiet.text
            box.checkpoint()
    finally:
        box.close()
