"""Ghost history sized to its contents: fingerprints in a ring of flat arrays, found through a 32-bit table.

``GhostFifo`` (``_ghosts.py``) gives its ring and its table one power-of-two capacity and 64-bit table slots:
simple, but with LRU-K's history per ghost that is 36 B per slot at a load of 3/8 to 3/4, about 50-100 B per
ghost, more than a whole tracked key may cost (``lru-k-compact``'s budget is 64 B for a resident key *and* its
share of ghosts). Here the ring is a plain circular array whose capacity follows the ghost count (+1/8, squeezed
or grown when full), and the table, at a load between 1/2 and 3/4 (any size, indexed modulo its size: a
power of two would leave it between 3/8 and 3/4), holds 32-bit ring positions: 17 B of ring per ghost
(fingerprint, window end, reference count) plus 5.3-8 B of table, and 8 B more when the history needs the
time of the last reference (a correlated-reference period above 0).

Semantics are GhostFifo's, which LRU-K's decisions depend on: FIFO order of first insertion, adding a present
fingerprint updates its values in place, ``popleft`` drops the oldest. Fingerprints are ``fingerprint(key)``
taken as unsigned 64-bit ints (``& U64``; never 0, which marks a hole left by a deletion from the middle), and
every column is unsigned: CPython's ``array`` stores unsigned items through a direct conversion, signed ones
through argument parsing, about twice as slow. Every operation is O(1) amortised; a
rebuild (ring full) costs O(ghosts) and comes at most once per ghosts/8 additions or deletions.
"""

from __future__ import annotations

from array import array
from itertools import compress

_MIN_RING = 16
U64 = (1 << 64) - 1
_MIN_TABLE = 16


def table_size(count: int) -> int:
    """The size of a table grown for ``count`` entries: load 1/2 (it grows again past 3/4)."""
    return max(_MIN_TABLE, 2 * count)


class GhostRing:
    """Fingerprints in insertion order with a window end (``until``), a reference count (``refs``) and,
    optionally, the time of the last reference (``last``) each; O(1) membership, deletion and drop-oldest."""

    __slots__ = ("_cap", "_head", "_n", "_size", "_table", "count", "fps", "last", "refs", "until", "with_last")

    def __init__(self, with_last: bool = False) -> None:
        self.with_last = with_last
        self.clear()

    def clear(self) -> None:
        self._alloc(_MIN_RING)
        self._table = array("I", bytes(4 * _MIN_TABLE))  # ring position + 1, 0 = empty
        self._size = _MIN_TABLE
        self._head = 0  # ring position of the oldest entry (or hole)
        self._n = 0  # ring entries from the head, holes included
        self.count = 0  # live ghosts

    def _alloc(self, cap: int) -> None:
        self._cap = cap
        self.fps = array("Q", bytes(8 * cap))
        self.until = array("Q", bytes(8 * cap))
        self.refs = array("B", bytes(cap))
        self.last = array("Q", bytes(8 * cap)) if self.with_last else array("Q")

    def __len__(self) -> int:
        return self.count

    def nbytes(self) -> int:
        """Bytes of the arrays' items (the ring's capacity and the table's)."""
        return sum(a.itemsize * len(a) for a in (self.fps, self.until, self.refs, self.last, self._table))

    def find(self, fp: int) -> int:
        """The ring position of ``fp`` (index into ``until``/``refs``/``last``), or -1."""
        table, fps, size = self._table, self.fps, self._size
        i = fp % size
        while True:
            v = table[i]
            if not v:
                return -1
            if fps[v - 1] == fp:
                return v - 1
            i += 1
            if i == size:
                i = 0

    def take(self, fp: int) -> int:
        """Forget ``fp`` and return its ring position, whose values stay readable until the next ``add``; or -1."""
        table, fps, size = self._table, self.fps, self._size
        i = fp % size
        while True:
            v = table[i]
            if not v:
                return -1
            if fps[v - 1] == fp:
                break
            i += 1
            if i == size:
                i = 0
        fps[v - 1] = 0
        # Backward-shift deletion (no tombstones): later entries of the probe run move back into the gap unless
        # their home slot lies cyclically within (gap, entry]. Inline: a call per entry doubled the miss path.
        j = i
        while True:
            j += 1
            if j == size:
                j = 0
            w = table[j]
            if not w:
                break
            h = fps[w - 1] % size
            if (i < j and (h <= i or h > j)) or (i > j and h <= i and h > j):
                table[i] = w
                i = j
        table[i] = 0
        self.count -= 1
        return v - 1

    def add(self, fp: int, until: int, refs: int, last: int = 0) -> None:
        """Append ``fp`` as the newest ghost; a present ``fp`` keeps its place and takes the new values."""
        table, fps, size = self._table, self.fps, self._size
        i = fp % size
        while True:  # one probe run: either fp's slot or the empty slot where it goes
            v = table[i]
            if not v:
                break
            if fps[v - 1] == fp:
                pos = v - 1
                break
            i += 1
            if i == size:
                i = 0
        if not v:
            if self._n == self._cap or 4 * (self.count + 1) > 3 * size:
                if self._n == self._cap:
                    self._rebuild(self.count + 1)
                else:
                    self._reindex(table_size(self.count + 1))
                table, fps, size = self._table, self.fps, self._size
                i = fp % size
                while table[i]:
                    i += 1
                    if i == size:
                        i = 0
            pos = self._head + self._n
            if pos >= self._cap:
                pos -= self._cap
            table[i] = pos + 1
            fps[pos] = fp
            self._n += 1
            self.count += 1
        self.until[pos] = until
        self.refs[pos] = refs
        if self.with_last:
            self.last[pos] = last

    def popleft(self) -> int:
        """Drop the oldest ghost and return its fingerprint (0 when there is none)."""
        if not self.count:
            return 0
        fps, cap = self.fps, self._cap
        head = self._head
        while not fps[head]:  # holes left by deletions from the middle
            head += 1
            if head == cap:
                head = 0
            self._n -= 1
        fp = fps[head]
        self._head = head
        self.take(fp)
        head += 1
        self._head = 0 if head == cap else head
        self._n -= 1
        return fp

    def _rebuild(self, need: int) -> None:
        """Squeeze the holes out, oldest first from position 0, into a ring of ``need`` + 1/8 slots."""
        head, n, cap = self._head, self._n, self._cap
        end = head + n

        def unrolled(column: array) -> array:
            return column[head:end] if end <= cap else column[head:] + column[: end - cap]

        fps = unrolled(self.fps)
        columns = [unrolled(c) for c in (self.until, self.refs, self.last) if len(c)]
        live = array("Q", compress(fps, fps))
        kept = [array(c.typecode, compress(c, fps)) for c in columns]
        self._alloc(max(_MIN_RING, need + (need >> 3) + 8))
        count = len(live)
        self.fps[:count] = live
        for dst, src in zip([c for c in (self.until, self.refs, self.last) if len(c)], kept, strict=True):
            dst[:count] = src
        self._head = 0
        self._n = self.count = count
        self._reindex(table_size(max(need, count)))

    def _reindex(self, size: int) -> None:
        table = array("I", bytes(4 * size))
        fps, cap = self.fps, self._cap
        pos = self._head
        for _ in range(self._n):
            fp = fps[pos]
            if fp:
                i = fp % size
                while table[i]:
                    i += 1
                    if i == size:
                        i = 0
                table[i] = pos + 1
            pos += 1
            if pos == cap:
                pos = 0
        self._table, self._size = table, size
