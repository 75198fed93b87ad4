"""Resync with the shared pool: find the invalidations this node missed and apply them.

Invalidations are PUBLISH messages: fire and forget. While this node's subscription is down (its pool node died or
failed over, a network cut) and while the node itself was stopped, other nodes' writes and deletes reach the pool
but not this node, whose local copies (DRAM, SSD) would stay readable under EVENTUAL, old values and deleted keys
alike, until written or expired here. So every subscription the pool takes (``PoolTier.subscriptions``, the first
after a start included) asks for a resync: each local copy's version is compared with the header of the pool's
record of the key (``GETRANGE``, in batches, off the event loop), and a copy the pool holds a newer version or a
tombstone of is dropped as the missed message would have dropped it. Messages arriving meanwhile are applied as
usual, so a finished resync leaves the node as if it had missed nothing; until then a stale copy can still be read
(INFO ``tier_pool`` ``resync_running``).

The walk: DRAM as it was at the start, then the SSD records in LMDB order, then the keys that came into DRAM
meanwhile (a promotion can move a record the SSD walk had not reached yet). A local copy is dropped only if, on the
loop at that moment, it is still older than the pool's version: a client's write meanwhile is newer and stays. A
resync that meets a pool fault is tried again (``RETRY_MIN`` doubling to ``RETRY_MAX``); one overtaken by a newer
subscription starts over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from kvstrata.engine.entry import Meta
from kvstrata.engine.tiers.pool import FLAG_TOMBSTONE

if TYPE_CHECKING:
    from kvstrata.engine.tiers.pool import PoolTier

log = logging.getLogger("kvstrata.pool")

# Keys per pool pipeline (and per SSD read transaction): a batch is one round trip per master, a few ms.
BATCH = 512
RETRY_MIN = 1.0
RETRY_MAX = 60.0

Head = tuple[int, int, int]


class PoolResync:
    """The server's resyncs with its pool (one at a time)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.store = server.store
        self.task: asyncio.Future[None] | None = None
        self.retry_at = 0.0
        self._delay = RETRY_MIN

    def due(self, now: float) -> bool:
        """Whether a resync should start now: a subscription no resync has followed yet, the subscription up (so
        nothing is missed from here on) and the pool usable."""
        pool: PoolTier | None = self.store.pool
        return (pool is not None and self.task is None and pool.subscriptions > pool.resynced and pool.subscribed
                and pool.active and now >= self.retry_at)

    def start(self) -> None:
        pool = self.store.pool
        assert pool is not None
        pool.resync_running = 1
        task = asyncio.ensure_future(self._run(pool, pool.subscriptions))
        self.task = task
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _run(self, pool: PoolTier, subscription: int) -> None:
        t0 = time.monotonic()
        checked, dropped = pool.resync_checked, pool.resync_dropped
        try:
            finished = await self._walk(pool, subscription)
        except Exception as exc:
            finished = False
            pool.resync_failures += 1
            self.retry_at = time.monotonic() + self._delay
            log.warning("pool resync failed (%s: %s); trying again in %.0f s", type(exc).__name__, exc, self._delay)
            self._delay = min(RETRY_MAX, self._delay * 2)
        finally:
            pool.resync_running = 0
            self.task = None
        if finished:
            pool.resynced = subscription
            self._delay = RETRY_MIN
            pool.resyncs += 1
            pool.resync_last_ms = round((time.monotonic() - t0) * 1000)
            log.info("pool resync done in %.3f s: %d local copies checked, %d stale ones dropped",
                     time.monotonic() - t0, pool.resync_checked - checked, pool.resync_dropped - dropped)

    async def _walk(self, pool: PoolTier, subscription: int) -> bool:
        """The resync's walk; False when a newer subscription overtook it (that one's resync starts over)."""
        store = self.store
        loop = asyncio.get_running_loop()
        executor = self.server._prefetch_io  # background reads: a client's load never queues behind a batch
        first = list(store.dram.entries.items())
        seen = {key for key, _ in first}
        for i in range(0, len(first), BATCH):
            pairs = [(key, entry.version) for key, entry in first[i:i + BATCH]]
            heads = await loop.run_in_executor(executor, pool.read_heads, [k for k, _ in pairs], "resync")
            if not self._apply(pool, subscription, pairs, heads):
                return False
        ssd = store.ssd
        if ssd is not None:
            after: bytes | None = None
            while True:
                pairs, heads, after = await loop.run_in_executor(executor, _ssd_batch, ssd, pool, after)
                if not self._apply(pool, subscription, pairs, heads):
                    return False
                if after is None:
                    break
        late = [(key, entry.version) for key, entry in list(store.dram.entries.items()) if key not in seen]
        for i in range(0, len(late), BATCH):
            pairs = late[i:i + BATCH]
            heads = await loop.run_in_executor(executor, pool.read_heads, [k for k, _ in pairs], "resync")
            if not self._apply(pool, subscription, pairs, heads):
                return False
        return True

    def _apply(self, pool: PoolTier, subscription: int, pairs: list[tuple[bytes, int]],
               heads: list[Head | None]) -> bool:
        """On the loop: drop the local copies the pool holds something newer of. False when a newer subscription
        came meanwhile (its own resync will look again)."""
        if pool.subscriptions != subscription:
            return False
        pool.resync_checked += len(pairs)
        for (key, seen_version), head in zip(pairs, heads, strict=True):
            if head is None or head[0] <= seen_version:
                continue
            local = self._local_version(key)
            if local is None or local >= head[0]:
                continue  # gone meanwhile, or written here since: newer than the pool's
            self.store.invalidate(key, head[0], deleted=bool(head[2] & FLAG_TOMBSTONE))
            pool.resync_dropped += 1
        return True

    def _local_version(self, key: bytes) -> int | None:
        """The version of this node's copy of ``key`` now (DRAM, a queued SSD write, or the SSD record's header:
        read on the loop, only for the few keys found stale)."""
        store = self.store
        entry = store.dram.entries.get(key)
        if entry is not None:
            return int(entry.version)
        ssd = store.ssd
        if ssd is None:
            return None
        known, pending = ssd.lookup_pending(key)
        if known:
            return None if pending is None else int(pending.version)
        meta = ssd.probe_many([key]).get(key)
        return meta.version if isinstance(meta, Meta) else None


def _ssd_batch(ssd: Any, pool: PoolTier, after: bytes | None
               ) -> tuple[list[tuple[bytes, int]], list[Head | None], bytes | None]:
    """In a worker thread: the next batch of SSD records' versions and the pool's headers of those keys."""
    pairs, nxt = ssd.committed_versions(after, BATCH)
    heads = pool.read_heads([key for key, _ in pairs], "resync") if pairs else []
    return pairs, heads, nxt
