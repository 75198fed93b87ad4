"""Plain counters the hot path increments; observability reads them as a snapshot."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class TierStats:
    hits: int = 0
    misses: int = 0
    promotions: int = 0
    demotions: int = 0
    evictions: int = 0
    corrupt_reads: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)


@dataclass
class EngineStats:
    expired_keys: int = 0
    evicted_keys: int = 0
    keyspace_hits: int = 0
    keyspace_misses: int = 0
    prefetch_queued: int = 0
    prefetch_done: int = 0
    pin_rejected: int = 0

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)
