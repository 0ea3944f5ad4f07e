"""HTTP for the guest, made by the host within the operator's allowlist.

May import: sandbox.
"""
