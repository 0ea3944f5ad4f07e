"""The scratch folder's measurement (wasm_kernel.files.scratch) against a hostile guest's files.

The guest's files are opened by wasmtime inside the kernel process, so a file this test process
opens, unlinks and writes is exactly what the kernel sees of a guest doing the same. Folders
deeper than the host's PATH_MAX are built through directory descriptors, as wasmtime does.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from wasm_kernel.files.scratch import ENTRY_BYTES, ScratchWatch, usage

MiB = 1 << 20


def write(descriptor: int, size: int) -> None:
    chunk = b"x" * MiB
    for _ in range(size // MiB):
        os.write(descriptor, chunk)
    os.fsync(descriptor)  # allocate the blocks now, not at the next writeback


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextmanager
def unlinked_file(path: Path, size: int) -> Iterator[int]:
    """A file at ``path``, unlinked while held open, then grown to ``size`` bytes."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        os.unlink(path)
        write(descriptor, size)
        yield descriptor
    finally:
        os.close(descriptor)


def make_chain(folder: Path, name: str, depth: int, payload: int = 0) -> None:
    """``depth`` folders each inside the last, all called ``name``; a file of ``payload``
    bytes at the bottom. One descriptor at a time, so no path length matters."""
    current = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=current)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=current)
            os.close(current)
            current = child
        if payload:
            descriptor = os.open("payload", os.O_WRONLY | os.O_CREAT, dir_fd=current)
            write(descriptor, payload)
            os.close(descriptor)
    finally:
        os.close(current)


def remove_chain(folder: Path, name: str, depth: int) -> None:
    """Undo make_chain (shutil.rmtree recurses once per level and holds a descriptor each)."""
    current = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=current)
        os.close(current)
        current = child
    try:
        os.unlink("payload", dir_fd=current)
    except FileNotFoundError:
        pass
    for _ in range(depth):
        parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=current)
        os.close(current)
        current = parent
        os.rmdir(name, dir_fd=current)
    os.close(current)


