"""LRU-K (O'Neil, O'Neil and Weikum, 1993): rank keys by the time of their K-th most recent reference.

A key referenced fewer than K times has an infinite backward K-distance and goes first, oldest last reference
first (LRU as the subsidiary policy). References closer together than the correlated-reference period (CRP)
count as one, so a burst of reads of one chunk does not make it look popular. The history of keys that left the
tier is retained for a while (bounded), so a key that comes back keeps its past.

Victim selection uses a heap with lazy invalidation: each rank change pushes a new item and stale items are
skipped (and compacted away when they outnumber live ones).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from kvstrata.clock import Clock, SystemClock

# Keys with fewer than K references rank below every key with K: shift their rank by this much.
_COLD_OFFSET = 1e15


class _History:
    __slots__ = ("hist", "last", "seq")

    def __init__(self, k: int, now: float) -> None:
        self.hist: list[float | None] = [now] + [None] * (k - 1)
        self.last = now
        self.seq = 0


class LRUKPolicy:
    name = "lru-k"

    def __init__(
        self,
        k: int = 2,
        crp: float = 0.0,
        clock: Clock | None = None,
        retained: int = 100_000,
    ) -> None:
        if k < 1:
            raise ValueError("LRU-K needs K >= 1")
        self.k = k
        self.crp = crp
        self._clock = clock or SystemClock()
        self._live: dict[bytes, _History] = {}
        self._ghosts: OrderedDict[bytes, _History] = OrderedDict()
        self._retained = retained
        self._heap: list[tuple[float, int, bytes]] = []
        self._seq = 0

    def _rank(self, h: _History) -> float:
        kth = h.hist[self.k - 1]
        return h.last - _COLD_OFFSET if kth is None else kth

    def _push(self, key: bytes, h: _History) -> None:
        self._seq += 1
        h.seq = self._seq
        heapq.heappush(self._heap, (self._rank(h), self._seq, key))
        if len(self._heap) > 2 * len(self._live) + 1024:
            self._compact()

    def _compact(self) -> None:
        self._heap = [(self._rank(h), h.seq, key) for key, h in self._live.items()]
        heapq.heapify(self._heap)

    def _reference(self, h: _History, now: float) -> None:
        if now - h.last > self.crp:
            # A new uncorrelated reference: older history moves forward by the length of the last burst,
            # so the burst counts as one reference at its end (the paper's correlation-period correction).
            first = h.hist[0]
            correl = h.last - first if first is not None else 0.0
            for i in range(self.k - 1, 0, -1):
                prev = h.hist[i - 1]
                h.hist[i] = None if prev is None else prev + correl
            h.hist[0] = now
        h.last = now

    def admit(self, key: bytes) -> None:
        now = self._clock.monotonic()
        h = self._ghosts.pop(key, None)
        if h is None:
            h = self._live.get(key)
        if h is None:
            h = _History(self.k, now)
        else:
            self._reference(h, now)
        self._live[key] = h
        self._push(key, h)

    def touch(self, key: bytes) -> None:
        h = self._live.get(key)
        if h is None:
            self.admit(key)
            return
        before = self._rank(h)
        self._reference(h, self._clock.monotonic())
        if self._rank(h) != before:
            self._push(key, h)

    def remove(self, key: bytes) -> None:
        h = self._live.pop(key, None)
        if h is None:
            return
        self._ghosts[key] = h
        if len(self._ghosts) > self._retained:
            self._ghosts.popitem(last=False)

    def victim(self) -> bytes | None:
        heap = self._heap
        live = self._live
        while heap:
            _, seq, key = heap[0]
            h = live.get(key)
            if h is not None and h.seq == seq:
                return key
            heapq.heappop(heap)
        return None

    def references(self, key: bytes) -> int:
        """How many uncorrelated references are remembered for a key (resident or retained)."""
        h = self._live.get(key) or self._ghosts.get(key)
        return 0 if h is None else sum(t is not None for t in h.hist)

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def clear(self) -> None:
        self._live.clear()
        self._ghosts.clear()
        self._heap.clear()
