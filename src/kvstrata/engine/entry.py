"""One stored value and what the engine knows about it."""

from __future__ import annotations

# Bytes charged per entry beyond key and value: the Entry object, its dict slot and the policy's bookkeeping.
ENTRY_OVERHEAD = 96

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


def entry_size(key: bytes, value: Value) -> int:
    return len(key) + len(value) + ENTRY_OVERHEAD
