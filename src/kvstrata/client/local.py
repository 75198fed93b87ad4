"""An in-process LRU of encoded chunks in host memory, in front of the server.

It implements the engine's tier interface (``kvstrata.engine.tiers.base.Tier``: ``get``, ``put``, ``delete``,
``contains``, ``used``, ``budget``, ``len``) with ``Entry`` objects, so it can stand wherever a tier does. It is
thread-safe (the transformers integration stores from a background thread).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from kvstrata.engine.entry import Entry

# Bytes charged per entry beyond key and value (Entry object, dict slot, ordering).
LOCAL_ENTRY_OVERHEAD = 256


class LocalTier:
    """Host-memory LRU of chunk values, bounded by ``budget`` bytes (keys + values + per-entry overhead)."""

    name = "local-dram"

    def __init__(self, budget: int = 1 << 30) -> None:
        self._budget = int(budget)
        self._used = 0
        self._entries: OrderedDict[bytes, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.evictions = 0

    @property
    def used(self) -> int:
        return self._used

    @property
    def budget(self) -> int:
        return self._budget

    def _size(self, key: bytes, entry: Entry) -> int:
        return len(key) + len(entry.value) + LOCAL_ENTRY_OVERHEAD

    def get(self, key: bytes) -> Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: bytes, entry: Entry) -> None:
        size = self._size(key, entry)
        if size > self._budget:
            return  # larger than the whole tier: not kept
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._used -= self._size(key, old)
            while self._entries and self._used + size > self._budget:
                k, e = self._entries.popitem(last=False)
                self._used -= self._size(k, e)
                self.evictions += 1
            self._entries[key] = entry
            self._used += size

    def delete(self, key: bytes) -> bool:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return False
            self._used -= self._size(key, entry)
            return True

    def contains(self, key: bytes) -> bool:
        return key in self._entries

    def clear(self, prefix: bytes = b"") -> int:
        with self._lock:
            doomed = [k for k in self._entries if k.startswith(prefix)]
            for k in doomed:
                self._used -= self._size(k, self._entries.pop(k))
            return len(doomed)

    def __len__(self) -> int:
        return len(self._entries)
