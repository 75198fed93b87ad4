"""The owner's-thread side of pool writes: the ``pending`` map (the newest state of each key until the writer
reports back), the ``index`` of what this node put in the pool, its byte budget, and queuing writes, deletes
(versioned tombstones) and budget evictions for the writer thread (``pool_writer``).

``index`` remembers key -> (version, charged bytes, pool expiry), oldest first. Over ``budget`` this node removes
its oldest records (only if the pool still holds the version it wrote: a newer record from another node is left
alone). Records also expire with the pool TTL; the index forgets them at the same time.

``PoolIndex`` is a mixin of ``PoolTier`` (pool.py), which owns the state.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Any

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.markers import Tombstone
from kvstrata.engine.tiers.pool_health import PoolUnavailableError
from kvstrata.engine.tiers.pool_record import HEADER_SIZE, RECORD_OVERHEAD
from kvstrata.engine.tiers.pool_writer import _CAS, _DEL_IF, _PUT, _TOMB, FAILED


class PoolIndex:
    """Pending writes, the index of this node's pool records and its budget (owner's thread)."""

    pending: dict[bytes, Entry | Tombstone]
    index: OrderedDict[bytes, tuple[int, int, int]]
    replay: dict[bytes, int]
    outcomes: dict[int, tuple[str, Any]]
    abandoned: set[int]

    def lookup_pending(self, key: bytes) -> tuple[bool, Entry | None]:
        found = self.pending.get(key)
        if found is None:
            return False, None
        return True, (None if found.__class__ is Tombstone else found)  # type: ignore[return-value]

    def likely(self, key: bytes) -> bool:
        """Read here first (above the SSD): a key this node put in the pool, its newest local version."""
        return key in self.index

    def holds(self, key: bytes, version: int) -> bool:
        """True when this node knows the pool holds ``version`` of ``key`` (written or being written by it)."""
        got = self.index.get(key)
        return got is not None and got[0] == version and got[2] > self._wall_ms()

    def wrote(self, key: bytes, version: int) -> bool:
        """True when ``version`` of ``key`` in the pool is this node's own write."""
        got = self.index.get(key)
        return got is not None and got[0] == version and got[1] > 0

    def _forget(self, key: bytes) -> None:
        got = self.index.pop(key, None)
        if got is not None and got[1]:
            self.used -= got[1]
            self.own -= 1

    def put(self, key: bytes, entry: Entry, *, track: bool = False, expected: int | None = None,
            fallback: int = 0) -> int:
        """Queue a write of ``entry`` to the pool; returns its sequence number, or 0 when it was skipped.

        ``expected``: a compare-and-set, decided in the pool against its version of the key (``fallback``, the
        local version, when the pool holds no record). ``track``: keep the outcome for ``take_outcome``.
        """
        if not self.usable(key):
            self.skipped_writes += 1
            self._forget(key)
            return 0
        now = self._wall_ms()
        px = self.ttl_ms
        if entry.expire_at:
            px = min(px, entry.expire_at - now)
            if px <= 0:
                return 0
        snap = Entry(entry.value, entry.version, entry.expire_at)
        self.replay.pop(key, None)  # a newer write supersedes a delete still to be replayed
        self.pending[key] = snap
        self._watchers.touched(key)
        self._forget(key)
        charged = len(self.prefix) + len(key) + len(entry.value) + HEADER_SIZE + RECORD_OVERHEAD
        self.index[key] = (entry.version, charged, now + px)
        self.used += charged
        self.own += 1
        if expected is None:
            op: tuple[Any, ...] = (_PUT, key, snap, (px, track))
        else:
            op = (_CAS, key, snap, (px, True, expected, fallback))
        seq = self._enqueue(op, len(entry.value))
        if self.used > self.budget:
            self._evict_over_budget(exclude=key)
        return seq

    def take_outcome(self, seq: int) -> tuple[str, Any]:
        """The outcome of tracked write ``seq`` (owner's thread); FAILED when none came (the pool went away)."""
        return self.outcomes.pop(seq, None) or (FAILED, self.degraded or "the pool did not answer")

    def abandon(self, seqs: list[int]) -> None:
        """Nobody will take the outcomes of these tracked writes (their command failed or its client went away):
        drop those already in, and have the writer drop the others when they come (``_outcome``), so that
        ``outcomes`` holds only what a command still waits for."""
        for seq in seqs:
            self.abandoned.add(seq)
            if self.outcomes.pop(seq, None) is not None:
                self.abandoned.discard(seq)

    def note(self, key: bytes, version: int) -> None:
        """Remember that the pool holds ``version`` of ``key`` (read from it, written by another node), so a
        demotion does not write it again. Charged 0 bytes: it is not this node's record."""
        got = self.index.get(key)
        if got is None or got[0] < version:
            self._forget(key)
            self.index[key] = (version, 0, self._wall_ms() + self.ttl_ms)

    def delete(self, key: bytes, version: int = 0, *, track: bool = False) -> int:
        """Queue a tombstone of ``key`` at ``version`` (the delete's own version: it hides every older record and
        refuses every older write for ``tombstone_ttl_ms``). Raises PoolUnavailableError when degraded: a delete
        is never dropped."""
        down = self.down_reason(key)
        if down is not None:
            raise PoolUnavailableError(f"the pool is unavailable ({down}); deletes need it")
        self._forget(key)
        self.replay.pop(key, None)
        tomb = Tombstone()
        self.pending[key] = tomb
        self._watchers.touched(key)
        return self._enqueue((_TOMB, key, tomb, (version, track, 0, 0)))

    def _evict_over_budget(self, exclude: bytes | None = None) -> None:
        for key in list(self.index):
            if self.used <= self.budget:
                break
            if key == exclude:
                continue
            version, charged, _exp = self.index[key]
            self._forget(key)
            if not charged:
                continue  # another node's record: only forgotten
            self.evictions += 1
            if key not in self.pending:
                self._enqueue((_DEL_IF, key, None, version))

    def expire_index(self) -> int:
        """Forget records whose pool TTL has passed (the pool has dropped them itself); replay deletes."""
        self.replay_deletes()
        now = self._wall_ms()
        done = 0
        # The first 4096 only (listed, since _forget changes the dict): never a copy of the whole index.
        for key, (_v, _c, exp) in list(itertools.islice(self.index.items(), 4096)):
            if exp <= now and key not in self.pending:
                self._forget(key)
                self.expired += 1
                done += 1
        return done

    def replay_deletes(self) -> int:
        """Send again the tombstones the pool did not take (owner's thread, while the pool is active)."""
        if not self.replay or not self.active:
            return 0
        todo, self.replay = self.replay, {}
        for key, version in todo.items():
            if not self.usable(key):
                self.replay[key] = version  # its master is still degraded: replayed once it answers
                continue
            tomb = self.pending.get(key)
            if tomb.__class__ is Tombstone:
                self.replayed += 1
                self._enqueue((_TOMB, key, tomb, (version, False, 0, 0)))
        return len(todo)

    def flush(self, version: int) -> int:
        """FLUSHALL: a tombstone at ``version`` for every key this node knows in the pool (written or read here);
        the other nodes drop their copies when the invalidations arrive. Keys this node never saw stay."""
        last = 0
        for key in list(self.index):
            last = self.delete(key, version) or last
        return last
