"""A best-fit extent allocator over one fixed region, with coalescing: the arena's space manager.

KV chunks come in a few fixed sizes per model, and every request is first rounded to a size class (four per
power of two, ``kvstrata.engine.bufpool.class_size``), so a freed slot is usually reused as it is by the next
value of the same class. Free extents are coalesced with their neighbours, so space freed by one class is not
stranded when the workload moves on to another.

Free extents are kept in three maps: start -> size, end -> start (to merge with the left neighbour), and a sorted
list of (size, start) for best fit (smallest extent that fits, lowest address among equals). The sorted list is
a plain list with ``bisect``: the number of free extents stays small (fragments coalesce), and inserting into a
list of a few thousand entries costs microseconds.
"""

from __future__ import annotations

import bisect


class Extents:
    """Offsets in ``[0, size)`` handed out in multiples of ``align`` bytes."""

    def __init__(self, size: int, align: int = 4096) -> None:
        self.align = align
        self.size = size - size % align
        self._by_start: dict[int, int] = {}
        self._by_end: dict[int, int] = {}
        self._sizes: list[tuple[int, int]] = []
        self.free_bytes = 0
        if self.size:
            self._add(0, self.size)

    def round(self, n: int) -> int:
        return -(-n // self.align) * self.align

    def _add(self, start: int, n: int) -> None:
        self._by_start[start] = n
        self._by_end[start + n] = start
        bisect.insort(self._sizes, (n, start))
        self.free_bytes += n

    def _remove(self, start: int, n: int) -> None:
        del self._by_start[start]
        del self._by_end[start + n]
        i = bisect.bisect_left(self._sizes, (n, start))
        del self._sizes[i]
        self.free_bytes -= n

    def alloc(self, n: int) -> int | None:
        """The start of ``n`` bytes (rounded up to ``align``), or None when no free extent is large enough."""
        n = self.round(max(n, 1))
        i = bisect.bisect_left(self._sizes, (n, -1))
        if i == len(self._sizes):
            return None
        size, start = self._sizes[i]
        self._remove(start, size)
        if size > n:
            self._add(start + n, size - n)
        return start

    def free(self, start: int, n: int) -> None:
        """Give back ``n`` bytes at ``start`` (exactly as allocated), merged with free neighbours."""
        n = self.round(max(n, 1))
        if start < 0 or start + n > self.size or start in self._by_start:
            raise ValueError(f"bad free of [{start}, {start + n})")
        left = self._by_end.get(start)
        if left is not None:
            lsize = self._by_start[left]
            self._remove(left, lsize)
            start, n = left, n + lsize
        rsize = self._by_start.get(start + n)
        if rsize is not None:
            self._remove(start + n, rsize)
            n += rsize
        self._add(start, n)

    @property
    def largest(self) -> int:
        return self._sizes[-1][0] if self._sizes else 0

    @property
    def fragments(self) -> int:
        return len(self._sizes)

    def extents(self) -> list[tuple[int, int]]:
        """(start, size) of every free extent, in address order (for tests and INFO)."""
        return sorted(self._by_start.items())
