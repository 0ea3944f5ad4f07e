"""Host folders and files that belong to a kernel: the folders granted to the guest (mounts), its
private /tmp and its size limit, the kernel's own folders, writes beside the notebook, and
opening files that others could have placed.

May import: nothing of the package.
"""
