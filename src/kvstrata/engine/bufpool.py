"""A pool of reusable, already-touched buffers for large values, with explicit leases.

Receiving a large value into fresh memory costs a page fault per 4 KiB (first touch runs at a fraction of memcpy
speed), so the server receives large bulk values into buffers that were touched before and come back here when
nothing uses them any more.

**Size classes.** Four classes per power of two from ``min_size`` (64 KiB, 80 KiB, 96 KiB, 112 KiB, 128 KiB,
160 KiB, ...): a value wastes under 25% of its class, and values of a power-of-two size waste nothing. A buffer
is a ``bytearray`` allocated (untouched: its pages are faulted in as the value arrives) at its class size and then shrunk to the value's exact
length. CPython only sets the length when a bytearray shrinks by less than half of its allocation or grows back
within it (``PyByteArray_Resize``'s "minor downsize" path), and every value is more than half its class, so
the memory stays where it is; ``tests/unit/test_bufpool.py`` checks the address does not move. Clients, the
engine and the SSD tier see an ordinary bytearray of exactly the value's length.

**Leases.** Every buffer handed out has an explicit count of leases (``acquire`` gives the first one). Holders:
the request parser until the command that carries the value has run, each DRAM entry that stores it (the DRAM
tier calls ``retain``/``release`` when entries come and go), and each reply in flight that sends it (the
connection releases its leases once the transport has written everything). A buffer goes back to the free list
when its count reaches zero. Before it is handed out again the pool resizes it to the new length; CPython
refuses to resize a bytearray while any buffer export exists (a memoryview, a pending uvloop write holding a
``Py_buffer``), so a buffer that is still referenced at the C level is never handed out: it waits in
quarantine until the export is gone. ``forfeit`` stops tracking a buffer whose ownership leaves for good
(it is then freed by the garbage collector like any other object).

**Memory.** The free list is bounded by ``max_bytes`` and by ``room()``, the DRAM budget left after the stored
entries, so the pool yields memory before any entry would have to be evicted for it. ``slack`` (class size minus
value size of buffers in use) is reported too, so INFO shows every byte the pool holds.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from kvstrata.protocol.alloc import untouched

MIN_SIZE = 64 * 1024
_STEPS = 4

_resize = ctypes.pythonapi.PyByteArray_Resize
_resize.argtypes = [ctypes.py_object, ctypes.c_ssize_t]
_resize.restype = ctypes.c_int


def class_size(n: int, min_size: int = MIN_SIZE) -> int:
    """The class a value of ``n`` bytes goes in: the smallest of min_size * 2^k * (1 + j/4) >= n."""
    if n <= min_size:
        return min_size
    p = 1 << (n - 1).bit_length()  # next power of two >= n
    half = p >> 1
    step = max(half // _STEPS, 1)
    c = half + -(-(n - half) // step) * step
    return max(c, min_size)


def set_length(buf: bytearray, n: int) -> None:
    """Set a bytearray's length in place (no copy); raises BufferError while it has exports."""
    _resize(buf, n)


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_malloc_tuned = False


def tune_malloc(mmap_threshold: int = 1024 * 1024, trim_threshold: int = 32 * 1024 * 1024) -> bool:
    """Keep glibc from returning and re-faulting the heap on every large request (once per process).

    Receiving a large value goes through a few temporary buffers of a few hundred KiB (the socket chunk that
    holds its header, hiredis's read buffer). With glibc's defaults the heap top is trimmed after each request
    and grown again for the next, a page fault per 4 KiB each time. Temporaries below ``mmap_threshold`` come
    from the heap, and up to ``trim_threshold`` free bytes stay there for reuse. Large values are in the pool.
    """
    global _malloc_tuned
    if _malloc_tuned:
        return True
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    _malloc_tuned = ok
    return ok


