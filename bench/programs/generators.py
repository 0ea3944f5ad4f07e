"""Generators: pipelines of generator functions, yield from, and generator expressions."""


def naturals(limit):
    n = 0
    while n < limit:
        yield n
        n += 1


def evens(source):
    for n in source:
        if n % 2 == 0:
            yield n


def squares(source):
    for n in source:
        yield n * n


def chunks(source, size):
    chunk = []
    for item in source:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def flatten(nested):
    for item in nested:
        if isinstance(item, list):
            yield from flatten(item)
        else:
            yield item


def bench():
    limit = 200_000
    total = sum(squares(evens(naturals(limit))))
    assert total == sum(n * n for n in range(0, limit, 2))
    sizes = [len(c) for c in chunks(naturals(100_001), 1000)]
    assert len(sizes) == 101 and sizes[-1] == 1
    tree = [[i, [i + 1, [i + 2, [i + 3]]]] for i in range(0, 40_000, 4)]
    assert sum(flatten(tree)) == sum(range(40_000))
    assert max(x % 1013 for x in naturals(100_000)) == 1012
