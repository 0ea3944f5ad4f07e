"""Every setting of the kernel, declared once with its type, bounds and default; the checked
setting types; the sandbox profiles that give other defaults.

May import: files, network, runtime, sandbox.
"""
