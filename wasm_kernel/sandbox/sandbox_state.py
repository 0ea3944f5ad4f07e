"""A sandbox's interpreter state taken between turns and put back: checkpoints (what a
trapping cell rolls back to) and images (saved, restored in place, resumed at a start).

A mixin of ``Sandbox``, which owns the interpreter, its lock and its helpers; kept apart so
that the sandbox's class holds its life cycle and turns, this one what outlives a turn.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import wasmtime

from ..guest.modules import _wasm_kernel_contract as declared
from ..images import image_archive, images
from ..images.image_fields import HostState
from ..images.image_writer import ScratchArchive
from ..memory.checkpoints import CheckpointStats
from ..memory.live_memory import LiveMemory
from . import held_files, image_transfer
from .contract import guest_turn
from .held_files import Reopening
from .host_functions import MAX_MESSAGE, GuestClock, HostCall
from .interpreter import Interpreter
from .limits import Limits
from .output import OutputPump

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


def _offsets(reply: dict | None) -> dict[int, int | None]:
    """The guest's answer of where each open file is: descriptor -> offset (None: a folder,
    or a file that cannot seek); what is not an answer is left out."""
    pairs = reply.get("offsets") if reply else None
    found: dict[int, int | None] = {}
    for pair in pairs if isinstance(pairs, list) else ():
        if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int):
            offset = pair[1]
            if offset is None or (isinstance(offset, int) and 0 <= offset <= 1 << 62):
                found[pair[0]] = offset
    return found


class SandboxState:
    """Checkpoints and images of the sandbox's one interpreter, taken under its turn lock."""

    _interpreter: Interpreter
    _turn_lock: threading.Lock
    _host_call: HostCall
    _output: OutputPump
    _clock: GuestClock
    _tmp: Path
    _changed: bool
    _closing: bool
    limits: Limits
    cwd: str
    import_paths: Sequence[str]
    _start: Callable[..., Interpreter]  # a new interpreter, resumed from an image
    _repair_turn: Callable[..., int | None]  # one of the kernel's own short turns

    def _resume(self, interpreter: Interpreter, image: images.Image) -> None:
        """An image's memory and globals, its clocks and /tmp, then the guest's own settling
        (this kernel's folders and import paths, fresh random seeds, stale files)."""
        image_transfer.load(interpreter, image, self.limits.memory_limit)
        self._clock.resume(image.host.clocks)
        image_archive.unpack_checked(image.scratch, self._tmp, self.limits.scratch_limit)
        held = image.host.held_files
        try:
            room = interpreter.stack_pointer()
            reopening = Reopening(
                interpreter.files, interpreter.store, interpreter.guest_memory, room
            )
            lost = reopening.run(held)
        except (ValueError, OSError, IndexError, wasmtime.WasmtimeError) as exc:
            raise images.ImageError(f"cannot open the image's files again: {exc}") from None
        offsets = {entry.fd: entry.offset for entry in held if entry.fd not in lost}
        settle = guest_turn(
            declared.SETTLE,
            image.host.cwd,
            self.cwd,
            list(self.import_paths),
            [[fd, offset] for fd, offset in offsets.items()],
            [[fd, path] for fd, path in lost.items()],
        )
        status = self._repair_turn(interpreter, settle, "the resumed interpreter trapped")
        if status != 0:
            raise images.ImageError("the resumed interpreter could not run the kernel's code")

    # -- images ---------------------------------------------------------------------------------

    def save_image(
        self,
        out: BinaryIO,
        host: HostState,
        mounts: list[str],
        memory_file: Path | None = None,
        fork: bool = False,
        on_boot_image: bool = False,
    ) -> LiveMemory | None:
        """This interpreter as an image file written into ``out``, taken between turns (its
        memory as a raw file at ``memory_file`` instead, for a boot image). With ``fork``,
        its memory stays where it is, frozen for the fork to map (``live_memory``), where
        checkpoints are copy-on-write; the frozen memory is returned, for the caller to keep
        open while the image exists. With ``on_boot_image``, the image leaves out the pages
        still equal to the boot memory file the guest was mapped from (``capture``)."""
        with self._turn_lock:
            interpreter = self._interpreter
            self._host_call.reply = None
            self._output.begin(lambda *_: None, MAX_MESSAGE, "")
            try:
                open_now = held_files.open_paths(interpreter.files)
                ask = guest_turn(declared.SERVE, declared.IMAGE_STATE, [fd for fd, _ in open_now])
                self._repair_turn(interpreter, ask, "the interpreter could not be asked")
            finally:
                self._output.end()
            self._changed = True  # that turn ran: the next checkpoint keeps what it did
            reply = self._host_call.reply
            cwd = reply.get("cwd") if reply else None
            host.cwd = cwd if isinstance(cwd, str) and cwd else self.cwd
            host.held_files = held_files.held_files(interpreter.files, _offsets(reply))
            host.clocks = self._clock.readings()
            scratch = ScratchArchive.of(self._tmp, self.limits.scratch_limit)
            live = None
            if fork and interpreter.state is not None and interpreter.state.shares:
                self._take_checkpoint(interpreter)  # the frozen file must hold every page
                boot_file = interpreter.memory_base[0] if interpreter.memory_base else None
                live = interpreter.state.hand_over(interpreter.store, boot_file)
            try:
                image_transfer.capture(
                    interpreter, out, host, mounts, scratch, memory_file, live, on_boot_image
                )
            except BaseException:
                for fd in live.fds if live is not None else ():
                    os.close(fd)
                raise
            return live

    def restore_image(self, image: images.Image) -> None:
        """Replace this interpreter by the image's, in place (like a rollback); on failure the
        current one stays as it was."""
        with self._turn_lock:
            kept, offsets = self._interpreter, dict(self._clock.offsets)
            backup = self._tmp.with_name(self._tmp.name + "-before-restore")
            self._tmp.rename(backup)  # the current store keeps its handle on the folder
            self._tmp.mkdir(mode=0o700)
            restored = None
            try:
                restored = self._start(image)
                if restored.state is not None:
                    self._take_checkpoint(restored)
            except BaseException:
                if restored is not None:
                    restored.close()
                self._host_call.bind(kept.guest_memory, kept.alloc)
                self._clock.memory = kept.guest_memory
                self._clock.offsets = offsets
                shutil.rmtree(self._tmp, ignore_errors=True)
                backup.rename(self._tmp)
                raise
            self._interpreter = restored
            kept.close()
            shutil.rmtree(backup, ignore_errors=True)

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Keep the current state as the one a trapping cell rolls back to."""
        with self._turn_lock:
            interpreter = self._interpreter
            if interpreter.state is not None and self._changed and not self._closing:
                self._take_checkpoint(interpreter)

    def _take_checkpoint(self, interpreter: Interpreter) -> None:
        assert interpreter.state is not None
        interpreter.state.take(interpreter.store)
        interpreter.files.checkpoint()
        self._changed = False

    @staticmethod
    def _checkpoint_held(interpreter: Interpreter) -> int:
        """Bytes of guest memory in the checkpoint a trap would now roll back to (0: none)."""
        state = interpreter.state
        return state.last.bytes if state is not None and state.taken else 0

    @property
    def checkpoint_stats(self) -> CheckpointStats | None:
        state = self._interpreter.state
        return state.last if state is not None else None

    @property
    def restore_seconds(self) -> float | None:
        """How long the last rollback took to put memory and globals back."""
        state = self._interpreter.state
        return state.last_restore_seconds if state is not None else None

    @property
    def checkpoint_method(self) -> str | None:
        """How checkpoints are taken (None: rollback is off)."""
        state = self._interpreter.state
        return state.method if state is not None else None
