"""S3-FIFO over int keys in flat arrays: the SSD tier's ranking at a fraction of ``s3fifo.py``'s memory.

The same algorithm as :mod:`kvstrata.engine.policy.s3fifo` (Yang et al., SOSP 2023): a new key enters the small
FIFO, or main when it is in the ghost FIFO (it left small unread recently); a hit raises a 2-bit count; eviction
takes small's head while small holds at least ``small_ratio`` of the keys (to main if it was hit there, count
reset, else out, into the ghosts), otherwise main's head (a count above 0 buys a reinsertion at the tail, one
lower). The keys are ints (1 <= key < 2**61: the SSD tier's write sequence numbers), kept scrambled
(``clock.scramble``) in three ``GhostFifo`` rings (``_ghosts.py``): small and main with one count byte per
key, ghosts bounded by the tracked key count. No Python object per key: ~20-45 B per key per ring at the
rings' load factors, plus the ghosts (``kvstrata bench hitrate --ssd`` measures it).

An offered victim that is then removed is an eviction (a key from small goes to the ghosts); a key removed
without being offered was deleted. Every operation is O(1) amortised (a promotion or reinsertion spends what a
hit earned).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kvstrata.engine.policy._ghosts import GhostFifo
from kvstrata.engine.policy.clock import scramble, unscramble

_KEY_LIMIT = 1 << 61


class CompactS3FIFOPolicy:
    """S3-FIFO over int keys; see the module docstring."""

    __slots__ = ("_ghost", "_main", "_offered", "_small", "max_count", "small_ratio")
    name = "s3-compact"

    def __init__(self, small_ratio: float = 0.1, max_count: int = 3) -> None:
        if not 0.0 < small_ratio < 1.0 or not 1 <= max_count <= 127:
            raise ValueError("small_ratio in (0, 1) and max_count in 1..127 are required")
        self.small_ratio = small_ratio
        self.max_count = max_count
        self._small = GhostFifo(payload=("b",))
        self._main = GhostFifo(payload=("b",))
        self._ghost = GhostFifo()
        self._offered = 0  # the scrambled key victim() offered last (0: none)

    def admit(self, key: int) -> None:
        if not 0 < key < _KEY_LIMIT:
            raise ValueError(f"s3-compact ranks int keys in [1, 2**61): {key!r}")
        fp = scramble(key)
        if self._small.find(fp) >= 0 or self._main.find(fp) >= 0:
            self.touch(key)
        elif self._ghost.count and self._ghost.discard(fp):
            self._main.add(fp, 0)
        else:
            self._small.add(fp, 0)

    def extend(self, keys: Iterable[int]) -> None:
        """Admit many new keys (none tracked, none a ghost), oldest first, into small in one go (a rebuild)."""
        keys = list(keys)
        if any(not 0 < k < _KEY_LIMIT for k in keys):
            raise ValueError("s3-compact ranks int keys in [1, 2**61)")
        self._small.extend(scramble(k) for k in keys)

    def touch(self, key: int) -> None:
        fp = scramble(key)
        for ring in (self._small, self._main):
            pos = ring.find(fp)
            if pos >= 0:
                count = ring.payload[0]
                if count[pos] < self.max_count:
                    count[pos] += 1
                return

    def remove(self, key: int) -> None:
        fp = scramble(key)
        evicted = fp == self._offered
        if evicted:
            self._offered = 0
        if self._small.discard(fp):
            if evicted:
                ghost = self._ghost
                ghost.add(fp)
                while ghost.count > max(1, len(self)):
                    ghost.popleft()
        else:
            self._main.discard(fp)

    def victim(self) -> int | None:
        small, main = self._small, self._main
        while small.count or main.count:
            if small.count and (not main.count or small.count >= self.small_ratio * (small.count + main.count)):
                fp = small.oldest()
                if small.payload[0][small.find(fp)]:
                    small.popleft()
                    main.add(fp, 0)  # hit while in small: to main, its count spent
                    continue
            else:
                fp = main.oldest()
                left = main.payload[0][main.find(fp)]
                if left:
                    main.popleft()
                    main.add(fp, left - 1)
                    continue
            self._offered = fp
            return unscramble(fp)
        return None

    def victims(self) -> Iterator[int]:
        """Tracked keys, unread small keys first, then main's by count and age (a view; nothing moves)."""
        small, main = self._small, self._main
        rest = []
        for fp in list(small):
            if small.payload[0][small.find(fp)]:
                rest.append(fp)
            else:
                yield unscramble(fp)
        for level in range(self.max_count + 1):
            for fp in list(main):
                if main.payload[0][main.find(fp)] == level:
                    yield unscramble(fp)
        for fp in rest:
            yield unscramble(fp)

    def segment_sizes(self) -> tuple[int, int, int]:
        """(small, main, ghost) key counts."""
        return self._small.count, self._main.count, self._ghost.count

    def __len__(self) -> int:
        return self._small.count + self._main.count

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, int) or not 0 < key < _KEY_LIMIT:
            return False
        fp = scramble(key)
        return self._small.find(fp) >= 0 or self._main.find(fp) >= 0

    def clear(self) -> None:
        self._small.clear()
        self._main.clear()
        self._ghost.clear()
        self._offered = 0
