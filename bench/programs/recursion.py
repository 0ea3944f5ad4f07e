"""Recursion: naive Fibonacci and Ackermann-Peter, deep and shallow call chains."""


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def ackermann(m, n):
    if m == 0:
        return n + 1
    if n == 0:
        return ackermann(m - 1, 1)
    return ackermann(m - 1, ackermann(m, n - 1))


def bench():
    assert fib(25) == 75025
    assert ackermann(2, 300) == 603
    assert ackermann(3, 5) == 253
