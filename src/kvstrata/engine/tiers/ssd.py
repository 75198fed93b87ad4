"""The SSD tier on LMDB: crash-safe, memory-mapped, and its own index, so everything is found after a restart.

Layout (sub-databases of one LMDB environment):
  data   bucket(2, BE) + tag + key  -> record (header, [full key], value)
  order  seq(8, BE)                 -> data key      (oldest first: the last tier's eviction order under ``fifo``,
                                                     and how a ranked victim's record is found, ``ssd_rank``)
  exp    expire_at(8, BE) + data key -> b""          (background reclaim of expired records)
  meta   name                        -> value        (format, used bytes, record count, version high-water)

Writes go through a queue to one writer thread that applies everything waiting in one write transaction (group
commit) and forces it to disk according to ``fsync``. Until a write is committed it sits in ``pending`` (the
newest state of each key, or None for a delete) so readers on the event loop never see a half-moved entry and
never block on the disk for a key that is on its way down. Reads are LMDB read transactions, safe from any
thread; the server runs them in a loader thread, or on the event loop when every page they copy is in memory
and they are short (``read_resident``), where a thread would cost more than the read.

Which record leaves when the budget is reached is ``--ssd-policy``'s choice: ``fifo``, the oldest write first
(the ``order`` index alone), or a ranking of the records by access (``ssd_rank``: reads and returns count).

The record format is ``ssd_record``'s, the writer thread's work ``ssd_writer``'s; this module is the tier itself
(state, reads, queuing writes, ``INFO``) and re-exports the names other modules import from here.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable
from ctypes import string_at
from typing import Any

import lmdb

from kvstrata.engine.entry import Entry, Meta
from kvstrata.engine.keyspace import bucket_of
from kvstrata.engine.tiers.base import TierRoles
from kvstrata.engine.tiers.keyfilter import KeyFilter, KeyIndex
from kvstrata.engine.tiers.markers import Corrupt, Tombstone
from kvstrata.engine.tiers.pause import EVERY_US, Pacer
from kvstrata.engine.tiers.resident import address, resident_at
from kvstrata.engine.tiers.ssd_rank import SsdRanking, create_ssd_ranking
from kvstrata.engine.tiers.ssd_record import (
    _BUCKET,
    _HEADER,
    _U64,
    FORMAT,
    HEADER_SIZE,
    MAGIC,
    MAX_INLINE_KEY,
    RECORD_OVERHEAD,
    _record_key,
    data_key,
    decode_meta,
    decode_record,
    encode_record,
)
from kvstrata.engine.tiers.ssd_writer import _DEL, _FLUSH, _META, _PUT, _SWEEP, _SYNC, SsdWriter
from kvstrata.engine.tiers.watch import Ticket, Watchers

log = logging.getLogger("kvstrata.ssd")

# Names other modules import from here (ssd_check, commands/observe.py, tests).
__all__ = [
    "FORMAT", "HEADER_SIZE", "MAGIC", "MAX_INLINE_KEY", "RECORD_OVERHEAD", "Corrupt", "SsdTier", "_BUCKET", "_U64",
    "_record_key", "data_key", "decode_record", "encode_record",
]


# Records whose place in the map is remembered for ``read_resident``: the most recently written or read (~200 bytes
# each).
LOCATIONS = 1 << 16


def _remember(places: OrderedDict[bytes, Any], lkey: bytes, place: Any) -> None:
    """Remember a record's place as the most recent of ``places``, which keep the LOCATIONS most recent (the
    writer thread and readers both call this: each step is one dict operation, atomic under the GIL)."""
    places.pop(lkey, None)
    places[lkey] = place
    if len(places) > LOCATIONS:
        try:
            places.popitem(last=False)
        except KeyError:  # emptied meanwhile (a flush)
            pass


class SsdTier(SsdWriter, TierRoles):
    """LMDB-backed last tier with a byte budget; over it, evicts by ``policy`` (``fifo``: oldest write first)."""

    name = "ssd"
    authoritative = True  # holds a key's only copy once demoted (write-back); see tiers/base.py

    def __init__(
        self,
        path: str,
        budget: int,
        *,
        fsync: str = "everysec",
        threaded: bool = True,
        on_commit: Callable[[int, list[bytes]], None] | None = None,
        policy: str = "fifo",
    ) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.budget = budget
        self.fsync = fsync
        # Room for LMDB's page and B-tree overhead beyond the data budget.
        map_size = max(budget * 2, budget + 64 * 1024**2)
        # fsync=always: LMDB's own synchronous commit, which writes and flushes the data pages before the meta
        # page that makes them visible (what a power loss needs). Otherwise commits are not flushed, and
        # everysec/barriers call env.sync (see docs/architecture.md, "Durability").
        durable = fsync == "always"
        self.env = lmdb.open(
            path, map_size=map_size, max_dbs=4, sync=durable, metasync=durable, max_readers=256, readahead=False
        )
        # Not writemap: with a memory-mapped writable file a full disk is a SIGBUS; with pwrite it is an error.
        self._data = self.env.open_db(b"data")
        self._order = self.env.open_db(b"order")
        self._exp = self.env.open_db(b"exp")
        self._meta = self.env.open_db(b"meta")
        # None under fifo; else the ranking of the records on disk (owned by the writer thread, ssd_rank.py).
        self._rank: SsdRanking | None = create_ssd_ranking(policy)
        with self.env.begin(write=True) as txn:
            fmt = txn.get(b"format", db=self._meta)
            if fmt is None:
                txn.put(b"format", _U64.pack(FORMAT), db=self._meta)
            elif _U64.unpack(fmt)[0] > FORMAT:
                raise RuntimeError(f"{path}: SSD tier format {_U64.unpack(fmt)[0]} is newer than this kvstrata")
            self.used = self._meta_int(txn, b"used")
            self.count = self._meta_int(txn, b"count")
            self.version_high_water = self._meta_int(txn, b"version_hw")
            with txn.cursor(db=self._order) as cur:
                self._seq = _U64.unpack(cur.key())[0] + 1 if cur.last() else 1
            if self._rank is not None:
                self._rebuild_rank(txn)
        self.pending: dict[bytes, Entry | Tombstone] = {}
        self._pending_groups: dict[int, list[tuple[bytes, Entry | Tombstone]]] = {}
        self._pending_stamp = (-1, -1)
        self.flush_pending = False
        self.committed_seq = 0
        self.failed: dict[int, str] = {}
        # Writes whose batch failed: still in ``pending`` (readable), retried by retry_stuck().
        self.stuck: dict[bytes, Entry] = {}
        self.stuck_bytes = 0
        # Failed writes queued again by retry_stuck() and not yet committed. The arena keeps the slots of their
        # values (and of ``stuck``'s) alive: they were dropped before the retry was queued, so the writer's
        # sequence numbers alone would let them be freed while ``pending`` and the writer thread still read them.
        self.retrying: dict[bytes, Entry] = {}
        self.degraded: str | None = None
        # Bytes of failed writes held in memory beyond which demotions are refused (set by the server).
        self.stuck_limit = 64 * 1024 * 1024
        self.evictions = 0
        # Keys looked up in LMDB (loader, synchronous reads): a key is read once per load. Updated from worker
        # threads under the GIL; a statistic, not a synchronisation point.
        self.reads = 0
        # Keys whose record header alone was looked up (EXISTS, TYPE, the TTL family: ``probe_many``).
        self.probes = 0
        # Of reads and probes, those done on the event loop (``read_resident``); loads that could have been but
        # met a record's pages on the disk, its place unknown, or more bytes than the cap, and went to a thread.
        self.inline_reads = 0
        self.inline_declined = 0
        self.inline_moved = 0
        # Of the declined, those with a record whose place no read or write has found (or no record at all that
        # the key filter could not rule out).
        self.inline_unknown = 0
        # data key -> address * 2**32 + length of its record in the map, as the writer (after its commit) or the
        # last read found it. Read on the event loop, learnt by the writer and loader threads, forgotten by the
        # writer as it removes a record (``_remove``):
        # single dict operations, atomic under the GIL. A stale place only misleads the residency check, which
        # ``read_resident`` then notices; the read itself always looks the record up.
        self._where: OrderedDict[bytes, int] = OrderedDict()
        # data key -> (address, length, write sequence number) of the records the writer thread found right after
        # committing them (``_learn_written``): read on the event loop straight out of the map, without py-lmdb
        # (which lets go of the GIL in every call, and a loop that lets go of it waits for the writer's batch to
        # get it back), and verified (sequence number, checksum) before they are used. Only the writer adds to it
        # (a loader's snapshot may predate a rewrite it has not seen), and it forgets a record before removing it
        # (``_remove``): so while a place is here, its pages hold that record, not yet freed for reuse (a small
        # record moved with its leaf page keeps its old copy until a later transaction reuses the page, and a
        # read that meets a reused page fails the verification and goes the lookup's way).
        self._direct: OrderedDict[bytes, tuple[int, int, int]] = OrderedDict()
        self.inline_direct = 0
        # Damaged LMDB pages met by reads and listings (each occurrence counts).
        self.unreadable_pages = 0
        self.corrupt_reads = 0
        self.expired = 0
        self.write_errors = 0
        # Committed puts and their bytes (queued size): what the tier costs the disk in writes.
        self.writes = 0
        self.write_bytes = 0
        self.on_commit = on_commit
        self._watchers = Watchers()
        self._deliver: Callable[[Callable[[], None]], None] = lambda fn: fn()
        self._closed = False
        self._flush_seq = 0
        # The writer thread's pauses for the event loop (``ssd-writer-pause``); a writer run on the caller's
        # thread (unit tests) would only pause the caller.
        self.pacer = Pacer(0)
        self._start_writer(threaded, "kvstrata-ssd-writer", None)
        self.set_writer_pause(EVERY_US)
        # The keys the tier may hold (keyfilter.py): a read of a key it rules out is answered without LMDB.
        self.key_filter = KeyIndex(lambda capacity: self._scan(capacity), self._filter_size,
                                   lambda: [data_key(k) for k in list(self.pending)], threaded)
        self.key_filter.start()

    def set_writer_pause(self, every_us: int) -> None:
        """``ssd-writer-pause``: the writer thread's work between two pauses (tiers/pause.py). A writer run on the
        caller's thread (``threaded=False``) never pauses: it would only pause the caller."""
        self.pacer.every_us = every_us if self._threaded else 0

    def _meta_int(self, txn: lmdb.Transaction, name: bytes) -> int:
        raw = txn.get(name, db=self._meta)
        return 0 if raw is None else _U64.unpack(raw)[0]

    def set_delivery(self, deliver: Callable[[Callable[[], None]], None]) -> None:
        """How the writer thread hands completions to the owner's thread (e.g. loop.call_soon_threadsafe)."""
        self._deliver = deliver

    # ---- the key filter (keyfilter.py) ----
    def _scan(self, capacity: int) -> KeyFilter | None:
        """Every data key on disk in a filter of ``capacity`` (any thread); None if the tier closed meanwhile or
        a page could not be read (the filter in use, if any, stays: it errs only towards reading)."""
        out = KeyFilter(capacity)
        chunk: list[bytes] = []
        try:
            with self.env.begin() as txn, txn.cursor(db=self._data) as cur:
                for lkey in cur.iternext(keys=True, values=False):
                    chunk.append(lkey)
                    if len(chunk) == 65536:
                        if self._closed:
                            return None
                        out.add_many(chunk)
                        chunk = []
        except lmdb.Error as exc:
            self._unreadable("listing its keys for the key filter", exc)
            return None
        out.add_many(chunk)
        return out

    def _filter_size(self) -> int:
        """Keys a new filter is sized for: twice what the tier holds and has queued. Not what the full filter
        took: under churn (the last tier evicting as new keys come) that grows without bound while the records
        do not; a rebuild drops the keys gone since."""
        return 2 * (self.count + len(self.pending))

    # ---- reads (any thread) ----
    def read(self, key: bytes) -> Entry | Corrupt | None:
        """The committed record of a key, ignoring ``pending`` (callers check that first)."""
        with self.env.begin(buffers=True) as txn:
            return self._read_in(txn, key)

    def _read_in(self, txn: lmdb.Transaction, key: bytes) -> Entry | Corrupt | None:
        """One record in a read transaction; a damaged page answers Corrupt for the key, never an exception. Counted
        in ``reads`` when looked up, in ``key_filter.absent`` when the key filter rules it out instead."""
        lkey = data_key(key)
        if self.key_filter.ruled_out(lkey):
            self.key_filter.absent += 1
            return None
        self.reads += 1
        try:
            rec = txn.get(lkey, db=self._data)
        except lmdb.Error as exc:
            self._unreadable(f"reading {key[:64]!r}", exc)
            return Corrupt(key, f"unreadable page: {exc}")
        if rec is not None:
            self._learn(lkey, rec)
        return self._decode(key, rec)

    def _learn(self, lkey: bytes, rec: Any) -> None:
        """Remember where a record lies in the map (``rec``: a view of it); not one of 4 GiB or more, which is
        never read on the loop (and whose length would not fit)."""
        if len(rec) >> 32:
            self._where.pop(lkey, None)
            return
        _remember(self._where, lkey, address(rec) << 32 | len(rec))

    def _trust(self, lkey: bytes, rec: Any) -> None:
        """The writer thread, right after committing ``rec``: its place may be read directly (``_direct``)."""
        n = len(rec)
        if n >> 32 or n < HEADER_SIZE:
            return
        _remember(self._direct, lkey, (address(rec), n, _HEADER.unpack_from(rec)[5]))

    def _read_direct(self, keys: list[bytes], spots: list[tuple[bytes, int, int, int]],
                     probe: bool) -> dict[bytes, Entry | Meta | Corrupt | None] | None:
        """``read_resident`` of records at places the writer found (``_direct``): a copy out of the map that holds
        the GIL throughout, verified against the remembered sequence number and the checksum (a probe verifies
        the whole record too: its header alone could be a reused page's). None when one fails: its place is
        forgotten and the caller looks the records up instead."""
        out: dict[bytes, Entry | Meta | Corrupt | None] = {}
        for key, (lkey, start, n, seq) in zip(keys, spots, strict=True):
            raw = string_at(start, n)  # n >= HEADER_SIZE (_trust); decode_record checks the magic and checksum
            found = decode_record(key, raw) if _HEADER.unpack_from(raw)[5] == seq else None
            if found.__class__ is not Entry:
                self._direct.pop(lkey, None)
                return None
            if probe:
                out[key] = Meta(found.version, found.expire_at, len(found.value))  # type: ignore[union-attr]
            else:
                out[key] = found
                if self._rank is not None:
                    self._rank.accessed(seq)
        self.inline_reads += len(keys)
        self.inline_direct += len(keys)
        if probe:
            self.probes += len(keys)
        else:
            self.reads += len(keys)
        return out

    def _decode(self, key: bytes, rec: Any) -> Entry | Corrupt | None:
        """A record read in a transaction still open (``rec`` is a view of the map) as ``read`` answers it."""
        try:
            if rec is None:
                return None
            found = decode_record(key, rec)
            if self._rank is not None and found.__class__ is Entry:
                self._rank.accessed(_HEADER.unpack_from(rec)[5])
            return found
        except (lmdb.Error, struct.error) as exc:
            self._unreadable(f"reading {key[:64]!r}", exc)
            return Corrupt(key, f"unreadable page: {exc}")

    def read_many(self, keys: Iterable[bytes]) -> dict[bytes, Entry | Corrupt | None]:
        out: dict[bytes, Entry | Corrupt | None] = {}
        with self.env.begin(buffers=True) as txn:
            for key in keys:
                out[key] = self._read_in(txn, key)
        return out

    def read_resident(self, keys: list[bytes], max_bytes: int,
                      probe: bool = False) -> dict[bytes, Entry | Meta | Corrupt | None] | None:
        """``read_many`` (``probe``: ``probe_many``) of records whose pages are all in memory, for a caller that
        must not wait for the disk (the event loop); None, having read nothing, when one is not or may not be
        (the caller reads them in a thread instead), when the records hold more than ``max_bytes`` (a copy that
        long would hold the loop), or when LMDB fails (the thread's read reports it).

        The pages are checked before the lookup, which touches them all (py-lmdb faults a value in as it returns
        it), at the place the writer or an earlier read found the record (``_where``): a key whose place is
        unknown (not found since a restart, forgotten, or without a record) goes to a thread, unless the key
        filter rules out a record of it (then it is answered None here). The B-tree pages a lookup walks are not
        checked: every lookup walks them, so they stay cached. When the writer found every record right after committing it (``_direct``), they are
        not looked up at all but copied out of the map and verified (``_read_direct``): no py-lmdb call, so the
        loop keeps the GIL.
        """
        if self._closed:
            return None
        self.key_filter.take_scan()
        where = self._where
        direct = self._direct
        places: list[tuple[bytes, int, int]] = []
        spots: list[tuple[bytes, int, int, int]] | None = []
        present: list[bytes] = []  # the keys of ``places``; the others the key filter ruled out
        absent: list[bytes] = []
        total = 0
        for key in keys:
            lkey = data_key(key)
            spot = direct.get(lkey) if spots is not None else None
            # Read directly, a record is copied and verified whole, a probe's too; otherwise (over the cap, or
            # pages on the disk, which a probe's lookup may not need) every record is looked up.
            if spots is not None and spot is not None and total + spot[1] <= max_bytes \
                    and resident_at(spot[0], spot[1]):
                start, n, seq = spot
                total += n
                spots.append((lkey, start, n, seq))
                places.append((lkey, start, n))
                present.append(key)
                continue
            loc = where.get(lkey)
            if loc is None:
                if self.key_filter.ruled_out(lkey):  # no record: nothing to read
                    absent.append(key)
                    continue
                self.inline_declined += 1
                self.inline_unknown += 1
                return None
            spots = None
            start, n = loc >> 32, loc & 0xFFFFFFFF
            # A probe reads the header and a long key's stored copy only; the value stays in the map.
            need = min(n, HEADER_SIZE + (len(key) if len(key) > MAX_INLINE_KEY else 0)) if probe else n
            total += need
            if total > max_bytes or not resident_at(start, need):
                self.inline_declined += 1
                return None
            places.append((lkey, start, n))
            present.append(key)
        # Counted when answered here (a load that fails below goes to a thread, which counts them itself).
        out: dict[bytes, Entry | Meta | Corrupt | None] = dict.fromkeys(absent)
        if not places:
            self.key_filter.absent += len(absent)
            return out
        if spots:
            got = self._read_direct(present, spots, probe)
            if got is not None:
                out.update(got)
                self.key_filter.absent += len(absent)
                return out
        recs: list[Any] = []
        with self.env.begin(buffers=True) as txn:
            try:
                for lkey, start, n in places:
                    rec = txn.get(lkey, db=self._data)
                    if rec is None:
                        where.pop(lkey, None)
                    elif address(rec) != start or len(rec) != n:
                        # Moved since it was remembered (rewritten, or the map was remapped): the check looked
                        # at the wrong pages, this once.
                        self.inline_moved += 1
                        self._learn(lkey, rec)
                    recs.append(rec)
            except lmdb.Error:
                return None
            self.inline_reads += len(present)
            self.key_filter.absent += len(absent)
            if probe:
                self.probes += len(present)
                out.update((key, self._decode_meta(key, rec)) for key, rec in zip(present, recs, strict=True))
            else:
                self.reads += len(present)
                out.update((key, self._decode(key, rec)) for key, rec in zip(present, recs, strict=True))
            return out

    def _decode_meta(self, key: bytes, rec: Any) -> Meta | Corrupt | None:
        try:
            return None if rec is None else decode_meta(key, rec)
        except struct.error as exc:
            self._unreadable(f"probing {key[:64]!r}", exc)
            return Corrupt(key, f"unreadable page: {exc}")

    def probe_many(self, keys: Iterable[bytes]) -> dict[bytes, Meta | Corrupt | None]:
        """Headers of ``keys``' records (version, expiry, value length): the value stays in the map, uncopied."""
        out: dict[bytes, Meta | Corrupt | None] = {}
        with self.env.begin(buffers=True) as txn:
            for key in keys:
                lkey = data_key(key)
                if self.key_filter.ruled_out(lkey):
                    self.key_filter.absent += 1
                    out[key] = None
                    continue
                self.probes += 1
                try:
                    rec = txn.get(lkey, db=self._data)
                except lmdb.Error as exc:
                    self._unreadable(f"probing {key[:64]!r}", exc)
                    out[key] = Corrupt(key, f"unreadable page: {exc}")
                    continue
                if rec is not None:
                    self._learn(lkey, rec)
                out[key] = self._decode_meta(key, rec)
        return out

    def _unreadable(self, what: str, exc: Exception) -> None:
        """Count a damaged LMDB page met by a read; the first one is logged (``kvstrata check`` finds them all)."""
        self.unreadable_pages += 1
        if self.unreadable_pages == 1:
            log.error("SSD tier %s: unreadable LMDB page while %s (%s); such pages are skipped and counted in "
                      "INFO tier_ssd unreadable_pages. Run `kvstrata check --essd-path %s`.",
                      self.path, what, exc, self.path)

    def lookup_pending(self, key: bytes) -> tuple[bool, Entry | None]:
        """(known, entry): known is true when the answer comes from memory without touching LMDB."""
        found = self.pending.get(key)
        if found is not None:
            return True, (None if found.__class__ is Tombstone else found)  # type: ignore[return-value]
        if self.flush_pending:
            return True, None
        return False, None

    @property
    def settled(self) -> bool:
        """True when nothing is waiting for the writer, so LMDB's counters are exact."""
        return not self.pending and not self.flush_pending

    def get(self, key: bytes) -> Entry | None:
        known, entry = self.lookup_pending(key)
        if known:
            return entry
        found = self.read(key)
        return found if isinstance(found, Entry) else None

    def contains(self, key: bytes) -> bool:
        return self.get(key) is not None

    def bucket_keys(self, bucket: int) -> list[bytes]:
        """Committed keys of one scan bucket, plus pending puts in it; pending deletes are left out."""
        prefix = _BUCKET.pack(bucket)
        keys: set[bytes] = set()
        if not self.flush_pending:
            try:
                with self.env.begin(buffers=True) as txn, txn.cursor(db=self._data) as cur:
                    if cur.set_range(prefix):
                        for lkey, rec in cur:
                            lk = bytes(lkey)
                            if not lk.startswith(prefix):
                                break
                            keys.add(_record_key(lk, rec))
            except (lmdb.Error, struct.error) as exc:
                # A damaged page: the keys read before it are listed, the rest of this bucket is skipped (SCAN,
                # KEYS and RANDOMKEY go on with the next bucket instead of failing).
                self._unreadable(f"listing bucket {bucket}", exc)
        for key, entry in self._pending_in(bucket):
            if entry.__class__ is Tombstone:
                keys.discard(key)
            else:
                keys.add(key)
        return list(keys)

    def committed_versions(self, after: bytes | None, limit: int) -> tuple[list[tuple[bytes, int]], bytes | None]:
        """Up to ``limit`` committed records, as (key, version), in LMDB order from just after the record key
        ``after`` (None: from the first), and the record key to go on after (None once the end is reached).
        Headers only, values untouched; safe from any thread (one read transaction); pending writes are not looked
        at. A damaged page ends the walk (counted and logged as for any read)."""
        out: list[tuple[bytes, int]] = []
        last: bytes | None = None
        try:
            with self.env.begin(buffers=True) as txn, txn.cursor(db=self._data) as cur:
                more = cur.first() if after is None else cur.set_range(after + b"\0")
                while more:
                    lkey, rec = cur.item()
                    last = bytes(lkey)
                    key = _record_key(last, rec)
                    meta = decode_meta(key, rec)
                    if isinstance(meta, Meta):
                        out.append((key, meta.version))
                    more = cur.next()
                    if len(out) >= limit:
                        return out, (last if more else None)
        except (lmdb.Error, struct.error) as exc:
            self._unreadable("listing record versions", exc)
        return out, None

    def _pending_in(self, bucket: int) -> list[tuple[bytes, Entry | Tombstone]]:
        """The pending writes of one scan bucket. KEYS, SCAN and MARKHOT ask bucket after bucket, so ``pending``
        is grouped once and regrouped only when it changed (every change moves a sequence number)."""
        stamp = (self.enqueued_seq, self.committed_seq)
        if stamp != self._pending_stamp:
            groups: dict[int, list[tuple[bytes, Entry | Tombstone]]] = {}
            for key, entry in self.pending.items():
                groups.setdefault(bucket_of(key), []).append((key, entry))
            self._pending_groups = groups
            self._pending_stamp = stamp
        return self._pending_groups.get(bucket, [])

    # ---- writes (owner's thread) ----
    def watch(self, keys: Iterable[bytes]) -> Ticket:
        """A ticket that turns stale when any of ``keys`` is written or deleted here before ``unwatch``."""
        return self._watchers.watch(keys)

    def unwatch(self, ticket: Ticket) -> None:
        self._watchers.unwatch(ticket)

    def put(self, key: bytes, entry: Entry) -> int:
        """Queue a write of a snapshot of ``entry``; returns its sequence number (see ``committed_seq``)."""
        snap = Entry(entry.value, entry.version, entry.expire_at)
        self.pending[key] = snap
        self.key_filter.note(data_key(key))
        self._watchers.touched(key)
        return self._enqueue((_PUT, key, snap), len(entry.value))

    def delete(self, key: bytes) -> bool:
        tomb = Tombstone()
        self.pending[key] = tomb
        self._watchers.touched(key)
        self._enqueue((_DEL, key, tomb))
        return True

    def flush(self) -> int:
        self.pending.clear()
        self.flush_pending = True
        self._watchers.touch_all()
        self._flush_seq = self.enqueued_seq + 1
        return self._enqueue((_FLUSH, None, None))

    def sweep_expired(self, now_ms: int, limit: int = 1000) -> int:
        return self._enqueue((_SWEEP, now_ms, limit))

    def save_version_high_water(self, value: int) -> int:
        self.version_high_water = value
        return self._enqueue((_META, b"version_hw", value))

    def barrier(self, sync: bool = False) -> int:
        """A no-op that commits after everything queued before it; with ``sync``, fsynced whatever ``fsync`` says."""
        return self._enqueue((_SYNC if sync else _META, None, None))

    def retry_stuck(self) -> int:
        """Queue again the writes that failed (e.g. disk full); those overwritten or deleted since are dropped."""
        stuck, self.stuck = self.stuck, {}
        self.stuck_bytes = 0
        again = 0
        for key, snap in stuck.items():
            if self.pending.get(key) is snap:
                self.retrying[key] = snap
                self._enqueue((_PUT, key, snap), len(snap.value))
                again += 1
        return again

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True  # read_resident reads nothing from here on: the map is about to be unmapped
        self.key_filter.close(30)  # a scan stops at its next chunk (_scan)
        self._stop_writer(30)
        self._direct.clear()
        self.env.sync(True)
        self.env.close()

    def __len__(self) -> int:
        """Committed records; exact once ``settled`` (DBSIZE waits for the writer first)."""
        return self.count

    def info_row(self, stats: dict[str, int]) -> dict[str, Any]:
        return {**self.info(), **stats, "evictions": self.evictions}

    def info(self) -> dict[str, Any]:
        rank = self._rank.info() if self._rank is not None else {"eviction_policy": "fifo"}
        return {**rank, "pending": len(self.pending), "queued_bytes": self.queued_bytes, "write_errors": self.write_errors,
                "expired": self.expired, "reads": self.reads, "writes": self.writes,
                "write_bytes": self.write_bytes, "probes": self.probes, "reads_inline": self.inline_reads,
                "inline_declined": self.inline_declined, "inline_moved": self.inline_moved,
                "inline_unknown": self.inline_unknown, "inline_direct": self.inline_direct,
                "unreadable_pages": self.unreadable_pages,
                "writer_pauses": self.pacer.pauses, **self.key_filter.info()}
