"""Short pauses of a background writer thread, so that the event loop gets the interpreter while the thread works.

CPython passes the GIL to a thread that waits for it only when the holder blocks, or after the switch interval
(5 ms) has run out. A writer thread lets go of the GIL for microseconds at a time (py-lmdb releases it inside
every call) and takes it back before a waiting thread has woken: so the event loop, woken by a client's request
while the SSD writer runs a batch, waits until the batch ends or the 5 ms are up. A writer that sleeps briefly
after every ``every_us`` of work lets a waiting event loop in there (BENCHMARKS.md, "Prefetch: the SSD writer
pauses for the event loop").
"""

from __future__ import annotations

import time

PAUSE_S = 50e-6
"""How long a pause sleeps: long enough for a thread waiting on the GIL to wake and take it."""
EVERY_US = 200
"""The default of ``ssd-writer-pause``: microseconds of work between two pauses."""


class Pacer:
    """Counts a thread's work time since its last pause (``start`` at the head of a batch, ``tick`` between two
    operations) and sleeps ``PAUSE_S`` whenever it exceeds ``every_us``. ``every_us`` 0: never pauses (and a
    writer run on the caller's thread, as unit tests do, must never pause: that is the event loop)."""

    __slots__ = ("_every_ns", "_since", "pauses")

    def __init__(self, every_us: int = EVERY_US) -> None:
        self._every_ns = 0
        self._since = 0
        self.pauses = 0
        self.every_us = every_us

    @property
    def every_us(self) -> int:
        return self._every_ns // 1000

    @every_us.setter
    def every_us(self, value: int) -> None:
        self._every_ns = max(0, int(value)) * 1000

    def start(self) -> None:
        self._since = time.perf_counter_ns()

    def tick(self) -> None:
        every = self._every_ns
        if not every:
            return
        now = time.perf_counter_ns()
        if now - self._since >= every:
            time.sleep(PAUSE_S)
            self.pauses += 1
            self._since = time.perf_counter_ns()
