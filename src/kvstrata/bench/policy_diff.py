"""Two eviction policies replayed in lock step over a trace: a differential check that they make the same choices.

Used to show that a re-implementation (``lru-k-compact`` against ``lru-k``) decides exactly as the original: the
trace is replayed as ``kvstrata bench hitrate`` replays it (a resident key is touched, a missing one is admitted
after the lowest-ranked keys are evicted down to the capacity), both policies get every call, and every victim
must be the same key. Hits are the same then by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstrata.bench.traces import Request


class Divergence(AssertionError):
    """The two policies chose different victims (or ended in different orders)."""


def lockstep(trace: Sequence[Request], capacity: int, a: Any, b: Any) -> int:
    """Replay ``trace`` with ``capacity`` slots through policies ``a`` and ``b`` at once; the number of evictions,
    all identical. Raises :class:`Divergence` at the first victim that differs, or if the final orders differ."""
    resident: set[Any] = set()
    evictions = 0
    for req in trace:
        for key in (*req.reads, *req.writes):
            if key in resident:
                a.touch(key)
                b.touch(key)
                continue
            while len(resident) >= capacity:
                victim = a.victim()
                other = b.victim()
                if victim != other:
                    raise Divergence(f"eviction {evictions}: {a.name} chose {victim!r}, {b.name} {other!r}")
                a.remove(victim)
                b.remove(victim)
                resident.discard(victim)
                evictions += 1
            a.admit(key)
            b.admit(key)
            resident.add(key)
    if list(a.victims()) != list(b.victims()):
        raise Divergence("the final rankings differ")
    return evictions
