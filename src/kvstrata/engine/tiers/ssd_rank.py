"""The SSD tier's eviction order when it is not plain oldest-first: a policy ranking the records on disk.

The SSD tier is the last tier, so it is the only one that evicts, and it can hold millions of records. Its policy
ranks the records' write sequence numbers (the ``order`` index's keys, also in each record's header), not their
keys: no key object lives in memory, and a victim is found on disk through ``order`` (seq -> data key). In flat
arrays: ``s3-compact`` (S3-FIFO, ``engine/policy/s3compact.py``, the default: ~85 B per record with its ghosts)
and ``clock`` (``engine/policy/clock.py``, ~58 B); the registry's policies (``s3-fifo``, ``lru``, ``lru-k``,
``arc``) rank the same ints in Python dicts, ~165-280 B per record (``kvstrata bench hitrate --ssd``).

What counts as an access:

* a read of a record from LMDB (a load, a synchronous read); probes of headers (EXISTS, TTL) do not count;
* a key written again soon after it left the SSD: under write-back a promotion to DRAM deletes the record and a
  later demotion writes it again under a new sequence number; a bounded FIFO of fingerprints of the data keys
  that left (``GhostFifo``, at most as many as the records tracked) turns that return into a touch.

Threads: reads happen on the loader's threads and the event loop, so they only append the sequence number to a
bounded deque (atomic under the GIL); the writer thread owns the policy, applies the logged reads at the start
of each batch and ranks, admits and removes inside its write transactions. A transaction that fails is undone
in the policy too (``rollback``), so it tracks what is committed; a record it does not track (the ranking
missed it) is still evicted oldest-first once the ranking runs out, so the budget never depends on it.

On restart the policy is rebuilt from ``order`` in write order (no access history survives a restart).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from kvstrata.engine.policy import create_policy
from kvstrata.engine.policy._ghosts import GhostFifo, fingerprint
from kvstrata.engine.policy.clock import ClockPolicy, scramble, unscramble
from kvstrata.engine.policy.s3compact import CompactS3FIFOPolicy

SSD_POLICIES: tuple[str, ...] = ("fifo", "clock", "s3-compact", "s3-fifo", "lru", "lru-k", "arc")
"""``fifo``: oldest write first, no ranking in memory (the tier's behaviour before rankings)."""
DEFAULT_SSD_POLICY = "s3-compact"
"""Chosen by ``kvstrata bench hitrate --ssd`` (BENCHMARKS.md, "Eviction: SSD tier")."""
ACCESS_LOG = 65_536
"""Reads remembered between two writer batches; beyond it the oldest are forgotten (a ranking hint only)."""
_MIN_RETURNING = 1024


class _Scrambled:
    """A registry policy ranking sequence numbers through ``scramble``: their ghosts' fingerprint tables probe
    linearly, and consecutive ints would make long probe runs (``ClockPolicy`` scrambles by itself)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    def admit(self, seq: int) -> None:
        self.inner.admit(scramble(seq))

    def touch(self, seq: int) -> None:
        self.inner.touch(scramble(seq))

    def remove(self, seq: int) -> None:
        self.inner.remove(scramble(seq))

    def victim(self) -> int | None:
        fp = self.inner.victim()
        return None if fp is None else unscramble(fp)

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, int) and scramble(seq) in self.inner

    def __len__(self) -> int:
        return len(self.inner)

    def clear(self) -> None:
        self.inner.clear()


def create_ssd_ranking(name: str) -> SsdRanking | None:
    """The ranking for ``--ssd-policy`` ``name``; None for ``fifo`` (the order index alone)."""
    if name not in SSD_POLICIES:
        raise ValueError(f"unknown SSD eviction policy {name!r}; known: {', '.join(SSD_POLICIES)}")
    return None if name == "fifo" else SsdRanking(name)


class SsdRanking:
    """A policy over the SSD records' sequence numbers, with the bookkeeping that keeps it in step with LMDB."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.policy: Any = (ClockPolicy() if name == "clock" else CompactS3FIFOPolicy() if name == "s3-compact"
                            else _Scrambled(create_policy(name)))
        self._reads: deque[int] = deque(maxlen=ACCESS_LOG)
        self._returning = GhostFifo()
        self._journal: list[tuple[bool, int]] = []  # (admitted?, seq) since the last commit
        self.cleared = False  # a FLUSH in the open transaction: a rollback rebuilds from disk
        self.returns = 0  # writes of a key that had left the SSD recently (counted as accesses)

    # ---- any thread ----
    def accessed(self, seq: int) -> None:
        """A record was read; ranked at the writer's next batch."""
        self._reads.append(seq)

    # ---- the writer thread ----
    def drain(self) -> None:
        """Apply the reads logged since the last batch."""
        reads, policy = self._reads, self.policy
        while reads:
            seq = reads.popleft()
            if seq in policy:
                policy.touch(seq)

    def admit(self, seq: int, lkey: bytes) -> None:
        """A record was written under ``seq``; a key that left recently comes back as accessed."""
        self.policy.admit(seq)
        self._journal.append((True, seq))
        if self._returning.count and self._returning.discard(fingerprint(lkey)):
            self.policy.touch(seq)
            self.returns += 1

    def remove(self, seq: int, lkey: bytes) -> None:
        """The record ``seq`` of data key ``lkey`` left (deleted, overwritten, expired or evicted)."""
        if seq in self.policy:
            self.policy.remove(seq)
            self._journal.append((False, seq))
        returning = self._returning
        returning.add(fingerprint(lkey))
        bound = max(_MIN_RETURNING, len(self.policy))
        while returning.count > bound:
            returning.popleft()

    def forget(self, seq: int) -> None:
        """A ranked sequence number with no record behind it (stale): dropped."""
        if seq in self.policy:
            self.policy.remove(seq)
            self._journal.append((False, seq))

    def victim(self) -> int | None:
        return self.policy.victim()

    def clear(self) -> None:
        self.policy.clear()
        self._returning.clear()
        self._journal.clear()
        self.cleared = True

    def commit(self) -> None:
        """The open transaction committed: its changes stay."""
        self._journal.clear()
        self.cleared = False

    def rollback(self) -> bool:
        """The open transaction failed: undo its admits and removals. False when a FLUSH was in it (the caller
        rebuilds from disk instead)."""
        journal, policy = self._journal, self.policy
        while journal:
            admitted, seq = journal.pop()
            if admitted:
                if seq in policy:
                    policy.remove(seq)
            else:
                policy.admit(seq)
        if self.cleared:
            self.cleared = False
            return False
        return True

    def rebuild(self, seqs: Iterable[int]) -> None:
        """Track ``seqs`` (the records on disk, oldest write first) and nothing else."""
        self.policy.clear()
        self._journal.clear()
        self.cleared = False
        if isinstance(self.policy, ClockPolicy | CompactS3FIFOPolicy):
            self.policy.extend(list(seqs))
            return
        admit = self.policy.admit
        for seq in seqs:
            admit(seq)

    def __len__(self) -> int:
        return len(self.policy)

    def info(self) -> dict[str, Any]:
        return {"eviction_policy": self.name, "ranked": len(self.policy), "returns": self.returns}
