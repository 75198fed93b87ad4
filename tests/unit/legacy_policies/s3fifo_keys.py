"""Reference copy of the pre-compact implementation (key objects and OrderedDicts), kept so that tests can check
that the compact policy in src/kvstrata/engine/policy makes the same decisions. Not used by the server.

S3-FIFO (Yang et al., SOSP 2023): a small probationary FIFO, a main FIFO with reinsertion, a ghost FIFO.

* A new key enters the *small* queue, unless it is in the *ghost* queue (it was evicted from small recently and
  came back): then it enters *main* directly.
* A hit only raises the key's 2-bit frequency (capped at 3); nothing moves, so a hit is one dict lookup.
* Eviction: while small holds at least ``small_ratio`` of the tracked keys, its head leaves it: to main if it
  was hit at least ``promote`` times while in small (frequency reset), else out of the tier (its key goes to the
  ghost queue). Otherwise main's head leaves: a key with frequency > 0 is reinserted at main's tail with its
  frequency decremented; one with frequency 0 is the victim.

One-off keys (scans, unique prompts) pass through small and never disturb main: the quick demotion that makes
the policy scan-resistant. Sizes are in keys: the policy has no capacity of its own, so the tier's current key
count stands in for it (the engine only evicts when the tier is full, so that count is the capacity in keys).
The ghost queue holds keys only (no values), at most as many as the tier tracks. Every operation is O(1)
amortised: each reinsertion consumes a unit of frequency earned by a hit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from kvstrata.engine.policy._stash import Stash, walk

MAX_FREQ = 3
_MIN_SMALL, _MAX_SMALL = 0.01, 0.9


class S3FIFOPolicy:
    __slots__ = ("_ghost", "_ghost_main", "_main", "_small", "_stash", "adaptive", "ghost_ratio", "promote",
                 "small_ratio")
    name = "s3-fifo"

    def __init__(
        self, small_ratio: float = 0.1, promote: int = 1, ghost_ratio: float = 1.0, *, adaptive: bool = False
    ) -> None:
        if not 0.0 < small_ratio < 1.0:
            raise ValueError("small_ratio must be in (0, 1)")
        if promote < 1 or ghost_ratio < 0:
            raise ValueError("promote >= 1 and ghost_ratio >= 0 are required")
        self.small_ratio = small_ratio
        self.promote = promote
        self.ghost_ratio = ghost_ratio
        self.adaptive = adaptive
        self._small: OrderedDict[bytes, int] = OrderedDict()  # key -> frequency
        self._main: OrderedDict[bytes, int] = OrderedDict()
        self._ghost: OrderedDict[bytes, None] = OrderedDict()
        self._ghost_main: OrderedDict[bytes, None] = OrderedDict()  # adaptive only: keys evicted from main
        self._stash = Stash()

    def segment_sizes(self) -> tuple[int, int, int]:
        """(small, main, ghost) key counts."""
        return len(self._small), len(self._main), len(self._ghost)

    def admit(self, key: bytes) -> None:
        if self._stash.items:
            self._stash.restore()
        if key in self._small or key in self._main:
            self.touch(key)
            return
        ghost, ghost_main = self._ghost, self._ghost_main
        if key in ghost:
            if self.adaptive:  # evicted from small too early: small should be larger
                self._adapt(max(1.0, len(ghost_main) / len(ghost)))
            del ghost[key]
            self._main[key] = 0
        elif key in ghost_main:  # (adaptive only) evicted from main too early: small should be smaller
            self._adapt(-max(1.0, len(ghost) / len(ghost_main)))
            del ghost_main[key]
            self._main[key] = 0
        else:
            self._small[key] = 0

    def _adapt(self, keys: float) -> None:
        """Move small's target size by ``keys`` keys, as ARC moves its target p."""
        tracked = len(self._small) + len(self._main) + 1
        self.small_ratio = min(_MAX_SMALL, max(_MIN_SMALL, self.small_ratio + keys / tracked))

    def touch(self, key: bytes) -> None:
        if self._stash.items:
            self._stash.restore()
        small = self._small
        f = small.get(key)
        if f is not None:
            if f < MAX_FREQ:
                small[key] = f + 1
            return
        main = self._main
        f = main.get(key)
        if f is not None:
            if f < MAX_FREQ:
                main[key] = f + 1
            return
        self.admit(key)

    def _next_victim(self) -> bytes | None:
        small, main = self._small, self._main
        target = self.small_ratio * (len(small) + len(main) + len(self._stash.items))
        while True:
            if small and (len(small) >= target or not main):
                key, f = next(iter(small.items()))
                if f >= self.promote:
                    del small[key]
                    main[key] = 0
                    continue
                return self._stash.take(key, small)
            if not main:
                return None
            key, f = next(iter(main.items()))
            if f > 0:
                main[key] = f - 1
                main.move_to_end(key)
                continue
            return self._stash.take(key, main)

    def victim(self) -> bytes | None:
        if self._stash.items:
            self._stash.restore()
        return self._next_victim()

    def victims(self) -> Iterator[bytes]:
        if self._stash.items:
            self._stash.restore()
        return walk(self._next_victim)

    def remove(self, key: bytes) -> None:
        stashed = self._stash.items.pop(key, None)
        if stashed is None:  # deleted, pinned or moved by the engine: no evidence, no ghost
            if self._small.pop(key, None) is None:
                self._main.pop(key, None)
            return
        ghost, ghost_main = self._ghost, self._ghost_main
        if stashed[0] is self._small:  # evicted from small: remember it, a return goes straight to main
            ghost[key] = None
        elif self.adaptive:
            ghost_main[key] = None
        else:
            return
        bound = int(self.ghost_ratio * (len(self._small) + len(self._main) + len(self._stash.items) + 1))
        while len(ghost) + len(ghost_main) > bound:
            (ghost if len(ghost) >= len(ghost_main) else ghost_main).popitem(last=False)

    def __len__(self) -> int:
        return len(self._small) + len(self._main) + len(self._stash.items)

    def __contains__(self, key: object) -> bool:
        return key in self._small or key in self._main or key in self._stash.items

    def clear(self) -> None:
        self._small.clear()
        self._main.clear()
        self._ghost.clear()
        self._ghost_main.clear()
        self._stash.items.clear()
