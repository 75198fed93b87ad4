"""Reference copy of the pre-compact implementation (key objects and OrderedDicts), kept so that tests can check
that the compact policy in src/kvstrata/engine/policy makes the same decisions. Not used by the server.

ARC (Megiddo and Modha, FAST 2003): recency and frequency lists whose split adapts to ghost hits.

* ``t1``: keys referenced once since they entered; ``t2``: keys referenced at least twice. Both in LRU order.
* ``b1`` / ``b2``: ghosts (keys only) of keys evicted from ``t1`` / ``t2``.
* ``p`` is the target size of ``t1``. A returning ``b1`` ghost means recency was evicted too early (``p``
  grows by max(1, |b2|/|b1|)); a ``b2`` ghost means frequency was (``p`` shrinks by max(1, |b1|/|b2|)). A
  returning ghost enters ``t2``.
* The victim is ``t1``'s LRU key while ``t1`` holds more than ``p`` keys, else ``t2``'s.

Adapted to an engine that only asks for rankings: the cache size ``c`` is the number of keys the tier tracks
(the engine evicts only when full, so that count is the capacity in keys); ghosts are trimmed so that
|t1| + |b1| <= c and the four lists hold at most 2c keys, as in the paper. ARC's tie rule for an incoming
``b2`` ghost (evict from ``t1`` when |t1| == p) is dropped: the victim is chosen before the engine says which key
is coming. ``victims()`` merges the two lists by the same rule without changing anything, lazily, O(1) per key.
Only a key removed right after being offered is an eviction that leaves a ghost; a deleted key leaves none.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator


class ARCPolicy:
    __slots__ = ("_b1", "_b2", "_offered", "_t1", "_t2", "p")
    name = "arc"

    def __init__(self) -> None:
        self._t1: OrderedDict[bytes, None] = OrderedDict()
        self._t2: OrderedDict[bytes, None] = OrderedDict()
        self._b1: OrderedDict[bytes, None] = OrderedDict()
        self._b2: OrderedDict[bytes, None] = OrderedDict()
        self._offered: set[bytes] = set()
        self.p = 0.0

    def segment_sizes(self) -> tuple[int, int, int, int]:
        """(t1, t2, b1, b2) key counts."""
        return len(self._t1), len(self._t2), len(self._b1), len(self._b2)

    def admit(self, key: bytes) -> None:
        t1, t2 = self._t1, self._t2
        if key in t1 or key in t2:
            self.touch(key)
            return
        b1, b2 = self._b1, self._b2
        c = len(t1) + len(t2) + 1
        if key in b1:
            self.p = min(float(c), self.p + max(1.0, len(b2) / len(b1)))
            del b1[key]
            t2[key] = None
        elif key in b2:
            self.p = max(0.0, self.p - max(1.0, len(b1) / len(b2)))
            del b2[key]
            t2[key] = None
        else:
            t1[key] = None

    def touch(self, key: bytes) -> None:
        t2 = self._t2
        if key in t2:
            t2.move_to_end(key)
            return
        t1 = self._t1
        if key in t1:
            del t1[key]
            t2[key] = None
            return
        self.admit(key)

    def _t1_first(self, t1_left: int, t2_left: int) -> bool:
        return t1_left > 0 and (t1_left > self.p or t2_left == 0)

    def victim(self) -> bytes | None:
        offered = self._offered
        offered.clear()
        t1, t2 = self._t1, self._t2
        if self._t1_first(len(t1), len(t2)):
            key = next(iter(t1))
        elif t2:
            key = next(iter(t2))
        else:
            return None
        offered.add(key)
        return key

    def victims(self) -> Iterator[bytes]:
        offered = self._offered
        offered.clear()
        return self._walk(offered)

    def _walk(self, offered: set[bytes]) -> Iterator[bytes]:
        t1, t2 = self._t1, self._t2
        n1, n2 = len(t1), len(t2)
        it1, it2 = iter(t1), iter(t2)
        while n1 or n2:
            if self._t1_first(n1, n2):
                key = next(it1)
                n1 -= 1
            else:
                key = next(it2)
                n2 -= 1
            offered.add(key)
            yield key

    def remove(self, key: bytes) -> None:
        t1 = self._t1
        if key in t1:
            del t1[key]
            ghosts = self._b1
        elif key in self._t2:
            del self._t2[key]
            ghosts = self._b2
        else:
            return
        if key not in self._offered:  # deleted or pinned, not evicted: no evidence
            return
        self._offered.discard(key)
        ghosts[key] = None
        b1, b2 = self._b1, self._b2
        c = len(t1) + len(self._t2) + 1
        while b1 and len(t1) + len(b1) > c:
            b1.popitem(last=False)
        while len(b1) + len(b2) > c:
            (b2 if b2 else b1).popitem(last=False)

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __contains__(self, key: object) -> bool:
        return key in self._t1 or key in self._t2

    def clear(self) -> None:
        for d in (self._t1, self._t2, self._b1, self._b2):
            d.clear()
        self._offered.clear()
        self.p = 0.0
