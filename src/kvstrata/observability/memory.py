"""The server's memory figures as Redis names them, for INFO memory and MEMORY STATS (one source, so the two agree).

``used_memory`` is what the DRAM tier charges (keys, values, a per-entry overhead): the budget's measure, as
Redis's used_memory is what maxmemory limits. Of it, the per-entry overhead is ``used_memory_overhead`` and the
rest ``used_memory_dataset``. The fragmentation ratio is Redis's: resident memory over used_memory, so it also
counts the interpreter (tens of MB) and arena pages a freed value left resident; it reads high on a small dataset,
as Redis's does.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import Any


def rss_now() -> int:
    """The process's resident memory now (bytes), from /proc; the peak where /proc cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return rss_peak()


def rss_peak() -> int:
    """The process's peak resident memory (bytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class MemoryFigures:
    """Bytes: the DRAM tier's charge, its peak, the per-entry part of it, resident memory, the clients' memory."""

    used: int
    peak: int
    overhead: int
    rss: int
    clients: int

    @property
    def dataset(self) -> int:
        return self.used - self.overhead

    @property
    def fragmentation(self) -> float:
        return self.rss / self.used if self.used else 0.0


def figures(store: Any, server: Any) -> MemoryFigures:
    """Now; raises the recorded used_memory peak as Redis's INFO does."""
    dram = store.dram
    peak = dram.used
    if server is not None:
        peak = server.stats.peak_memory = max(server.stats.peak_memory, dram.used)
    return MemoryFigures(used=dram.used, peak=peak, overhead=dram.overhead * len(dram.entries), rss=rss_now(),
                         clients=server.clients_memory() if server is not None else 0)
