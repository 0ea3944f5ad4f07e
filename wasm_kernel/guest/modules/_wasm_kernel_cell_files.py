"""The file name a cell's code runs under, for both sides: the guest compiles each cell under
it, and the host announces how it is made (the visual debugger's ``debugInfo``) and names the
cells a debugger dumps by it. As ipykernel names them: ``<folder>/<murmur2 of the code>.py``,
the hash seeded as ``debugInfo`` says, so that the breakpoints JupyterLab sets on the name it
computes land on the code that runs. Nothing is written there (linecache holds the source).
"""

import struct

HASH_METHOD = "Murmur2"
HASH_SEED = 0xC70F6907
# the guest's temporary folder and the process number it reports (WASI's, always the same)
CELL_FOLDER = "/tmp/ipykernel_42/"
CELL_SUFFIX = ".py"
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data, seed=HASH_SEED):
    """MurmurHash2 (32-bit) of ``data``'s bytes, as JupyterLab computes it. Every cell is
    hashed, in the guest's interpreter: its words are read in one call and each is mixed in
    as few operations as the hash allows (a 1,000-character cell cost as much as a whole
    bare ``x + 1`` cell, reading them one by one)."""
    length = len(data)
    h = (seed ^ length) & _MASK
    whole = length - length % 4
    m, mask = _M, _MASK
    for k in struct.unpack(f"<{whole // 4}I", data[:whole]):
        k = k * m & mask
        h = (h * m & mask) ^ ((k ^ k >> 24) * m & mask)
    tail = data[whole:]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def source_hash(code):
    """The murmur2 of a cell's source text, which names its file."""
    return murmur2(code.encode("utf-8", "surrogatepass"))


_hashed = None  # (the running cell's text, its source_hash as the host computed it)


def cell_hashed(code, digest):
    """The host hashed the cell that runs now, natively: naming its file needs no hashing in
    the guest's interpreter (which cost ~2,300 fuel a character)."""
    global _hashed
    _hashed = (code, digest)


def cell_file(code):
    """The file a cell of this source text runs under."""
    hashed = _hashed
    digest = hashed[1] if hashed is not None and hashed[0] == code else source_hash(code)
    return f"{CELL_FOLDER}{digest}{CELL_SUFFIX}"
