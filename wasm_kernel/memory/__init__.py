"""Guest memory between turns: checkpoints, copy-on-write views of a file, the pages a cell wrote,
and a live session's memory handed to a fork.

May import: runtime.
"""
