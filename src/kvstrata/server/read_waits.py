"""How long reads that DRAM could not serve at once waited, by how they were served, and how long prefetching held
the event loop: the figures that explain a read-latency tail (``INFO prefetch``, docs/prefetch.md).

Kinds of sample, each in microseconds:

* ``joined``: a read that found its key in the prefetch batch being loaded and waited for it to be up (a late
  prefetch);
* ``load``: a read's own (foreground) load from a lower tier, from the request to the key's state being known;
* ``queued``: of a foreground load, the time it waited for a loader thread before its read started;
* ``promote``: one prefetched key's promotion into DRAM (one event-loop turn: every connection waits).

Only the latest ``keep`` samples of each kind are kept (a percentile over recent traffic, in bounded memory);
the counts are totals. Everything is recorded on the event loop (the loader thread only notes when it started).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

KINDS: tuple[str, ...] = ("joined", "load", "queued", "promote")
KEEP = 4096


def percentile(ordered: Sequence[int], q: float) -> int:
    """The q-quantile of sorted samples (nearest rank, rounding down; 0 without samples)."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0


class ReadWaits:
    __slots__ = ("counts", "samples")

    def __init__(self, keep: int = KEEP) -> None:
        self.samples: dict[str, deque[int]] = {kind: deque(maxlen=keep) for kind in KINDS}
        self.counts: dict[str, int] = dict.fromkeys(KINDS, 0)

    def add(self, kind: str, usec: int) -> None:
        self.samples[kind].append(usec)
        self.counts[kind] += 1

    def info(self) -> list[tuple[str, int]]:
        """``wait_<kind>s``, ``wait_<kind>_p50_us`` and ``wait_<kind>_p99_us`` for each kind (0 without samples)."""
        rows: list[tuple[str, int]] = []
        for kind in KINDS:
            ordered = sorted(self.samples[kind])
            rows += [(f"wait_{kind}s", self.counts[kind]), (f"wait_{kind}_p50_us", percentile(ordered, 0.5)),
                     (f"wait_{kind}_p99_us", percentile(ordered, 0.99))]
        return rows
