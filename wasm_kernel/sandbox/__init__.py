"""One sandboxed interpreter: the wasmtime store and the host functions the guest imports, the
guest<->host contract, turns and their limits, interrupts and stops, the guest's streams and
descriptors, and taking or putting back its state.

May import: files, images, memory, runtime.
"""
