"""The engine facade: one keyspace over stacked tiers (DRAM, then an ordered list of lower tiers: the SSD, the
shared pool, any registered tier), with TTL, versions, pins and policy.

Everything here is synchronous. The server runs it on its event loop and keeps disk reads off that loop by
loading the keys a command needs beforehand (``missing``/``begin_load``/``finish_load``); any key it did not
load is read synchronously, so correctness never depends on that optimisation.

Invariants:
- the DRAM tier never holds more than its budget: room is made before an entry goes in, by demoting the
  lowest-ranked unpinned entries to the next tier (or dropping them when DRAM is the last tier);
- a key has one authoritative copy: DRAM if it is there, else the SSD tier (``pending`` first, then LMDB);
  under write-through the SSD also keeps a durable copy of DRAM entries (``Entry.on_ssd``);
- an expired entry is never returned, whichever tier holds it;
- the pool (``kvstrata.engine.tiers.pool``) only ever holds copies: it is read off the loop by the loader, and a
  pool hit is promoted into DRAM (replacing an older local copy: the highest version wins).

The lower tiers are ``self.lower``, in ``tier-order``; lookups, demotion, deletes, listing, expiry and INFO walk
that list by each tier's declared role (``tiers/base.py``). ``self.ssd`` and ``self.pool`` name the two built-in
tiers only where a duty is theirs alone (write-through and checkpoints; versions and invalidation in the pool).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvstrata.clock import Clock, SystemClock
from kvstrata.engine.admission import Admission
from kvstrata.engine.command_state import CommandState, CommandStateMixin
from kvstrata.engine.entry import ENTRY_OVERHEAD, Entry, Meta, Value
from kvstrata.engine.expiry import ExpiryMixin
from kvstrata.engine.invalidation import InvalidationMixin
from kvstrata.engine.listing import ListingMixin
from kvstrata.engine.loader import CopyHit, LoaderMixin, LoadTicket, PoolHit
from kvstrata.engine.pins import PinsMixin
from kvstrata.engine.placement import PlacementMixin
from kvstrata.engine.policy import EvictionPolicy, create_policy
from kvstrata.engine.predict import Predictor
from kvstrata.engine.prefetching import LATE, PrefetchMixin
from kvstrata.engine.stats import EngineStats, TierStats
from kvstrata.engine.tiers.base import LowerTier
from kvstrata.engine.tiers.dram import DramTier
from kvstrata.engine.tiers.pool import PoolTier, PoolUnavailableError
from kvstrata.engine.tiers.ssd import SsdTier
from kvstrata.engine.versions import HLC_LOGICAL_BITS, NODE_BITS, VERSION_BLOCK, VersionsMixin
from kvstrata.errors import OutOfMemoryError, VersionMismatchError

# Keys remembered as evicted from the SSD while not in DRAM: a load's record promoted after its key's eviction comes
# up as a dirty entry (its next demotion writes it). The window is a load's, ms to a prefetch batch's seconds.
EVICTED_BELOW_MAX = 65536

# Re-exported: the server and the tests import these from here.
__all__ = ["HLC_LOGICAL_BITS", "LATE", "NODE_BITS", "VERSION_BLOCK", "CopyHit", "LoadTicket", "PoolHit", "Store"]


def _ordered(ssd: SsdTier | None, pool: PoolTier | None, tier_order: str) -> list[LowerTier]:
    """The stack from the two built-in tiers and a tier-order (callers that pass tiers one by one)."""
    given: dict[str, LowerTier] = {t.name: t for t in (ssd, pool) if t is not None}
    names = [n.strip() for n in tier_order.split(",")[1:]]
    return [given[n] for n in names if n in given] + [t for n, t in given.items() if n not in names]


class Store(VersionsMixin, LoaderMixin, PlacementMixin, PrefetchMixin, ExpiryMixin, ListingMixin, PinsMixin,
            InvalidationMixin, CommandStateMixin):
    """The engine: DRAM and the tiers below it, one keyspace. Each concern lives in its own module (versions,
    loader, placement, prefetching, expiry, listing, pins, invalidation); this class holds the state they share and the
    command-facing reads and writes."""

    def __init__(
        self,
        dram_budget: int,
        *,
        policy: EvictionPolicy | None = None,
        clock: Clock | None = None,
        ssd: SsdTier | None = None,
        durability: str = "write-back",
        noeviction: bool = False,
        promote_hits: int = 2,
        promote_window: float = 60.0,
        hot_max_fraction: float = 0.5,
        entry_overhead: int = ENTRY_OVERHEAD,
        pool: PoolTier | None = None,
        tier_order: str = "dram,pool,ssd",
        lower: Sequence[LowerTier] | None = None,
        node_id: int = 0,
        predictor: Predictor | None = None,
        chain_evict: bool = False,
        head_keep: float = 2.0,
        prefetch_protect: float = 1.0,
        profile_min_bytes: int = 0,
    ) -> None:
        self.clock = clock or SystemClock()
        self.dram = DramTier(dram_budget, entry_overhead)
        self.policy = policy if policy is not None else create_policy("lru", clock=self.clock)
        # Admission (a policy with ``admits``, e.g. ScanGuard): a refused new key is written past a full DRAM.
        self._admits = getattr(self.policy, "admits", None)
        # The tiers below DRAM, fastest first (tier-order); built by the registry or from ssd=/pool=.
        self.lower: list[LowerTier] = list(lower) if lower is not None else _ordered(ssd, pool, tier_order)
        self._by_name: dict[str, LowerTier] = {t.name: t for t in self.lower}
        # The one tier that may hold a key's only copy (the SSD), if any; the tiers holding copies above it (or
        # all of them without it) get a copy on demotion; unshared ones drop theirs when a client writes.
        self.keeper: LowerTier | None = next((t for t in self.lower if t.authoritative), None)
        above = self.lower.index(self.keeper) if self.keeper is not None else len(self.lower)
        self._copies_above = [t for t in self.lower[:above] if not t.authoritative]
        self._private = [t for t in self.lower if not t.authoritative and not t.shared]
        self._loaded_tiers = [t for t in self.lower if not t.in_process]
        self._listed = [t for t in self.lower if t.authoritative]
        ssd = next((t for t in self.lower if isinstance(t, SsdTier)), None)
        pool = next((t for t in self.lower if isinstance(t, PoolTier)), None)
        self.ssd = ssd
        self.write_through = durability == "write-through" and ssd is not None
        # Whether a key keeps its SSD copy once it has one: a promotion leaves the record as the entry's clean copy
        # and a write to such a key is written to the SSD too (queued, not waited for under write-back). Always under
        # write-through; under write-back once saves are asked for (save points, SAVE, BGSAVE:
        # kvstrata.server.saves), so that what a save wrote stays saved. Otherwise the tiers are exclusive.
        self.keep_below = self.write_through
        self.noeviction = noeviction
        self.admission = Admission(promote_hits, promote_window)
        self.hot_max_fraction = hot_max_fraction
        self.hot: dict[bytes, int] = {}
        self.stats = EngineStats()
        # (event, key) for keys that expired or that the last tier evicted: the server's keyspace
        # notifications (server/notify.py); may be called from a loader or writer thread.
        self.on_event: Callable[[bytes, bytes], None] | None = None
        # A key changed (written, deleted, its expiry changed, invalidated by the pool; None: a flush), on the
        # loop: client-side caching's invalidations (server/tracking.py). None while no client tracks.
        self.on_modified: Callable[[bytes | None], None] | None = None
        # A counted read missed the key (keyspace notifications' keymiss, class m), a write created one (new, class
        # n); None while nobody listens.
        self.on_miss: Callable[[bytes], None] | None = None
        self.on_new: Callable[[bytes], None] | None = None
        self.tier_stats = {name: TierStats() for name in ("dram", "ssd", "pool", *self._by_name)}
        self._dram_stats = self.tier_stats["dram"]
        # The DRAM dict is never replaced (only cleared), so the hot path may hold it directly.
        self._entries = self.dram.entries
        self._ttl_heap: list[tuple[int, bytes]] = []
        self._overlay: dict[bytes, Any] | None = None
        # Record headers probed for the current command (EXISTS, TYPE, TTL...: engine/loader.py ``probe``).
        self._probed: dict[bytes, Any] | None = None
        # The current command's stream and the completions its reply waits for (engine/command_state.py).
        self.command = CommandState()
        self.sync_reads = 0
        self.version = ssd.version_high_water if ssd is not None else 0
        if ssd is not None:
            ssd.on_commit = self._ssd_committed
        # Keys the SSD evicted while not in DRAM, most recent last (bounded; write-through only): a record of one
        # read before its eviction and promoted after it is no clean copy (_promote).
        self._evicted_below: dict[bytes, None] = {}
        # The shared pool (None without --pool): versions are decided there and invalidations come from it.
        self.pool = pool
        # Keys another node wrote since this node's copy (dropped): read from the pool next, not from LMDB.
        self.refetch: dict[bytes, int] = {}
        if pool is not None:
            pool.on_invalidate = self._invalidated_by_pool
            pool.on_refused = self.pool_refused
        self.node_id = node_id & ((1 << NODE_BITS) - 1)
        # Access profiles and prediction (docs/prefetch.md); None: no profiling (a DRAM-only server).
        self.predictor = predictor
        if predictor is not None:
            predictor.attach(self.dram.entries)  # what DRAM holds, read only (the walk's DRAM bound)
        # Smaller values are not profiled: a KV chunk is large, and profiling costs ~3 us per access.
        self.profile_min_bytes = profile_min_bytes
        # WATCH (commands/transactions.py): per watched key, how many clients watch it and a counter every write,
        # delete, expiry change or flush of it bumps, so that EXEC sees a key created and deleted again meanwhile.
        self.watch_epochs: dict[bytes, list[int]] = {}
        # Writes, deletes and expiry changes since the store was made (Redis's ``dirty``): save points compare it with
        # what the last save had seen (kvstrata.server.saves).
        self.changes = 0
        # Chain-aware demotion (needs the predictor's profiles): chain heads stay head_keep times longer.
        self.chain_evict = chain_evict and predictor is not None
        self.head_keep = head_keep
        # A prefetch displaces only keys expected to be used this many times later than it (docs/prefetch.md).
        self.prefetch_protect = prefetch_protect
        # Keys a prefetch brought up that nobody has read yet: monotonic landing time (LATE once a read waited).
        self.prefetched: dict[bytes, float] = {}

    def get(self, key: bytes, *, touch: bool = True, count: bool | None = None) -> Entry | None:
        """The key's entry from whichever tier holds it (None: absent or expired). ``touch``: a use of the key (its
        eviction rank, promotion, the predictor, the tiers' hit counts); ``count`` (default: ``touch``): a read
        Redis counts in keyspace_hits/misses (its lookupKeyRead; a write's lookup is not, an EXISTS is)."""
        if count is None:
            count = touch
        entry = self._entries.get(key)
        if entry is not None:
            if entry.expire_at and entry.expire_at <= self.clock.now_ms():
                self._expire_dram(key)
                if count:
                    self.count_read(key, False)
                return None
            if count:
                self.stats.keyspace_hits += 1
            if touch:
                self._dram_stats.hits += 1
                if not entry.pinned:
                    self.policy.touch(key)
                if self.prefetched and key in self.prefetched:
                    self._prefetch_used(key)
                if self.predictor is not None and len(entry.value) >= self.profile_min_bytes:
                    self.predictor.read(key, self.command.stream)
            return entry
        if touch:
            self._dram_stats.misses += 1
        entry, origin = self.lookup_below(key)
        if entry is None:
            if touch:
                for tier in self.lower:
                    self.tier_stats[tier.name].misses += 1
            if count:
                self.count_read(key, False)
            return None
        if count:
            self.stats.keyspace_hits += 1
        copy = not self._by_name[origin].authoritative
        if touch:
            if self.predictor is not None and len(entry.value) >= self.profile_min_bytes:
                self.predictor.read(key, self.command.stream)
            self.tier_stats[origin].hits += 1
            if copy:
                # A copy (fetched over the network, or from a cache tier): kept (no admission rule), replacing
                # any older local copy.
                self.adopt(key, entry, origin)
            elif self.admission.should_promote(key, self.clock.now_ms()) or self._hot_match(key):
                self._promote(key, entry)
        elif copy:
            # EXISTS, TYPE, a CAS check...: the record was read already, so it is kept here too.
            self.tier_stats[origin].hits += 1
            self.adopt(key, entry, origin)
        return entry

    def count_read(self, key: bytes, found: bool, notify: bool = True) -> None:
        """A read of ``key`` Redis counts in keyspace_hits or keyspace_misses; a miss also tells ``on_miss`` (the
        keymiss notification) unless ``notify`` is false (OBJECT's lookups, as Redis's)."""
        if found:
            self.stats.keyspace_hits += 1
            return
        self.stats.keyspace_misses += 1
        if notify and self.on_miss is not None:
            self.on_miss(key)

    def probe_counted(self, key: bytes, *, notify: bool = True) -> Entry | Meta | None:
        """``probe`` (the record's header) for a read Redis counts without touching the key: EXISTS, TTL, TYPE,
        OBJECT (its lookupKeyRead with LOOKUP_NOTOUCH)."""
        meta = self.probe(key)
        self.count_read(key, meta is not None, notify)
        return meta

    def tier_of(self, key: bytes) -> str | None:
        if key in self.dram.entries:
            return "dram" if self.get(key, touch=False) is not None else None
        entry, origin = self.lookup_below(key)
        return origin if entry is not None else None

    def put(
        self,
        key: bytes,
        value: Value,
        expire_at: int = 0,
        *,
        cold: bool = False,
        expected_version: int | None = None,
        recreate: bool = False,
    ) -> Entry:
        """Store a new value (replacing any old one in any tier) and give it a fresh version. ``recreate``: the
        key is deleted and added again whether it existed or not (RENAME, COPY, RESTORE), for class n."""
        # Keyspace notifications' class n: whether the key exists, looked up before anything changes (a header
        # below DRAM) and only while someone listens, as Redis warns the class costs.
        created = self.on_new is not None and (recreate or self.probe(key) is None)
        self.changes += 1
        if self.watch_epochs:
            self.touch_watched(key)
        if self.on_modified is not None:
            self.on_modified(key)
        if self.predictor is not None and len(value) >= self.profile_min_bytes:
            self.predictor.write(key, self.command.stream)
        pool = self.pool
        cas_fallback = 0
        if self.refetch:
            self.refetch.pop(key, None)
        if expected_version is not None:
            current = self.probe(key)  # its version only: a header, where the command probed (load="meta")
            have = current.version if current is not None else 0
            if pool is None:
                if have != expected_version:
                    raise VersionMismatchError(f"version mismatch: expected {expected_version}, current {have}")
            elif not pool.usable(key):
                raise PoolUnavailableError(f"the pool is unavailable ({pool.down_reason(key)}); VER needs it")
            else:
                # The pool decides (pool_scripts.CAS); the local copy may be older than the pool's.
                cas_fallback = have
                self.observe_version(expected_version)
        ssd = self.ssd
        if ssd is None and self.pool is None:
            self.version += 1
            entry = Entry(value, self.version, expire_at)
        else:
            entry = Entry(value, self.next_version(), expire_at)
        size = self.dram.charge(key, value)  # an arena value is charged its slot's class (docs/dataplane.md)
        dram = self.dram
        old = dram.entries.get(key)
        if ssd is not None:
            if size > ssd.budget:
                raise OutOfMemoryError("command not allowed: the value is larger than the SSD tier's budget.")
            if cold or size > dram.budget - dram.pinned_bytes or (
                old is None and self._admits is not None and dram.used + size > dram.budget
                and not self._admits(key)
            ):
                # Straight to SSD: asked for, it cannot fit in DRAM beside the pinned keys, or DRAM is full and
                # its admission refuses a key it has not seen (a one-off write would displace a used entry).
                self._check_last_tier_room(size)
                self._drop_dram(key)
                self._ack(ssd.put(key, entry))
                if pool is not None:
                    self.command.pool_ack = self._pool_put(key, entry, expected_version, cas_fallback)
                self._drop_copies(key)
                return entry
            stale_below = not self.write_through and (
                (old is not None and old.on_ssd) or (old is None and self.probe_below(key) is not None)
            )
            self._insert(key, entry, size, old)
            # Only once the new value is in: a write refused for room must not lose the old one.
            if stale_below:
                if self.keep_below:  # its saved copy is kept current, not dropped (see keep_below)
                    ssd.put(key, entry)
                    entry.on_ssd = True
                else:
                    ssd.delete(key)
        else:
            self._insert(key, entry, size, old)
        if self.write_through:
            assert ssd is not None
            self._ack(ssd.put(key, entry))
            entry.on_ssd = True
        if pool is not None:
            self.command.pool_ack = self._pool_put(key, entry, expected_version, cas_fallback)
        if self._private:
            self._drop_copies(key)
        if created:
            self.on_new(key)  # type: ignore[misc]
        return entry

    def _drop_copies(self, key: bytes) -> None:
        """A client changed ``key``: the copies held by unshared tiers are stale (a shared one is written)."""
        for tier in self._private:
            tier.delete(key)

    def _pool_put(self, key: bytes, entry: Entry, expected: int | None, fallback: int) -> int:
        """Publish a write to the pool; tracked (its outcome kept for the reply) unless acks are local. Recorded in
        the command's ``pool_writes``: its reply waits for it (``pool_acks``)."""
        pool = self.pool
        assert pool is not None
        seq = pool.put(key, entry, track=expected is not None or pool.ack != "local", expected=expected,
                       fallback=fallback)
        state = self.command
        if state.pool_writes is None:
            state.pool_writes = []
        state.pool_writes.append((key, entry.version, seq))
        return seq

    def _ack(self, seq: int) -> None:
        if self.write_through:
            self.command.ack_seq = seq

    def delete(self, key: bytes, *, track: bool = False) -> bool:
        """Delete ``key`` from every tier. ``track``: the caller takes the pool tombstone's outcome
        (``pool.take_outcome(self.command.pool_ack)``, as DEL's reply does); untracked ones record none."""
        deleted = self._delete(key, track)
        if deleted:
            self.changes += 1
            if self.watch_epochs:  # as Redis: a key that was not there is not changed
                self.touch_watched(key)
            if self.on_modified is not None:
                self.on_modified(key)
        return deleted

    def _delete(self, key: bytes, track: bool) -> bool:
        pool = self.pool
        if pool is not None and not pool.usable(key):
            # Refused, never dropped: a delete the pool does not hold would let other copies come back.
            raise PoolUnavailableError(f"the pool is unavailable ({pool.down_reason(key)}); deletes need it")
        if self.refetch:
            self.refetch.pop(key, None)
        entry = self._drop_dram(key)
        # Whether the key exists below DRAM is decided before the pool's pending delete hides a pool-only copy.
        below = self._below(key) if entry is None else None
        if pool is not None:
            self.command.pool_ack = pool.delete(key, self.next_version(), track=track and pool.ack != "local")
        for tier in self.lower:
            if tier is pool:
                continue
            if not tier.authoritative or (entry.on_ssd if entry is not None else below is not None):
                tier.delete(key)
                if tier is self.ssd:
                    self._ack(self.ssd.enqueued_seq)
        if entry is not None:
            return not entry.expired(self.clock.now_ms())
        return below is not None

    def set_expire(self, key: bytes, expire_at: int) -> bool:
        """Set (or with 0, remove) the absolute expiry of an existing key; False if the key is missing."""
        changed = self._set_expire(key, expire_at)
        if changed:
            self.changes += 1
            if self.watch_epochs:
                self.touch_watched(key)
            if self.on_modified is not None:
                self.on_modified(key)
        return changed

    def _set_expire(self, key: bytes, expire_at: int) -> bool:
        entry = self.dram.entries.get(key)
        if entry is not None and not entry.expired(self.clock.now_ms()):
            entry.expire_at = expire_at
            if expire_at:
                heapq.heappush(self._ttl_heap, (expire_at, key))
            if entry.on_ssd and self.ssd is not None:
                self._ack(self.ssd.put(key, entry))
            if self.pool is not None:
                self.pool.put(key, entry)
            self._drop_copies(key)
            return True
        if entry is not None:
            self._expire_dram(key)
            return False
        below, origin = self.lookup_below(key)
        if below is None:
            return False
        keeper = self.keeper
        if keeper is None:
            # Only copies below DRAM (DRAM + pool): the record comes up (as any copy hit) and changes here.
            if self.adopt(key, below, origin):
                return self._set_expire(key, expire_at)
            return False
        moved = Entry(below.value, below.version, expire_at)
        seq = keeper.put(key, moved)
        if keeper is self.ssd:
            self._ack(seq)
        if self.pool is not None:
            self.pool.put(key, moved)
        self._drop_copies(key)
        return True

    def replace_value(self, key: bytes, value: Value, *, keep_ttl: bool = True) -> Entry:
        """A new value for a key, keeping its TTL (APPEND, SETRANGE, INCR...)."""
        current = self.get(key, touch=False)
        expire_at = current.expire_at if (current is not None and keep_ttl) else 0
        return self.put(key, value, expire_at)

    def checkpoint(self) -> int:
        """Queue a durable copy of every DRAM entry not yet on SSD (clean shutdown, SAVE); returns the last seq."""
        if self.ssd is None:
            return 0
        self.checkpoint_keys(self.dram.entries)
        self.command.ack_seq = self.ssd.barrier(sync=True)
        return self.command.ack_seq

    def checkpoint_keys(self, keys: Iterable[bytes]) -> None:
        """Queue to the SSD writer those of ``keys`` whose DRAM entry has no copy there yet (a background save does
        the DRAM a slice at a time: ``kvstrata.server.saves``)."""
        ssd = self.ssd
        if ssd is None:
            return
        now = self.clock.now_ms()
        entries = self.dram.entries
        for key in keys:
            entry = entries.get(key)
            if entry is not None and not entry.on_ssd and not entry.expired(now):
                ssd.put(key, entry)
                entry.on_ssd = True

    def unsaved(self, keys: list[bytes], entries: list[Entry]) -> int:
        """Of the DRAM entries a save started with (``keys``, ``entries``: parallel lists), how many are still
        their key's value and unexpired but have no SSD copy now that the save committed: the SSD tier evicted
        them (its budget is below the data), this save's copy or an earlier one."""
        now = self.clock.now_ms()
        current = self.dram.entries
        return sum(1 for key, entry in zip(keys, entries, strict=True)
                   if not entry.on_ssd and current.get(key) is entry and not entry.expired(now))

    def watch(self, key: bytes) -> int:
        """A client starts watching ``key``: its epoch now (see ``watch_epochs``)."""
        slot = self.watch_epochs.setdefault(key, [0, 0])
        slot[0] += 1
        return slot[1]

    def watch_epoch(self, key: bytes) -> int:
        slot = self.watch_epochs.get(key)
        return slot[1] if slot is not None else -1

    def unwatch(self, keys: Any) -> None:
        """Clients stopped watching ``keys`` (each once per WATCH that counted it)."""
        for key in keys:
            slot = self.watch_epochs.get(key)
            if slot is not None:
                slot[0] -= 1
                if slot[0] <= 0:
                    del self.watch_epochs[key]

    def touch_watched(self, key: bytes) -> None:
        slot = self.watch_epochs.get(key)
        if slot is not None:
            slot[1] += 1

    def flush(self) -> None:
        if self.on_modified is not None:
            self.on_modified(None)
        for key, slot in self.watch_epochs.items():
            if self.probe(key) is not None:  # as Redis: a watched key that was not there is not changed
                slot[1] += 1
        self.stats.prefetch_wasted += len(self.prefetched)
        self.prefetched.clear()
        if self.predictor is not None:
            self.predictor.clear()
        self.dram.clear()
        self.policy.clear()
        self._ttl_heap.clear()
        if self.pool is not None:
            self.pool.flush(self.next_version())  # tombstones at one version: the pool decides
        for tier in self.lower:
            if tier is self.ssd:
                self._ack(self.ssd.flush())
            elif tier is not self.pool:
                tier.flush()

    def _ssd_committed(self, committed_seq: int, evicted: list[bytes]) -> None:
        if not evicted:
            return
        self.stats.evicted_keys += len(evicted)
        if self.on_event is not None:
            for key in evicted:
                self.on_event(b"evicted", key)
        gone = self._evicted_below
        for key in evicted:
            entry = self.dram.entries.get(key)
            if entry is not None:
                entry.on_ssd = False
            elif self.keep_below:
                gone.pop(key, None)
                gone[key] = None
        while len(gone) > EVICTED_BELOW_MAX:
            del gone[next(iter(gone))]

    def tier_info(self) -> list[dict[str, Any]]:
        """One row per tier, DRAM first then the lower tiers in order: INFO tier_<name> and the metrics."""
        rows: list[dict[str, Any]] = [
            {"name": "dram", "used": self.dram.used, "budget": self.dram.budget, "keys": len(self.dram),
             "pinned_bytes": self.dram.pinned_bytes, **self.tier_stats["dram"].as_dict()}
        ]
        for tier in self.lower:
            rows.append({"name": tier.name, "used": tier.used, "budget": tier.budget, "keys": len(tier),
                         **tier.info_row(self.tier_stats[tier.name].as_dict())})
        return rows
