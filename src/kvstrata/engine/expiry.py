"""Expiry: lazy in every tier, active in DRAM (a heap of expiry times, bounded work per tick) and in each lower
tier that reclaims its own (``sweep_expired``: the SSD writer's sweep of the ``exp`` index).
"""

from __future__ import annotations

import heapq


class ExpiryMixin:
    """Store's active expiry (state: ``_ttl_heap``)."""

    def _expire_dram(self, key: bytes) -> None:
        entry = self._drop_dram(key)
        if entry is None:
            return
        self.stats.expired_keys += 1
        if entry.on_ssd and self.keeper is not None:
            self.keeper.delete(key)
        if self.on_event is not None:
            self.on_event(b"expired", key)

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

    def sweep_lower(self, limit: int = 1000) -> None:
        """Let each lower tier reclaim its expired records (bounded work per tier per call)."""
        now = self.clock.now_ms()
        for tier in self.lower:
            tier.sweep_expired(now, limit)

    sweep_ssd = sweep_lower  # the name the server and tests used first
