"""The prefetch queue: a bounded priority queue of keys to promote from lower tiers, drained in the background."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable

from kvstrata.engine.store import Store

log = logging.getLogger("kvstrata.prefetch")


class Prefetcher:
    def __init__(self, store: Store, load: Callable[[list[bytes]], Awaitable[bool]], capacity: int = 65536,
                 batch: int = 64) -> None:
        self.store = store
        self._load = load
        self.capacity = capacity
        self.batch = batch
        self._heap: list[tuple[int, int, bytes]] = []
        self._queued: set[bytes] = set()
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self.dropped = 0
        self.promoted = 0

    def submit(self, keys: list[bytes], priority: int = 0) -> int:
        """Queue keys that are not already in DRAM or queued; higher priority goes first. Returns how many."""
        queued = 0
        entries = self.store.dram.entries
        for key in keys:
            if key in entries or key in self._queued or self.store.ssd is None:
                continue
            if len(self._heap) >= self.capacity:
                self.dropped += 1
                continue
            heapq.heappush(self._heap, (-priority, next(self._seq), key))
            self._queued.add(key)
            queued += 1
        if queued:
            self.store.stats.prefetch_queued += queued
            self._wake.set()
        return queued

    def __len__(self) -> int:
        return len(self._heap)

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._heap:
                keys = []
                while self._heap and len(keys) < self.batch:
                    keys.append(heapq.heappop(self._heap)[2])
                try:
                    await self._load(keys)
                    for key in keys:
                        if self.store.promote(key):
                            self.promoted += 1
                            self.store.stats.prefetch_done += 1
                except Exception:  # a failed prefetch must never take the server down
                    log.exception("prefetch batch failed")
                finally:
                    self.store.end_command()
                    self._queued.difference_update(keys)
