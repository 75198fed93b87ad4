"""A Bloom filter of the keys the SSD tier holds, so that a read of a key it has never held is answered on the
event loop instead of in a loader thread.

A read whose record's place is unknown goes to a thread: without reading, a key with no record cannot be told
from one whose place was never learnt. A KV cache's misses are mostly of that kind (the chunks of a prompt never
seen), so each cost a thread hop. The filter answers "certainly not held" for them: no false negatives (every
key the tier may hold was added), false positives only cost the old way. Keys are never removed (a deleted
key's bits stay: a false positive, not an error); a filter that has taken more keys than it was sized for is
rebuilt from the tier (``SsdTier``'s ``_start_filter``).

About 1.2 bytes a key at a 1% false-positive rate (k = 7 probes, 9.6 bits a key).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import xxhash

PROBES = 7
BITS_PER_KEY = 9.6  # ~1% false positives with PROBES probes
MIN_KEYS = 1 << 16  # the smallest filter sized (77 KiB)


class KeyFilter:
    """A Bloom filter over byte strings: ``add``, ``add_many`` (vectorised), ``in``, ``merge``.

    Not thread-safe for writers: one thread adds (the tier's owner); readers on other threads only see bits set
    (a bit is never cleared), which is what a lookup needs.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(MIN_KEYS, capacity)
        nbits = -(-int(self.capacity * BITS_PER_KEY) // 8) * 8
        self.nbits = nbits
        self._bits = bytearray(nbits // 8)
        self.count = 0  # keys added (a key added twice counts twice: full() errs towards rebuilding early)

    @property
    def nbytes(self) -> int:
        return len(self._bits)

    def full(self) -> bool:
        """Whether it has taken more keys than it was sized for (its false-positive rate is rising)."""
        return self.count > self.capacity

    def _spots(self, key: bytes) -> tuple[int, int]:
        h = xxhash.xxh3_64_intdigest(key)
        return h & 0xFFFFFFFF, (h >> 32) | 1

    def add(self, key: bytes) -> None:
        h1, h2 = self._spots(key)
        bits, n = self._bits, self.nbits
        for i in range(PROBES):
            p = (h1 + i * h2) % n
            bits[p >> 3] |= 1 << (p & 7)
        self.count += 1

    def __contains__(self, key: bytes) -> bool:
        h1, h2 = self._spots(key)
        bits, n = self._bits, self.nbits
        for i in range(PROBES):
            p = (h1 + i * h2) % n
            if not bits[p >> 3] & (1 << (p & 7)):
                return False
        return True

    def add_many(self, keys: Iterable[bytes]) -> None:
        """``add`` for many keys at once (a scan of the tier): the probes are set with numpy."""
        digest = xxhash.xxh3_64_intdigest
        hashes = np.fromiter((digest(k) for k in keys), dtype=np.uint64)
        if not hashes.size:
            return
        h1 = hashes & np.uint64(0xFFFFFFFF)
        h2 = (hashes >> np.uint64(32)) | np.uint64(1)
        view = np.frombuffer(self._bits, dtype=np.uint8)
        n = np.uint64(self.nbits)
        for i in range(PROBES):
            p = (h1 + np.uint64(i) * h2) % n
            np.bitwise_or.at(view, (p >> np.uint64(3)).astype(np.intp),
                             np.left_shift(np.uint8(1), (p & np.uint64(7)).astype(np.uint8)))
        self.count += int(hashes.size)

    def merge(self, other: KeyFilter) -> None:
        """Add every key of ``other`` (a filter of the same size)."""
        if other.nbits != self.nbits:
            raise ValueError("only filters of the same size merge")
        view = np.frombuffer(self._bits, dtype=np.uint8)
        np.bitwise_or(view, np.frombuffer(other._bits, dtype=np.uint8), out=view)
        self.count += other.count
