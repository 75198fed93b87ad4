"""Invalidation by the shared pool: another node's write or delete, or a write of this node's the pool refused,
drops the older local copies (DRAM, the SSD, any unshared copy tier) so that reads find the pool's
(docs/pool.md, "Invalidation").
"""

from __future__ import annotations

REFETCH_MAX = 100_000


class InvalidationMixin:
    """Store's reaction to the pool's invalidations (state: ``refetch``)."""

    def _invalidated_by_pool(self, key: bytes, version: int, deleted: bool) -> None:
        """An invalidation message from the pool's channel. This node's own writes come back on it too: their
        local copy is that version or newer, so they are skipped - otherwise a key demoted to the SSD before its
        own message arrived would be dropped there and read back from the pool. (Node ids are only 8 bits and
        may collide between nodes, so the pool's index of this node's writes decides, not the version's node
        bits.)"""
        pool = self.pool
        if not deleted and pool is not None and pool.wrote(key, version):
            return
        self.invalidate(key, version, deleted)

    def invalidate(self, key: bytes, version: int, deleted: bool = True) -> None:
        """The pool now holds ``version`` of ``key`` (another node's write, or a delete): drop local copies that
        are older, so every read finds the pool's (docs/pool.md, "Invalidation"). After a write, the key is read
        from the pool next (``refetch``); after a delete it is gone here too."""
        entry = self.dram.entries.get(key)
        if entry is not None:
            if entry.version >= version:
                return
            self._drop_dram(key)
        elif self.ssd is not None:
            found, pending = self.ssd.lookup_pending(key)
            if found and pending is not None and pending.version >= version:
                return
        if self.on_modified is not None:  # another node changed it: clients caching it are told
            self.on_modified(key)
        if self.ssd is not None:
            self.ssd.delete(key)
            if not deleted:
                self.refetch[key] = version
                if len(self.refetch) > REFETCH_MAX:  # bounded: the oldest fall back to "not here" (a miss)
                    del self.refetch[next(iter(self.refetch))]
        if self._private:
            self._drop_copies(key)
        pool = self.pool
        if pool is not None:
            pool._watchers.touched(key)  # a load of the old copy in flight is not installed
            pool.dropped_copies += 1

    def pool_refused(self, key: bytes, version: int) -> None:
        """The pool refused this node's write of ``version`` (a higher version is there, or a CAS mismatch): the
        local copy of it is not kept, so reads find the pool's."""
        entry = self.dram.entries.get(key)
        if entry is not None and entry.version != version:
            return
        self.invalidate(key, version + 1, deleted=False)

