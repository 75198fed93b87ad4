"""CLOCK (second chance) with a 2-bit reference count, in flat arrays: the policy for a tier of millions of keys.

The keys are ints (1 <= key < 2**61; the SSD tier ranks its records' write sequence numbers, so no key object is
kept in memory at all). They sit in insertion order in a ``GhostFifo`` ring (``_ghosts.py``: ``array('q')``
slots found through an open-addressing table) with one signed byte per key beside it, the reference count:

* ``admit`` appends the key with count 0; ``touch`` raises the count, capped at ``max_count``;
* ``victim`` looks at the oldest key: with a count above 0 it goes to the newest end with its count lowered by
  one (its second chance), else it is the victim (and stays tracked until ``remove``).

A key read once since it arrived outlives every unread key written before it, a key read often outlives several
rounds: FIFO plus a few bits of frequency, the hit ratio of LRU-like policies on second-level caches at a small
fraction of their memory. Every operation is O(1) amortised (each second chance spends a unit of count earned by
a touch). Memory: 8 B of ring and 8 B of table per slot plus the count byte, at a load between 3/8 and 3/4:
about 22-45 B per key, measured by ``kvstrata bench hitrate --ssd``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kvstrata.engine.policy._ghosts import GhostFifo

_KEY_LIMIT = 1 << 61
_MASK = _KEY_LIMIT - 1
# Keys are stored scrambled (an odd multiplier mod 2**61, undone with its inverse): sequence numbers are
# consecutive, and consecutive slots in the ring's linear-probing table would make long runs that every deletion
# walks; scrambled, a range of keys spreads evenly. Never 0 for a key > 0 (the multiplier is invertible).
_MIX = 0x9E3779B97F4A7C15 & _MASK | 1
_UNMIX = pow(_MIX, -1, _KEY_LIMIT)


def scramble(key: int) -> int:
    """A bijection of [1, 2**61) onto itself that spreads consecutive ints (see ``unscramble``)."""
    return key * _MIX & _MASK


def unscramble(fp: int) -> int:
    return fp * _UNMIX & _MASK


class ClockPolicy:
    """Second-chance FIFO over int keys; see the module docstring."""

    __slots__ = ("_count", "_ring", "max_count")
    name = "clock"

    def __init__(self, max_count: int = 3) -> None:
        if not 1 <= max_count <= 127:
            raise ValueError("max_count must be in 1..127")
        self.max_count = max_count
        self._ring = GhostFifo(payload=("b",))
        self._count = self._ring.payload[0]

    def admit(self, key: int) -> None:
        if not 0 < key < _KEY_LIMIT:
            raise ValueError(f"clock ranks int keys in [1, 2**61): {key!r}")
        ring = self._ring
        fp = scramble(key)
        pos = ring.find(fp)
        if pos >= 0:
            if self._count[pos] < self.max_count:
                self._count[pos] += 1
            return
        ring.add(fp, 0)
        self._count = ring.payload[0]  # a rebuild replaces the arrays

    def extend(self, keys: Iterable[int]) -> None:
        """Admit many new keys (none tracked yet), oldest first, in one go: a rebuild from disk."""
        keys = list(keys)
        for key in keys:
            if not 0 < key < _KEY_LIMIT:
                raise ValueError(f"clock ranks int keys in [1, 2**61): {key!r}")
        self._ring.extend(scramble(key) for key in keys)
        self._count = self._ring.payload[0]

    def touch(self, key: int) -> None:
        pos = self._ring.find(scramble(key))
        if pos >= 0:
            count = self._count
            if count[pos] < self.max_count:
                count[pos] += 1

    def remove(self, key: int) -> None:
        self._ring.discard(scramble(key))

    def victim(self) -> int | None:
        ring = self._ring
        while ring.count:
            fp = ring.oldest()
            pos = ring.find(fp)
            left = self._count[pos]
            if not left:
                return unscramble(fp)
            ring.popleft()
            ring.add(fp, left - 1)
            self._count = ring.payload[0]
        return None

    def victims(self) -> Iterator[int]:
        """Tracked keys in the order ``victim`` would take them if none were touched: by count, then age."""
        ring = self._ring
        for level in range(self.max_count + 1):
            for fp in list(ring):
                if self._count[ring.find(fp)] == level:
                    yield unscramble(fp)

    def count_of(self, key: int) -> int:
        """The key's reference count (-1 when not tracked)."""
        pos = self._ring.find(scramble(key))
        return -1 if pos < 0 else self._count[pos]

    def __len__(self) -> int:
        return self._ring.count

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and 0 < key < _KEY_LIMIT and self._ring.find(scramble(key)) >= 0

    def clear(self) -> None:
        self._ring.clear()
        self._count = self._ring.payload[0]
