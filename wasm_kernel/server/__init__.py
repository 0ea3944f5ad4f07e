"""The per-user kernel server that forks ready kernels, the jupyter_client provisioner that
asks it for them, and the Jupyter Server extension that tells kernels which notebook they
belong to.

May import: files, jupyter, memory, runtime, settings.
"""
