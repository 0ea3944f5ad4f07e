"""Floats: a planar n-body simulation with pure-Python float arithmetic; energy is conserved."""


def energy(bodies):
    e = 0.0
    for i, (x, y, vx, vy, m) in enumerate(bodies):
        e += 0.5 * m * (vx * vx + vy * vy)
        for x2, y2, _, _, m2 in bodies[i + 1 :]:
            e -= m * m2 / ((x - x2) ** 2 + (y - y2) ** 2) ** 0.5
    return e


def advance(bodies, dt, steps):
    n = len(bodies)
    for _ in range(steps):
        for i in range(n):
            xi, yi, vxi, vyi, mi = bodies[i]
            for j in range(i + 1, n):
                xj, yj, vxj, vyj, mj = bodies[j]
                dx, dy = xi - xj, yi - yj
                d2 = dx * dx + dy * dy
                mag = dt / (d2 * d2**0.5)
                vxi -= dx * mj * mag
                vyi -= dy * mj * mag
                bodies[j][2] = vxj + dx * mi * mag
                bodies[j][3] = vyj + dy * mi * mag
            bodies[i][2], bodies[i][3] = vxi, vyi
        for body in bodies:
            body[0] += dt * body[2]
            body[1] += dt * body[3]


def bench():
    bodies = [
        [0.0, 0.0, 0.0, 0.0, 1000.0],
        [100.0, 0.0, 0.0, 3.16, 1.0],
        [0.0, 200.0, -2.23, 0.0, 2.0],
        [-300.0, 0.0, 0.0, -1.82, 0.5],
        [0.0, -400.0, 1.58, 0.0, 0.1],
    ]
    before = energy(bodies)
    advance(bodies, 0.01, 8_000)
    after = energy(bodies)
    assert abs(after - before) < 1e-3 * abs(before), (before, after)
    assert 60.0 < (bodies[1][0] ** 2 + bodies[1][1] ** 2) ** 0.5 < 140.0
