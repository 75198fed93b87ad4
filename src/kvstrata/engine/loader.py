"""Loading lower tiers off the event loop: which keys a command needs read, the loader thread's batched read of
LMDB and the pool (or, for SSD records in the page cache, a read on the loop itself: ``read_inline``), watch
tickets so that a load raced by a write is never installed, and the overlay that serves the loaded records to the
next command. Also what a read finds below DRAM (``_below``), and probes: commands that
need only a key's metadata (EXISTS, TYPE, the TTL family: ``load="meta"``) have the loader read record headers
(``probe_lower``) into a second overlay (``_probed``) and answer from it (``probe``), the values left unread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kvstrata.engine.entry import Entry, Meta
from kvstrata.engine.tiers.markers import Corrupt
from kvstrata.engine.tiers.watch import Ticket

log = logging.getLogger("kvstrata.engine")
_UNREAD = object()  # a key the loader did not read


class CopyHit:
    """A loader result from a tier that holds copies (the pool...), so the engine counts it there and adopts it."""

    __slots__ = ("entry", "tier")

    def __init__(self, entry: Entry | Meta, tier: str = "pool") -> None:
        self.entry = entry
        self.tier = tier


PoolHit = CopyHit  # the name the pool's loads had first


class LoadTicket:
    """What ``begin_load`` hands to the loader thread and ``finish_load`` checks afterwards: a watch ticket per
    tier read, and the plan: per tier in order, the keys read there first (None: every key not found yet)."""

    __slots__ = ("keys", "plan", "tickets")

    def __init__(self, keys: list[bytes], plan: list[tuple[Any, list[bytes] | None]],
                 tickets: list[tuple[Any, Ticket]]) -> None:
        self.keys = keys
        self.plan = plan
        self.tickets = tickets

    @property
    def stale(self) -> bool:
        return any(t.stale for _, t in self.tickets)


INLINE_MAX = 256 * 1024  # the default of `ssd-inline-max`


class LoaderMixin:
    """Store's loads (state: ``_overlay``, ``_probed``, ``sync_reads``; ``inline_max``: ``read_inline``'s cap)."""

    inline_max = INLINE_MAX

    def missing(self, keys: Iterable[bytes]) -> list[bytes]:
        """Keys whose state is unknown without reading a lower tier (not in DRAM nor in pending writes)."""
        loads = [t for t in self._loaded_tiers if t.active]
        if not loads:
            return []  # DRAM only, in-process tiers only, or a degraded pool alone: nothing to read off the loop
        entries = self.dram.entries
        keeper = self.keeper
        if keeper is not None and not keeper.in_process:
            if getattr(keeper, "flush_pending", False):
                return []
            look = keeper.lookup_pending
            refetch = self.refetch if self.pool is not None and self.pool.active else ()
            return [k for k in keys if k not in entries and (k in refetch or not look(k)[0])]
        # Only copies below DRAM (a diskless node): a key not in DRAM nor pending is looked up, off the loop.
        return [k for k in keys if k not in entries and not any(t.lookup_pending(k)[0] for t in loads)]

    def begin_load(self, keys: list[bytes]) -> LoadTicket:
        """Watch ``keys`` and plan their load: tiers in order; a tier holding copies above the authoritative one
        is read first only for the keys it is likely to hold (the pool: this node's records), and after the
        tiers below for the rest."""
        keeper = self.keeper
        plan: list[tuple[Any, list[bytes] | None]] = []
        tickets: list[tuple[Any, Ticket]] = []
        below = False
        for tier in self._loaded_tiers:
            if not tier.active:
                continue
            tickets.append((tier, tier.watch(keys)))
            if tier is keeper:
                below = True
            if keeper is None or tier.authoritative or below:
                plan.append((tier, None))
                continue
            refetch = self.refetch
            look = tier.lookup_pending
            plan.append((tier, [k for k in keys if (k in refetch or tier.likely(k)) and not look(k)[0]]))
        return LoadTicket(list(keys), plan, tickets)

    def read_inline(self, ticket: LoadTicket, probe: bool = False) -> dict[bytes, Any] | None:
        """``read_lower`` (``probe_lower`` with ``probe``) on the caller's thread, the event loop, when that cannot
        wait for a disk: the load reads one tier alone, and that tier's ``read_resident`` answers (the SSD's, when
        every record's pages are in memory), at most ``inline_max`` bytes in all (``ssd-inline-max``). None, having read nothing the caller must undo, when not:
        the caller then reads in a loader thread, as every load did before. A load done here costs a few
        microseconds a record where a thread's cost two thread switches and, while the loop runs Python, a wait for
        the GIL for each record (py-lmdb lets go of it inside every read)."""
        if self.inline_max <= 0 or len(ticket.plan) != 1:
            return None
        tier, first = ticket.plan[0]
        return None if first is not None else tier.read_resident(ticket.keys, self.inline_max, probe)

    def probe_lower(self, ticket: LoadTicket) -> dict[bytes, Any]:
        """The loader: record headers (``Meta``) of a planned load, as ``read_lower`` reads records (a tier
        without a cheaper probe answers whole records, which are then used as a load's would be)."""
        return self.read_lower(ticket, probe=True)

    def read_lower(self, ticket: LoadTicket, probe: bool = False) -> dict[bytes, Any]:
        """The loader (a worker thread): the records of a planned load, tier by tier in order.

        Results are Entry/Corrupt/None from the authoritative tier, or CopyHit for a record found in a tier that
        holds copies. A tier is read for every key the tiers before it did not answer; one read first for some
        keys (``plan``) is read again at the end for the keys the others did not hold.
        """
        found: dict[bytes, Any] = {}
        for tier, first in ticket.plan:
            self._read_tier(tier, first if first is not None else
                            [k for k in ticket.keys if found.get(k) is None], found, probe)
        for tier, first in ticket.plan:
            if first is not None:
                done = set(first)
                self._read_tier(tier, [k for k in ticket.keys if k not in done and found.get(k) is None], found,
                                probe)
        return found

    @staticmethod
    def _read_tier(tier: Any, keys: list[bytes], found: dict[bytes, Any], probe: bool = False) -> None:
        if not keys:
            return
        got = tier.probe_many(keys) if probe else tier.read_many(keys)
        if tier.authoritative:
            found.update(got)
            return
        for k in keys:
            rec = got.get(k)
            if rec is not None and not isinstance(rec, Corrupt):
                found[k] = CopyHit(rec, tier.name)

    def cancel_load(self, ticket: LoadTicket) -> None:
        for tier, watch in ticket.tickets:
            tier.unwatch(watch)

    def finish_load(self, ticket: LoadTicket, found: dict[bytes, Any]) -> bool:
        """Install loaded records as the overlay for the next command; False if a write raced the load."""
        self.cancel_load(ticket)
        if ticket.stale:
            return False
        self._overlay = found
        return True

    def finish_probe(self, ticket: LoadTicket, found: dict[bytes, Any]) -> bool:
        """Install probed headers for the next command (``probe``); False if a write raced the probe."""
        self.cancel_load(ticket)
        if ticket.stale:
            return False
        self._probed = found
        return True

    def probed(self, key: bytes) -> bool:
        """Whether ``probe`` answers a key without reading a tier (DRAM, pending writes, the probed headers)."""
        if not self.missing((key,)):
            return True
        return self._probed is not None and key in self._probed

    def probe(self, key: bytes) -> Entry | Meta | None:
        """A key's version, expiry and value length (``.value_len``) as ``get(key, touch=False)`` finds them, but
        from the probed record headers when the command's keys were probed: no value read below DRAM.

        An expired record is dropped as a read drops it; a record from a tier that had no cheaper probe (a whole
        copy) is adopted into DRAM as ``get`` adopts it. Keys nobody probed are read as ``get`` reads them.
        """
        probed = self._probed
        if probed is None or key in self._entries:
            return self.get(key, touch=False)
        found, origin = self._lookup(key, probed)
        if found.__class__ is Entry and not self._by_name[origin].authoritative:
            self.tier_stats[origin].hits += 1
            self.adopt(key, found, origin)  # type: ignore[arg-type]
        return found

    def probe_below(self, key: bytes) -> Entry | Meta | None:
        """``_below`` for a key the command probed (its header, no value read), else ``_below``."""
        probed = self._probed
        if probed is not None and key in probed:
            return self._lookup(key, probed)[0]
        return self._below(key)

    def loaded(self, key: bytes) -> bool:
        """Whether a key's lower-tier state is known without reading a tier (DRAM, pending writes, the overlay)."""
        if not self.missing((key,)):
            return True
        return self._overlay is not None and key in self._overlay

    def unknown(self, keys: list[bytes]) -> set[bytes]:
        """Those of ``keys`` that are not ``loaded``: one pass over them all (a walk's predicted chunks, checked
        on a GET's path), where ``loaded`` costs a call a key."""
        overlay = self._overlay
        missing = self.missing(keys)
        return {k for k in missing if k not in overlay} if overlay else set(missing)

    def end_command(self) -> None:
        self._overlay = None
        self._probed = None

    def _overlay_tier(self) -> Any:
        """The tier whose changes invalidate a kept overlay: the authoritative one, else the first read."""
        return self.keeper if self.keeper is not None else next(iter(self._loaded_tiers), None)

    def keep_overlay(self, keys: list[bytes]) -> tuple[dict[bytes, Any], Ticket] | None:
        """Keep the current overlay for a later run of the same command (a STRONG read suspended for the pool),
        watched so that a change of these keys below DRAM in between invalidates it."""
        if self._overlay is None:
            return None
        tier = self._overlay_tier()
        if tier is None:
            return None
        return dict(self._overlay), tier.watch(keys)

    def restore_overlay(self, kept: tuple[dict[bytes, Any], Ticket], *, install: bool = True) -> bool:
        """Reinstall a kept overlay if nothing changed its keys below DRAM since; False when it went stale."""
        overlay, ticket = kept
        tier = self._overlay_tier()
        assert tier is not None
        tier.unwatch(ticket)
        if ticket.stale or not install:
            return False
        self._overlay = overlay
        return True

    def _below(self, key: bytes) -> Entry | None:
        """The lower tiers' entry for a key that is not in DRAM (``lookup_below`` without the tier's name)."""
        return self.lookup_below(key)[0]

    def lookup_below(self, key: bytes) -> tuple[Entry | None, str]:
        return self._lookup(key, self._overlay)  # type: ignore[return-value]

    def _lookup(self, key: bytes, overlay: dict[bytes, Any] | None) -> tuple[Entry | Meta | None, str]:
        """(entry, the name of the tier it came from) for a key that is not in DRAM, unexpired; (None, "").

        The tiers in order. The authoritative tier's pending writes come first (they
        are newer than anything read); then, in order, an in-process tier is looked up directly, a tier read
        off the loop only through the loader's overlay (the pool is never read on the event loop), and the
        authoritative tier through the overlay or, for a key nobody loaded, a synchronous read. ``_lookup`` does
        the same walk over a given overlay: the loaded records, or the probed headers (``probe``).
        """
        if self.refetch and key in self.refetch and overlay is not None:
            # Invalidated by another node's write: the pool's record, as the loader read it, comes first.
            hit = overlay.get(key)
            if hit.__class__ is CopyHit:
                return self._copy_found(key, hit)
        keeper = self.keeper
        if keeper is not None:
            known, found = keeper.lookup_pending(key)
            if known:
                return self._live_below(key, keeper, found), keeper.name
        hit = overlay.get(key, _UNREAD) if overlay is not None else _UNREAD
        for tier in self.lower:
            if tier is keeper:
                if hit.__class__ is CopyHit:
                    continue  # the loader found nothing here
                if hit is _UNREAD:
                    if tier.in_process:
                        continue
                    self.sync_reads += 1
                    hit = tier.read(key)
                if isinstance(hit, Corrupt):
                    self.tier_stats[tier.name].corrupt_reads += 1
                    log.error("corrupt %s record for key %r (%s): dropped", tier.name.upper(), key[:64], hit.reason)
                    tier.delete(key)
                    if overlay is not None:
                        overlay[key] = None
                    return None, ""
                if hit is not None:
                    return self._live_below(key, tier, hit), tier.name
            elif tier.in_process:
                found = tier.lookup_pending(key)[1]
                if found is not None and not found.expired(self.clock.now_ms()):
                    self.observe_version(found.version)
                    return found, tier.name
            elif hit.__class__ is CopyHit and hit.tier == tier.name:
                return self._copy_found(key, hit)
        return None, ""

    def _live_below(self, key: bytes, tier: Any, found: Entry | Meta | None) -> Entry | Meta | None:
        if found is not None and found.expired(self.clock.now_ms()):
            tier.delete(key)
            self.stats.expired_keys += 1
            if self.on_event is not None:
                self.on_event(b"expired", key)
            return None
        return found

    def _copy_found(self, key: bytes, hit: CopyHit) -> tuple[Entry | Meta | None, str]:
        """A record the loader read from a tier holding copies, unless a write or delete left here since."""
        tier = self._by_name.get(hit.tier)
        entry: Entry | Meta | None = hit.entry
        if tier is not None:
            known, pending = tier.lookup_pending(key)
            if known:
                # A write or delete of this key left here after the loader read the tier: it is newer.
                entry = pending
                if entry is None:
                    return None, ""
        assert entry is not None
        if entry.expired(self.clock.now_ms()):
            return None, ""
        self.observe_version(entry.version)
        return entry, hit.tier

    def local_versions(self, keys: Iterable[bytes]) -> dict[bytes, int]:
        """The version of each key in the local tiers (0 when absent), for a STRONG pool check."""
        out: dict[bytes, int] = {}
        for key in keys:
            entry = self.dram.entries.get(key)
            if entry is None:
                entry, origin = self.lookup_below(key)
                if entry is not None and not self._by_name[origin].authoritative:
                    self.tier_stats[origin].hits += 1
                    if not self.adopt(key, entry, origin):
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
