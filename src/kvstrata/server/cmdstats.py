"""Per-command counters (calls, failures, total and histogrammed latency) and the slow log.

The hot path does a few integer operations per command; INFO commandstats/latencystats, SLOWLOG and the
Prometheus exporter read these objects when asked.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kvstrata.redact import redact_args

# Latency histogram: bucket i counts commands that took less than 2**i microseconds (i = bit length of the µs).
HIST_BUCKETS = 64


class CommandStats:
    __slots__ = ("calls", "failed", "hist", "rejected", "usec")

    def __init__(self) -> None:
        self.calls = 0
        self.failed = 0
        # Refused before running (wrong arity, NOAUTH, ACL): not in calls, as Redis's rejected_calls.
        self.rejected = 0
        self.usec = 0
        self.hist = [0] * HIST_BUCKETS

    def reset(self) -> None:
        self.calls = self.failed = self.rejected = self.usec = 0
        self.hist = [0] * HIST_BUCKETS


@dataclass
class SlowEntry:
    id: int
    when: int
    usec: int
    args: list[bytes]
    client_addr: str
    client_name: bytes


@dataclass
class SlowLog:
    max_len: int = 128
    entries: deque[SlowEntry] = field(default_factory=deque)
    next_id: int = 0

    def add(self, usec: int, args: list[Any], client_addr: str, client_name: bytes) -> None:
        args = redact_args(args)  # passwords never reach SLOWLOG GET nor /stats.json
        # As Redis does: at most 32 arguments, each cut to 128 bytes, so the log stays small.
        shown = [bytes(a[:128]) + (b"... (%d more bytes)" % (len(a) - 128) if len(a) > 128 else b"")
                 for a in args[:32]]
        if len(args) > 32:
            shown[-1] = b"... (%d more arguments)" % (len(args) - 31)
        self.entries.appendleft(SlowEntry(self.next_id, int(time.time()), usec, shown, client_addr, client_name))
        self.next_id += 1
        while len(self.entries) > self.max_len:
            self.entries.pop()

    def reset(self) -> None:
        self.entries.clear()
