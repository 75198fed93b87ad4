"""The engine facade: one keyspace over stacked tiers (DRAM, SSD, optionally a shared pool), with TTL, versions,
pins and policy.

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
"""

from __future__ import annotations

import heapq
import logging
import random
from collections.abc import Iterable
from typing import Any

from kvstrata.clock import Clock, SystemClock
from kvstrata.engine.admission import Admission
from kvstrata.engine.entry import ENTRY_OVERHEAD, Entry, Value
from kvstrata.engine.keyspace import SCAN_BUCKETS, glob_match
from kvstrata.engine.policy import EvictionPolicy, create_policy
from kvstrata.engine.predict import Predictor
from kvstrata.engine.profile import HEAD
from kvstrata.engine.stats import EngineStats, TierStats
from kvstrata.engine.tiers.dram import DramTier
from kvstrata.engine.tiers.markers import Corrupt
from kvstrata.engine.tiers.pool import PoolTier
from kvstrata.engine.tiers.ssd import SsdTier
from kvstrata.errors import OutOfMemoryError, VersionMismatchError

log = logging.getLogger("kvstrata.engine")

VERSION_BLOCK = 100_000
# With a pool, versions are hybrid logical clocks: (wall ms << HLC_LOGICAL_BITS | logical) << NODE_BITS | node.
HLC_LOGICAL_BITS = 12
NODE_BITS = 8
HLC_VERSION_BLOCK = 1000 << (HLC_LOGICAL_BITS + NODE_BITS)  # one second of wall time
HEAD_SCAN = 256  # chain-aware demotion passes over at most this many chain heads per choice
LATE = -1.0  # Store.prefetched: a read waited for this key's prefetch


class PoolHit:
    """A loader result that came from the pool (so the engine counts it there and promotes it)."""

    __slots__ = ("entry",)

    def __init__(self, entry: Entry) -> None:
        self.entry = entry


class LoadTicket:
    """What ``begin_load`` hands to the loader thread and ``finish_load`` checks afterwards."""

    __slots__ = ("pool_first", "pool_ticket", "rest", "ssd_ticket")

    def __init__(self, ssd_ticket: list[Any], pool_ticket: list[Any] | None, pool_first: list[bytes],
                 rest: list[bytes]) -> None:
        self.ssd_ticket = ssd_ticket
        self.pool_ticket = pool_ticket
        self.pool_first = pool_first
        self.rest = rest

    @property
    def stale(self) -> bool:
        return bool(self.ssd_ticket[0] or (self.pool_ticket is not None and self.pool_ticket[0]))


