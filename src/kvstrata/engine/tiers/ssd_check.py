"""Verify and salvage an SSD tier (``kvstrata check``): every record is read and checked, damaged pages are
skipped and reported, and ``repair`` copies every readable record into a fresh LMDB.

A record is *corrupt* when its header or checksum fails, when it is stored under the wrong LMDB key (a flipped
key byte makes it unreachable by its key), or when its page cannot be parsed; an *unreadable bucket* is a scan
bucket whose B-tree pages LMDB refuses to walk (``MDB_CORRUPTED``, ``MDB_PAGE_NOTFOUND``): its records after the
damage cannot be listed. The check never writes to the environment it checks.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import lmdb

from kvstrata.engine.entry import Entry
from kvstrata.engine.keyspace import SCAN_BUCKETS
from kvstrata.engine.tiers.markers import Corrupt
from kvstrata.engine.tiers.ssd import _BUCKET, _U64, SsdTier, _record_key, data_key, decode_record

MISPLACED = "stored under the wrong key"


@dataclass
class CheckReport:
    path: str
    records: int = 0  # records found (readable or not)
    ok: int = 0
    # (key, reason); for a record under the wrong LMDB key, that LMDB key (bucket, tag, key) and MISPLACED.
    corrupt: list[tuple[bytes, str]] = field(default_factory=list)
    unreadable_buckets: list[tuple[int, str]] = field(default_factory=list)
    meta_count: int | None = None  # the record count LMDB's meta says, None when unreadable
    version_high_water: int = 0
    max_version: int = 0
    repaired_to: str | None = None
    copied: int = 0
    salvaged: int = 0  # readable records of unreadable buckets, found through the eviction-order index

    @property
    def missing(self) -> int:
        """Records LMDB's meta counts that no listing found (a damaged page can hide them without an error)."""
        return max(0, self.meta_count - self.records) if self.meta_count is not None else 0

    @property
    def clean(self) -> bool:
        return not self.corrupt and not self.unreadable_buckets and not self.missing

    def lines(self) -> list[str]:
        out = [f"SSD tier {self.path}: {self.records} records, {self.ok} ok, {len(self.corrupt)} corrupt, "
               f"{len(self.unreadable_buckets)} unreadable buckets, {self.missing} missing "
               f"(meta count: {self.meta_count}; {self.salvaged} found through the index)"]
        out += [f"  corrupt {key[:80]!r}: {why}" for key, why in self.corrupt]
        out += [f"  unreadable bucket {b}: {why}" for b, why in self.unreadable_buckets]
        if self.repaired_to is not None:
            out.append(f"repaired: {self.copied} records copied into a fresh tier; the damaged one is kept at "
                       f"{self.repaired_to}")
        return out


def _scan_bucket(txn: lmdb.Transaction, db: Any, bucket: int, report: CheckReport,
                 good: list[tuple[bytes, Entry]] | None, seen: set[bytes]) -> None:
    prefix = _BUCKET.pack(bucket)
    try:
        with txn.cursor(db=db) as cur:
            if not cur.set_range(prefix):
                return
            for lkey, rec in cur:
                lk = bytes(lkey)
                if not lk.startswith(prefix):
                    return
                seen.add(lk)
                report.records += 1
                try:
                    key = _record_key(lk, rec)
                    found = decode_record(key, rec)
                except (struct.error, ValueError) as exc:
                    report.corrupt.append((lk[3:], f"unparsable record: {exc}"))
                    continue
                if isinstance(found, Corrupt):
                    report.corrupt.append((key, found.reason))
                elif found is None or data_key(key) != lk:
                    # Its key was damaged: reported as stored (bucket, tag and key), since the key it names may
                    # well be another, intact record's.
                    report.corrupt.append((lk, MISPLACED))
                elif txn.get(lk, db=db) is None:
                    # Listed by the cursor but not found by a lookup: a damaged key elsewhere on its page broke
                    # the B-tree's order, so GET cannot reach this record.
                    report.corrupt.append((key, "unreachable by lookup"))
                else:
                    report.ok += 1
                    report.max_version = max(report.max_version, found.version)
                    if good is not None:
                        good.append((key, found))
    except (lmdb.Error, struct.error) as exc:
        report.unreadable_buckets.append((bucket, f"{type(exc).__name__}: {exc}"))


