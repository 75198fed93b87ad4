"""Injectable clocks: wall time for TTLs, a monotonic clock for recency, so tests never sleep."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the Unix epoch (TTLs are absolute wall times, as in Redis)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes backwards (recency, LRU-K)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; both readings advance together."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._ms = start_ms
        self._mono = 0.0

    def now_ms(self) -> int:
        return self._ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._ms += int(round(seconds * 1000))
        self._mono += seconds
