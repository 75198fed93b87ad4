"""One stored value and what the engine knows about it."""

from __future__ import annotations

from typing import NamedTuple

# Bytes charged per entry beyond key and value: the Entry object, its dict slot, the scan index and the policy's
# bookkeeping (LRU-K's history and ghost). Measured in CPython 3.11 with 200k small entries: about 320 B with LRU
# and 490 B with LRU-K (checked by tests/unit/test_store_dram.py::test_entry_overhead_covers_rss).
ENTRY_OVERHEAD = 512

Value = bytes | bytearray


class Entry:
    """A value with its version, absolute expiry (wall ms, 0 = none) and flags.

    ``on_ssd`` is true when an identical copy is already durable on the SSD tier (write-through), so demoting
    the entry only drops the DRAM copy.
    """

    __slots__ = ("expire_at", "on_ssd", "pinned", "value", "version")

    def __init__(self, value: Value, version: int, expire_at: int = 0) -> None:
        self.value = value
        self.version = version
        self.expire_at = expire_at
        self.pinned = False
        self.on_ssd = False

    def expired(self, now_ms: int) -> bool:
        return 0 < self.expire_at <= now_ms

    @property
    def value_len(self) -> int:
        return len(self.value)


class Meta(NamedTuple):
    """What a probe of a lower tier finds of a record without reading its value (EXISTS, TYPE, the TTL family):
    its version, absolute expiry (wall ms, 0 = none) and value length. Answers those commands as an Entry would."""

    version: int
    expire_at: int
    value_len: int

    def expired(self, now_ms: int) -> bool:
        return 0 < self.expire_at <= now_ms

