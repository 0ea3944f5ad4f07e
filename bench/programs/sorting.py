"""Sorting: integers, strings, tuples and records with key functions (own LCG data)."""


def lcg(seed, n):
    values = []
    for _ in range(n):
        seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
        values.append(seed)
    return values


def bench():
    numbers = lcg(42, 30_000)
    ascending = sorted(numbers)
    assert all(a <= b for a, b in zip(ascending, ascending[1:], strict=False))
    strings = [format(v, "x") for v in numbers[:20_000]]
    strings.sort()
    assert strings[0] <= strings[1] <= strings[-1]
    records = [(v % 100, -v, str(v)) for v in numbers[:20_000]]
    records.sort()
    assert records[0][0] == 0 and records[-1][0] == 99
    by_key = sorted(numbers[:20_000], key=lambda v: (v % 1000, v))
    assert by_key[0] % 1000 == 0
    descending = sorted(numbers, reverse=True)
    assert descending == ascending[::-1]
    assert sum(ascending[:10]) == 3_644_850, sum(ascending[:10])
