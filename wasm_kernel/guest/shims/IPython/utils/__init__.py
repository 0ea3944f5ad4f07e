"""IPython.utils for the sandbox: only what notebook code commonly imports."""