class Store:
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
        node_id: int = 0,
        predictor: Predictor | None = None,
        chain_evict: bool = False,
        head_keep: float = 2.0,
        prefetch_protect: float = 2.0,
        profile_min_bytes: int = 0,
    ) -> None:
        self.clock = clock or SystemClock()
        self.dram = DramTier(dram_budget, entry_overhead)
        self.policy = policy if policy is not None else create_policy("lru", clock=self.clock)
        self.ssd = ssd
        self.write_through = durability == "write-through" and ssd is not None
        self.noeviction = noeviction
        self.admission = Admission(promote_hits, promote_window)
        self.hot_max_fraction = hot_max_fraction
        self.hot: dict[bytes, int] = {}
        self.stats = EngineStats()
        self.tier_stats = {"dram": TierStats(), "ssd": TierStats(), "pool": TierStats()}
        self._dram_stats = self.tier_stats["dram"]
        # The DRAM dict is never replaced (only cleared), so the hot path may hold it directly.
        self._entries = self.dram.entries
        self._ttl_heap: list[tuple[int, bytes]] = []
        self._overlay: dict[bytes, Any] | None = None
        # The SSD writer sequence number the current command's reply must wait for (0: none). Set by writes
        # under write-through and by checkpoints; the server resets it before each command.
        self.ack_seq = 0
        self.sync_reads = 0
        self.version = ssd.version_high_water if ssd is not None else 0
        if ssd is not None:
            ssd.on_commit = self._ssd_committed
        # The shared pool (None without --pool). It needs the SSD tier: the loader that keeps pool reads off
        # the event loop is the SSD tier's (see docs/pool.md).
        self.pool = pool
        self.pool_first = tier_order.startswith("dram,pool")
        self.node_id = node_id & ((1 << NODE_BITS) - 1)
        # The pool write the current command's reply should wait for (0: none); set by put().
        self.pool_ack = 0
        self._origin = "ssd"
        # Access profiles and prediction (docs/prefetch.md); None: no profiling (a DRAM-only server).
        self.predictor = predictor
        # Smaller values are not profiled: a KV chunk is large, and profiling costs ~3 us per access.
        self.profile_min_bytes = profile_min_bytes
        # The client stream the current command comes from (the server sets it per command).
        self.stream = 0
        # Chain-aware demotion (needs the predictor's profiles): chain heads stay head_keep times longer.
        self.chain_evict = chain_evict and predictor is not None
        self.head_keep = head_keep
        # A prefetch never displaces a key used (or prefetched) within this many seconds, nor a hotter one.
        self.prefetch_protect = prefetch_protect
        # Keys a prefetch brought up that nobody has read yet: monotonic landing time (LATE once a read waited).
        self.prefetched: dict[bytes, float] = {}

    # ---- versions ----
    def next_version(self) -> int:
        if self.pool is not None:
            return self._next_hlc()
        self.version += 1
        if self.ssd is not None and self.version > self.ssd.version_high_water:
            # Reserve a block ahead, so versions keep increasing after a restart without a write per version.
            self.ssd.save_version_high_water(self.version + VERSION_BLOCK)
        return self.version

    def _next_hlc(self) -> int:
        """A hybrid-logical-clock version, comparable across nodes: wall ms, a logical counter, the node id.

        It is higher than every version this node has issued or seen in the pool (``observe_version``), and
        higher than any version issued before a restart (the SSD tier keeps a high-water mark).
        """
        clock = self.version >> NODE_BITS
        physical = self.clock.now_ms() << HLC_LOGICAL_BITS
        clock = max(clock + 1, physical)
        self.version = (clock << NODE_BITS) | self.node_id
        if self.ssd is not None and self.version > self.ssd.version_high_water:
            self.ssd.save_version_high_water(self.version + HLC_VERSION_BLOCK)
        return self.version

    def observe_version(self, version: int) -> None:
        """Lamport's receive rule: later local writes get versions above one seen in the pool."""
        if version > self.version:
            self.version = (version >> NODE_BITS) << NODE_BITS | self.node_id

    # ---- loading lower tiers ahead of a command ----
    def missing(self, keys: Iterable[bytes]) -> list[bytes]:
        """Keys whose state is unknown without reading LMDB (not in DRAM nor in the SSD's pending writes)."""
        ssd = self.ssd
        if ssd is None:
            return []
        entries = self.dram.entries
        pending = ssd.pending
        if ssd.flush_pending:
            return []
        return [k for k in keys if k not in entries and k not in pending]

    def begin_load(self, keys: list[bytes]) -> LoadTicket:
        """Watch ``keys`` and plan their load: which are read from the pool first, which from LMDB first."""
        assert self.ssd is not None
        pool = self.pool
        if pool is None or not pool.active:
            return LoadTicket(self.ssd.watch(keys), None, [], list(keys))
        first: list[bytes] = []
        rest: list[bytes] = []
        if self.pool_first:
            # Keys this node put in the pool (their newest local version) are read there first.
            index = pool.index
            for k in keys:
                (first if k in index and k not in pool.pending else rest).append(k)
        else:
            rest = list(keys)
        return LoadTicket(self.ssd.watch(keys), pool.watch(keys), first, rest)

    def read_lower(self, ticket: LoadTicket) -> dict[bytes, Any]:
        """The loader (a worker thread): LMDB records and pool records of a planned load, in tier order.

        Results are Entry/Corrupt/None from the SSD tier, or PoolHit for a record found in the pool. The SSD is
        read for every key the pool did not answer; the pool for every key LMDB does not hold.
        """
        ssd = self.ssd
        assert ssd is not None
        pool = self.pool
        found: dict[bytes, Any] = {}
        rest = ticket.rest
        if ticket.pool_first and pool is not None:
            got = pool.read_many(ticket.pool_first)
            rest = list(rest)
            for k in ticket.pool_first:
                rec = got.get(k)
                if rec is not None and not isinstance(rec, Corrupt):
                    found[k] = PoolHit(rec)
                else:
                    rest.append(k)
        found.update(ssd.read_many(rest))
        if ticket.pool_ticket is not None and pool is not None:
            # Keys not read in the pool yet: begin_load put each key in exactly one of pool_first and rest.
            ask = [k for k in ticket.rest if found.get(k) is None]
            if ask:
                got = pool.read_many(ask)
                for k in ask:
                    rec = got.get(k)
                    if rec is not None and not isinstance(rec, Corrupt):
                        found[k] = PoolHit(rec)
        return found

    def cancel_load(self, ticket: LoadTicket) -> None:
        assert self.ssd is not None
        self.ssd.unwatch(ticket.ssd_ticket)
        if ticket.pool_ticket is not None and self.pool is not None:
            self.pool.unwatch(ticket.pool_ticket)

    def finish_load(self, ticket: LoadTicket, found: dict[bytes, Any]) -> bool:
        """Install loaded records as the overlay for the next command; False if a write raced the load."""
        self.cancel_load(ticket)
        if ticket.stale:
            return False
        self._overlay = found
        return True

    def end_command(self) -> None:
        self._overlay = None

    def keep_overlay(self, keys: list[bytes]) -> tuple[dict[bytes, Any], list[Any]] | None:
        """Keep the current overlay for a later run of the same command (a STRONG read suspended for the pool),
        watched so that an SSD change of these keys in between invalidates it."""
        if self._overlay is None or self.ssd is None:
            return None
        return dict(self._overlay), self.ssd.watch(keys)

    def restore_overlay(self, kept: tuple[dict[bytes, Any], list[Any]], *, install: bool = True) -> bool:
        """Reinstall a kept overlay if nothing changed its keys on the SSD since; False when it went stale."""
        overlay, ticket = kept
        assert self.ssd is not None
        self.ssd.unwatch(ticket)
        if ticket[0] or not install:
            return False
        self._overlay = overlay
        return True

    # ---- lookups ----
    def _below(self, key: bytes) -> Entry | None:
        """The lower tiers' entry for a key that is not in DRAM, unexpired, or None.

        ``self._origin`` says where it came from: "ssd" (pending writes, the loader's overlay or a synchronous
        LMDB read) or "pool" (only ever from the loader's overlay: the pool is never read on the event loop).
        """
        ssd = self.ssd
        self._origin = "ssd"
        if ssd is None:
            return None
        known, found = ssd.lookup_pending(key)
        if not known:
            overlay = self._overlay
            if overlay is not None and key in overlay:
                found = overlay[key]
                if found.__class__ is PoolHit:
                    return self._pool_found(key, found.entry)
            else:
                self.sync_reads += 1
                found = ssd.read(key)
            if isinstance(found, Corrupt):
                self.tier_stats["ssd"].corrupt_reads += 1
                log.error("corrupt SSD record for key %r (%s): dropped", key[:64], found.reason)
                ssd.delete(key)
                if overlay is not None:
                    overlay[key] = None
                return None
        if found is not None and found.expired(self.clock.now_ms()):
            ssd.delete(key)
            self.stats.expired_keys += 1
            return None
        return found

    def _pool_found(self, key: bytes, entry: Entry) -> Entry | None:
        pool = self.pool
        if pool is not None:
            known, pending = pool.lookup_pending(key)
            if known:
                # A write or delete of this key left here after the loader read the pool: it is newer.
                entry = pending  # type: ignore[assignment]
                if entry is None:
                    return None
        if entry.expired(self.clock.now_ms()):
            return None
        self._origin = "pool"
        self.observe_version(entry.version)
        return entry

    def get(self, key: bytes, *, touch: bool = True) -> Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            if entry.expire_at and entry.expire_at <= self.clock.now_ms():
                self._expire_dram(key)
                return None
            if touch:
                self._dram_stats.hits += 1
                if not entry.pinned:
                    self.policy.touch(key)
                if self.prefetched and key in self.prefetched:
                    self._prefetch_used(key)
                if self.predictor is not None and len(entry.value) >= self.profile_min_bytes:
                    self.predictor.read(key, self.stream)
            return entry
        if touch:
            self._dram_stats.misses += 1
        entry = self._below(key)
        if entry is None:
            if touch and self.ssd is not None:
                self.tier_stats["ssd"].misses += 1
                if self.pool is not None:
                    self.tier_stats["pool"].misses += 1
            return None
        if touch:
            if self.predictor is not None and len(entry.value) >= self.profile_min_bytes:
                self.predictor.read(key, self.stream)
            if self._origin == "pool":
                # Fetched over the network: keep it (no admission rule), replacing any older local copy.
                self.tier_stats["pool"].hits += 1
                self.adopt(key, entry)
            else:
                self.tier_stats["ssd"].hits += 1
                if self.admission.should_promote(key, self.clock.now_ms()) or self._hot_match(key):
                    self._promote(key, entry)
        elif self._origin == "pool":
            # EXISTS, TYPE, a CAS check...: the record crossed the network already, so it is kept here too.
            self.tier_stats["pool"].hits += 1
            self.adopt(key, entry)
        return entry

    def tier_of(self, key: bytes) -> str | None:
        if key in self.dram.entries:
            return "dram" if self.get(key, touch=False) is not None else None
        if self._below(key) is None:
            return None
        return self._origin

    # ---- writes ----
    def put(
        self,
        key: bytes,
        value: Value,
        expire_at: int = 0,
        *,
        cold: bool = False,
        expected_version: int | None = None,
    ) -> Entry:
        """Store a new value (replacing any old one in any tier) and give it a fresh version."""
        if self.predictor is not None and len(value) >= self.profile_min_bytes:
            self.predictor.write(key, self.stream)
        if expected_version is not None:
            current = self.get(key, touch=False)
            have = current.version if current is not None else 0
            if have != expected_version:
                raise VersionMismatchError(f"version mismatch: expected {expected_version}, current {have}")
        ssd = self.ssd
        if ssd is None:
            self.version += 1
            entry = Entry(value, self.version, expire_at)
        else:
            entry = Entry(value, self.next_version(), expire_at)
        size = self.dram.charge(key, value)  # data plane hook: an arena value is charged its slot's class
        dram = self.dram
        old = dram.entries.get(key)
        if ssd is not None:
            if size > ssd.budget:
                raise OutOfMemoryError("command not allowed: the value is larger than the SSD tier's budget.")
            if cold or size > dram.budget - dram.pinned_bytes:
                # Straight to SSD: asked for, or it cannot fit in DRAM beside the pinned keys.
                self._check_last_tier_room(size)
                self._drop_dram(key)
                self._ack(ssd.put(key, entry))
                if self.pool is not None:
                    self.pool_ack = self.pool.put(key, entry)
                return entry
            stale_below = not self.write_through and (
                (old is not None and old.on_ssd) or (old is None and self._below(key) is not None)
            )
            self._insert(key, entry, size, old)
            # Only once the new value is in: a write refused for room must not lose the old one.
            if stale_below:
                ssd.delete(key)
        else:
            self._insert(key, entry, size, old)
        if self.write_through:
            assert ssd is not None
            self._ack(ssd.put(key, entry))
            entry.on_ssd = True
        if expire_at:
            heapq.heappush(self._ttl_heap, (expire_at, key))
        if self.pool is not None:
            self.pool_ack = self.pool.put(key, entry)
        return entry

    def _ack(self, seq: int) -> None:
        if self.write_through:
            self.ack_seq = seq

    def _insert(self, key: bytes, entry: Entry, size: int, old: Entry | None) -> None:
        """Put an entry of ``size`` bytes into DRAM, replacing ``old``, after making room for it."""
        dram = self.dram
        # data plane hook: dram.size is what dropping ``old`` frees now (a leased arena slot stays charged)
        growth = size if old is None else size - dram.size(key, old.value)
        if dram.used + growth > dram.budget:
            self.make_room(growth, exclude=key)
        if old is not None and self.prefetched:
            self._unprefetch(key)
        dram.put(key, entry, size, old)
        if old is None:
            self.policy.admit(key)
        elif old.pinned:
            # Still hot, but the grown value must fit under the pin cap again, or it goes back to the policy.
            if not self._pin(key, entry):
                self.policy.admit(key)
        else:
            self.policy.touch(key)
        if not entry.pinned and self._hot_match(key):
            self._pin(key, entry)

    def make_room(self, nbytes: int, *, exclude: bytes | None = None) -> None:
        """Demote (or, in the last tier, evict) until ``nbytes`` more fit in DRAM; -OOM if they cannot.

        ``exclude`` is the key being written: it is never moved out to make room for itself. Nothing moves
        unless enough can be freed.
        """
        dram = self.dram
        if dram.used + nbytes <= dram.budget:
            return
        if self.ssd is None and self.noeviction:
            raise OutOfMemoryError()
        kept = dram.pinned_bytes + dram.held_bytes  # data plane hook: leased-but-dropped bytes cannot move
        current = dram.entries.get(exclude) if exclude is not None else None
        if current is not None and not current.pinned:
            kept += self.dram.size(exclude, current.value)  # type: ignore[arg-type]
        if kept + nbytes > dram.budget:
            raise OutOfMemoryError("command not allowed: the value does not fit in the DRAM budget beside the "
                                   "pinned keys.")
        need = dram.used + nbytes - dram.budget
        chosen = self._choose_victims(need, exclude)
        # Leased arena slots free only their key when demoted (data plane): refuse rather than overshoot.
        if sum(dram.size(k, dram.entries[k].value) for k in chosen) < need:
            raise OutOfMemoryError("command not allowed: the value does not fit in the DRAM budget beside the "
                                   "pinned and leased values.")
        self._move_out(chosen)

    def _move_out(self, chosen: list[bytes]) -> None:
        """Demote ``chosen`` (or, in the last tier, evict them); -OOM, with nothing moved, if the SSD cannot take them."""
        entries = self.dram.entries
        if self.ssd is not None:
            # Check the last tier can take them all before anything moves: a refused write loses nothing.
            self._check_last_tier_room(sum(len(entries[k].value) for k in chosen if not entries[k].on_ssd))
        for victim in chosen:
            self._demote(victim)

    def _choose_victims(self, need: int, exclude: bytes | None) -> list[bytes]:
        """The keys to move out of DRAM to free ``need`` bytes, lowest ranked first.

        With chain-aware demotion, a chain head (a conversation's first chunk after a shared prefix) is passed
        over until it has been idle ``head_keep`` times as long as the key taken instead: reading it is what
        triggers the prefetch of the rest of the conversation, and the rest is not predictable without it.
        """
        chosen: list[bytes] = []
        entries = self.dram.entries
        size = self.dram.size
        heads: list[bytes] = []
        profiles = self.predictor.profiles if self.chain_evict and self.predictor is not None else None
        now = self.clock.monotonic()
        keep = self.head_keep
        for victim in self.policy.victims():
            if victim == exclude:
                continue
            if profiles is not None:
                s = profiles.slots.get(victim)
                if s is not None and profiles.flags[s] & HEAD and len(heads) < HEAD_SCAN:
                    heads.append(victim)
                    continue
                if heads:
                    idle = now - profiles.last_access(victim)
                    while heads and need > 0 and now - profiles.last_access(heads[0]) >= keep * idle:
                        head = heads.pop(0)
                        chosen.append(head)
                        need -= size(head, entries[head].value)
                    if need <= 0:
                        break
            chosen.append(victim)
            need -= size(victim, entries[victim].value)
            if need <= 0:
                break
        for victim in heads:
            if need <= 0:
                break
            chosen.append(victim)
            need -= size(victim, entries[victim].value)
        return chosen

    def _check_last_tier_room(self, nbytes: int) -> None:
        ssd = self.ssd
        if ssd is not None and ssd.stuck_bytes > ssd.stuck_limit:
            raise OutOfMemoryError(f"command not allowed: the SSD tier cannot take writes ({ssd.degraded}).")
        if self.noeviction and self.ssd is not None:
            if self.ssd.used + self.ssd.queued_bytes + nbytes > self.ssd.budget:
                raise OutOfMemoryError("command not allowed: the SSD tier is full and maxmemory-policy is noeviction.")

    def _demote(self, key: bytes) -> None:
        entry = self._drop_dram(key)
        if entry is None:
            return
        if self.ssd is None:
            self.tier_stats["dram"].evictions += 1
            self.stats.evicted_keys += 1
            return
        self.tier_stats["dram"].demotions += 1
        pool = self.pool
        if pool is not None and self.pool_first and not pool.holds(key, entry.version) \
                and not entry.expired(self.clock.now_ms()):
            # DRAM -> pool: the shared copy, read first by this node and found by the others.
            if pool.put(key, entry):
                self.tier_stats["pool"].demotions += 1
        if not entry.on_ssd:
            self.ssd.put(key, entry)

    def _promote(self, key: bytes, entry: Entry) -> bool:
        size = self.dram.size(key, entry.value)
        if size > self.dram.budget or self.ssd is None:
            return False
        try:
            self.make_room(size)
        except OutOfMemoryError:
            return False
        fresh = Entry(entry.value, entry.version, entry.expire_at)
        self.dram.put(key, fresh, size, None)
        self.policy.admit(key)
        if self.write_through:
            fresh.on_ssd = True
        else:
            self.ssd.delete(key)
        if fresh.expire_at:
            heapq.heappush(self._ttl_heap, (fresh.expire_at, key))
        if self._hot_match(key):
            self._pin(key, fresh)
        self.tier_stats["ssd"].promotions += 1
        self.admission.forget(key)
        return True

    def promote(self, key: bytes) -> bool:
        """Move a lower-tier key up now (a prefetch); False when it is missing, already in DRAM, or could only
        come up by displacing pinned, recently used or hotter data."""
        if key in self.dram.entries:
            return False
        entry = self._below(key)
        if entry is None:
            self.stats.prefetch_absent += 1
            return False
        from_pool = self._origin == "pool"
        size = self.dram.size(key, entry.value)
        if not from_pool and size > self.dram.budget:
            return False
        if not self._prefetch_room(key, size):
            self.stats.prefetch_rejected += 1
            return False
        # Room is made: the usual paths up only install the entry.
        done = self.adopt(key, entry) if from_pool else self._promote(key, entry)
        if done:
            self.prefetched[key] = self.clock.monotonic()
            self.stats.prefetch_issued += 1
        return done

    def _prefetch_room(self, key: bytes, size: int) -> bool:
        """Make room for a prefetched key, but only by demoting colder data; False (nothing moved) otherwise."""
        dram = self.dram
        if dram.used + size <= dram.budget:
            return True
        if dram.pinned_bytes + size > dram.budget:
            return False
        need = dram.used + size - dram.budget
        chosen = self._choose_victims(need, key)
        if sum(dram.size(k, dram.entries[k].value) for k in chosen) < need:
            return False
        now = self.clock.monotonic()
        recent = now - self.prefetch_protect
        predictor = self.predictor
        heat = predictor.profiles.temporal(key, now) if predictor is not None else 0.0
        for victim in chosen:
            landed = self.prefetched.get(victim)
            if landed is not None and landed >= recent:
                return False
            if predictor is not None:
                profiles = predictor.profiles
                if profiles.last_access(victim) >= recent or profiles.temporal(victim, now) > heat + 1.0:
                    return False
        try:
            self._move_out(chosen)
        except OutOfMemoryError:
            return False
        return True

    def _prefetch_used(self, key: bytes) -> None:
        landed = self.prefetched.pop(key)
        self.stats.prefetch_used += 1
        if landed < 0:
            self.stats.prefetch_late += 1

    def _unprefetch(self, key: bytes) -> None:
        if self.prefetched.pop(key, None) is not None:
            self.stats.prefetch_wasted += 1

    def mark_late(self, keys: Iterable[bytes]) -> None:
        """These prefetched keys were read while their load was still in flight (the read waited for it)."""
        for key in keys:
            if key in self.prefetched:
                self.prefetched[key] = LATE

    def prefetch_ratios(self) -> tuple[float | None, float | None]:
        """(accuracy, coverage), each None while there is nothing to measure (docs/prefetch.md)."""
        st = self.stats
        lower = st.prefetch_used + self.tier_stats["ssd"].hits + self.tier_stats["pool"].hits
        accuracy = round(st.prefetch_used / st.prefetch_issued, 4) if st.prefetch_issued else None
        coverage = round((st.prefetch_used - st.prefetch_late) / lower, 4) if lower else None
        return accuracy, coverage

    def prefetch_info(self) -> dict[str, float | int]:
        """Prefetch outcomes and the ratios built from them (0.0 while there is nothing to measure)."""
        st = self.stats
        accuracy, coverage = self.prefetch_ratios()
        out: dict[str, float | int] = {
            "prefetch_issued": st.prefetch_issued,
            "prefetch_used": st.prefetch_used,
            "prefetch_late": st.prefetch_late,
            "prefetch_wasted": st.prefetch_wasted,
            "prefetch_pending_use": len(self.prefetched),
            "prefetch_absent": st.prefetch_absent,
            "prefetch_rejected": st.prefetch_rejected,
            "prefetch_predicted": st.prefetch_predicted,
            "prefetch_accuracy": 0.0 if accuracy is None else accuracy,
            "prefetch_coverage": 0.0 if coverage is None else coverage,
        }
        if self.predictor is not None:
            out.update(self.predictor.info())
        return out

    def adopt(self, key: bytes, entry: Entry) -> bool:
        """Install a record read from the pool in DRAM, keeping its version (a pool hit or a STRONG refresh).

        It replaces any local copy, which is older (the caller checked). The SSD tier keeps its role: under
        write-back the local record is now stale and is deleted (DRAM is authoritative); under write-through the
        SSD gets the adopted value unless it is this node's own write (which the SSD already holds).
        """
        ssd = self.ssd
        assert ssd is not None
        size = self.dram.size(key, entry.value)
        old = self.dram.entries.get(key)
        if size > self.dram.budget - self.dram.pinned_bytes:
            return False
        try:
            self.make_room(size if old is None else size - self.dram.size(key, old.value), exclude=key)
        except OutOfMemoryError:
            return False
        fresh = Entry(entry.value, entry.version, entry.expire_at)
        if old is not None:
            self._drop_dram(key)
        self.dram.put(key, fresh, size, None)
        self.policy.admit(key)
        pool = self.pool
        ours = pool is not None and pool.wrote(key, entry.version)
        if pool is not None and not ours:
            pool.note(key, entry.version)
        if self.write_through:
            if not ours:
                ssd.put(key, fresh)
            fresh.on_ssd = True
        else:
            ssd.delete(key)
        if fresh.expire_at:
            heapq.heappush(self._ttl_heap, (fresh.expire_at, key))
        if self._hot_match(key):
            self._pin(key, fresh)
        self.tier_stats["pool"].promotions += 1
        return True

    def refresh_from_pool(self, found: dict[bytes, Entry | None]) -> int:
        """STRONG reads: adopt each pool record that is newer than the local copy; returns how many."""
        done = 0
        now = self.clock.now_ms()
        for key, rec in found.items():
            if rec is None or rec.expired(now):
                continue
            current = self.get(key, touch=False)
            if current is not None and current.version >= rec.version:
                continue
            self.observe_version(rec.version)
            if self.adopt(key, rec):
                done += 1
        return done

    def local_versions(self, keys: Iterable[bytes]) -> dict[bytes, int]:
        """The version of each key in the local tiers (0 when absent), for a STRONG pool check."""
        out: dict[bytes, int] = {}
        for key in keys:
            entry = self.dram.entries.get(key)
            if entry is None:
                entry = self._below(key)
                if entry is not None and self._origin == "pool":
                    self.tier_stats["pool"].hits += 1
                    if not self.adopt(key, entry):
                        entry = None  # only in the loader's overlay: not a local copy
            if entry is not None and entry.expired(self.clock.now_ms()):
                entry = None
            out[key] = entry.version if entry is not None else 0
        return out

    def _drop_dram(self, key: bytes) -> Entry | None:
        """Take a key out of DRAM and out of the policy's and the prefetch tracking's view; its entry or None."""
        entry = self.dram.pop(key)
        if entry is not None:
            self.policy.remove(key)
            if self.prefetched:
                self._unprefetch(key)
        return entry

    def delete(self, key: bytes) -> bool:
        if self.pool is not None:
            self.pool.delete(key)
        entry = self._drop_dram(key)
        now = self.clock.now_ms()
        if entry is not None:
            if entry.on_ssd and self.ssd is not None:
                self.ssd.delete(key)
                self._ack(self.ssd.enqueued_seq)
            return not entry.expired(now)
        below = self._below(key)
        if below is None:
            return False
        assert self.ssd is not None
        self.ssd.delete(key)
        self._ack(self.ssd.enqueued_seq)
        return True

    def set_expire(self, key: bytes, expire_at: int) -> bool:
        """Set (or with 0, remove) the absolute expiry of an existing key; False if the key is missing."""
        entry = self.dram.entries.get(key)
        if entry is not None and not entry.expired(self.clock.now_ms()):
            entry.expire_at = expire_at
            if expire_at:
                heapq.heappush(self._ttl_heap, (expire_at, key))
            if entry.on_ssd and self.ssd is not None:
                self._ack(self.ssd.put(key, entry))
            if self.pool is not None:
                self.pool.put(key, entry)
            return True
        if entry is not None:
            self._expire_dram(key)
            return False
        below = self._below(key)
        if below is None:
            return False
        assert self.ssd is not None
        moved = Entry(below.value, below.version, expire_at)
        self._ack(self.ssd.put(key, moved))
        if self.pool is not None:
            self.pool.put(key, moved)
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
        now = self.clock.now_ms()
        for key, entry in self.dram.entries.items():
            if not entry.on_ssd and not entry.expired(now):
                self.ssd.put(key, entry)
                entry.on_ssd = True
        self.ack_seq = self.ssd.barrier(sync=True)
        return self.ack_seq

    def flush(self) -> None:
        self.stats.prefetch_wasted += len(self.prefetched)
        self.prefetched.clear()
        if self.predictor is not None:
            self.predictor.clear()
        self.dram.clear()
        self.policy.clear()
        self._ttl_heap.clear()
        if self.pool is not None:
            self.pool.flush()
        if self.ssd is not None:
            self._ack(self.ssd.flush())

    # ---- expiry ----
    def _expire_dram(self, key: bytes) -> None:
        entry = self._drop_dram(key)
        if entry is None:
            return
        self.stats.expired_keys += 1
        if entry.on_ssd and self.ssd is not None:
            self.ssd.delete(key)

    def active_expire(self, max_keys: int = 20) -> int:
        """Expire up to ``max_keys`` due DRAM keys (bounded work per call); returns how many expired."""
        now = self.clock.now_ms()
        heap = self._ttl_heap
        done = 0
        checked = 0
        while heap and heap[0][0] <= now and checked < max_keys * 4:
            expire_at, key = heapq.heappop(heap)
            checked += 1
            entry = self.dram.entries.get(key)
            if entry is not None and entry.expire_at == expire_at:
                self._expire_dram(key)
                done += 1
                if done >= max_keys:
                    break
        if len(heap) > 2 * len(self.dram.entries) + 1024:
            self._ttl_heap = [(e.expire_at, k) for k, e in self.dram.entries.items() if e.expire_at]
            heapq.heapify(self._ttl_heap)
        if self.hot:
            self._expire_hot(now)
        return done

    def sweep_ssd(self, limit: int = 1000) -> None:
        if self.ssd is not None:
            self.ssd.sweep_expired(self.clock.now_ms(), limit)

    # ---- keyspace ----
    def dbsize(self) -> int:
        n = len(self.dram)
        if self.ssd is not None:
            n -= sum(1 for e in self.dram.entries.values() if e.on_ssd)
            n += len(self.ssd)
        return n

    def _bucket_keys(self, bucket: int) -> set[bytes]:
        keys = set(self.dram.buckets.get(bucket, ()))
        if self.ssd is not None:
            keys.update(self.ssd.bucket_keys(bucket))
        return keys

    def _live(self, key: bytes) -> bool:
        return self.get(key, touch=False) is not None

    def scan(self, cursor: int, count: int = 10, match: bytes | None = None) -> tuple[int, list[bytes]]:
        out: list[bytes] = []
        bucket = cursor
        while bucket < SCAN_BUCKETS and len(out) < count:
            for key in self._bucket_keys(bucket):
                if (match is None or glob_match(match, key)) and self._live(key):
                    out.append(key)
            bucket += 1
        return (0 if bucket >= SCAN_BUCKETS else bucket), out

    def keys(self, pattern: bytes) -> list[bytes]:
        out: list[bytes] = []
        for bucket in range(SCAN_BUCKETS):
            for key in self._bucket_keys(bucket):
                if glob_match(pattern, key) and self._live(key):
                    out.append(key)
        return out

    def random_key(self) -> bytes | None:
        for _ in range(16):
            buckets = self.dram.buckets
            if not buckets:
                break
            keys = buckets.get(random.choice(list(buckets)))
            if keys:
                key = random.choice(tuple(keys))
                if self._live(key):
                    return key
        if self.ssd is not None:
            start = random.randrange(SCAN_BUCKETS)
            for i in range(SCAN_BUCKETS):
                for key in self.ssd.bucket_keys((start + i) % SCAN_BUCKETS):
                    if self._live(key):
                        return key
        for key in list(self.dram.entries):
            if self._live(key):
                return key
        return None

    # ---- hot keys ----
    def _hot_match(self, key: bytes) -> bool:
        if not self.hot:
            return False
        now = self.clock.now_ms()
        return any((until == 0 or until > now) and glob_match(p, key) for p, until in self.hot.items())

    def _pin(self, key: bytes, entry: Entry) -> bool:
        size = self.dram.size(key, entry.value)
        if self.dram.pinned_bytes + size > self.hot_max_fraction * self.dram.budget:
            self.stats.pin_rejected += 1
            return False
        self.dram.set_pinned(key, entry, True)
        self.policy.remove(key)
        return True

    def _unpin(self, key: bytes, entry: Entry) -> None:
        self.dram.set_pinned(key, entry, False)
        self.policy.admit(key)

    def mark_hot(self, pattern: bytes, until_ms: int = 0) -> tuple[int, list[bytes]]:
        """Pin matching DRAM keys; returns (pinned now, matching keys still on lower tiers to bring up)."""
        self.hot[pattern] = until_ms
        pinned = 0
        for key, entry in list(self.dram.entries.items()):
            if not entry.pinned and glob_match(pattern, key) and self._pin(key, entry):
                pinned += 1
        below: list[bytes] = []
        if self.ssd is not None:
            for bucket in range(SCAN_BUCKETS):
                below.extend(k for k in self.ssd.bucket_keys(bucket)
                             if k not in self.dram.entries and glob_match(pattern, k))
        return pinned, below

    def unmark_hot(self, pattern: bytes) -> int:
        if self.hot.pop(pattern, None) is None:
            return 0
        unpinned = 0
        for key, entry in list(self.dram.entries.items()):
            if entry.pinned and not self._hot_match(key):
                self._unpin(key, entry)
                unpinned += 1
        return unpinned

    def _expire_hot(self, now: int) -> None:
        for pattern, until in list(self.hot.items()):
            if until and until <= now:
                self.unmark_hot(pattern)

    # ---- SSD writer callbacks ----
    def _ssd_committed(self, committed_seq: int, evicted: list[bytes]) -> None:
        if not evicted:
            return
        self.stats.evicted_keys += len(evicted)
        for key in evicted:
            entry = self.dram.entries.get(key)
            if entry is not None:
                entry.on_ssd = False

    def tier_info(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = [
            {"name": "dram", "used": self.dram.used, "budget": self.dram.budget, "keys": len(self.dram),
             "pinned_bytes": self.dram.pinned_bytes, **self.tier_stats["dram"].as_dict()}
        ]
        if self.ssd is not None:
            rows.append({"name": "ssd", "used": self.ssd.used, "budget": self.ssd.budget, "keys": len(self.ssd),
                         "pending": len(self.ssd.pending), "queued_bytes": self.ssd.queued_bytes,
                         "write_errors": self.ssd.write_errors, "expired": self.ssd.expired,
                         **self.tier_stats["ssd"].as_dict(),
                         "evictions": self.ssd.evictions})
        pool = self.pool
        if pool is not None:
            degraded = int(pool.degraded is not None)
            rows.append({"name": "pool", "used": pool.used, "budget": pool.budget, "keys": len(pool),
                         **self.tier_stats["pool"].as_dict(),
                         "evictions": pool.evictions, "corrupt_reads": pool.corrupt_reads,
                         "pool_degraded": degraded, **pool.info()})
        return rows

