"""Classes: a small event simulation with inheritance, properties, dunder methods and slots."""


class Vector:
    __slots__ = ("x", "y")

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __add__(self, other):
        return Vector(self.x + other.x, self.y + other.y)

    def __mul__(self, k):
        return Vector(self.x * k, self.y * k)

    def __eq__(self, other):
        return self.x == other.x and self.y == other.y

    @property
    def manhattan(self):
        return abs(self.x) + abs(self.y)


class Agent:
    def __init__(self, ident, position, velocity):
        self.ident = ident
        self.position = position
        self.velocity = velocity
        self.moves = 0

    def step(self):
        self.position = self.position + self.velocity
        self.moves += 1

    def bounce(self):
        self.velocity = self.velocity * -1


class Walker(Agent):
    def step(self):
        super().step()
        if self.position.manhattan > 50:
            self.bounce()


class Runner(Walker):
    def step(self):
        super().step()
        super().step()


def bench():
    agents = []
    for i in range(300):
        kind = Runner if i % 3 == 0 else Walker
        agents.append(kind(i, Vector(i % 7, -(i % 5)), Vector(1 + i % 3, i % 2)))
    for _ in range(100):
        for agent in agents:
            agent.step()
    moves = sum(a.moves for a in agents)
    spread = sum(a.position.manhattan for a in agents)
    assert moves == 100 * (300 + 100), moves
    assert all(a.position.manhattan <= 60 for a in agents)
    assert Vector(1, 2) + Vector(3, 4) == Vector(4, 6)
    assert spread == 3_475, spread
