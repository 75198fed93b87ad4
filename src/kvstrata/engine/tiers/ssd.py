"""The SSD tier on LMDB: crash-safe, memory-mapped, and its own index, so everything is found after a restart.

Layout (sub-databases of one LMDB environment):
  data   bucket(2, BE) + tag + key  -> record (header, [full key], value)
  order  seq(8, BE)                 -> data key      (oldest first: the eviction order of the last tier)
  exp    expire_at(8, BE) + data key -> b""          (background reclaim of expired records)
  meta   name                        -> value        (format, used bytes, record count, version high-water)

Writes go through a queue to one writer thread that applies everything waiting in one write transaction (group
commit) and forces it to disk according to ``fsync``. Until a write is committed it sits in ``pending`` (the
newest state of each key, or None for a delete) so readers on the event loop never see a half-moved entry and
never block on the disk for a key that is on its way down. Reads are LMDB read transactions, safe from any
thread; the server runs them off the event loop.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Iterable
from typing import Any

import lmdb
import xxhash

from kvstrata.engine.entry import Entry
from kvstrata.engine.keyspace import bucket_of
from kvstrata.engine.tiers.base import TierRoles
from kvstrata.engine.tiers.markers import Corrupt, Tombstone
from kvstrata.engine.tiers.watch import Ticket, Watchers
from kvstrata.engine.tiers.writer import BatchWriter

log = logging.getLogger("kvstrata.ssd")

MAGIC = b"KS"
FORMAT = 1
# magic, format, flags, version, expire_at, seq, checksum, full-key length
_HEADER = struct.Struct("<2sBBQqQQI")
_CHECKED = struct.Struct("<2sBBQqQ")
HEADER_SIZE = _HEADER.size
_U64 = struct.Struct(">Q")
_BUCKET = struct.Struct(">H")
RECORD_OVERHEAD = 64
# Free space kept on the SSD tier's filesystem for LMDB's own pages and metadata.
_DISK_MARGIN = 8 * 1024 * 1024
MAX_INLINE_KEY = 400  # LMDB keys are limited to 511 bytes; longer keys are stored under their hash.

_PUT, _DEL, _FLUSH, _SWEEP, _META, _SYNC = range(6)


def data_key(key: bytes) -> bytes:
    prefix = _BUCKET.pack(bucket_of(key))
    if len(key) <= MAX_INLINE_KEY:
        return prefix + b"k" + key
    return prefix + b"h" + xxhash.xxh3_128_digest(key)


def _checksum(prefix: bytes, full_key: bytes, value: Any) -> int:
    h = xxhash.xxh3_64(prefix)
    if full_key:
        h.update(full_key)
    h.update(value)
    return h.intdigest()


def encode_record(key: bytes, value: Any, version: int, expire_at: int, seq: int) -> list[Any]:
    full_key = key if len(key) > MAX_INLINE_KEY else b""
    checked = _CHECKED.pack(MAGIC, FORMAT, 0, version, expire_at, seq)
    header = _HEADER.pack(MAGIC, FORMAT, 0, version, expire_at, seq, _checksum(checked, full_key, value),
                          len(full_key))
    return [header, full_key, value]


def decode_record(key: bytes, rec: Any) -> Entry | Corrupt | None:
    """Parse and verify a record (bytes or a memoryview into the map); None when it belongs to another key."""
    if len(rec) < HEADER_SIZE:
        return Corrupt(key, "short record")
    magic, fmt, _flags, version, expire_at, seq, checksum, klen = _HEADER.unpack_from(rec)
    if magic != MAGIC:
        return Corrupt(key, "bad magic")
    if fmt != FORMAT:
        return Corrupt(key, f"unknown record format {fmt}")
    mv = memoryview(rec)
    full_key = bytes(mv[HEADER_SIZE : HEADER_SIZE + klen])
    value_view = mv[HEADER_SIZE + klen :]
    checked = _CHECKED.pack(MAGIC, fmt, _flags, version, expire_at, seq)
    if _checksum(checked, full_key, value_view) != checksum:
        return Corrupt(key, "checksum mismatch")
    if klen and full_key != key:
        return None
    return Entry(bytes(value_view), version, expire_at)


def _record_key(lkey: bytes, rec: Any) -> bytes:
    if lkey[2:3] == b"k":
        return bytes(lkey[3:])
    klen = _HEADER.unpack_from(rec)[7]
    return bytes(memoryview(rec)[HEADER_SIZE : HEADER_SIZE + klen])


class SsdTier(BatchWriter, TierRoles):
    """LMDB-backed last tier with a byte budget; evicts oldest-demoted first when over it."""

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
        # Damaged LMDB pages met by reads and listings (each occurrence counts).
        self.unreadable_pages = 0
        self.corrupt_reads = 0
        self.expired = 0
        self.write_errors = 0
        self.on_commit = on_commit
        self._watchers = Watchers()
        self._deliver: Callable[[Callable[[], None]], None] = lambda fn: fn()
        self._closed = False
        self._flush_seq = 0
        self._start_writer(threaded, "kvstrata-ssd-writer", None)

    def _meta_int(self, txn: lmdb.Transaction, name: bytes) -> int:
        raw = txn.get(name, db=self._meta)
        return 0 if raw is None else _U64.unpack(raw)[0]

    def set_delivery(self, deliver: Callable[[Callable[[], None]], None]) -> None:
        """How the writer thread hands completions to the owner's thread (e.g. loop.call_soon_threadsafe)."""
        self._deliver = deliver

    # ---- reads (any thread) ----
    def read(self, key: bytes) -> Entry | Corrupt | None:
        """The committed record of a key, ignoring ``pending`` (callers check that first)."""
        self.reads += 1
        with self.env.begin(buffers=True) as txn:
            return self._read_in(txn, key)

    def _read_in(self, txn: lmdb.Transaction, key: bytes) -> Entry | Corrupt | None:
        """One record in a read transaction; a damaged page answers Corrupt for the key, never an exception."""
        try:
            rec = txn.get(data_key(key), db=self._data)
            return None if rec is None else decode_record(key, rec)
        except (lmdb.Error, struct.error) as exc:
            self._unreadable(f"reading {key[:64]!r}", exc)
            return Corrupt(key, f"unreadable page: {exc}")

    def read_many(self, keys: Iterable[bytes]) -> dict[bytes, Entry | Corrupt | None]:
        out: dict[bytes, Entry | Corrupt | None] = {}
        keys = list(keys)
        self.reads += len(keys)
        with self.env.begin(buffers=True) as txn:
            for key in keys:
                out[key] = self._read_in(txn, key)
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

    # ---- the writer ----
    def _process(self, batch: list[tuple[Any, ...]]) -> None:
        error: str | None = None
        evicted: list[bytes] = []
        try:
            evicted = self._apply_with_room(batch)
            if self.fsync != "always" and any(op[2] == _SYNC for op in batch):
                self.env.sync(True)  # under "always" the commit itself was synchronous
        except Exception as exc:  # disk errors must not kill the writer; the batch is reported as failed
            error = f"{type(exc).__name__}: {exc}"
            self.write_errors += 1
            log.error("SSD write of %d operations failed: %s", len(batch), error)
        self._deliver(lambda: self._committed(batch, error, evicted))

    def _disk_room(self, batch: list[tuple[Any, ...]], evicted: list[bytes]) -> None:
        """Evict oldest records first when the filesystem could not take this batch.

        LMDB reuses pages freed by earlier transactions, so freeing happens in a transaction of its own; the
        margin leaves room for that transaction and LMDB's metadata. Running into ENOSPC inside a commit would
        leave the environment unusable, so it is avoided here rather than handled afterwards.
        """
        need = sum(len(op[3]) + len(op[4].value) + HEADER_SIZE + RECORD_OVERHEAD for op in batch if op[2] == _PUT)
        if not need:
            return
        st = os.statvfs(self.path)
        free = st.f_bavail * st.f_frsize
        shortfall = need + _DISK_MARGIN - free
        if shortfall <= 0:
            return
        target = max(0, self.used - shortfall)
        if self.used <= 0:
            raise OSError(28, f"no space left on the SSD tier's filesystem for {need} bytes")
        log.warning("SSD filesystem nearly full (%d bytes free, %d needed): evicting oldest records", free, need)
        used0, count0 = self.used, self.count
        budget = self.budget
        try:
            self.budget = target
            with self.env.begin(write=True) as txn:
                self._evict(txn, None, evicted)
                self._save_meta(txn)
        except BaseException:
            self.used, self.count = used0, count0
            raise
        finally:
            self.budget = budget

    def _apply_with_room(self, batch: list[tuple[Any, ...]]) -> list[bytes]:
        evicted: list[bytes] = []
        self._disk_room(batch, evicted)
        for attempt in range(4):
            try:
                with self.env.begin(write=True) as txn:
                    return evicted + self._apply(txn, batch)
            except lmdb.MapFullError:
                # The map filled before our own budget did (page overhead): free the oldest tenth and retry.
                log.warning("SSD map full (attempt %d); evicting the oldest records", attempt + 1)
                freed: list[bytes] = []
                used0, count0 = self.used, self.count
                try:
                    with self.env.begin(write=True) as txn:
                        self._evict(txn, max(1, self.count // 10 * (attempt + 1)), freed)
                        self._save_meta(txn)
                except BaseException:
                    self.used, self.count = used0, count0
                    raise
                evicted += freed
        # Still no room: apply one by one and drop what cannot fit (this is the last tier).
        for op in batch:
            try:
                with self.env.begin(write=True) as txn:
                    evicted += self._apply(txn, [op])
            except lmdb.MapFullError:
                if op[2] == _PUT:
                    evicted.append(op[3])
                    self.evictions += 1
        return evicted

    def _remove(self, txn: lmdb.Transaction, lkey: bytes, old: bytes | None = None) -> bool:
        """Delete a record and its index entries (``old``: the record, when the caller has just read it)."""
        if old is None:
            old = txn.get(lkey, db=self._data)
        if old is None:
            return False
        try:
            _, _, _, _, expire_at, seq, _, _ = _HEADER.unpack_from(old)
            # A damaged header may name another record's index entries: only delete ones that point here.
            if txn.get(_U64.pack(seq), db=self._order) == lkey:
                txn.delete(_U64.pack(seq), db=self._order)
            if expire_at > 0:
                txn.delete(_U64.pack(expire_at) + lkey, db=self._exp)
        except struct.error:
            pass
        txn.delete(lkey, db=self._data)
        self.used -= len(lkey) + len(old) + RECORD_OVERHEAD
        self.count -= 1
        return True

    def _apply(self, txn: lmdb.Transaction, batch: list[tuple[Any, ...]]) -> list[bytes]:
        evicted: list[bytes] = []
        used0, count0, seq0 = self.used, self.count, self._seq
        try:
            for _seq, _nbytes, kind, a, b in batch:
                if kind == _PUT:
                    self._put(txn, a, b)
                elif kind == _DEL:
                    self._remove(txn, data_key(a))
                elif kind == _FLUSH:
                    for db in (self._data, self._order, self._exp):
                        txn.drop(db, delete=False)
                    self.used = 0
                    self.count = 0
                elif kind == _SWEEP:
                    self._sweep(txn, a, b)
                elif kind == _META and a is not None:
                    txn.put(a, _U64.pack(b), db=self._meta)
            if self.used > self.budget:
                self._evict(txn, None, evicted)
            self._save_meta(txn)
        except BaseException:
            self.used, self.count, self._seq = used0, count0, seq0
            raise
        return evicted

    def _put(self, txn: lmdb.Transaction, key: bytes, entry: Entry) -> None:
        lkey = data_key(key)
        self._remove(txn, lkey)
        seq = self._seq
        self._seq += 1
        parts = encode_record(key, entry.value, entry.version, entry.expire_at, seq)
        size = sum(len(p) for p in parts)
        txn.put(lkey, b"".join(parts), db=self._data)
        txn.put(_U64.pack(seq), lkey, db=self._order)
        if entry.expire_at > 0:
            txn.put(_U64.pack(entry.expire_at) + lkey, b"", db=self._exp)
        self.used += len(lkey) + size + RECORD_OVERHEAD
        self.count += 1

    def _evict(self, txn: lmdb.Transaction, n: int | None, evicted: list[bytes]) -> None:
        """Remove the oldest records until under budget (``n`` None) or ``n`` of them; their keys go to ``evicted``."""
        with txn.cursor(db=self._order) as cur:
            while ((n is None and self.used > self.budget) or (n is not None and n > 0)) and cur.first():
                seq_key = bytes(cur.key())
                lkey = bytes(cur.value())
                rec = txn.get(lkey, db=self._data)
                if rec is None or len(rec) < HEADER_SIZE or _U64.pack(_HEADER.unpack_from(rec)[5]) != seq_key:
                    # A stale index entry (the key was rewritten since), or a record whose header is damaged.
                    cur.delete()
                    if rec is not None and isinstance(decode_record(b"", rec), Corrupt):
                        self._remove(txn, lkey)
                    continue
                key = _record_key(lkey, rec)
                self._remove(txn, lkey, rec)
                evicted.append(key)
                self.evictions += 1
                if n is not None:
                    n -= 1

    def _sweep(self, txn: lmdb.Transaction, now_ms: int, limit: int) -> None:
        with txn.cursor(db=self._exp) as cur:
            done = 0
            while done < limit and cur.first():
                k = bytes(cur.key())
                expire_at = _U64.unpack(k[:8])[0]
                if expire_at > now_ms:
                    break
                lkey = k[8:]
                cur.delete()
                done += 1
                # The index entry may be stale (the key was rewritten, or its header was damaged): only a
                # record that itself says it expired then is removed.
                rec = txn.get(lkey, db=self._data)
                if rec is not None and len(rec) >= HEADER_SIZE and _HEADER.unpack_from(rec)[4] == expire_at:
                    if self._remove(txn, lkey):
                        self.expired += 1

    def _save_meta(self, txn: lmdb.Transaction) -> None:
        txn.put(b"used", _U64.pack(max(0, self.used)), db=self._meta)
        txn.put(b"count", _U64.pack(max(0, self.count)), db=self._meta)

    def _committed(self, batch: list[tuple[Any, ...]], error: str | None, evicted: list[bytes]) -> None:
        for op in batch:
            seq, nbytes, kind, key, snap = op
            self.queued_bytes -= nbytes
            if kind == _PUT and self.retrying.get(key, 0) is snap:
                del self.retrying[key]  # committed, or back in ``stuck`` just below
            if error is not None and kind == _PUT and self.pending.get(key, 0) is snap:
                # Not on disk: the value stays readable from memory and is written again later.
                self.stuck[key] = snap
                self.stuck_bytes += nbytes
            elif kind in (_PUT, _DEL) and self.pending.get(key, 0) is snap:
                del self.pending[key]
            elif kind == _FLUSH and seq == self._flush_seq:
                self.flush_pending = False
            if error is not None:
                self.failed[seq] = error
        self.degraded = error
        if len(self.failed) > 10000:
            for seq in sorted(self.failed)[:5000]:
                del self.failed[seq]
        self.committed_seq = batch[-1][0]
        if self.on_commit is not None:
            self.on_commit(self.committed_seq, evicted)

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
        self._closed = True
        self._stop_writer(30)
        self.env.sync(True)
        self.env.close()

    def __len__(self) -> int:
        """Committed records; exact once ``settled`` (DBSIZE waits for the writer first)."""
        return self.count

    def info_row(self, stats: dict[str, int]) -> dict[str, Any]:
        return {**self.info(), **stats, "evictions": self.evictions}

    def info(self) -> dict[str, Any]:
        return {"pending": len(self.pending), "queued_bytes": self.queued_bytes, "write_errors": self.write_errors,
                "expired": self.expired, "reads": self.reads, "unreadable_pages": self.unreadable_pages}
