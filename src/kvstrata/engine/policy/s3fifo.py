"""S3-FIFO (Yang et al., SOSP 2023): a small probationary FIFO, a main FIFO with reinsertion, a ghost FIFO.

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
The ghost queue holds 64-bit fingerprints of keys in flat arrays (``_ghosts.GhostFifo``: no key object is kept
alive), at most as many as the tier tracks. Every operation is O(1)
amortised: each reinsertion consumes a unit of frequency earned by a hit.

Memory: one dict maps every resident key to a small int (its frequency, +4 while in small: CPython shares small
ints, so nothing is allocated per key), and each queue is a ``deque`` of key references (8 B per key). A key
removed from the middle of a queue (deleted, pinned) stays there as a stale entry, counted per queue and skipped
when it reaches the head; stale entries are swept once they outnumber the live ones. The keys offered by
``victims()`` wait aside until the next call (the *stash*, as in ``_stash.py``) and go back to their queues'
heads unless removed. Nothing is allocated per hit or per eviction beyond the ghost's slot.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from kvstrata.engine.policy._ghosts import GhostFifo, fingerprint
from kvstrata.engine.policy._stash import walk

MAX_FREQ = 3
_SMALL = 4  # added to the frequency of a key in small: the dict value says which queue the key is in
_MIN_SMALL, _MAX_SMALL = 0.01, 0.9


class S3FIFOPolicy:
    __slots__ = ("_freq", "_ghost", "_ghost_main", "_main", "_n_main", "_n_small", "_small", "_stale",
                 "_stale_main", "_stale_small", "_stash", "adaptive", "ghost_ratio", "promote", "small_ratio")
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
        self._freq: dict[bytes, int] = {}  # resident key -> frequency (+ _SMALL while in small)
        self._small: deque[bytes] = deque()
        self._main: deque[bytes] = deque()
        self._n_small = self._n_main = 0  # live entries of each queue (stashed keys not included)
        self._stale_small: dict[bytes, int] = {}  # key -> entries of it in small that are no longer live
        self._stale_main: dict[bytes, int] = {}
        self._stale = 0
        self._ghost = GhostFifo()  # fingerprints of keys evicted from small
        self._ghost_main = GhostFifo()  # adaptive only: keys evicted from main
        self._stash: dict[bytes, bool] = {}  # offered keys, in order -> whether they came from small

    def segment_sizes(self) -> tuple[int, int, int]:
        """(small, main, ghost) key counts."""
        return self._n_small, self._n_main, len(self._ghost)

    def admit(self, key: bytes) -> None:
        if self._stash:
            self._restore()
        if key in self._freq:
            self.touch(key)
            return
        ghost, ghost_main = self._ghost, self._ghost_main
        fp = fingerprint(key)
        if ghost.count and ghost.discard(fp):
            if self.adaptive:  # evicted from small too early: small should be larger
                self._adapt(max(1.0, ghost_main.count / (ghost.count + 1)))
        elif ghost_main.count and ghost_main.discard(fp):  # (adaptive only) evicted from main too early
            self._adapt(-max(1.0, ghost.count / (ghost_main.count + 1)))
        else:
            self._freq[key] = _SMALL
            self._small.append(key)
            self._n_small += 1
            return
        self._freq[key] = 0
        self._main.append(key)
        self._n_main += 1

    def _adapt(self, keys: float) -> None:
        """Move small's target size by ``keys`` keys, as ARC moves its target p."""
        tracked = self._n_small + self._n_main + 1
        self.small_ratio = min(_MAX_SMALL, max(_MIN_SMALL, self.small_ratio + keys / tracked))

    def touch(self, key: bytes) -> None:
        if self._stash:
            self._restore()
        f = self._freq.get(key)
        if f is None:
            self.admit(key)
        elif f & 3 != MAX_FREQ:
            self._freq[key] = f + 1

    def _next_victim(self) -> bytes | None:
        small, main, freq = self._small, self._main, self._freq
        stale_small, stale_main = self._stale_small, self._stale_main
        target = self.small_ratio * (self._n_small + self._n_main + len(self._stash))
        while True:
            if self._n_small and (self._n_small >= target or not self._n_main):
                key = small.popleft()
                if stale_small and key in stale_small:
                    self._drop_stale(stale_small, key)
                    continue
                self._n_small -= 1
                if freq[key] - _SMALL >= self.promote:
                    freq[key] = 0
                    main.append(key)
                    self._n_main += 1
                    continue
                self._stash[key] = True
                return key
            if not self._n_main:
                return None
            key = main.popleft()
            if stale_main and key in stale_main:
                self._drop_stale(stale_main, key)
                continue
            f = freq[key]
            if f > 0:
                freq[key] = f - 1
                main.append(key)
                continue
            self._n_main -= 1
            self._stash[key] = False
            return key

    def _drop_stale(self, stale: dict[bytes, int], key: bytes) -> None:
        """A stale entry of ``key`` left its queue's head."""
        left = stale[key] - 1
        if left:
            stale[key] = left
        else:
            del stale[key]
        self._stale -= 1

    def _restore(self) -> None:
        """Put the keys offered but not taken back at the heads of their queues, in their order."""
        for key, from_small in reversed(self._stash.items()):
            if from_small:
                self._small.appendleft(key)
                self._n_small += 1
            else:
                self._main.appendleft(key)
                self._n_main += 1
        self._stash.clear()

    def victim(self) -> bytes | None:
        if self._stash:
            self._restore()
        return self._next_victim()

    def victims(self) -> Iterator[bytes]:
        if self._stash:
            self._restore()
        return walk(self._next_victim)

    def remove(self, key: bytes) -> None:
        from_small = self._stash.pop(key, None)
        if from_small is None:  # deleted, pinned or moved by the engine: no evidence, no ghost
            f = self._freq.pop(key, None)
            if f is None:
                return
            if f >= _SMALL:
                stale, self._n_small = self._stale_small, self._n_small - 1
            else:
                stale, self._n_main = self._stale_main, self._n_main - 1
            stale[key] = stale.get(key, 0) + 1  # its queue entry stays until it reaches the head
            self._stale += 1
            if self._stale > self._n_small + self._n_main + 64:
                self._sweep()
            return
        del self._freq[key]
        ghost, ghost_main = self._ghost, self._ghost_main
        if from_small:  # evicted from small: remember it, a return goes straight to main
            ghost.add(fingerprint(key))
        elif self.adaptive:
            ghost_main.add(fingerprint(key))
        else:
            return
        bound = int(self.ghost_ratio * (self._n_small + self._n_main + len(self._stash) + 1))
        while ghost.count + ghost_main.count > bound:
            (ghost if ghost.count >= ghost_main.count else ghost_main).popleft()

    def _sweep(self) -> None:
        """Drop every stale queue entry (they precede their key's live entry, if any, in the same queue)."""
        for queue, stale in ((self._small, self._stale_small), (self._main, self._stale_main)):
            live: deque[bytes] = deque()
            for key in queue:
                left = stale.get(key)
                if left:
                    stale[key] = left - 1
                else:
                    live.append(key)
            queue.clear()
            queue.extend(live)
            stale.clear()
        self._stale = 0

    def __len__(self) -> int:
        return self._n_small + self._n_main + len(self._stash)

    def __contains__(self, key: object) -> bool:
        return key in self._freq

    def clear(self) -> None:
        self._freq.clear()
        self._small.clear()
        self._main.clear()
        self._n_small = self._n_main = self._stale = 0
        self._stale_small.clear()
        self._stale_main.clear()
        self._ghost.clear()
        self._ghost_main.clear()
        self._stash.clear()
