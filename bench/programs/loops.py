"""Loops: a list-based sieve of Eratosthenes and nested integer loops."""


def count_primes(limit):
    sieve = [True] * limit
    sieve[0] = sieve[1] = False
    i = 2
    while i * i < limit:
        if sieve[i]:
            for j in range(i * i, limit, i):
                sieve[j] = False
        i += 1
    count = 0
    for flag in sieve:
        if flag:
            count += 1
    return count


def collatz_longest(limit):
    best, best_start = 0, 0
    for start in range(1, limit):
        n, steps = start, 0
        while n != 1:
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            steps += 1
        if steps > best:
            best, best_start = steps, start
    return best_start, best


def bench():
    assert count_primes(200_000) == 17984
    assert collatz_longest(10_000) == (6171, 261)
