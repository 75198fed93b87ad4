"""Access profiles of keys: temporal, spatial (chain) and session scores in a fixed amount of memory.

Every key the engine sees read or written gets a profile slot. A slot is a row of small fixed-width arrays (no
Python object per key), so a profile costs the same few bytes whatever the key, and the table never grows past
``max_keys`` slots: when it is full, a CLOCK hand reuses the slot of a key not referenced since the hand last
passed (the profiles of keys long gone age out first).

What a profile holds, and the score it gives:

* **temporal**: the last access, both as monotonic time and as an access number (``tick_at``: the table counts
  every access it records, ``tick``), and an exponentially decayed access count (``heat``) whose half-life is
  counted in accesses, not seconds: ``half_life`` times the number of keys DRAM holds (``horizon``), so the
  score means the same at 300 and at 30,000 reads a second and scales with the memory it competes for; and the
  moving average of the accesses between its uses (``ival``), from which its next use is expected
  (:meth:`AccessProfiles.reuse_distance`: what a prefetch compares before displacing it);
* **spatial**: the key's successor in its chunk chain (``next``), learned from the order in which one client
  stream touches keys (a chain is stored and read chunk after chunk), and how often a read of the key was
  followed by a read of that successor (``cont``) or not (``stop``). Its score is the probability that reading
  the key leads to reading its successor. A key whose successor changes (a shared system prompt's last chunk,
  followed by every conversation that uses it) is a **branch** and predicts nothing;
* **session**: a link created where a stream stopped reading and started writing (a **boundary**: the end of a
  turn's cached prefix, where its new chunks begin) is crossed only when that conversation comes back. Whether
  a returning session reads past its last boundary is learned across all boundaries (the session score) and is
  the prior of every boundary link not tested yet; interior links have their own prior.

Nothing here moves data or knows about tiers; :mod:`kvstrata.engine.predict` walks these links to choose
prefetches. Wall times come from the injected clock (``monotonic`` seconds) and are only ever compared as ratios
(chain-aware demotion); every window that decides something is counted in accesses.

Chunk keys chain (a chunk's key hashes its parent's), so every key has exactly one predecessor: the table
keeps it (``pred``), and a link that would give a key a second predecessor (two conversations interleaved on one
connection) is not learned.
"""

from __future__ import annotations

import math
from array import array

from kvstrata.clock import Clock

BRANCH = 1
"""The key has been followed by more than one successor: its next chunk is not predictable from it."""
BOUNDARY = 2
"""The link to ``next`` was made by a write after a read: the end of a cached prefix, crossed only by a return."""
PRIOR_WEIGHT = 2.0
"""How many observations a class prior is worth against a link's own counts."""
HEAD = 4
"""The key follows a branch: the first chunk of its own context after a shared prefix (a conversation's head)."""
COUNT_MAX = 0xFFFF
_LN2 = math.log(2.0)


class ClassStats:
    """Continuations and stops observed over all non-branch links of one class (interior or boundary)."""

    __slots__ = ("cont", "stop", "prior_cont", "prior_stop")

    def __init__(self, prior_cont: float = 1.0, prior_stop: float = 1.0) -> None:
        self.cont = 0
        self.stop = 0
        self.prior_cont = prior_cont
        self.prior_stop = prior_stop

    @property
    def prior(self) -> float:
        """Estimate of P(a read of such a key is followed by a read of its successor), from pseudo-counts."""
        return (self.cont + self.prior_cont) / (self.cont + self.stop + self.prior_cont + self.prior_stop)


