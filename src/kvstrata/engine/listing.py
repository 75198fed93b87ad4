"""Listing the keyspace across tiers: DBSIZE, SCAN (a cursor over the 4096 CRC-32 buckets DRAM and the
authoritative tiers share), KEYS and RANDOMKEY. Tiers that hold copies are not listed: their keys are listed where
the key lives (DRAM, the authoritative tier), or, with only copies below DRAM, not at all (as other nodes' pool
records are not).
"""

from __future__ import annotations

import random

from kvstrata.engine.keyspace import SCAN_BUCKETS, glob_matcher


class ListingMixin:
    """Store's keyspace listing."""

    def dbsize(self) -> int:
        n = len(self.dram)
        for tier in self._listed:
            n -= sum(1 for e in self.dram.entries.values() if e.on_ssd)  # counted in DRAM already
            n += len(tier)
        return n

    def _bucket_keys(self, bucket: int) -> set[bytes]:
        keys = set(self.dram.buckets.get(bucket, ()))
        for tier in self._listed:
            keys.update(tier.bucket_keys(bucket))
        return keys

    def _live(self, key: bytes) -> bool:
        return self.get(key, touch=False) is not None

    def scan(self, cursor: int, count: int = 10, match: bytes | None = None) -> tuple[int, list[bytes]]:
        out: list[bytes] = []
        bucket = cursor
        matches = None if match is None else glob_matcher(match)
        while bucket < SCAN_BUCKETS and len(out) < count:
            for key in self._bucket_keys(bucket):
                if (matches is None or matches(key)) and self._live(key):
                    out.append(key)
            bucket += 1
        return (0 if bucket >= SCAN_BUCKETS else bucket), out

    def keys(self, pattern: bytes) -> list[bytes]:
        out: list[bytes] = []
        matches = glob_matcher(pattern)
        for bucket in range(SCAN_BUCKETS):
            for key in self._bucket_keys(bucket):
                if matches(key) and self._live(key):
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
        for tier in self._listed:
            start = random.randrange(SCAN_BUCKETS)
            for i in range(SCAN_BUCKETS):
                for key in tier.bucket_keys((start + i) % SCAN_BUCKETS):
                    if self._live(key):
                        return key
        for key in list(self.dram.entries):
            if self._live(key):
                return key
        return None
