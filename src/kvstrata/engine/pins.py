"""Hot keys: patterns pinned in DRAM (TAIR.KV.MARKHOT), capped at ``hot-max-fraction`` of the budget.
"""

from __future__ import annotations

from kvstrata.engine.entry import Entry
from kvstrata.engine.keyspace import SCAN_BUCKETS, glob_match, glob_matcher


class PinsMixin:
    """Store's pins (state: ``hot``)."""

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
        matches = glob_matcher(pattern)
        for key, entry in list(self.dram.entries.items()):
            if not entry.pinned and matches(key) and self._pin(key, entry):
                pinned += 1
        below: list[bytes] = []
        for tier in self._listed:
            for bucket in range(SCAN_BUCKETS):
                below.extend(k for k in tier.bucket_keys(bucket)
                             if k not in self.dram.entries and matches(k))
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
