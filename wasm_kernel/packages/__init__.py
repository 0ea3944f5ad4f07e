"""%pip for the guest: the host's pip run for the guest's platform, wheels checked as hostile
input, unpacked, cached and counted against a quota.

May import: files.
"""
