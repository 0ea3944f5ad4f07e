"""A kernel started with an empty compiled-runtime cache answers at once and compiles once.

This test compiles the real runtime (one to four minutes on two cores), because that path is
what a user meets on a fresh machine.
"""

from __future__ import annotations

import time

import pytest

from wasm_kernel.runtime.cache import default_cache_dir

pytestmark = pytest.mark.slow  # each test takes seconds to minutes


@pytest.mark.timeout(900)
def test_empty_cache_answers_kernel_info_then_compiles_on_first_cell(start_kernel, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    # The runtime's files and the guest's packages come from `install` (a kernel never
    # downloads): this cache lacks only the compiled runtime
    installed = default_cache_dir()
    for entry in [*installed.glob("runtime-*"), *installed.glob("guest-*")]:
        (cache / entry.name).symlink_to(entry)
    began = time.monotonic()
    kernel = start_kernel(env={"WASM_KERNEL_CACHE_DIR": str(cache)})
    info = kernel.client.kernel_info(reply=True, timeout=30)
    assert info["content"]["status"] == "ok"
    assert time.monotonic() - began < 30, "kernel_info must not wait for the compile"

    run = kernel.execute("print('compiled and running'); 6 * 7", timeout=800)

    assert run.content["status"] == "ok", run.content
    notice = run.stream_text("stderr")
    assert "compiling the Python runtime" in notice and "once" in notice
    assert run.stream_text("stdout") == "compiled and running\n"
    assert run.result_text() == "42"
    entries = [
        p
        for p in cache.iterdir()
        if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
    ]
    assert len(entries) == 1 and (entries[0] / "module.cwasm").stat().st_size > 0

    # A second kernel on the same cache finds the entry: no compile notice, immediate answer.
    second = start_kernel(env={"WASM_KERNEL_CACHE_DIR": str(cache)})
    rerun = second.execute("6 * 7", timeout=60)
    assert rerun.result_text() == "42"
    assert "compiling" not in rerun.stream_text("stderr")
