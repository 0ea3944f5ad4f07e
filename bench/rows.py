"""A row of the benchmark's results table: one measure, native against wasm-kernel, with
min / median and their ratios (bench/run.py prints and saves them)."""

from __future__ import annotations

import statistics


def stats(samples: list[float] | None) -> dict | None:
    if not samples:
        return None
    return {
        "min": min(samples),
        "median": statistics.median(samples),
        "n": len(samples),
        "samples": samples,
    }


def row(
    section: str,
    measure: str,
    unit: str,
    native: list[float] | None,
    wasm: list[float] | None,
    note: str = "",
) -> dict:
    result = {
        "section": section,
        "measure": measure,
        "unit": unit,
        "native": stats(native),
        "wasm": stats(wasm),
        "note": note,
    }
    if result["native"] and result["wasm"]:
        result["ratio_min"] = result["wasm"]["min"] / result["native"]["min"]
        result["ratio_median"] = result["wasm"]["median"] / result["native"]["median"]
    return result