@contextmanager
def descriptor_limit(spare: int) -> Iterator[None]:
    """Let this process open at most ``spare`` more descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The limit bounds descriptor numbers, not their count: with numbers in use above free
    # ones (other tests' sockets), count ``spare`` free numbers up from the lowest.
    in_use = {int(name) for name in os.listdir("/proc/self/fd")}
    free = (number for number in range(soft) if number not in in_use)
    limit = [next(free) for _ in range(spare + 1)][-1]  # ``spare`` free numbers lie below it
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def scratch(tmp_path: Path, name: str = "scratch") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return folder


# -- what usage() counts --------------------------------------------------------------------------


def reference_usage(folder: Path) -> int:
    """The rules, plainly (for short paths and no links): each entry's allocated blocks, at
    least ENTRY_BYTES."""
    total = 0
    for parent, folders, files in os.walk(folder):
        for name in folders + files:
            total += max(os.lstat(os.path.join(parent, name)).st_blocks * 512, ENTRY_BYTES)
    return total


def test_a_branching_tree_is_measured_exactly(tmp_path: Path) -> None:
    folder = scratch(tmp_path)
    for path in ("a/b/c/d", "a/b/e", "a/f", "g/h/i", "g/j", "k"):
        (folder / path).mkdir(parents=True)
    for index, path in enumerate(("a/b/c/d", "a/b", "a/f", "g/h/i", "g", ".", "k")):
        (folder / path / f"file{index}").write_bytes(b"z" * (index * 20_000))
    assert usage(folder) == reference_usage(folder) > 11 * ENTRY_BYTES


def test_unlinked_files_held_open_count(tmp_path: Path) -> None:
    folder = scratch(tmp_path)
    (folder / "sub").mkdir()
    with unlinked_file(folder / "gone", 8 * MiB):
        # renamed within the folder, then unlinked: still the folder's
        os.close(os.open(folder / "sub" / "a", os.O_WRONLY | os.O_CREAT))
        moved = os.open(folder / "sub" / "a", os.O_RDWR)
        try:
            os.rename(folder / "sub" / "a", folder / "b")
            os.unlink(folder / "b")
            write(moved, 4 * MiB)
            size = usage(folder)
        finally:
            os.close(moved)
    assert 12 * MiB + ENTRY_BYTES <= size < 13 * MiB, size
    assert not size.unmeasured
    assert usage(folder) == ENTRY_BYTES  # closed: gone for good, only "sub" remains


def test_unlinked_files_elsewhere_do_not_count(tmp_path: Path) -> None:
    # an odd name (a newline, non-UTF-8 bytes, " (deleted)"), and a neighbour whose name
    # starts with it: only the folder itself is measured
    odd = os.fsdecode(b"scr\natch \xff (deleted)")
    folder = scratch(tmp_path, odd)
    neighbour = scratch(tmp_path, odd + "2")
    with unlinked_file(neighbour / "big", 8 * MiB), unlinked_file(tmp_path / "big", 8 * MiB):
        with unlinked_file(folder / "mine", 2 * MiB):
            assert 2 * MiB <= usage(folder) < 3 * MiB
        assert usage(folder) == 0


def test_a_file_both_linked_and_open_counts_once(tmp_path: Path) -> None:
    folder = scratch(tmp_path)
    descriptor = os.open(folder / "f", os.O_RDWR | os.O_CREAT)
    try:
        write(descriptor, 4 * MiB)
        assert 4 * MiB <= usage(folder) < 5 * MiB
    finally:
        os.close(descriptor)


def test_hard_links_count_their_blocks_once(tmp_path: Path) -> None:
    folder = scratch(tmp_path)
    (folder / "a").mkdir()
    (folder / "b").mkdir()
    descriptor = os.open(folder / "a" / "f", os.O_WRONLY | os.O_CREAT)
    write(descriptor, 4 * MiB)
    os.close(descriptor)
    alone = usage(folder)
    os.link(folder / "a" / "f", folder / "b" / "f")
    os.link(folder / "a" / "f", folder / "f")
    # each further name costs an entry (so links cannot be made for free), the data once
    assert usage(folder) == alone + 2 * ENTRY_BYTES
    assert alone < 5 * MiB


def test_symlinks_are_not_followed(tmp_path: Path) -> None:
    folder = scratch(tmp_path)
    outside = scratch(tmp_path, "outside")
    descriptor = os.open(outside / "big", os.O_WRONLY | os.O_CREAT)
    write(descriptor, 4 * MiB)
    os.close(descriptor)
    os.symlink(outside, folder / "there")
    os.symlink(folder, folder / "loop")
    assert usage(folder) == 2 * ENTRY_BYTES


def test_paths_longer_than_path_max_are_measured(tmp_path: Path) -> None:
    folder = scratch(tmp_path)
    make_chain(folder, "n" * 250, 40, payload=2 * MiB)  # a path of over 10,000 bytes
    try:
        size = usage(folder)
        assert 2 * MiB + 40 * ENTRY_BYTES <= size < 3 * MiB, size
        assert not size.unmeasured
    finally:
        remove_chain(folder, "n" * 250, 40)


def test_deep_chains_are_measured_with_few_descriptors(tmp_path: Path) -> None:
    folder = scratch(tmp_path)
    depth = 1500  # a path of 7,500 bytes, and more folders than descriptors to spare
    make_chain(folder, "deep", depth, payload=MiB)
    try:
        before = open_fds()
        with descriptor_limit(spare=8):  # one descriptor per level would run out at once
            size = usage(folder)
        assert open_fds() == before
        assert MiB + depth * ENTRY_BYTES <= size < 2 * MiB + depth * ENTRY_BYTES, size
        assert not size.unmeasured
    finally:
        remove_chain(folder, "deep", depth)


def test_what_cannot_be_measured_fails_closed(tmp_path: Path) -> None:
    folder = scratch(tmp_path)
    (folder / "sub").mkdir()
    stops: list[int] = []
    watch = ScratchWatch(folder, 64 * MiB, stops.append, touches=True)
    try:
        before = open_fds()
        with descriptor_limit(spare=0):
            size = usage(folder)
            watch.begin(1)
            watch.touched()
            over = watch.end()
        assert open_fds() == before
        assert size.unmeasured and "descriptors" in size.unmeasured, size.unmeasured
        # even though nothing grew: what could not be measured counts as over the limit
        assert over is not None and over.unmeasured
    finally:
        watch.close()


# -- when ScratchWatch walks ----------------------------------------------------------------------


def test_turns_that_touch_nothing_do_not_walk(tmp_path: Path) -> None:
    folder = scratch(tmp_path)
    watch = ScratchWatch(folder, 64 * MiB, lambda turn: None, touches=True)
    try:
        for turn in range(1, 6):
            watch.begin(turn)
            assert watch.end() is None
        assert watch.walks == 1  # the first baseline
        watch.touched()  # e.g. the guest opened a file for writing
        watch.begin(6)
        (folder / "f").write_bytes(b"x")
        assert watch.end() is None
        assert watch.walks == 3  # the baseline, and the turn's end
        watch.begin(7)
        assert watch.end() is None
        assert watch.walks == 3  # nothing touched since the last walk

        # a file left open for writing may grow in any turn, touched or not
        descriptor = os.open(folder / "open", os.O_WRONLY | os.O_CREAT)
        try:
            watch.begin(8)
            assert watch.end() is None
            assert watch.walks == 4
        finally:
            os.close(descriptor)
        watch.begin(9)
        assert watch.end() is None
        assert watch.walks == 4
    finally:
        watch.close()


def test_without_touches_every_turn_is_measured(tmp_path: Path) -> None:
    # a sandbox that does not call touched() (touches=False) keeps the old behaviour
    folder = scratch(tmp_path)
    watch = ScratchWatch(folder, 4 * MiB, lambda turn: None)
    try:
        watch.begin(1)
        assert watch.end() is None
        watch.begin(2)
        descriptor = os.open(folder / "big", os.O_WRONLY | os.O_CREAT)
        write(descriptor, 6 * MiB)
        os.close(descriptor)
        assert watch.end() > 4 * MiB
        assert watch.walks == 3  # the first baseline, then each end (which begin reuses)
    finally:
        watch.close()


def test_only_growth_counts(tmp_path: Path) -> None:
    folder = scratch(tmp_path)
    watch = ScratchWatch(folder, 4 * MiB, lambda turn: None, touches=True)
    try:
        watch.begin(1)
        descriptor = os.open(folder / "big", os.O_WRONLY | os.O_CREAT)
        watch.touched()
        write(descriptor, 6 * MiB)
        os.close(descriptor)
        assert watch.end() > 4 * MiB  # stopped, but the file stays

        watch.begin(2)  # starts over the limit: may delete (which touches nothing)
        os.unlink(folder / "big")
        assert watch.end() is None

        watch.begin(3)  # the baseline is what is there now, not the 6 MiB seen last
        descriptor = os.open(folder / "again", os.O_WRONLY | os.O_CREAT)
        watch.touched()
        write(descriptor, 5 * MiB)
        os.close(descriptor)
        assert watch.end() > 4 * MiB
    finally:
        watch.close()


def _poll_until_stopped(tmp_path: Path, touch: bool) -> None:
    folder = scratch(tmp_path)
    stopped = threading.Event()
    turns: list[int] = []

    def stop(turn: int) -> None:
        turns.append(turn)
        stopped.set()

    watch = ScratchWatch(folder, 8 * MiB, stop, touches=True)
    try:
        watch.begin(41)
        with unlinked_file(folder / "grows", 0) as descriptor:
            if touch:
                watch.touched()
            deadline = time.monotonic() + 10
            while not stopped.is_set() and time.monotonic() < deadline:
                write(descriptor, MiB)
                stopped.wait(0.02)
            assert stopped.is_set(), "the watch never stopped the turn"
            assert turns == [41]
            assert watch.stopped is not None and watch.stopped > 8 * MiB
            assert watch.end() > 8 * MiB
    finally:
        watch.close()


def test_polling_stops_a_turn_that_writes_past_the_limit(tmp_path: Path) -> None:
    _poll_until_stopped(tmp_path, touch=True)


def test_polling_finds_a_file_open_for_writing_untouched(tmp_path: Path) -> None:
    _poll_until_stopped(tmp_path, touch=False)