class AccessProfiles:
    """Fixed-size table of key profiles (see the module docstring)."""

    def __init__(self, clock: Clock, *, max_keys: int = 262_144, half_life: float = 1.0) -> None:
        if max_keys < 2:
            raise ValueError("max_keys must be at least 2")
        self.clock = clock
        self.max_keys = max_keys
        self.half_life = half_life
        # Accesses per half-life of ``heat``: the predictor sets it from the keys DRAM holds (half_life x that).
        self.horizon = max(1.0, half_life * 4096)
        self.tick = 0
        self.slots: dict[bytes, int] = {}
        self.keys: list[bytes | None] = [None] * max_keys
        # Each slot's key family (the predictor's lane: see predict.family), found on the key's first access.
        self.family: list[bytes | None] = [None] * max_keys
        self.last = array("d", bytes(8 * max_keys))
        self.tick_at = array("q", bytes(8 * max_keys))
        self.pred = array("i", [-1]) * max_keys
        self.pred_gen = array("I", bytes(4 * max_keys))
        self.heat = array("f", bytes(4 * max_keys))
        self.ival = array("f", bytes(4 * max_keys))
        self.next = array("i", [-1]) * max_keys
        self.next_gen = array("I", bytes(4 * max_keys))
        self.gen = array("I", bytes(4 * max_keys))
        self.cont = array("H", bytes(2 * max_keys))
        self.stop = array("H", bytes(2 * max_keys))
        self.flags = array("B", bytes(max_keys))
        self.ref = array("B", bytes(max_keys))
        self._free = list(range(max_keys - 1, -1, -1))
        self._hand = 0
        # A chain is read as a prefix, so a reader stops only where its cached prefix ends: interior links start
        # out likely (3:1) and boundary links even (1:1) until the traffic says otherwise.
        self.interior = ClassStats(3.0, 1.0)
        self.boundary = ClassStats(1.0, 1.0)
        self.aged_out = 0

    def __len__(self) -> int:
        return len(self.slots)

    def __contains__(self, key: object) -> bool:
        return key in self.slots

    # ---- slots ----
    def slot(self, key: bytes) -> int:
        """The key's slot, allocating one (possibly aging another key out) when it has none."""
        s = self.slots.get(key)
        if s is not None:
            return s
        s = self._free.pop() if self._free else self._reclaim()
        self.slots[key] = s
        self.keys[s] = key
        self.family[s] = None
        self.gen[s] = (self.gen[s] + 1) & 0xFFFFFFFF
        self.last[s] = 0.0
        self.tick_at[s] = 0
        self.heat[s] = 0.0
        self.ival[s] = 0.0
        self.next[s] = -1
        self.pred[s] = -1
        self.cont[s] = 0
        self.stop[s] = 0
        self.flags[s] = 0
        self.ref[s] = 1
        return s

    def _reclaim(self) -> int:
        """CLOCK: the first slot not referenced since the hand last passed it (a second chance each)."""
        ref = self.ref
        n = self.max_keys
        hand = self._hand
        while ref[hand]:
            ref[hand] = 0
            hand = (hand + 1) % n
        self._hand = (hand + 1) % n
        old = self.keys[hand]
        if old is not None:
            del self.slots[old]
            self.keys[hand] = None
            self.aged_out += 1
        return hand

    # ---- observations ----
    def touch(self, s: int, now: float) -> int:
        """Record an access of slot ``s`` at ``now``; returns the accesses since its previous one (-1 if none)."""
        self.tick = tick = self.tick + 1
        at = self.tick_at[s]
        h = self.heat[s]
        if at:
            g = tick - at
            if h:
                h *= 0.5 ** (g / self.horizon)
            iv = self.ival[s]
            self.ival[s] = g if not iv else iv + (g - iv) * 0.25
        self.heat[s] = h + 1.0
        self.tick_at[s] = tick
        self.last[s] = now if now > 0.0 else 1e-9
        self.ref[s] = 1
        return tick - at if at else -1

    def predecessor(self, s: int) -> int:
        """The slot of the key ``s`` was learned to follow, or -1 (none, or its profile aged out since)."""
        q = self.pred[s]
        if q < 0 or self.gen[q] != self.pred_gen[s]:
            return -1
        return q

    def successor(self, s: int) -> int:
        """The slot of ``s``'s next chunk, or -1 (none, or its profile aged out since)."""
        n = self.next[s]
        if n < 0 or self.gen[n] != self.next_gen[s]:
            return -1
        return n

    def link(self, s: int, n: int) -> bool:
        """Learn that ``n`` followed ``s`` in a stream; a different successor than before makes ``s`` a branch.

        Not learned (False) when ``n`` already follows another key: a chained key has one parent, so the other
        key is a different conversation's chunk seen in between (interleaved streams), not ``n``'s parent.
        """
        if n == s:
            return False
        q = self.predecessor(n)
        if q >= 0 and q != s:
            return False
        current = self.successor(s)
        if current >= 0 and current != n:
            self.flags[s] |= BRANCH
            self.flags[current] |= HEAD
        if self.flags[s] & BRANCH:
            self.flags[n] |= HEAD
        self.next[s] = n
        self.next_gen[s] = self.gen[n]
        self.pred[n] = s
        self.pred_gen[n] = self.gen[s]
        return True

    def outcome(self, s: int, continued: bool) -> None:
        """A read of ``s`` (which had a successor) was, or was not, followed by a read of that successor."""
        flags = self.flags[s]
        if continued:
            if self.cont[s] < COUNT_MAX:
                self.cont[s] += 1
        elif self.stop[s] < COUNT_MAX:
            self.stop[s] += 1
        if not flags & BRANCH:
            cls = self.boundary if flags & BOUNDARY else self.interior
            if continued:
                cls.cont += 1
            else:
                cls.stop += 1

    # ---- scores ----
    def temporal(self, key: bytes) -> float:
        """Decayed access count of ``key`` now (0 for an unknown key)."""
        s = self.slots.get(key)
        if s is None or not self.tick_at[s]:
            return 0.0
        return float(self.heat[s]) * 0.5 ** ((self.tick - self.tick_at[s]) / self.horizon)

    def reuse_distance(self, s: int) -> float:
        """Accesses until slot ``s`` is expected to be used again, from its own history (inf if never used).

        At least the accesses since its last use (the longer a key has been idle, the longer it is expected to
        stay idle), and at least its usual interval (a moving average of the accesses between its uses; a key
        used once is given one half-life).
        """
        at = self.tick_at[s]
        if not at:
            return float("inf")
        iv = self.ival[s]
        return float(max(self.tick - at, iv if iv else self.horizon / _LN2))

    def last_access(self, key: bytes) -> float:
        """Monotonic time of the key's last access (0.0 if unknown)."""
        s = self.slots.get(key)
        return self.last[s] if s is not None else 0.0

    def link_score(self, s: int) -> float:
        """P(a read of ``s`` is followed by a read of its successor): its own counts, weighted with its class."""
        flags = self.flags[s]
        if flags & BRANCH:
            return 0.0
        prior = (self.boundary if flags & BOUNDARY else self.interior).prior
        return (self.cont[s] + PRIOR_WEIGHT * prior) / (self.cont[s] + self.stop[s] + PRIOR_WEIGHT)

    def spatial(self, key: bytes) -> float:
        """The spatial score of ``key``: the probability its known next chunk is read right after it."""
        s = self.slots.get(key)
        if s is None or self.successor(s) < 0:
            return 0.0
        return self.link_score(s)

    @property
    def session_score(self) -> float:
        """P(a returning session reads past the end of its previous turn), learned over all boundaries."""
        return self.boundary.prior

    def next_key(self, key: bytes) -> bytes | None:
        s = self.slots.get(key)
        if s is None:
            return None
        n = self.successor(s)
        return self.keys[n] if n >= 0 else None

    @staticmethod
    def bytes_per_key() -> int:
        """Array bytes of one slot (the dict entry and slot list add a fixed amount more; see the tests)."""
        return 8 + 8 + 4 + 4 + 4 + 4 + 4 + 4 + 4 + 2 + 2 + 1 + 1
