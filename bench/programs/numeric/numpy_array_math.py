"""numpy: elementwise arithmetic, ufuncs, reductions, sorting and a small matrix product."""

import numpy as np


def bench():
    n = 1_000_000
    x = np.arange(n, dtype=np.float64) / n
    y = np.sqrt(x) * np.sin(x * 3.0) + x**2 - 0.5
    z = np.where(y > 0, y, -y).cumsum()
    assert abs(x.sum() - (n - 1) / 2) < 1e-6
    assert z[-1] > 0 and np.all(np.diff(z) >= 0)
    values = (np.arange(n, dtype=np.int64) * 7919) % 100_003
    ordered = np.sort(values)
    assert ordered[0] == 0 and ordered[-1] == 100_002 and np.all(ordered[1:] >= ordered[:-1])
    a = np.arange(200 * 200, dtype=np.float64).reshape(200, 200) % 17
    product = a @ a.T
    assert np.allclose(product, product.T)
    assert product.trace() == (a * a).sum()
    assert np.isclose(np.linalg.norm(a), np.sqrt((a * a).sum()))
