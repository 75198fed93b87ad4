"""The SSD writer thread's side: it applies every queued operation waiting in one LMDB write transaction (group
commit), makes room first when the budget or the filesystem could not take the batch (evicting by the tier's
ranking, ``ssd_rank``, or oldest first),
reclaims expired records, and hands the outcome back to the owner's thread (``_committed``), which settles
``pending`` and reports evictions.

``SsdWriter`` is a ``BatchWriter`` mixin of ``SsdTier`` (ssd.py), which owns the LMDB environment and the state.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import lmdb

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.markers import Corrupt
from kvstrata.engine.tiers.pause import Pacer
from kvstrata.engine.tiers.ssd_rank import SsdRanking
from kvstrata.engine.tiers.ssd_record import (
    _HEADER,
    _U64,
    HEADER_SIZE,
    RECORD_OVERHEAD,
    _record_key,
    data_key,
    decode_record,
    encode_record,
)
from kvstrata.engine.tiers.writer import BatchWriter

log = logging.getLogger("kvstrata.ssd")

# Free space kept on the SSD tier's filesystem for LMDB's own pages and metadata.
_DISK_MARGIN = 8 * 1024 * 1024

_PUT, _DEL, _FLUSH, _SWEEP, _META, _SYNC = range(6)


class SsdWriter(BatchWriter):
    """Applies a batch of queued SSD operations (writer thread) and settles them (owner's thread)."""

    env: lmdb.Environment
    pending: dict[bytes, Any]
    _rank: SsdRanking | None
    _where: OrderedDict[bytes, int]
    _direct: OrderedDict[bytes, tuple[int, int, int]]
    _trust: Callable[[bytes, Any], None]
    _learn: Callable[[bytes, Any], None]
    pacer: Pacer

    def _process(self, batch: list[tuple[Any, ...]]) -> None:
        error: str | None = None
        evicted: list[bytes] = []
        self.pacer.start()
        if self._rank is not None:
            self._rank.drain()
        try:
            self._apply_with_room(batch, evicted)
            if self.fsync != "always" and any(op[2] == _SYNC for op in batch):
                self.env.sync(True)  # under "always" the commit itself was synchronous
            self._learn_written(batch)
        except Exception as exc:  # disk errors must not kill the writer; the batch is reported as failed
            error = f"{type(exc).__name__}: {exc}"
            self._rank_done(False)
            self.write_errors += 1
            log.error("SSD write of %d operations failed: %s", len(batch), error)
        self._deliver(lambda: self._committed(batch, error, evicted))

    def _learn_written(self, batch: list[tuple[Any, ...]]) -> None:
        """Find where the records just committed lie in the map (``SsdTier._learn``), so that their first read
        can run on the event loop while their pages are still in the page cache. Here, not on the loop: the
        lookup touches every page of the value (py-lmdb), which were just written, but a loop must not bet on it."""
        keys = [data_key(op[3]) for op in batch if op[2] == _PUT]
        if not keys:
            return
        try:
            tick = self.pacer.tick
            with self.env.begin(buffers=True) as txn:
                for lkey in keys:
                    tick()
                    rec = txn.get(lkey, db=self._data)
                    if rec is not None:
                        self._learn(lkey, rec)
                        self._trust(lkey, rec)
        except lmdb.Error:
            pass  # the records stay unknown: their first read goes to a loader thread

    def _rank_done(self, committed: bool) -> None:
        """Keep the ranking in step with the transaction that just ended (committed or failed)."""
        rank = self._rank
        if rank is None:
            return
        if committed:
            rank.commit()
        elif not rank.rollback():
            with self.env.begin() as txn:
                self._rebuild_rank(txn)

    def _rebuild_rank(self, txn: lmdb.Transaction) -> None:
        """Rank every record on disk in write order (the ``order`` index): at startup, and after a failed FLUSH."""
        assert self._rank is not None
        with txn.cursor(db=self._order) as cur:
            self._rank.rebuild(_U64.unpack(bytes(k))[0] for k in cur.iternext(keys=True, values=False))

    def _disk_room(self, batch: list[tuple[Any, ...]], evicted: list[bytes]) -> None:
        """Evict records (lowest ranked first) when the filesystem could not take this batch.

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
        log.warning("SSD filesystem nearly full (%d bytes free, %d needed): evicting records", free, need)
        used0, count0 = self.used, self.count
        budget = self.budget
        try:
            self.budget = target
            with self.env.begin(write=True) as txn:
                self._evict(txn, None, evicted)
                self._save_meta(txn)
            self._rank_done(True)
        except BaseException:
            self.used, self.count = used0, count0
            self._rank_done(False)
            raise
        finally:
            self.budget = budget

    def _apply_with_room(self, batch: list[tuple[Any, ...]], evicted: list[bytes]) -> None:
        """Apply ``batch``, making room as needed; the keys of records evicted by committed transactions go to
        ``evicted`` as they commit, so that they are reported even when the batch itself then fails (a clean
        copy's entry must learn that its record is gone)."""
        self._disk_room(batch, evicted)
        for attempt in range(4):
            try:
                with self.env.begin(write=True) as txn:
                    done = self._apply(txn, batch)
                self._rank_done(True)
                evicted += done
                return
            except lmdb.MapFullError:
                self._rank_done(False)
                # The map filled before our own budget did (page overhead): free a tenth and retry.
                log.warning("SSD map full (attempt %d); evicting records", attempt + 1)
                freed: list[bytes] = []
                used0, count0 = self.used, self.count
                try:
                    with self.env.begin(write=True) as txn:
                        self._evict(txn, max(1, self.count // 10 * (attempt + 1)), freed)
                        self._save_meta(txn)
                    self._rank_done(True)
                except BaseException:
                    self.used, self.count = used0, count0
                    self._rank_done(False)
                    raise
                evicted += freed
        # Still no room: apply one by one and drop what cannot fit (this is the last tier).
        for op in batch:
            try:
                with self.env.begin(write=True) as txn:
                    done = self._apply(txn, [op])
                self._rank_done(True)
                evicted += done
            except lmdb.MapFullError:
                self._rank_done(False)
                if op[2] == _PUT:
                    evicted.append(op[3])
                    self.evictions += 1

    def _remove(self, txn: lmdb.Transaction, lkey: bytes, old: bytes | None = None) -> bool:
        """Delete a record and its index entries (``old``: the record, when the caller has just read it)."""
        self._direct.pop(lkey, None)  # first: the loop must not read these pages once they may be freed
        self._where.pop(lkey, None)
        if old is None:
            old = txn.get(lkey, db=self._data)
        if old is None:
            return False
        try:
            _, _, _, _, expire_at, seq, _, _ = _HEADER.unpack_from(old)
            # A damaged header may name another record's index entries: only delete ones that point here.
            if txn.get(_U64.pack(seq), db=self._order) == lkey:
                txn.delete(_U64.pack(seq), db=self._order)
            if self._rank is not None:
                self._rank.remove(seq, lkey)
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
        tick = self.pacer.tick
        try:
            for _seq, _nbytes, kind, a, b in batch:
                tick()  # the event loop may be waiting for the GIL (tiers/pause.py)
                if kind == _PUT:
                    self._put(txn, a, b)
                elif kind == _DEL:
                    self._remove(txn, data_key(a))
                elif kind == _FLUSH:
                    for db in (self._data, self._order, self._exp):
                        txn.drop(db, delete=False)
                    self._direct.clear()
                    self._where.clear()
                    if self._rank is not None:
                        self._rank.clear()
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
        if self._rank is not None:
            self._rank.admit(seq, lkey)
        self.used += len(lkey) + size + RECORD_OVERHEAD
        self.count += 1

    def _evict(self, txn: lmdb.Transaction, n: int | None, evicted: list[bytes]) -> None:
        """Remove records until under budget (``n`` None) or ``n`` of them; their keys go to ``evicted``.

        The ranking's victims go first; the oldest writes (the ``order`` index) after them, for any record the
        ranking does not track, and always under ``fifo``: the budget never depends on the ranking.
        """
        if self._rank is not None:
            n = self._evict_ranked(txn, n, evicted)
        with txn.cursor(db=self._order) as cur:
            while ((n is None and self.used > self.budget) or (n is not None and n > 0)) and cur.first():
                seq_key = bytes(cur.key())
                lkey = bytes(cur.value())
                rec = txn.get(lkey, db=self._data)
                if rec is None or len(rec) < HEADER_SIZE or _U64.pack(_HEADER.unpack_from(rec)[5]) != seq_key:
                    # A stale index entry (the key was rewritten since), or a record whose header is damaged.
                    cur.delete()
                    self._remove_if_corrupt(txn, lkey, rec)
                    continue
                self._evict_record(txn, lkey, rec, evicted)
                if n is not None:
                    n -= 1

    def _evict_record(self, txn: lmdb.Transaction, lkey: bytes, rec: bytes, evicted: list[bytes]) -> None:
        self.pacer.tick()  # an eviction may remove thousands of records in one batch
        key = _record_key(lkey, rec)
        self._remove(txn, lkey, rec)
        evicted.append(key)
        self.evictions += 1

    def _remove_if_corrupt(self, txn: lmdb.Transaction, lkey: bytes, rec: bytes | None) -> None:
        """A record an index entry led to but whose header did not match: removed when it does not decode."""
        if rec is not None and isinstance(decode_record(b"", rec), Corrupt):
            self._remove(txn, lkey)

    def _evict_ranked(self, txn: lmdb.Transaction, n: int | None, evicted: list[bytes]) -> int | None:
        """``_evict`` by the ranking: its victims' records are found through ``order``; what is left of ``n``."""
        rank = self._rank
        assert rank is not None
        while (n is None and self.used > self.budget) or (n is not None and n > 0):
            seq = rank.victim()
            if seq is None:
                break
            seq_key = _U64.pack(seq)
            lkey = txn.get(seq_key, db=self._order)
            rec = txn.get(lkey, db=self._data) if lkey is not None else None
            if rec is None or len(rec) < HEADER_SIZE or _HEADER.unpack_from(rec)[5] != seq:
                # Stale: the record was rewritten or removed since, or its header is damaged (as in _evict).
                rank.forget(seq)
                if lkey is not None:
                    txn.delete(seq_key, db=self._order)
                    self._remove_if_corrupt(txn, lkey, rec)
                continue
            self._evict_record(txn, lkey, rec, evicted)
            if n is not None:
                n -= 1
        return n

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
                self.pacer.tick()
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
            elif kind == _PUT:
                self.writes += 1
                self.write_bytes += nbytes
        self.degraded = error
        if len(self.failed) > 10000:
            for seq in sorted(self.failed)[:5000]:
                del self.failed[seq]
        self.committed_seq = batch[-1][0]
        if self.on_commit is not None:
            self.on_commit(self.committed_seq, evicted)

