"""W-TinyLFU (Einziger, Friedman and Manes, 2017; Caffeine's policy): a window LRU, a TinyLFU admission
filter, a segmented LRU main area, and a hill climber that sizes the window.

* Every key enters the *window* (LRU). While the window holds more than its share of the tracked keys, its LRU
  key is a *candidate* for the main area: it duels with main's victim (the *probation* head), and the one
  the frequency sketch (engine/policy/sketch.py) has seen less often is evicted; a tie evicts the candidate.
  So a one-off key, however recent, never displaces a key that recurs.
* Main is a segmented LRU: a hit in *probation* moves the key to *protected* (at most ``protected_ratio`` of
  main; its overflow goes back to probation's MRU end).
* The window share starts at ``window_ratio`` and is tuned by hill climbing on the hit ratio the policy sees
  (``touch`` of a tracked key = hit, ``admit`` = miss), one step per sample of as many accesses as tracked
  keys (Caffeine waits for 10x as many; these traces are too short for that): recency-heavy traffic (chat
  turns) should grow the window, frequency-heavy traffic (RAG) shrink it.
* Keys past the window's share (plus the one candidate the next eviction duels) join probation without a duel
  when they are admitted: that is how main fills while nothing is evicted.

Sizes are in keys: the tracked key count stands in for the capacity (the engine evicts only when full). The
sketch costs 10-40 bytes per tracked key; there are no ghosts. ``victims()`` applies the duels as it goes (a
winning candidate joins probation) and takes offered keys off their queues, putting back any the engine did not
remove on its next call (engine/policy/_stash.py). Every operation is O(1).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from kvstrata.engine.policy._stash import Stash, walk
from kvstrata.engine.policy.sketch import FrequencySketch

_MIN_WINDOW, _MAX_WINDOW = 0.01, 0.8
_MIN_SKETCH = 1024  # counters per row, at least: a narrower sketch confuses scans with hot keys
_MIN_SAMPLE = 640  # accesses per hill-climbing step, at least
_SAMPLE_FACTOR = 1  # accesses per step per tracked key: Caffeine uses 10; on these traces 1 adapts in time


class WTinyLFUPolicy:
    __slots__ = (
        "_accesses",
        "_cands",
        "_hits",
        "_pending",
        "_last_ratio",
        "_probation",
        "_protected",
        "_sample",
        "_sketch",
        "_stash",
        "_step",
        "_window",
        "_won",
        "adaptive",
        "protected_ratio",
        "window_ratio",
    )
    name = "w-tinylfu"

    def __init__(self, window_ratio: float = 0.01, protected_ratio: float = 0.8, *, adaptive: bool = True) -> None:
        if not 0.0 < window_ratio < 1.0 or not 0.0 < protected_ratio < 1.0:
            raise ValueError("window_ratio and protected_ratio must be in (0, 1)")
        self.window_ratio = window_ratio
        self.protected_ratio = protected_ratio
        self.adaptive = adaptive
        self._window: OrderedDict[bytes, None] = OrderedDict()
        self._probation: OrderedDict[bytes, None] = OrderedDict()
        self._protected: OrderedDict[bytes, None] = OrderedDict()
        # Keys moved from the window into probation that have not yet dueled with probation's LRU key.
        self._cands: OrderedDict[bytes, None] = OrderedDict()
        self._pending: dict[bytes, None] = {}  # candidates dueled since the last restore, in order
        self._won: dict[bytes, bytes] = {}  # offered victim -> the candidate that beat it
        self._sketch = FrequencySketch(_MIN_SKETCH)
        self._stash = Stash()
        self._hits = self._accesses = 0
        self._last_ratio = 0.0
        self._step = 0.0625
        self._sample = _MIN_SAMPLE

    def segment_sizes(self) -> tuple[int, int, int]:
        """(window, probation, protected) key counts."""
        return len(self._window), len(self._probation), len(self._protected)

    def _record(self, key: bytes, hit: bool) -> None:
        self._sketch.add(key)
        if self.adaptive:
            self._hits += hit
            self._accesses += 1
            if self._accesses >= self._sample:
                self._climb()

    def _climb(self) -> None:
        """One hill-climbing step on the window share, from the hit ratio of the last sample."""
        ratio = self._hits / self._accesses
        if ratio < self._last_ratio:  # the last step hurt: go the other way
            self._step = -self._step
        self._last_ratio = ratio
        self.window_ratio = min(_MAX_WINDOW, max(_MIN_WINDOW, self.window_ratio + self._step))
        self._step *= 0.98
        self._hits = self._accesses = 0
        self._sample = max(_MIN_SAMPLE, _SAMPLE_FACTOR * len(self))

    def admit(self, key: bytes) -> None:
        if self._stash.items:
            self._restore()
        if key in self._window or key in self._probation or key in self._protected:
            self.touch(key)
            return
        window = self._window
        window[key] = None
        # Past its share (and one more, the candidate the next eviction duels), the window's LRU keys join
        # probation without a duel: that is how main fills while nothing is evicted.
        limit = self.window_ratio * len(self) + 1
        while len(window) > limit:
            self._probation[window.popitem(last=False)[0]] = None
        self._record(key, False)
        tracked = len(self._window) + len(self._probation) + len(self._protected)
        if 2 * tracked > self._sketch.width:  # the tier outgrew the sketch: start a wider one
            self._sketch = FrequencySketch(4 * tracked)

    def touch(self, key: bytes) -> None:
        if self._stash.items:
            self._restore()
        protected = self._protected
        if key in protected:
            protected.move_to_end(key)
        elif key in self._window:
            self._window.move_to_end(key)
        elif key in self._probation:
            probation = self._probation
            del probation[key]
            self._cands.pop(key, None)
            protected[key] = None
            if len(protected) > self.protected_ratio * (len(probation) + len(protected)):
                probation[protected.popitem(last=False)[0]] = None
        else:
            self.admit(key)
            return
        self._record(key, True)

    def _next_victim(self) -> bytes | None:
        window, probation, protected, cands = self._window, self._probation, self._protected, self._cands
        take = self._stash.take
        # The window's overflow joins probation's MRU end as candidates (Caffeine's evictFromWindow) ...
        limit = self.window_ratio * len(self)
        while len(window) > limit:
            key = window.popitem(last=False)[0]
            probation[key] = None
            cands[key] = None
        # ... and the oldest candidate duels with probation's LRU key (evictFromMain): the rarer one goes.
        if cands:
            # Dueled candidates wait in _pending until the engine removes the key offered: a duel whose loser
            # stays (offered, not taken) is undone by _restore, so asking again gives the same answer.
            cand = next(iter(cands))
            del cands[cand]
            self._pending[cand] = None
            victim = next(iter(probation))
            if victim == cand and protected:  # probation holds only candidates: duel main's other end
                victim = next(iter(protected))
            if victim != cand:
                estimate = self._sketch.estimate
                if estimate(cand) > estimate(victim):
                    if victim in cands:
                        del cands[victim]
                        self._pending[victim] = None
                    self._won[victim] = cand
                    return take(victim, probation if victim in probation else protected)
            return take(cand, probation)
        if probation:
            return take(next(iter(probation)), probation)
        if protected:
            return take(next(iter(protected)), protected)
        return take(next(iter(window)), window) if window else None

    def victim(self) -> bytes | None:
        if self._stash.items:
            self._restore()
        return self._next_victim()

    def victims(self) -> Iterator[bytes]:
        if self._stash.items:
            self._restore()
        return walk(self._next_victim)

    def _restore(self) -> None:
        """Put offered keys back, and undo the duels of candidates whose opponent was not removed."""
        self._stash.restore()
        cands, probation = self._cands, self._probation
        for cand in reversed(self._pending):
            if cand in probation:
                cands[cand] = None
                cands.move_to_end(cand, last=False)
        self._pending.clear()
        self._won.clear()

    def remove(self, key: bytes) -> None:
        self._cands.pop(key, None)
        self._pending.pop(key, None)
        if self._stash.items.pop(key, None) is not None:
            winner = self._won.pop(key, None)
            if winner is not None:  # the duel is settled: the winner stays in probation for good
                self._pending.pop(winner, None)
            return
        for queue in (self._window, self._probation, self._protected):
            if key in queue:
                del queue[key]
                return

    def __len__(self) -> int:
        return len(self._window) + len(self._probation) + len(self._protected) + len(self._stash.items)

    def __contains__(self, key: object) -> bool:
        return key in self._window or key in self._probation or key in self._protected or key in self._stash.items

    def clear(self) -> None:
        for queue in (self._window, self._probation, self._protected):
            queue.clear()
        self._stash.items.clear()
        self._cands.clear()
        self._pending.clear()
        self._won.clear()
        self._sketch = FrequencySketch(_MIN_SKETCH)
        self._hits = self._accesses = 0
