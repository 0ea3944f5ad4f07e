"""A module beside the parity notebooks: `import helpers` works as it does natively."""


def greet(name):
    return f"hello from {name}"
