"""The Jupyter kernel: ipykernel's Kernel subclass and its application, one cell's messages, comms,
completion and inspection, history, accounting, the audit log, %snapshot and hibernation, and
how a kernel starts its sandbox.

May import: agents, files, images, memory, network, output, packages, runtime, sandbox,
settings.
"""
