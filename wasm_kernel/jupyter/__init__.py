"""The Jupyter kernel: ipykernel's Kernel subclass and its application, one cell's messages, comms,
completion and inspection, JupyterLab's visual debugger (its protocol and session), history,
accounting, the audit log, %snapshot and hibernation, how a kernel starts its sandbox, and how
it ends when told to from outside (SIGTERM, its launcher gone: hibernated first).

May import: agents, files, images, memory, network, output, packages, runtime, sandbox,
settings.
"""