def check(path: str, *, collect: bool = False) -> tuple[CheckReport, list[tuple[bytes, Entry]]]:
    """Read every record of the SSD tier at ``path``; with ``collect``, also return the readable ones."""
    if not os.path.exists(os.path.join(path, "data.mdb")):
        raise FileNotFoundError(f"{path}: no SSD tier here (data.mdb is missing)")
    report = CheckReport(path)
    good: list[tuple[bytes, Entry]] | None = [] if collect else None
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=4, readahead=False, create=False)
    try:
        try:
            data = env.open_db(b"data", create=False)
        except lmdb.Error as exc:
            report.unreadable_buckets.append((-1, f"the data database: {type(exc).__name__}: {exc}"))
            return report, good or []
        with env.begin(buffers=True) as txn:
            try:
                meta = env.open_db(b"meta", txn=txn, create=False)
                raw = txn.get(b"count", db=meta)
                report.meta_count = None if raw is None else _U64.unpack(raw)[0]
                raw = txn.get(b"version_hw", db=meta)
                report.version_high_water = 0 if raw is None else _U64.unpack(raw)[0]
            except (lmdb.Error, struct.error):
                report.meta_count = None
        seen: set[bytes] = set()
        txn = env.begin(buffers=True)
        try:
            for bucket in range(SCAN_BUCKETS):
                damaged = len(report.unreadable_buckets)
                _scan_bucket(txn, data, bucket, report, good, seen)
                if len(report.unreadable_buckets) > damaged:
                    # LMDB marks a transaction that met a damaged page as failed: go on in a fresh one.
                    txn.abort()
                    txn = env.begin(buffers=True)
        finally:
            txn.abort()
        if report.unreadable_buckets:
            _salvage_by_index(env, data, report, good, seen)
    finally:
        env.close()
    return report, good or []


def _salvage_by_index(env: lmdb.Environment, data: Any, report: CheckReport,
                      good: list[tuple[bytes, Entry]] | None, seen: set[bytes]) -> None:
    """Records in buckets the cursor could not walk may still be reachable by lookup: the eviction-order index
    names every record's LMDB key, so each one not listed yet is looked up directly."""
    try:
        order = env.open_db(b"order", create=False)
        with env.begin(buffers=True) as txn, txn.cursor(db=order) as cur:
            lkeys = [bytes(v) for _, v in cur]
    except (lmdb.Error, struct.error):
        return  # the index is damaged too: what the listing found is all there is
    with env.begin(buffers=True) as txn:
        for lk in lkeys:
            if lk in seen or len(lk) < 3:
                continue
            seen.add(lk)
            try:
                rec = txn.get(lk, db=data)
                if rec is None:
                    continue
                key = _record_key(lk, rec)
                found = decode_record(key, rec)
            except (lmdb.Error, struct.error, ValueError):
                continue
            report.records += 1
            if isinstance(found, Entry) and data_key(key) == lk:
                report.ok += 1
                report.salvaged += 1
                report.max_version = max(report.max_version, found.version)
                if good is not None:
                    good.append((key, found))
            else:
                report.corrupt.append((key, found.reason if isinstance(found, Corrupt) else MISPLACED))


def repair(path: str, budget: int) -> CheckReport:
    """Copy every readable record into a fresh tier, which takes the place of ``path``; the damaged environment
    is kept beside it (``<path>.damaged-<time>``). Run it with the server stopped."""
    report, good = check(path, collect=True)
    fresh = f"{path.rstrip('/')}.repair-{int(time.time())}"
    tier = SsdTier(fresh, budget, fsync="no", threaded=False)
    try:
        # Versions keep increasing after the repair: above every one issued before, readable or not.
        tier.save_version_high_water(max(report.version_high_water, report.max_version + 1))
        for key, entry in good:
            tier.put(key, entry)
        report.copied = len(good)
    finally:
        tier.close()
    damaged = f"{path.rstrip('/')}.damaged-{int(time.time())}"
    os.rename(path, damaged)
    os.rename(fresh, path)
    report.repaired_to = damaged
    return report
