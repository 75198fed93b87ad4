"""The pool writer thread's side: it sends every queued operation waiting as one pipeline per master (versioned
``SET``, compare-and-set, tombstone or budget ``DEL``, decided in the pool by ``pool_scripts``), optionally
waits for replicas, and hands the results back to the owner's thread (``_committed``), which settles ``pending``,
the index and the outcomes of tracked writes.

``PoolWriter`` is a ``BatchWriter`` mixin of ``PoolTier`` (pool.py), which owns the state.
"""

from __future__ import annotations

import struct
from typing import Any

from kvstrata.engine.tiers import pool_scripts
from kvstrata.engine.tiers.pool_health import PoolUnavailableError, _is_fault
from kvstrata.engine.tiers.pool_record import FLAG_TOMBSTONE, encode_record
from kvstrata.engine.tiers.writer import BatchWriter

_PUT, _DEL_IF, _CAS, _TOMB = range(4)
TOMB_RETRIES = 3
OK, OLDER, MISMATCH, FAILED = "ok", "older", "mismatch", "failed"


class PoolWriter(BatchWriter):
    """Applies a batch of queued pool operations (writer thread) and settles them (owner's thread)."""

    degraded: str | None
    pending: dict[bytes, Any]
    outcomes: dict[int, tuple[str, Any]]
    abandoned: set[int]

    def _outcome(self, seq: int, outcome: tuple[str, Any]) -> None:
        """Keep a tracked write's outcome for the command that waits for it, unless that command is gone
        (``abandon``): then nobody would ever take it. Recorded first and dropped after, so that an ``abandon``
        on the owner's thread at any moment in between leaves neither the outcome nor the mark behind."""
        self.outcomes[seq] = outcome
        if seq in self.abandoned:
            self.outcomes.pop(seq, None)
            self.abandoned.discard(seq)

    def _process(self, batch: list[tuple[Any, ...]]) -> None:
        error: str | None = None
        results: list[Any] = []
        if not self.active:
            error = f"skipped (pool degraded: {self.degraded})"
        else:
            def add(pipe: Any, i: int) -> None:
                _seq, _n, kind, key, snap, arg = batch[i]
                pkey = self.pool_key(key)
                if kind == _PUT:
                    rec = encode_record(key, snap.value, snap.version, snap.expire_at)
                    ver = struct.pack(">Q", snap.version)
                    pipe.execute_command("EVAL", pool_scripts.SET_IF_NEWER, 1, pkey, rec, ver, arg[0],
                                         self.channel, ver + b"\x00")
                elif kind == _CAS:
                    rec = encode_record(key, snap.value, snap.version, snap.expire_at)
                    ver = struct.pack(">Q", snap.version)
                    pipe.execute_command("EVAL", pool_scripts.CAS, 1, pkey, rec, ver, arg[0], self.channel,
                                         struct.pack(">Q", arg[2]), struct.pack(">Q", arg[3]), ver + b"\x00")
                elif kind == _TOMB:
                    rec = encode_record(key, b"", arg[0], 0, FLAG_TOMBSTONE)
                    ver = struct.pack(">Q", arg[0])
                    pipe.execute_command("EVAL", pool_scripts.SET_IF_NEWER, 1, pkey, rec, ver,
                                         self.tombstone_ttl_ms, self.channel, ver + b"\x01")
                else:
                    pipe.execute_command("EVAL", pool_scripts.DEL_IF_VERSION, 1, pkey, struct.pack(">Q", arg))

            try:
                c = self.client()
                # A key whose master is degraded (or failed now) gets its exception as result: a failed write.
                results, _failed = self._run([op[3] for op in batch], "write", add)
                if self.ack == "replicas":
                    results = self._wait_replicas(c, batch, results)
            except Exception as exc:
                if self.degraded is None:
                    self._failed("write", exc)
                error = f"{type(exc).__name__}: {exc}"
        self._deliver(lambda: self._committed(batch, error, results))

    def _wait_replicas(self, c: Any, batch: list[tuple[Any, ...]], results: list[Any]) -> list[Any]:
        """``WAIT ack_replicas`` on each master a tracked write of this batch went to; a write whose master could
        not confirm enough replicas within one pool-timeout fails (it may be lost in a failover)."""
        masters: dict[Any, list[int]] = {}
        for i, (_seq, _n, kind, key, _snap, arg) in enumerate(batch):
            if kind in (_PUT, _CAS, _TOMB) and arg[1] and results[i] == 1:
                node = c.get_node_from_key(self.pool_key(key)) if self.cluster else None
                masters.setdefault(node, []).append(i)
        out = list(results)
        for node, idx in masters.items():
            kw = {"target_nodes": node} if node is not None else {}
            # Half a pool-timeout: WAIT answers (with the count so far) before the socket gives up.
            got = c.execute_command("WAIT", self.ack_replicas, max(1, self.timeout_ms // 2), **kw)
            if int(got) < self.ack_replicas:
                self.replica_waits_short += 1
                for i in idx:
                    out[i] = RuntimeError(f"only {got} of {self.ack_replicas} pool replicas confirmed the write")
        return out

    def _committed(self, batch: list[tuple[Any, ...]], error: str | None, results: list[Any]) -> None:
        for i, (seq, nbytes, kind, key, snap, arg) in enumerate(batch):
            self.queued_bytes -= nbytes
            mine = kind != _DEL_IF and self.pending.get(key, 0) is snap
            if mine:
                del self.pending[key]
            self.committed_seq = max(self.committed_seq, seq)
            if kind == _DEL_IF:
                continue
            tracked = bool(arg[1])
            # A tombstone sent again reports to the DEL that queued the first one (arg[3]: its seq).
            origin = (arg[3] or seq) if kind == _TOMB else seq
            res = results[i] if results else None
            version = arg[0] if kind == _TOMB else snap.version
            if kind == _TOMB and (error is not None or isinstance(res, BaseException)):
                # A delete is never dropped: its tombstone stays pending here (so this node does not read the
                # old record back) and is sent again once the pool answers (``replay_deletes``).
                if key not in self.pending:
                    self.pending[key] = snap
                if self.pending.get(key) is snap:
                    self.replay[key] = arg[0]
            if error is not None or isinstance(res, BaseException):
                text = error if error is not None else f"{type(res).__name__}: {res}"
                self.skipped_writes += 1
                if error is None and not (isinstance(res, PoolUnavailableError) or _is_fault(res)):
                    self.refused_writes += 1
                got = self.index.get(key)
                if got is not None and got[0] == version:
                    self._forget(key)
                if tracked:
                    self._outcome(origin, (FAILED, text))
                    if kind != _TOMB and (self.ack != "local" or kind == _CAS):
                        # The client hears that the write failed: this node does not serve it either.
                        self.on_refused(key, version)
                continue
            self.writes += 1
            self.write_bytes += nbytes
            if kind == _TOMB:
                self.tombstones += 1
            if res == 1:
                if tracked:
                    self._outcome(origin, (OK, version))
                continue
            # Refused: the pool holds a higher version (or, for a CAS, another one than expected).
            if isinstance(res, list):
                pool_version = struct.unpack(">Q", res[0])[0] if len(res[0]) == 8 else 0
                outcome = MISMATCH
                self.cas_refused += 1
            else:
                pool_version = struct.unpack(">Q", res)[0] if isinstance(res, bytes) and len(res) == 8 else 0
                outcome = OLDER
                self.conflicts += 1
            got = self.index.get(key)
            if got is not None and got[0] == version:
                self._forget(key)
            if kind == _TOMB:
                if outcome == OLDER and arg[2] < TOMB_RETRIES and (tracked or key not in self.pending):
                    # The pool holds a higher version that arrived first (another node's clock was ahead): this
                    # delete came later, so it must win. Sent again above the pool's version, and the DEL waits
                    # for it (its outcome), also when a write of the key was queued here meanwhile: that write
                    # does not stand for the delete (a CAS of it may be refused, and until it lands the pool
                    # serves the record the DEL was to remove). The newer write stays the pending state.
                    if key not in self.pending:
                        self.pending[key] = snap
                    self._enqueue((_TOMB, key, snap, (pool_version + 1, tracked, arg[2] + 1, origin)))
                elif tracked:
                    self._outcome(origin, (OLDER, pool_version))  # the DEL did not take: -TRYAGAIN
                continue
            self.on_refused(key, version)
            if tracked:
                self._outcome(seq, (outcome, pool_version))
