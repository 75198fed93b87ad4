"""Reads from the pool, done by the caller's worker thread: ``read_many`` (loads), ``probe_many`` (what EXISTS,
TTL and writes that replace a value need: the header and the length, the value not sent), ``check_versions``
(STRONG reads) and ``read_heads`` (record headers only: the STRONG check's first step, the resync after a missed
invalidation). They only touch the redis-py client, which is thread-safe, and never run on the event loop.

``PoolReads`` is a mixin of ``PoolTier`` (pool.py), which owns the counters it updates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstrata.engine.entry import Entry, Meta
from kvstrata.engine.tiers.markers import Corrupt
from kvstrata.engine.tiers.pool_health import PoolUnavailableError
from kvstrata.engine.tiers.pool_record import (
    FLAG_TOMBSTONE,
    HEADER_SIZE,
    PoolDeleted,
    decode_head,
    decode_record,
)


class PoolReads:
    """The read side of a ``PoolTier`` (worker threads)."""

    def _gather(self, keys: list[bytes], what: str, add: Callable[[Any, int], None],
                per_key: int = 1) -> list[Any] | None:
        """``_run`` for the loads: None (nothing known) when there are no keys, the pool is degraded or the
        pipelines failed; otherwise each key's reply, an exception for a key whose master is degraded (counted in
        ``skipped_reads``)."""
        if not keys or not self.active:
            if keys:
                self.skipped_reads += len(keys)
            return None
        try:
            got, failed = self._run(keys, what, add, per_key=per_key)
        except Exception as exc:
            if self.degraded is None:
                self._failed(what, exc)
            return None
        self.skipped_reads += len(failed)
        return got

    def read_many(self, keys: list[bytes]) -> dict[bytes, Entry | Corrupt | None]:
        """The pool's records for ``keys``; {} (nothing known) when degraded or on error."""
        raws = self._gather(keys, "read", lambda pipe, i: pipe.get(self.pool_key(keys[i])))
        if raws is None:
            return {}
        out: dict[bytes, Entry | Corrupt | None] = {}
        for key, raw in zip(keys, raws, strict=True):
            if isinstance(raw, BaseException):
                continue  # its master is degraded: nothing known about this key
            self.reads += 1
            if raw is None:
                out[key] = None
                continue
            self.read_bytes += len(raw)
            rec = decode_record(key, raw)
            if isinstance(rec, Corrupt):
                self.corrupt_reads += 1
            elif isinstance(rec, PoolDeleted):
                out[key] = None  # deleted: a miss (the tombstone only keeps older copies from coming back)
                continue
            out[key] = rec
        return out

    def probe_many(self, keys: list[bytes]) -> dict[bytes, Meta | Corrupt | None]:
        """The pool's record headers of ``keys`` as ``Meta`` (version, expiry, value length; ``GETRANGE`` and
        ``STRLEN``: the value is not sent), None for a key the pool holds nothing or a tombstone of; {} (nothing
        known) when degraded or on error. The checksum covers the value, so it is verified by a full read only."""
        def add(pipe: Any, i: int) -> None:
            name = self.pool_key(keys[i])
            pipe.getrange(name, 0, HEADER_SIZE - 1)
            pipe.execute_command("STRLEN", name)

        got = self._gather(keys, "probe", add, per_key=2)
        if got is None:
            return {}
        out: dict[bytes, Meta | Corrupt | None] = {}
        for key, r in zip(keys, got, strict=True):
            if isinstance(r, BaseException) or any(isinstance(x, BaseException) for x in r):
                continue  # its master is degraded: nothing known about this key
            raw, length = r
            self.probes += 1
            if not raw:
                out[key] = None
                continue
            hdr = decode_head(raw)
            if hdr is None:
                self.corrupt_reads += 1
                out[key] = Corrupt(key, "not a pool record")
            elif hdr[2] & FLAG_TOMBSTONE:
                out[key] = None  # deleted: absent
            else:
                out[key] = Meta(hdr[0], hdr[1], int(length) - HEADER_SIZE)
        return out

    def check_versions(self, local: dict[bytes, int]) -> dict[bytes, Entry | PoolDeleted | None]:
        """For STRONG reads: the pool's state of each key whose pool version is higher than ``local[key]``: its
        record (Entry) or, for a delete, PoolDeleted; None when the pool holds nothing newer.

        First only the headers (``GETRANGE``), then the full records that are newer. Raises
        PoolUnavailableError when the pool cannot be asked: a STRONG read never guesses.
        """
        if not local:
            return {}
        if not self.active:
            raise PoolUnavailableError(f"the pool is unavailable ({self.degraded}); STRONG reads need it")
        keys = list(local)
        down = next((r for k in keys if (r := self.down_reason(k)) is not None), None)
        if down is not None:
            raise PoolUnavailableError(f"the pool is unavailable ({down}); STRONG reads need it")
        try:
            heads = self.read_heads(keys, "version check")
            out: dict[bytes, Entry | PoolDeleted | None] = dict.fromkeys(keys)
            newer = []
            for key, hdr in zip(keys, heads, strict=True):
                if hdr is None or hdr[0] <= local[key]:
                    continue
                if hdr[2] & FLAG_TOMBSTONE:
                    out[key] = PoolDeleted(hdr[0])
                else:
                    newer.append(key)
            if newer:
                raws, failed = self._run(newer, "version check", lambda pipe, i: pipe.get(self.pool_key(newer[i])))
                bad = next((r for r in raws if isinstance(r, BaseException)), None)
                if bad is not None:
                    raise bad
                for key, raw in zip(newer, raws, strict=True):
                    rec = decode_record(key, raw) if raw is not None else None
                    if isinstance(rec, Entry | PoolDeleted) and rec.version > local[key]:
                        out[key] = rec
                    elif isinstance(rec, Corrupt):
                        self.corrupt_reads += 1
            return out
        except Exception as exc:
            if self.degraded is None and not self.masters_down:
                self._failed("version check", exc)
            raise PoolUnavailableError(f"the pool could not be asked: {type(exc).__name__}: {exc}") from None

    def read_heads(self, keys: list[bytes], what: str) -> list[tuple[int, int, int] | None]:
        """(version, expire_at, flags) of the pool's record of each key (``GETRANGE``, the value is not sent), None
        where the pool holds no record. Raises the first fault: an answer is for every key or for none."""
        raws, _failed = self._run(keys, what,
                                  lambda pipe, i: pipe.getrange(self.pool_key(keys[i]), 0, HEADER_SIZE - 1))
        bad = next((r for r in raws if isinstance(r, BaseException)), None)
        if bad is not None:
            raise bad
        return [decode_head(raw or b"") for raw in raws]
