"""Python in the sandbox for programs: the session client's plumbing, host tools, and the MCP
server with its kernels and upstream servers. The public client is ``wasm_kernel.client``.

May import: files, images, sandbox, settings.
"""
