"""A count-min frequency sketch with a doorkeeper and periodic aging, as TinyLFU (Einziger et al., 2017) uses.

* Four rows of ``width`` one-byte counters (``width`` a power of two), saturating at 15 as Caffeine's 4-bit
  counters do. The estimate of a key is its smallest counter: collisions only over-count.
* The doorkeeper is a one-hash bit array (a byte per bit here) in front of the rows: a key's first occurrence
  since the last aging only sets its doorkeeper bit, so one-off keys never reach the counters.
* Aging: after ``10 * width`` recorded occurrences every counter is halved and the doorkeeper is cleared, so
  frequencies describe the recent past (a window measured in accesses, never in seconds).

Memory: 5 * width bytes. W-TinyLFU keeps ``width`` between 2 and 8 times its tracked key count (at least 1024),
starting afresh when the count outgrows it: 10 to 40 bytes per tracked key.
"""

from __future__ import annotations

from zlib import crc32

_HALVE = bytes(v >> 1 for v in range(256))
_SEED = 0x9E3779B9
_CAP = 15


class FrequencySketch:
    __slots__ = ("_adds", "_door", "_mask", "_rows", "_sample", "width")

    def __init__(self, keys: int = 16) -> None:
        width = 16  # at most 2**32 (the hashes are 32-bit)
        while width < keys:
            width <<= 1
        self.width = width
        self._mask = width - 1
        self._rows = bytearray(4 * width)
        self._door = bytearray(width)
        self._sample = 10 * width
        self._adds = 0

    def _slots(self, key: bytes) -> tuple[int, int, int, int, int]:
        # CRC-32 rather than hash(): Python salts bytes hashes per process, and a benchmark must replay the same.
        h = crc32(key)
        g = crc32(key, _SEED) | 1  # a second, odd hash: row i uses h + i * g (double hashing)
        m, w = self._mask, self.width
        return h & m, (h + g) & m, w + ((h + 2 * g) & m), 2 * w + ((h + 3 * g) & m), 3 * w + ((h + 4 * g) & m)

    def add(self, key: bytes) -> None:
        """Record one occurrence of ``key``."""
        d, a, b, c, e = self._slots(key)
        door = self._door
        if not door[d]:
            door[d] = 1
        else:
            rows = self._rows
            for i in (a, b, c, e):
                v = rows[i]
                if v < _CAP:
                    rows[i] = v + 1
        self._adds += 1
        if self._adds >= self._sample:
            self.age()

    def estimate(self, key: bytes) -> int:
        """Occurrences of ``key`` in the recent past (0..16), never an under-count between agings."""
        d, a, b, c, e = self._slots(key)
        rows = self._rows
        return min(rows[a], rows[b], rows[c], rows[e]) + self._door[d]

    def age(self) -> None:
        """Halve every counter and clear the doorkeeper."""
        self._rows = self._rows.translate(_HALVE)
        self._door = bytearray(self.width)
        self._adds //= 2

    def nbytes(self) -> int:
        return len(self._rows) + len(self._door)
