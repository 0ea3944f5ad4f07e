"""The per-user kernel server that forks ready kernels, and the jupyter_client provisioner that
asks it for them.

May import: files, jupyter, memory, runtime.
"""