def trim_malloc() -> bool:
    """Give the heap's free memory back to the kernel (glibc's ``malloc_trim(0)``; MEMORY PURGE): whether any was."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return False
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return bool(fn(0))


def _reshape(buf: bytearray, n: int) -> None:
    """Set the length to n, failing with BufferError while the buffer is exported (even when n is unchanged:
    CPython skips its export check for a same-length resize, so probe with a one-byte change first)."""
    if len(buf) == n:
        set_length(buf, n - 1)
    set_length(buf, n)


class BufferPool:
    """Reusable large buffers by size class; see the module docstring for the ownership rules."""

    def __init__(self, max_bytes: int = 256 * 1024 * 1024, *, min_size: int = MIN_SIZE,
                 room: Callable[[], int] | None = None) -> None:
        self.max_bytes = max_bytes
        self.min_size = min_size
        self.room = room
        self._free: dict[int, list[bytearray]] = {}
        self._free_bytes = 0
        self._quarantine: list[bytearray] = []
        self._limbo: list[list[Any]] = []
        self._tick = 0
        self._class_tick: dict[int, int] = {}  # class -> when it was last asked for
        # id(buffer) -> [buffer, leases, class size]; the list keeps the buffer alive, so its id stays unique.
        self._leases: dict[int, list[Any]] = {}
        self.slack = 0
        self.in_use_bytes = 0
        # Objects with a ``settle()`` method (connections with replies in flight): asked to give back leases
        # that have become free before the pool allocates new memory.
        self.holders: set[Any] = set()
        self.hits = 0
        self.misses = 0
        self.dropped = 0
        self.quarantined = 0

    # ---- handing out ----
    def acquire(self, n: int) -> bytearray:
        """A buffer of exactly ``n`` bytes holding one lease (contents unspecified)."""
        if n < self.min_size:
            return bytearray(n)
        c = class_size(n, self.min_size)
        self._tick += 1
        self._class_tick[c] = self._tick
        if self._limbo:
            self._reclaim()
        buf = self._take(c, n)
        if buf is None and (self.holders or self._quarantine):
            self.settle()
            buf = self._take(c, n)
        if buf is None:
            self.misses += 1
            buf = untouched(c)  # pages are touched as the value arrives, not for a size a client only declared
            if n != c:
                set_length(buf, n)
        else:
            self.hits += 1
        self._leases[id(buf)] = [buf, 1, c]
        self.slack += c - n
        self.in_use_bytes += c
        return buf

    def _take(self, c: int, n: int) -> bytearray | None:
        free = self._free.get(c)
        while free:
            buf = free.pop()
            self._free_bytes -= c
            try:
                _reshape(buf, n)
            except BufferError:
                # Still exported somewhere (a pending write): not reusable until that ends.
                self.quarantined += 1
                self._quarantine.append(buf)
                self._free_bytes += c
                continue
            return buf
        return None

    def settle(self) -> None:
        """Collect leases that holders can give back, and retry quarantined buffers."""
        for holder in list(self.holders):
            holder.settle()
        if self._limbo:
            self._reclaim()
        if self._quarantine:
            waiting = self._quarantine
            self._quarantine = []
            for buf in waiting:
                self._free_bytes -= class_size(len(buf), self.min_size)
                self._put_free(buf, class_size(len(buf), self.min_size), probe=True)

    # ---- leases ----
    def tracked(self, buf: Any) -> bool:
        rec = self._leases.get(id(buf))
        return rec is not None and rec[1] > 0

    def leases(self, buf: Any) -> int:
        rec = self._leases.get(id(buf))
        return 0 if rec is None else rec[1]

    def retain(self, buf: Any) -> bool:
        """Take another lease on ``buf`` if the pool tracks it; returns whether it does."""
        rec = self._leases.get(id(buf))
        if rec is None:
            return False
        rec[1] += 1  # from zero too: a buffer in limbo is taken back
        return True

    def release(self, buf: Any) -> None:
        """Give back one lease; at zero the buffer returns to the free list (no-op for untracked objects)."""
        rec = self._leases.get(id(buf))
        if rec is None or rec[1] <= 0:
            return
        rec[1] -= 1
        if rec[1] == 0:
            # Not free yet: a handler may still return this value (GETSET, GETDEL) and its reply take a lease
            # before the next buffer is handed out. Buffers left at zero are freed then (``_reclaim``).
            self._limbo.append(rec)

    def _reclaim(self) -> None:
        limbo = self._limbo
        self._limbo = []
        for rec in limbo:
            buf = rec[0]
            if rec[1] != 0 or self._leases.get(id(buf)) is not rec:
                continue
            del self._leases[id(buf)]
            c = rec[2]
            self.slack -= c - len(buf)
            self.in_use_bytes -= c
            self._put_free(buf, c, probe=False)

    def forfeit(self, buf: Any) -> None:
        """Stop tracking ``buf``: it is never returned to the pool (its new owner lets the GC free it)."""
        rec = self._leases.pop(id(buf), None)
        if rec is not None:
            self.slack -= rec[2] - len(buf)
            self.in_use_bytes -= rec[2]

    def _put_free(self, buf: bytearray, c: int, *, probe: bool) -> None:
        limit = self.max_bytes
        if self.room is not None:
            limit = min(limit, self.room() - self.slack)
        if self._free_bytes + c > limit:
            # Make room by dropping free buffers of the classes used least recently (a workload that moved
            # on to other sizes must not leave the pool full of classes nobody asks for).
            self._evict(self._free_bytes + c - limit, keep=c)
            if self._free_bytes + c > limit:
                self.dropped += 1
                return
        if probe:
            try:
                _reshape(buf, c)
            except BufferError:
                self._quarantine.append(buf)
                self._free_bytes += c
                return
        self._free.setdefault(c, []).append(buf)
        self._free_bytes += c

    def _evict(self, need: int, keep: int) -> None:
        for cls in sorted(self._free, key=lambda k: self._class_tick.get(k, -1)):
            if cls == keep:
                continue
            free = self._free[cls]
            while free and need > 0:
                free.pop()
                self._free_bytes -= cls
                need -= cls
                self.dropped += 1
            if need <= 0:
                return

    def trim(self) -> None:
        """Drop free buffers until the pool fits ``max_bytes`` and the DRAM room (largest classes first)."""
        limit = self.max_bytes
        if self.room is not None:
            limit = min(limit, self.room() - self.slack)
        limit = max(limit, 0)
        for c in sorted(self._free, reverse=True):
            free = self._free[c]
            while free and self._free_bytes > limit:
                free.pop()
                self._free_bytes -= c
                self.dropped += 1
        while self._quarantine and self._free_bytes > limit:
            buf = self._quarantine.pop()
            self._free_bytes -= class_size(len(buf), self.min_size)
            self.dropped += 1

    def clear(self) -> None:
        self._free.clear()
        self._quarantine.clear()
        self._free_bytes = 0

    # ---- reporting ----
    @property
    def free_bytes(self) -> int:
        return self._free_bytes

    def info(self) -> dict[str, int]:
        return {
            "buffer_pool_free_bytes": self._free_bytes,
            "buffer_pool_free_buffers": sum(map(len, self._free.values())) + len(self._quarantine),
            "buffer_pool_slack_bytes": self.slack,
            "buffer_pool_in_use_buffers": len(self._leases),
            "buffer_pool_in_use_bytes": self.in_use_bytes,
            "buffer_pool_max_bytes": self.max_bytes,
            "buffer_pool_hits": self.hits,
            "buffer_pool_misses": self.misses,
            "buffer_pool_dropped": self.dropped,
            "buffer_pool_quarantined": self.quarantined,
        }
