"""Interpreter images on disk: their format, writing and checking them, their private /tmp archive
and stored pages, the folder that holds them, and the names a client may know.

May import: files, memory, runtime.
"""
