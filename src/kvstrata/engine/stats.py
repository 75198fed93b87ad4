"""Plain counters the hot path increments; observability reads them as a snapshot."""

from __future__ import annotations

from dataclasses import dataclass, fields


class Counters:
    """A dataclass of integer counters that can be read as a dict and reset to zero."""

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    def add(self, **deltas: int) -> None:
        for name, delta in deltas.items():
            setattr(self, name, getattr(self, name) + delta)

    def reset(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            setattr(self, f.name, 0)


@dataclass
class TierStats(Counters):
    hits: int = 0
    misses: int = 0
    promotions: int = 0
    demotions: int = 0
    evictions: int = 0
    corrupt_reads: int = 0


@dataclass
class EngineStats(Counters):
    # Reads as Redis counts them (INFO keyspace_hits/misses): counted where the read is, not per tier.
    keyspace_hits: int = 0
    keyspace_misses: int = 0
    expired_keys: int = 0
    evicted_keys: int = 0
    prefetch_queued: int = 0
    prefetch_done: int = 0
    pin_rejected: int = 0
    # Prefetch outcomes (docs/prefetch.md): every promotion by a prefetch is issued; it is then used (read while
    # in DRAM), late (read while its load was still in flight: a subset of used) or wasted (left DRAM unread).
    prefetch_predicted: int = 0
    prefetch_issued: int = 0
    prefetch_used: int = 0
    prefetch_late: int = 0
    prefetch_wasted: int = 0
    prefetch_absent: int = 0
    prefetch_rejected: int = 0
