"""The WebAssembly rewriter behind rollback, on small modules and on the real runtime."""

from __future__ import annotations

import pytest
import wasmtime

from wasm_kernel.runtime import rewrite
from wasm_kernel.runtime.runtime import load_runtime

PAGE = 65536

SMALL_MODULE = """
(module
  (import "env" "log" (func $log (param i32)))
  (memory (export "memory") 2)
  (global $stack (mut i32) (i32.const 4096))
  (global $counter (mut i32) (i32.const 11))
  (global $constant i32 (i32.const 7))
  (func $sbrk (param $increment i32) (result i32)
    ;; the original: grow memory by whole pages and return the old end
    (i32.mul (memory.grow (i32.div_u (local.get $increment) (i32.const 65536)))
             (i32.const 65536)))
  (func (export "sbrk") (param i32) (result i32) (call $sbrk (local.get 0)))
  (func (export "bump") (global.set $counter (i32.add (global.get $counter) (i32.const 1)))))
"""


def instantiate(wasm: bytes) -> tuple[wasmtime.Store, dict]:
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    linker.define_func(
        "env", "log", wasmtime.FuncType([wasmtime.ValType.i32()], []), lambda _: None
    )
    module = wasmtime.Module(engine, wasm)
    exports = linker.instantiate(store, module).exports(store)
    return store, {export.name: exports[export.name] for export in module.exports}


@pytest.fixture
def rewritten() -> tuple[wasmtime.Store, dict]:
    return instantiate(rewrite.make_restorable(wasmtime.wat2wasm(SMALL_MODULE)))


def test_leb128_round_trips() -> None:
    for value in (0, 1, 127, 128, 300, 65535, 2**31 - 1, 2**32 - 1):
        assert rewrite.read_u32(rewrite.write_u32(value), 0) == (
            value,
            len(rewrite.write_u32(value)),
        )
    for value in (0, 1, -1, 63, 64, -64, -65, 2**31 - 1, -(2**31)):
        decoded, _ = rewrite._read_s32(rewrite.write_s32(value), 0)
        assert decoded == value & 0xFFFFFFFF


def test_mutable_globals_are_exported_and_writable(rewritten) -> None:
    store, exports = rewritten
    names = set(exports)
    assert {
        "wasm_kernel.global.0",
        "wasm_kernel.global.1",
        rewrite.BRK_EXPORT,
        rewrite.GROW_FAILED_EXPORT,
    } <= names
    assert "wasm_kernel.global.2" not in names, "an immutable global needs no restoring"
    counter = exports["wasm_kernel.global.1"]
    assert counter.value(store) == 11
    exports["bump"](store)
    assert counter.value(store) == 12
    counter.set_value(store, 11)  # what a rollback does
    exports["bump"](store)
    assert counter.value(store) == 12


def test_sbrk_moves_the_exported_break_and_reuses_memory_after_a_rollback(rewritten) -> None:
    store, exports = rewritten
    sbrk, memory, brk = exports["sbrk"], exports["memory"], exports[rewrite.BRK_EXPORT]
    assert sbrk(store, 0) == 2 * PAGE, "the break starts at the end of the initial memory"
    assert brk.value(store) == 2 * PAGE
    assert sbrk(store, 3 * PAGE) == 2 * PAGE
    assert memory.data_len(store) == 5 * PAGE and brk.value(store) == 5 * PAGE

    brk.set_value(store, 2 * PAGE)  # roll back to before the growth
    assert sbrk(store, 3 * PAGE) == 2 * PAGE
    assert memory.data_len(store) == 5 * PAGE, "memory grown before is reused, not grown again"
    assert sbrk(store, 100) == 5 * PAGE, "increments smaller than a page are honoured"
    assert memory.data_len(store) == 6 * PAGE


