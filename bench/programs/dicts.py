"""Dicts: insertion, lookup, update, deletion and iteration over string and int keys."""

# ruff: noqa: UP031 (%-formatting is part of what these programs exercise)


def bench():
    table = {}
    for i in range(60_000):
        table["k%d" % i] = i
    hits = 0
    for i in range(0, 120_000, 3):
        if "k%d" % i in table:
            hits += 1
    for i in range(0, 60_000, 2):
        del table["k%d" % i]
    counts = {}
    for i in range(100_000):
        key = (i * 7919) % 1000
        counts[key] = counts.get(key, 0) + 1
    merged = {**counts, **{k: -v for k, v in counts.items() if k % 5 == 0}}
    total = sum(merged.values())
    inverted = {v: k for k, v in table.items()}
    assert hits == 20_000
    assert len(table) == 30_000
    assert len(counts) == 1000 and all(v == 100 for v in counts.values())
    assert total == 100_000 - 2 * 200 * 100
    assert inverted[59_999] == "k59999"
