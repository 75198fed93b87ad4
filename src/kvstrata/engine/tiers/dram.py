"""The DRAM tier: a dict of entries with exact byte accounting and a scan index by key bucket.

With the shared-memory arena (``kvstrata.engine.arena.ArenaPool``, set as ``arena``) large values live in
arena slots. An arena value is charged its slot's class size (fragmentation counts against the budget), and a
slot dropped while a client leases it stays charged until the arena frees it (``_uncharge``): ``size()`` is
what removing an entry frees *now*, ``charge()`` what storing it costs.
"""

from __future__ import annotations

from typing import Any

from kvstrata.engine.entry import ENTRY_OVERHEAD, Entry
from kvstrata.engine.keyspace import bucket_of


class DramTier:
    """Holds entries in host memory. It counts bytes; the engine keeps ``used <= budget``.

    ``buckets`` groups keys by a stable hash so SCAN can walk the keyspace bucket by bucket with a cursor that
    stays valid while keys come and go (and move between tiers, which share the bucket function).
    """

    name = "dram"

    def __init__(self, budget: int, entry_overhead: int = ENTRY_OVERHEAD) -> None:
        self.budget = budget
        self.overhead = entry_overhead
        self.used = 0
        self.entries: dict[bytes, Entry] = {}
        self.buckets: dict[int, set[bytes]] = {}
        self.pinned_bytes = 0
        # A BufferPool whose buffers stored values may be (kvstrata.engine.bufpool): each entry holding one
        # holds a lease on it, given back when the entry leaves this tier. Set only when DRAM is the last tier
        # (a demoted value would otherwise be shared with the SSD writer).
        self.bufpool: Any = None
        self.bufpool_min = 1 << 62
        self.arena: Any = None  # an ArenaPool: entries holding its slots hold them (adopt/drop)

    def attach_arena(self, arena: Any) -> None:
        self.arena = arena
        self.bufpool = arena  # INFO memory lists the receive pool's rows: the arena's
        arena.on_uncharge = self._uncharge

    @property
    def held_bytes(self) -> int:
        """Charged bytes no entry holds (leased-but-dropped arena slots, two-phase write reservations): nothing
        can be demoted to free them."""
        return self.arena.deferred_bytes + self.arena.reserved_bytes if self.arena is not None else 0

    def _uncharge(self, nbytes: int) -> None:
        self.used -= nbytes

    def charge(self, key: bytes, value: Any) -> int:
        """Bytes charged for storing an entry: key, value (an arena slot's whole class) and the overhead."""
        arena = self.arena
        if arena is not None and arena.slot(value) is not None:
            return len(key) + arena.charge(len(value)) + self.overhead
        return len(key) + len(value) + self.overhead

    def size(self, key: bytes, value: Any) -> int:
        """Bytes removing an entry frees now: its charge, less a leased arena slot (freed on release)."""
        arena = self.arena
        if arena is not None:
            s = arena.slot(value)
            if s is not None:
                return len(key) + self.overhead + (0 if s.leases else s.cls)
        return len(key) + len(value) + self.overhead

    def _let_go(self, key: bytes, value: Any) -> int:
        """The entry holding ``value`` leaves: returns the bytes freed now (see ``size``)."""
        arena = self.arena
        if arena is not None and arena.slot(value) is not None:
            kept = arena.drop(value)
            return len(key) + self.overhead + arena.charge(len(value)) - kept
        if len(value) >= self.bufpool_min:
            self.bufpool.release(value)
        return len(key) + len(value) + self.overhead

    def get(self, key: bytes) -> Entry | None:
        return self.entries.get(key)

    def contains(self, key: bytes) -> bool:
        return key in self.entries

    def put(self, key: bytes, entry: Entry, size: int, old: Entry | None) -> None:
        """Insert or replace (``old`` is the entry being replaced, ``size`` the new entry's charged bytes)."""
        if old is None:
            b = bucket_of(key)
            bucket = self.buckets.get(b)
            if bucket is None:
                bucket = self.buckets[b] = set()
            bucket.add(key)
        self.entries[key] = entry
        if self.arena is not None:
            size = self.charge(key, entry.value)
            self.arena.adopt(entry.value)
        elif len(entry.value) >= self.bufpool_min:
            self.bufpool.retain(entry.value)
        self.used += size
        if entry.pinned:
            self.pinned_bytes += size
        if old is not None:
            if old.pinned:
                self.pinned_bytes -= self.charge(key, old.value)
            self.used -= self._let_go(key, old.value)

    def delete(self, key: bytes) -> bool:
        return self.pop(key) is not None

    def pop(self, key: bytes) -> Entry | None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return None
        if entry.pinned:
            self.pinned_bytes -= self.charge(key, entry.value)
        self.used -= self._let_go(key, entry.value)
        b = bucket_of(key)
        bucket = self.buckets[b]
        bucket.discard(key)
        if not bucket:
            del self.buckets[b]
        return entry

    def rehome(self, key: bytes, entry: Entry, view: Any) -> None:
        """Replace ``entry``'s value by ``view``, an arena copy of it (same bytes, new charge)."""
        old = entry.value
        if entry.pinned:
            self.pinned_bytes -= self.charge(key, old)
        self.used -= self._let_go(key, old)
        entry.value = view
        size = self.charge(key, view)
        self.arena.adopt(view)
        self.used += size
        if entry.pinned:
            self.pinned_bytes += size

    def set_pinned(self, key: bytes, entry: Entry, pinned: bool) -> None:
        if entry.pinned == pinned:
            return
        entry.pinned = pinned
        size = self.charge(key, entry.value)
        self.pinned_bytes += size if pinned else -size

    def clear(self) -> None:
        if self.bufpool is not None or self.arena is not None:
            for key, entry in self.entries.items():
                self._let_go(key, entry.value)
        self.entries.clear()
        self.buckets.clear()
        # Leased slots of the dropped entries stay charged until the arena frees them, reservations until they end.
        self.used = self.held_bytes
        self.pinned_bytes = 0

    def __len__(self) -> int:
        return len(self.entries)
