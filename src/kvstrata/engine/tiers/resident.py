"""Whether memory-mapped bytes are in memory: ``mincore(2)`` on a buffer's or an address range's pages.

The SSD tier reads a record on the event loop only when that cannot wait for the disk (``SsdTier.read_resident``):
LMDB hands out its records as views of its memory map, and a record whose pages are all in the page cache is
copied at memory speed, where handing the read to a loader thread costs two thread switches and, under load, a
wait for the GIL per record (BENCHMARKS.md, "Prefetch: SSD loads on the event loop when their pages are in
memory"). The check must come before the lookup: py-lmdb touches every page of a value it returns (to fault them
in without the GIL), so the tier checks the range where the SSD writer or an earlier read found the record
(``resident_at``).

For a file-backed mapping Linux reports the page cache's state to the file's owner or anyone who may write it
(the server created its LMDB file); for anyone else it reports only the pages mapped into the process, which
errs towards "not resident" (the read then goes to a thread, as it did before).
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Callable
from typing import Any

import numpy as np

PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(None, use_errno=True)
_mincore = _libc.mincore
_mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_mincore.restype = ctypes.c_int


def address_numpy(buf: Any) -> int:
    """Where a (possibly read-only) buffer's first byte lies in this process's memory."""
    return int(np.frombuffer(buf, np.uint8).__array_interface__["data"][0])


def resident_at_numpy(start: int, n: int) -> bool:
    """``resident_at`` without the native module: the same check, ~14 us a call instead of ~1."""
    if n <= 0:
        return True
    first = start - start % PAGE
    pages = (start + n - first + PAGE - 1) // PAGE
    vec = np.empty(pages, np.uint8)
    if _mincore(first, pages * PAGE, vec.ctypes.data) != 0:
        return False
    # Only the low bit is defined (the page is resident); the others are reserved.
    return bool((vec & 1).all())


def resident_numpy(buf: Any) -> bool:
    return resident_at_numpy(address_numpy(buf), len(buf)) if len(buf) else True


try:
    from kvstrata.native._pages import address as _native_address
    from kvstrata.native._pages import resident as _native_resident
    from kvstrata.native._pages import resident_at as _native_resident_at
except ImportError:  # built without a compiler or Python headers (hatch_build.py)
    _native_address = _native_resident = _native_resident_at = None

resident: Callable[[Any], bool] = _native_resident if _native_resident is not None else resident_numpy
"""Whether every page under a buffer is in memory, so reading it cannot wait for a disk. An empty buffer is; a
range the kernel will not report on (``mincore`` failing) is not."""
resident_at: Callable[[int, int], bool] = (_native_resident_at if _native_resident_at is not None
                                           else resident_at_numpy)
"""``resident`` of ``length`` bytes at an address, which need not be mapped (then False): checks memory before
anything touches it."""
address: Callable[[Any], int] = _native_address if _native_address is not None else address_numpy
"""Where a (possibly read-only) buffer's first byte lies in this process's memory."""
