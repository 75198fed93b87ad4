"""Loading lower tiers off the event loop: which keys a command needs read, the loader thread's batched read of
LMDB and the pool, watch tickets so that a load raced by a write is never installed, and the overlay that serves
the loaded records to the next command. Also what a read finds below DRAM (``_below``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.markers import Corrupt
from kvstrata.engine.tiers.watch import Ticket

log = logging.getLogger("kvstrata.engine")


class PoolHit:
    """A loader result that came from the pool (so the engine counts it there and promotes it)."""

    __slots__ = ("entry",)

    def __init__(self, entry: Entry) -> None:
        self.entry = entry


class LoadTicket:
    """What ``begin_load`` hands to the loader thread and ``finish_load`` checks afterwards."""

    __slots__ = ("pool_first", "pool_ticket", "rest", "ssd_ticket")

    def __init__(self, ssd_ticket: Ticket | None, pool_ticket: Ticket | None, pool_first: list[bytes],
                 rest: list[bytes]) -> None:
        self.ssd_ticket = ssd_ticket
        self.pool_ticket = pool_ticket
        self.pool_first = pool_first
        self.rest = rest

    @property
    def stale(self) -> bool:
        return (self.ssd_ticket is not None and self.ssd_ticket.stale) or (
            self.pool_ticket is not None and self.pool_ticket.stale)


class LoaderMixin:
    """Store's loads (state: ``_overlay``, ``_origin``, ``sync_reads``)."""

    def missing(self, keys: Iterable[bytes]) -> list[bytes]:
        """Keys whose state is unknown without reading a lower tier (not in DRAM nor in pending writes)."""
        ssd = self.ssd
        if ssd is None:
            # DRAM + pool (a diskless node): a key not in DRAM is looked up in the pool, off the loop.
            pool = self.pool
            if pool is None or not pool.active:
                return []
            entries = self.dram.entries
            return [k for k in keys if k not in entries and k not in pool.pending]
        entries = self.dram.entries
        pending = ssd.pending
        if ssd.flush_pending:
            return []
        refetch = self.refetch if self.pool is not None and self.pool.active else ()
        return [k for k in keys if k not in entries and (k not in pending or k in refetch)]

    def begin_load(self, keys: list[bytes]) -> LoadTicket:
        """Watch ``keys`` and plan their load: which are read from the pool first, which from LMDB first."""
        ssd = self.ssd
        pool = self.pool
        if pool is None or not pool.active:
            assert ssd is not None
            return LoadTicket(ssd.watch(keys), None, [], list(keys))
        if ssd is None:
            return LoadTicket(None, pool.watch(keys), [], list(keys))
        first: list[bytes] = []
        rest: list[bytes] = []
        if self.pool_first:
            # Keys this node put in the pool (their newest local version) are read there first.
            index = pool.index
            refetch = self.refetch
            for k in keys:
                (first if (k in index or k in refetch) and k not in pool.pending else rest).append(k)
        else:
            rest = list(keys)
        return LoadTicket(ssd.watch(keys), pool.watch(keys), first, rest)

    def read_lower(self, ticket: LoadTicket) -> dict[bytes, Any]:
        """The loader (a worker thread): LMDB records and pool records of a planned load, in tier order.

        Results are Entry/Corrupt/None from the SSD tier, or PoolHit for a record found in the pool. The SSD is
        read for every key the pool did not answer; the pool for every key LMDB does not hold.
        """
        ssd = self.ssd
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
        if ssd is not None:
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
        if ticket.ssd_ticket is not None and self.ssd is not None:
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

    def loaded(self, key: bytes) -> bool:
        """Whether a key's lower-tier state is known without reading LMDB (DRAM, pending writes, the overlay)."""
        if key in self.dram.entries:
            return True
        if self.refetch and key in self.refetch and self.pool is not None and self.pool.active:
            return self._overlay is not None and key in self._overlay
        if self.ssd is None:
            pool = self.pool
            if pool is None or not pool.active or key in pool.pending:
                return True
        elif self.ssd.lookup_pending(key)[0]:
            return True
        return self._overlay is not None and key in self._overlay

    def end_command(self) -> None:
        self._overlay = None

    def keep_overlay(self, keys: list[bytes]) -> tuple[dict[bytes, Any], Ticket] | None:
        """Keep the current overlay for a later run of the same command (a STRONG read suspended for the pool),
        watched so that an SSD change of these keys in between invalidates it."""
        if self._overlay is None:
            return None
        # Diskless (DRAM + pool): the overlay holds the pool records the loader read, watched on the pool.
        tier = self.ssd if self.ssd is not None else self.pool
        if tier is None:
            return None
        return dict(self._overlay), tier.watch(keys)

    def restore_overlay(self, kept: tuple[dict[bytes, Any], Ticket], *, install: bool = True) -> bool:
        """Reinstall a kept overlay if nothing changed its keys on the SSD since; False when it went stale."""
        overlay, ticket = kept
        tier = self.ssd if self.ssd is not None else self.pool
        assert tier is not None
        tier.unwatch(ticket)
        if ticket.stale or not install:
            return False
        self._overlay = overlay
        return True

    def _below(self, key: bytes) -> Entry | None:
        """The lower tiers' entry for a key that is not in DRAM, unexpired, or None.

        ``self._origin`` says where it came from: "ssd" (pending writes, the loader's overlay or a synchronous
        LMDB read) or "pool" (only ever from the loader's overlay: the pool is never read on the event loop).
        """
        ssd = self.ssd
        self._origin = "ssd"
        if ssd is None:
            # DRAM + pool: only what the loader read from the pool (the pool is never read on the loop).
            overlay = self._overlay
            if overlay is not None:
                hit = overlay.get(key)
                if hit.__class__ is PoolHit:
                    return self._pool_found(key, hit.entry)
            return None
        if self.refetch and key in self.refetch and self._overlay is not None:
            # Invalidated by another node's write: the pool's record, as the loader read it, comes first.
            hit = self._overlay.get(key)
            if hit.__class__ is PoolHit:
                return self._pool_found(key, hit.entry)
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

    def refresh_from_pool(self, found: dict[bytes, Entry | None]) -> int:
        """STRONG reads: adopt each pool record that is newer than the local copy; returns how many."""
        done = 0
        now = self.clock.now_ms()
        for key, rec in found.items():
            if rec is None:
                continue
            if not isinstance(rec, Entry):  # a tombstone newer than the local copy (pool.PoolDeleted)
                self.invalidate(key, rec.version)
                continue
            if rec.expired(now):
                continue
            current = self.get(key, touch=False)
            if current is not None and current.version >= rec.version:
                continue
            self.observe_version(rec.version)
            if self.adopt(key, rec):
                done += 1
        return done