def test_sbrk_refuses_negative_and_impossible_increments(rewritten) -> None:
    store, exports = rewritten
    sbrk, brk = exports["sbrk"], exports[rewrite.BRK_EXPORT]
    sbrk(store, 0)
    before = brk.value(store)
    assert sbrk(store, -PAGE) & 0xFFFFFFFF == 0xFFFFFFFF
    assert brk.value(store) == before, "a refused increment leaves the break alone"
    assert exports[rewrite.GROW_FAILED_EXPORT].value(store) == 0, "negative is refused, not failed"
    brk.set_value(store, 0xFFFF0000 - 2**32)  # near the top of the 4 GiB space (signed i32)
    assert sbrk(store, 0x20000) & 0xFFFFFFFF == 0xFFFFFFFF, "passing 4 GiB must fail, not wrap"
    assert exports[rewrite.GROW_FAILED_EXPORT].value(store) == 1, "the failure is recorded"


@pytest.mark.parametrize(
    ("wat", "reason"),
    [
        ("(module (func $other))", "sbrk"),
        (
            '(module (import "env" "g" (global i32))'
            " (func $sbrk (param i32) (result i32) i32.const 0))",
            "import globals",
        ),
    ],
)
def test_unknown_module_shapes_are_refused(wat: str, reason: str) -> None:
    with pytest.raises(rewrite.UnsupportedModule, match=reason):
        rewrite.make_restorable(wasmtime.wat2wasm(wat))


def test_non_wasm_bytes_are_refused() -> None:
    with pytest.raises(rewrite.UnsupportedModule, match="not a WebAssembly"):
        rewrite.make_restorable(b"\x7fELF not wasm")


def test_interrupt_cells_of_a_module_without_cpython_are_refused() -> None:
    with pytest.raises(rewrite.UnsupportedModule, match="PyErr_SetInterruptEx"):
        rewrite.find_interrupt_cells(wasmtime.wat2wasm(SMALL_MODULE))


def test_real_runtime_rewrites_and_its_interrupt_cells_are_found() -> None:
    """The pinned runtime has the shape the rewriter and the interrupt analysis expect."""
    wasm = load_runtime().module.path.read_bytes()
    cells = rewrite.find_interrupt_cells(wasm)
    addresses = [cells.handler_tripped, cells.is_tripped, cells.breaker_pointer]
    assert all(0 < address < 64 << 20 for address in addresses), "static data lies low"
    assert cells.breaker_bit and cells.breaker_bit & (cells.breaker_bit - 1) == 0, "one bit"
    restorable = rewrite.make_restorable(wasm)
    assert wasmtime.Module.validate(wasmtime.Engine(_engine_config()), restorable) is None
    layout = rewrite.parse_sections(restorable)
    assert (
        len(rewrite.defined_globals(layout))
        == len(rewrite.defined_globals(rewrite.parse_sections(wasm))) + 2
    ), "brk and grow_failed"


def _engine_config() -> wasmtime.Config:
    config = wasmtime.Config()
    config.wasm_exceptions = True
    return config


def test_wasilibc_reset_preopens_is_exported_where_the_module_has_it() -> None:
    """A resumed image must forget the preopen table it was saved with (wasi-libc keeps it in
    linear memory), so the rewrite exports the function that does."""
    with_reset = SMALL_MODULE.replace(
        '(func (export "bump")',
        "(func $__wasilibc_reset_preopens (global.set $counter (i32.const 0)))\n"
        '  (func (export "bump")',
    )
    store, exports = instantiate(rewrite.make_restorable(wasmtime.wat2wasm(with_reset)))
    exports["bump"](store)
    counter = next(
        value
        for name, value in exports.items()
        if name.startswith(rewrite.GLOBAL_EXPORT_PREFIX) and value.value(store) == 12
    )
    exports[rewrite.RESET_PREOPENS_EXPORT](store)
    assert counter.value(store) == 0
    _, without = instantiate(rewrite.make_restorable(wasmtime.wat2wasm(SMALL_MODULE)))
    assert rewrite.RESET_PREOPENS_EXPORT not in without
