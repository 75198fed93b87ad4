"""LRU-K in flat arrays (``lru-k-compact``): the registry's ``lru-k`` decisions with no Python object per key.

The ranking, its adaptive ``theta``, the CRP and the ghost evidence are exactly ``LRUKPolicy``'s (``lru_k.py``
explains them): for the same calls both offer the same victims in the same order, with the same ``theta``, and
score the same hits (tests/unit/test_policy_lru_k_compact.py replays scripts and the bench traces through
both). Only the storage differs. ``lru-k`` keeps a resident key in an ``OrderedDict`` entry whose value is an
int object (~124 B per key with the dict), and its ghosts in a ``GhostFifo`` (~60 B per ghost); here:

* every resident key has a **slot**, a small integer from a free list, valid while the key is resident (reused
  after it leaves); per slot: the key reference (a list), the time of the last reference (``array('Q')``), the
  reference count capped at K (``array('B')``; K means proven, i.e. the protected segment) and ``prev``/``next``
  links (``array('I')``) of two circular doubly linked lists, probation and protected, each in order of last
  reference, with slots 0 and 1 as their sentinels. Free slots are chained through ``next``;
* a key finds its slot through an open-addressing table of slot numbers (``array('I')``, linear probing from
  ``hash(key)`` modulo the table's size, backward-shift deletion, load between 1/2 and 3/4): bytes keys cache
  their hash, so a lookup is usually one probe and one key comparison. The slot lives in the policy, not on the
  store's entry: an int attribute per entry would be an int object (32 B) plus the attribute (8 B), more than
  the table, and the policy protocol (keys in, keys out) would have to change for every caller;
* ghosts (keys that left, with their window end and count) are a ``GhostRing`` (``_ghost_ring.py``): the same
  64-bit fingerprints and FIFO semantics as ``lru-k``'s ``GhostFifo`` (so even a fingerprint collision leads to
  the same decision), in a ring sized to its contents with a 32-bit table. The time of a ghost's last reference
  is kept only when the CRP is above 0 (with CRP 0 every return is uncorrelated: times strictly increase).

Memory, measured by ``kvstrata bench hitrate`` (``memory_per_key``: as many ghosts as tracked keys, bytes the
policy holds per tracked key, growth slack included): about 27 B of slot arrays and 5.3-8 B of table per
resident key, 17 B of ring (+1/8 slack at most) and 5.3-8 B of table per ghost: 55-63 B per tracked key
(BENCHMARKS.md, "Eviction: LRU-K in flat arrays"). The price is CPU: a touch of a proven key (a DRAM hit) is a
table probe, a store of the time and a move to the tail of its list, a dozen Python-level array operations
against ``lru-k``'s two C-level ``OrderedDict`` calls: ~1 us on a quiet machine, ~4x ``lru-k``. That is why it
is an option (a DRAM tier of many small values) and not the server's default.

Time is the policy's own call count (ticked exactly where ``lru-k`` ticks it), never a clock, so the ranking is
the same at any request rate; times are exact 64-bit ints.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator

from kvstrata.engine.policy._ghost_ring import U64, GhostRing, table_size
from kvstrata.engine.policy._ghosts import fingerprint
from kvstrata.engine.policy.lru_k import (
    _LOG_THETA_MAX,
    _LOG_THETA_MIN,
    _MAX_STEP,
    DEFAULT_ADAPT_RATE,
    DEFAULT_RETAINED,
)

_PROBATION = 0  # sentinel slot of the probation list
_PROTECTED = 1  # sentinel slot of the protected list
_FIRST_SLOT = 2
_MAX_K = 255  # counts are one byte


class CompactLRUKPolicy:
    """LRU-K (see ``lru_k.LRUKPolicy``) over slot-indexed flat arrays; see the module docstring."""

    __slots__ = (
        "_exposure_prob",
        "_exposure_prot",
        "_free",
        "_ghosts",
        "_index",
        "_keys",
        "_last",
        "_log_theta",
        "_n_prob",
        "_n_prot",
        "_next",
        "_offered",
        "_prev",
        "_refs",
        "_size",
        "_theta",
        "_tick",
        "adapt_rate",
        "crp",
        "k",
        "retained",
    )
    name = "lru-k-compact"

    def __init__(
        self,
        k: int = 2,
        crp: float = 0.0,
        retained: int = DEFAULT_RETAINED,
        *,
        adapt_rate: float = DEFAULT_ADAPT_RATE,
    ) -> None:
        if not 1 <= k <= _MAX_K:
            raise ValueError(f"LRU-K needs 1 <= K <= {_MAX_K} in flat arrays")
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
        self._tick = 0  # the policy's clock: its call count, ticked where lru-k ticks (itertools.count from 0)
        self._offered: set[bytes] = set()
        self._reset()

    def _reset(self) -> None:
        self._keys: list[bytes | None] = [None, None]
        self._last = array("Q", [0, 0])
        self._refs = array("B", [0, 0])
        self._prev = array("I", [_PROBATION, _PROTECTED])  # two empty circular lists
        self._next = array("I", [_PROBATION, _PROTECTED])
        self._free = 0  # head of the free-slot chain (through _next); 0: none
        self._index = array("I", bytes(4 * 16))  # slot number, 0 = empty
        self._size = 16
        self._n_prob = self._n_prot = 0
        self._ghosts = GhostRing(with_last=self.crp > 0)
        self._log_theta = _LOG_THETA_MAX
        self._theta = 1.0
        self._exposure_prob = 0.0
        self._exposure_prot = 0.0
        self._offered.clear()

    # ---- state, for INFO and tests ----
    @property
    def theta(self) -> float:
        """The probation head is evicted first when idle at least ``theta`` times the protected head (<= 1)."""
        return self._theta

    @property
    def log_theta(self) -> float:
        return self._log_theta

    def segment_sizes(self) -> tuple[int, int, int]:
        """(probation, protected, ghosts) key counts."""
        return self._n_prob, self._n_prot, self._ghosts.count

    def slot_capacity(self) -> int:
        """Slots ever allocated (free ones included): the peak number of keys tracked at once."""
        return len(self._keys) - _FIRST_SLOT

    def slot_of(self, key: object) -> int:
        """The key's slot (>= 2) while it is tracked, else 0."""
        index, keys, size = self._index, self._keys, self._size
        i = hash(key) % size
        s = index[i]
        while s and keys[s] != key:
            i += 1
            if i == size:
                i = 0
            s = index[i]
        return s

    def nbytes(self) -> int:
        """Bytes of the arrays' items and the key list's references (capacity, not just what is in use)."""
        arrays = (self._last, self._refs, self._prev, self._next, self._index)
        return sum(a.itemsize * len(a) for a in arrays) + 8 * len(self._keys) + self._ghosts.nbytes()

    # ---- the policy protocol ----
    def touch(self, key: bytes) -> None:
        index, keys, size = self._index, self._keys, self._size
        i = hash(key) % size
        s = index[i]
        while s and keys[s] != key:
            i += 1
            if i == size:
                i = 0
            s = index[i]
        if not s:
            self.admit(key)
            return
        now = self._tick
        self._tick = now + 1
        if self._refs[s] != self.k:
            self._touch_probation(s, now)
            return
        # The common hit: a proven key becomes the most recent one (1 is the protected list's sentinel; literals
        # and single loads because this is the server's hot path).
        self._last[s] = now
        nxt = self._next
        n = nxt[s]
        if n != 1:
            prev = self._prev
            p = prev[s]
            nxt[p] = n
            prev[n] = p
            t = prev[1]
            nxt[t] = s
            prev[s] = t
            nxt[s] = 1
            prev[1] = s

    def _touch_probation(self, s: int, now: int) -> None:
        refs, last, prev, nxt = self._refs, self._last, self._prev, self._next
        tail = _PROBATION
        if now - last[s] > self.crp:
            count = refs[s] + 1
            refs[s] = count
            if count >= self.k:  # proven: from the probation list to the protected one
                self._n_prob -= 1
                self._n_prot += 1
                tail = _PROTECTED
        last[s] = now
        n = nxt[s]
        if n != tail:  # not the most recent key of its list yet
            p = prev[s]
            nxt[p] = n
            prev[n] = p
            t = prev[tail]
            nxt[t] = s
            prev[s] = t
            nxt[s] = tail
            prev[tail] = s

    def admit(self, key: bytes) -> None:
        index, keys, size = self._index, self._keys, self._size
        i = hash(key) % size
        s = index[i]
        while s and keys[s] != key:
            i += 1
            if i == size:
                i = 0
            s = index[i]
        if s:
            self.touch(key)
            return
        now = self._tick
        self._tick = now + 1
        ghosts = self._ghosts
        pos = ghosts.take(fingerprint(key) & U64) if ghosts.count else -1
        if pos < 0:
            self._insert(key, now, 1, i)
            return
        until, count = ghosts.until[pos], ghosts.refs[pos]
        proven = count >= self.k
        if now < until:
            self._adapt(protected=proven)
        # With CRP 0 every return is uncorrelated (times strictly increase), so no ghost keeps its last time.
        if not proven and (not ghosts.with_last or now - ghosts.last[pos] > self.crp):
            count += 1
            proven = count >= self.k
        self._insert(key, now, self.k if proven else count, i)

    def _insert(self, key: bytes, now: int, count: int, i: int) -> None:
        """Give ``key`` a slot at the tail of its list (protected when ``count`` is K) and index it at ``i``, the
        empty table slot that ended its lookup (found again if the table grows)."""
        tracked = self._n_prob + self._n_prot + 1
        if 4 * tracked > 3 * self._size:
            self._reindex(table_size(tracked))
            i = -1
        keys, last, refs, prev, nxt = self._keys, self._last, self._refs, self._prev, self._next
        s = self._free
        if s:
            self._free = nxt[s]
            keys[s] = key
            last[s] = now
            refs[s] = count
        else:
            s = len(keys)
            keys.append(key)
            last.append(now)
            refs.append(count)
            prev.append(0)
            nxt.append(0)
        if count >= self.k:
            tail = _PROTECTED
            self._n_prot += 1
        else:
            tail = _PROBATION
            self._n_prob += 1
        t = prev[tail]
        nxt[t] = s
        prev[s] = t
        nxt[s] = tail
        prev[tail] = s
        index = self._index
        if i < 0:
            size = self._size
            i = hash(key) % size
            while index[i]:
                i += 1
                if i == size:
                    i = 0
        index[i] = s

    def _reindex(self, size: int) -> None:
        index = array("I", bytes(4 * size))
        for s, key in enumerate(self._keys):
            if key is not None:
                i = hash(key) % size
                while index[i]:
                    i += 1
                    if i == size:
                        i = 0
                index[i] = s
        self._index, self._size = index, size

    def remove(self, key: bytes) -> None:
        index, keys, size = self._index, self._keys, self._size
        i = hash(key) % size
        s = index[i]
        while s and keys[s] != key:
            i += 1
            if i == size:
                i = 0
            s = index[i]
        if not s:
            return
        # Backward-shift deletion, as in GhostRing.take: no tombstones, so lookups stay short.
        j = i
        while True:
            j += 1
            if j == size:
                j = 0
            w = index[j]
            if not w:
                break
            h = hash(keys[w]) % size
            if (i < j and (h <= i or h > j)) or (i > j and h <= i and h > j):
                index[i] = w
                i = j
        index[i] = 0
        prev, nxt = self._prev, self._next
        p, n = prev[s], nxt[s]
        nxt[p] = n
        prev[n] = p
        last = self._last[s]
        count = self._refs[s]
        from_protected = count >= self.k
        if from_protected:
            self._n_prot -= 1
        else:
            self._n_prob -= 1
        keys[s] = None
        self._refs[s] = 0
        nxt[s] = self._free
        self._free = s
        tracked = self._n_prob + self._n_prot
        offered = self._offered
        if key in offered:
            # An eviction: until twice its idle time has passed, a return is evidence about its segment.
            offered.discard(key)
            now = self._tick
            self._tick = now + 1
            window = now - last
            if window < 0:
                window = 0
            until = now + window
            decay = 1.0 - 1.0 / (tracked + 1)  # forget over about one turnover of the tracked keys
            if from_protected:
                self._exposure_prob *= decay
                self._exposure_prot = self._exposure_prot * decay + window
            else:
                self._exposure_prob = self._exposure_prob * decay + window
                self._exposure_prot *= decay
        else:
            until = 0  # never evidence: now < 0 never holds (as -inf in lru-k)
        ghosts = self._ghosts
        ghosts.add(fingerprint(key) & U64, until, count, last)
        if ghosts.count > tracked or ghosts.count > self.retained:
            bound = min(self.retained, tracked)
            while ghosts.count > bound:
                ghosts.popleft()

    def victim(self) -> bytes | None:
        nxt = self._next
        if not self._n_prob:
            key = self._keys[nxt[_PROTECTED]] if self._n_prot else None
        elif not self._n_prot:
            key = self._keys[nxt[_PROBATION]]
        else:
            s1, s2 = nxt[_PROBATION], nxt[_PROTECTED]
            now = self._tick
            self._tick = now + 1
            last = self._last
            key = self._keys[s1 if self._probation_first(now - last[s1], now - last[s2]) else s2]
        offered = self._offered
        offered.clear()
        if key is not None:
            offered.add(key)
        return key

    def victims(self) -> Iterator[bytes]:
        """Tracked keys from the lowest rank up: the two lists merged by the rule of :meth:`victim`. Lazy, O(1)
        per key; the ranking is taken at the first key, and the caller must not change the policy meanwhile."""
        offered = self._offered
        offered.clear()
        keys, last, nxt = self._keys, self._last, self._next
        s1, s2 = nxt[_PROBATION], nxt[_PROTECTED]
        now = self._tick
        self._tick = now + 1
        while s1 != _PROBATION and s2 != _PROTECTED:
            if self._probation_first(now - last[s1], now - last[s2]):
                s, s1 = s1, nxt[s1]
            else:
                s, s2 = s2, nxt[s2]
            key = keys[s]
            offered.add(key)  # type: ignore[arg-type]
            yield key  # type: ignore[misc]
        s, end = (s1, _PROBATION) if s1 != _PROBATION else (s2, _PROTECTED)
        while s != end:
            key = keys[s]
            offered.add(key)  # type: ignore[arg-type]
            yield key  # type: ignore[misc]
            s = nxt[s]

    def _probation_first(self, idle1: int, idle2: int) -> bool:
        """Whether the probation head (idle for ``idle1`` accesses) goes before the protected head (``idle2``)."""
        crp = self.crp
        if (idle1 > crp) != (idle2 > crp):  # exactly one head is outside the CRP: only it is evictable
            return idle1 > crp
        return idle1 >= self._theta * idle2

    def references(self, key: bytes) -> int:
        """How many uncorrelated references are remembered for a key (resident or retained), at most K."""
        s = self.slot_of(key)
        if s:
            return self._refs[s]
        pos = self._ghosts.find(fingerprint(key) & U64)
        return 0 if pos < 0 else min(self._ghosts.refs[pos], self.k)

    def __len__(self) -> int:
        return self._n_prob + self._n_prot

    def __contains__(self, key: object) -> bool:
        return self.slot_of(key) != 0

    def clear(self) -> None:
        self._reset()

    # ---- adaptation (as LRUKPolicy._adapt) ----
    def _adapt(self, *, protected: bool) -> None:
        """A ghost came back within its window: its segment evicts too early. Move ln(theta) accordingly."""
        e_prob, e_prot = self._exposure_prob, self._exposure_prot
        own = e_prot if protected else e_prob
        if own <= 0.0:
            return
        step = min(_MAX_STEP, self.adapt_rate * (e_prob + e_prot) / (2.0 * own))
        if protected:
            self._log_theta = max(_LOG_THETA_MIN, self._log_theta - step)
        else:
            self._log_theta = min(_LOG_THETA_MAX, self._log_theta + step)
        self._theta = min(1.0, math.exp(self._log_theta))
