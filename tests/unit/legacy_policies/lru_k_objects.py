"""Reference copy of the pre-compact implementation (key objects and OrderedDicts), kept so that tests can check
that the compact policy in src/kvstrata/engine/policy makes the same decisions. Not used by the server.

LRU-K with O(1) operations: two recency-ordered segments and an adaptive time ratio between them.

What is kept from LRU-K (O'Neil, O'Neil and Weikum, 1993)
    A key is *proven* once it has K uncorrelated references (K = 2 by default). References closer together than
    the correlated-reference period (CRP) to the key's previous reference are correlated and count as one, so a
    burst of reads inside one request does not make a chunk look popular. A key referenced within the CRP of now
    is not evictable while some other key is. The reference history of keys that left the tier is retained for a
    while, so a key that comes back keeps its past (a second reference after an eviction proves it).

Why not the classic ranking
    Classic LRU-K ranks every unproven key (infinite backward K-distance) below every proven one, and finding
    the lowest backward K-distance needs a priority queue. On chat traffic the ranking is also wrong: chunks of
    finished sessions have been read twice and so outrank the chunks a live session wrote a minute ago, which it
    re-reads on its next turn. LRU is close to optimal there, while on retrieval (RAG)
    traffic, where written chunks are never read again and documents follow a Zipf law, LRU-K's "unproven
    first" rule is what beats LRU. So the order between the two classes has to be learnt from the traffic.

The structure (as in 2Q and ARC, every operation O(1), no heap)
    * ``probation``: keys with fewer than K uncorrelated references; ``protected``: keys with K or more. Each is
      an ``OrderedDict`` in order of last reference, so its head is the segment's least recently used key.
    * The victim is one of the two heads. With ``idle`` = time since a key's last reference, the probation head
      goes first when ``idle(probation head) >= theta * idle(protected head)``, else the protected head. With
      ``theta = 1`` this is exactly LRU over all keys; as ``theta`` goes to 0 it becomes LRU-K's rule (unproven
      keys first, oldest first), with proven keys ordered by last reference as in 2Q rather than by their K-th
      most recent one. ``theta`` never exceeds 1: an unproven key never outlives a proven key that
      has been idle as long. The CRP rule comes first: a head referenced within the CRP of now is skipped when
      the other head is evictable.
    * ``theta`` is learnt from *ghosts*: keys recently moved out of the tier, with their history, at most
      ``min(retained, tracked keys)`` of them (oldest dropped first). A key removed right after ``victim`` or
      ``victims`` offered it was evicted; its ghost carries a window: it counts as evidence only if the key is
      admitted again within its idle time at eviction, i.e. if keeping it twice as long would have turned the
      miss into a hit. Such a probation ghost hit says unproven keys are evicted too early (``theta`` goes up),
      a protected one says proven keys are (``theta`` goes down). Each step is divided by that segment's share
      of the recent eviction *exposure* (the summed windows, decayed over about one tracked-keys' worth of
      evictions): the controller settles where returns per second of window are as frequent in both segments,
      which is where one more second of lifetime buys as many hits in either. Keys removed for another reason
      (deleted, pinned) keep their history as ghosts but never move ``theta``.
    * ``theta`` lives on a log scale between 1/256 and 8 and is used as ``min(theta, 1)``; it starts at 8. The
      headroom above 1 is hysteresis: the policy orders keys as LRU does until the protected segment has shown
      clearly more evidence than the probation segment, and after a stretch of probation ghost hits it takes as
      many protected ones before it departs from LRU order again. This keeps LRU-K from trailing LRU on traffic
      where LRU is already near optimal (chat), at the price of adapting more slowly on retrieval traffic.

Time is the policy's own call count unless a clock is injected (tests do): idle times, ghost windows and the CRP
are then counted in accesses, never in seconds. With a 1 s wall-clock CRP (the former server setting) a client
replaying a trace at full speed made every re-reference "correlated" and LRU-K degenerated into LRU; counted in
accesses, the ranking is the same at any request rate (`kvstrata bench hitrate` replays every trace at two
rates 1000x apart to check it).

The engine's protocol: ``admit`` when a key enters the tier, ``touch`` on a hit, ``victim`` for the lowest-ranked
key or ``victims`` for all of them lowest first (they stay tracked), ``remove`` after a key left (eviction,
demotion, deletion or pinning). Per call: a few dict operations and one tick of the access counter; an object is allocated
per admitted key, none per touch.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Iterator

from kvstrata.clock import Clock

DEFAULT_RETAINED = 100_000
"""Default cap on remembered history of keys that left the tier (also capped by the number of tracked keys)."""
DEFAULT_ADAPT_RATE = 0.005
"""Step of ln(theta) per qualifying ghost hit, before the exposure normalisation."""

_LOG_THETA_MIN = math.log(1 / 256)
_LOG_THETA_MAX = math.log(8.0)
_MAX_STEP = 0.25  # a safety net for a segment with almost no recent exposure


class _Key:
    """What the policy remembers about one key, resident or ghost."""

    __slots__ = ("count", "last", "until")

    def __init__(self, last: float) -> None:
        self.count = 1  # uncorrelated references, capped at K
        self.last = last  # time of the last (correlated or not) reference
        self.until = -math.inf  # as a ghost of an evicted key: a return before this is evidence


class LRUKPolicy:
    __slots__ = (
        "_exposure_prob",
        "_exposure_prot",
        "_ghosts",
        "_log_theta",
        "_now",
        "_offered",
        "_probation",
        "_protected",
        "_theta",
        "adapt_rate",
        "crp",
        "k",
        "retained",
    )
    name = "lru-k"

    def __init__(
        self,
        k: int = 2,
        crp: float = 0.0,
        clock: Clock | None = None,
        retained: int = DEFAULT_RETAINED,
        *,
        adapt_rate: float = DEFAULT_ADAPT_RATE,
    ) -> None:
        if k < 1:
            raise ValueError("LRU-K needs K >= 1")
        if crp < 0:
            raise ValueError("the correlated-reference period cannot be negative")
        if retained < 0:
            raise ValueError("retained cannot be negative")
        if adapt_rate < 0:
            raise ValueError("adapt_rate cannot be negative")
        self.k = k
        self.crp = crp
        self.retained = retained
        self.adapt_rate = adapt_rate
        # Without a clock, time is the policy's own call count: windows, idle times and the CRP are then counted
        # in accesses, so the ranking does not depend on how fast the clients run (the server's choice).
        self._now = itertools.count().__next__ if clock is None else clock.monotonic
        self._probation: OrderedDict[bytes, _Key] = OrderedDict()
        self._protected: OrderedDict[bytes, _Key] = OrderedDict()
        self._ghosts: OrderedDict[bytes, _Key] = OrderedDict()
        self._log_theta = _LOG_THETA_MAX
        self._theta = 1.0
        # Summed windows (s) of recent evictions from each segment, decayed by 1 - 1/tracked per eviction.
        self._exposure_prob = 0.0
        self._exposure_prot = 0.0
        # Keys handed out by the last victim()/victims() call: removing one of them is an eviction.
        self._offered: set[bytes] = set()

    # ---- state, for INFO and tests ----
    @property
    def theta(self) -> float:
        """The probation head is evicted first when idle at least ``theta`` times the protected head (<= 1)."""
        return self._theta

    @property
    def log_theta(self) -> float:
        """The controller's state, ln(theta) before capping at 1 (between ln(1/256) and ln(8))."""
        return self._log_theta

    def segment_sizes(self) -> tuple[int, int, int]:
        """(probation, protected, ghosts) key counts."""
        return len(self._probation), len(self._protected), len(self._ghosts)

    # ---- the policy protocol ----
    def admit(self, key: bytes) -> None:
        if key in self._probation or key in self._protected:
            self.touch(key)
            return
        now = self._now()
        rec = self._ghosts.pop(key, None)
        if rec is None:
            rec = _Key(now)
            if self.k > 1:
                self._probation[key] = rec
            else:
                self._protected[key] = rec
            return
        proven = rec.count >= self.k
        if now < rec.until:
            self._adapt(protected=proven)
        rec.until = -math.inf
        if not proven and now - rec.last > self.crp:
            rec.count += 1
            proven = rec.count >= self.k
        rec.last = now
        if proven:
            self._protected[key] = rec
        else:
            self._probation[key] = rec

    def touch(self, key: bytes) -> None:
        protected = self._protected
        rec = protected.get(key)
        if rec is not None:  # the common hit: a proven key becomes the most recent one
            rec.last = self._now()
            protected.move_to_end(key)
            return
        probation = self._probation
        rec = probation.get(key)
        if rec is None:
            self.admit(key)
            return
        now = self._now()
        if now - rec.last > self.crp:
            rec.count += 1
            if rec.count >= self.k:
                rec.last = now
                del probation[key]
                protected[key] = rec
                return
        rec.last = now
        probation.move_to_end(key)

    def victim(self) -> bytes | None:
        probation, protected = self._probation, self._protected
        if not probation:
            key = next(iter(protected), None)
        elif not protected:
            key = next(iter(probation))
        else:
            key1, rec1 = next(iter(probation.items()))
            key2, rec2 = next(iter(protected.items()))
            now = self._now()
            key = key1 if self._probation_first(now - rec1.last, now - rec2.last) else key2
        offered = self._offered
        offered.clear()
        if key is not None:
            offered.add(key)
        return key

    def victims(self) -> Iterator[bytes]:
        """Tracked keys from the lowest rank up: the two segments merged by the rule of :meth:`victim`.

        Lazy, O(1) per key. The ranking is taken at the time of the first key; the caller must not change the
        policy while iterating.
        """
        offered = self._offered
        offered.clear()
        head1 = iter(self._probation.items())
        head2 = iter(self._protected.items())
        item1 = next(head1, None)
        item2 = next(head2, None)
        now = self._now()
        while item1 is not None and item2 is not None:
            if self._probation_first(now - item1[1].last, now - item2[1].last):
                key = item1[0]
                item1 = next(head1, None)
            else:
                key = item2[0]
                item2 = next(head2, None)
            offered.add(key)
            yield key
        rest, item = (head1, item1) if item1 is not None else (head2, item2)
        while item is not None:
            offered.add(item[0])
            yield item[0]
            item = next(rest, None)

    def _probation_first(self, idle1: float, idle2: float) -> bool:
        """Whether the probation head (idle for ``idle1`` s) goes before the protected head (``idle2`` s)."""
        crp = self.crp
        if (idle1 > crp) != (idle2 > crp):  # exactly one head is outside the CRP: only it is evictable
            return idle1 > crp
        return idle1 >= self._theta * idle2

    def remove(self, key: bytes) -> None:
        probation, protected = self._probation, self._protected
        rec = probation.pop(key, None)
        from_protected = rec is None
        if from_protected:
            rec = protected.pop(key, None)
            if rec is None:
                return
        tracked = len(probation) + len(protected)
        offered = self._offered
        if key in offered:
            # An eviction: until twice its idle time has passed, a return is evidence about its segment.
            offered.discard(key)
            now = self._now()
            window = now - rec.last
            if window < 0.0:
                window = 0.0
            rec.until = now + window
            decay = 1.0 - 1.0 / (tracked + 1)  # forget over about one turnover of the tracked keys
            if from_protected:
                self._exposure_prob *= decay
                self._exposure_prot = self._exposure_prot * decay + window
            else:
                self._exposure_prob = self._exposure_prob * decay + window
                self._exposure_prot *= decay
        else:
            rec.until = -math.inf
        ghosts = self._ghosts
        ghosts[key] = rec
        if len(ghosts) > tracked or len(ghosts) > self.retained:
            bound = min(self.retained, tracked)
            while len(ghosts) > bound:
                ghosts.popitem(last=False)

    def references(self, key: bytes) -> int:
        """How many uncorrelated references are remembered for a key (resident or retained), at most K."""
        rec = self._probation.get(key) or self._protected.get(key) or self._ghosts.get(key)
        return 0 if rec is None else min(rec.count, self.k)

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    def __contains__(self, key: object) -> bool:
        return key in self._probation or key in self._protected

    def clear(self) -> None:
        self._probation.clear()
        self._protected.clear()
        self._ghosts.clear()
        self._log_theta = _LOG_THETA_MAX
        self._theta = 1.0
        self._exposure_prob = self._exposure_prot = 0.0
        self._offered.clear()

    # ---- adaptation ----
    def _adapt(self, *, protected: bool) -> None:
        """A ghost came back within its window: its segment evicts too early. Move ln(theta) accordingly."""
        e_prob, e_prot = self._exposure_prob, self._exposure_prot
        own = e_prot if protected else e_prob
        if own <= 0.0:
            return
        # Scaled by the segment's share of the exposure, so that the two kinds of hit balance where they are
        # equally frequent per second of window, not where they are equally many.
        step = min(_MAX_STEP, self.adapt_rate * (e_prob + e_prot) / (2.0 * own))
        if protected:
            self._log_theta = max(_LOG_THETA_MIN, self._log_theta - step)
        else:
            self._log_theta = min(_LOG_THETA_MAX, self._log_theta + step)
        self._theta = min(1.0, math.exp(self._log_theta))
