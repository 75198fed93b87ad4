"""Bytearrays whose memory is touched only as it is written.

``bytearray(n)`` zero-fills, so a client that declares a 512 MiB bulk and sends nothing would make the server
touch 512 MiB at once. A buffer from ``untouched(n)`` is allocated without being written (for large sizes malloc
maps fresh pages, which cost RAM only once data lands in them), so memory grows with the bytes that arrive, as
in Redis, whose allocator reserves the declared size without touching it. The contents are unspecified until
written: use it only for buffers that are filled completely before anyone reads them.
"""

from __future__ import annotations

import ctypes

_from_string = ctypes.pythonapi.PyByteArray_FromStringAndSize
_from_string.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_from_string.restype = ctypes.py_object

# Below this, zero-filling costs nothing worth avoiding (and pymalloc may hand out memory that was used before).
_SMALL = 64 * 1024


def untouched(n: int) -> bytearray:
    """A bytearray of ``n`` bytes whose pages are not written by the allocation itself."""
    if n < _SMALL:
        return bytearray(n)
    buf = _from_string(None, n)
    assert isinstance(buf, bytearray)
    return buf
