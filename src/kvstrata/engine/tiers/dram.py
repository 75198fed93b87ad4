"""The DRAM tier: a dict of entries with exact byte accounting and a scan index by key bucket."""

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

    def size(self, key: bytes, value: bytes | bytearray) -> int:
        """Bytes charged for an entry: key, value and the fixed per-entry overhead."""
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
        else:
            old_size = self.size(key, old.value)
            self.used -= old_size
            if old.pinned:
                self.pinned_bytes -= old_size
        self.entries[key] = entry
        self.used += size
        if entry.pinned:
            self.pinned_bytes += size
        if len(entry.value) >= self.bufpool_min:
            self.bufpool.retain(entry.value)
        if old is not None and len(old.value) >= self.bufpool_min:
            self.bufpool.release(old.value)

    def delete(self, key: bytes) -> bool:
        return self.pop(key) is not None

    def pop(self, key: bytes) -> Entry | None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return None
        size = self.size(key, entry.value)
        self.used -= size
        if entry.pinned:
            self.pinned_bytes -= size
        b = bucket_of(key)
        bucket = self.buckets[b]
        bucket.discard(key)
        if not bucket:
            del self.buckets[b]
        if len(entry.value) >= self.bufpool_min:
            self.bufpool.release(entry.value)
        return entry

    def set_pinned(self, key: bytes, entry: Entry, pinned: bool) -> None:
        if entry.pinned == pinned:
            return
        entry.pinned = pinned
        size = self.size(key, entry.value)
        self.pinned_bytes += size if pinned else -size

    def clear(self) -> None:
        if self.bufpool is not None:
            for entry in self.entries.values():
                if len(entry.value) >= self.bufpool_min:
                    self.bufpool.release(entry.value)
        self.entries.clear()
        self.buckets.clear()
        self.used = 0
        self.pinned_bytes = 0

    def __len__(self) -> int:
        return len(self.entries)
