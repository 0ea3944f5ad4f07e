"""Big integers: 2000 digits of pi by two arctangent formulas that must agree, factorials,
modular powers and a Mersenne prime."""


def arccot(x, unity):
    total = term = unity // x
    x_squared = x * x
    n, sign = 3, -1
    while term:
        term //= x_squared
        total += sign * (term // n)
        n += 2
        sign = -sign
    return total


def pi_machin(digits):
    unity = 10 ** (digits + 10)
    return 4 * (4 * arccot(5, unity) - arccot(239, unity)) // 10**10


def pi_stormer(digits):
    unity = 10 ** (digits + 10)
    return 4 * (12 * arccot(18, unity) + 8 * arccot(57, unity) - 5 * arccot(239, unity)) // 10**10


def bench():
    pi = pi_machin(2_000)
    assert abs(pi - pi_stormer(2_000)) <= 1  # the guard digits absorb the rounding
    assert str(pi)[:30] == "314159265358979323846264338327"
    factorial = 1
    for i in range(2, 4_000):
        factorial *= i
    assert factorial % (2**3_989) == 0 and factorial % (2**3_990) != 0  # Legendre: v2(3999!) = 3989
    modulus = (1 << 1279) - 1  # a Mersenne prime: Fermat's little theorem must hold
    assert pow(3, modulus - 1, modulus) == 1
    square = 1
    for _ in range(2_000):
        square = square * square % modulus + 1
    assert square.bit_length() <= 1279 and square % 1_000_003 == 252_123
