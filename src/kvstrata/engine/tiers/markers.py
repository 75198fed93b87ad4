"""Markers shared by the tiers whose state lives partly off the event loop (SSD, pool)."""

from __future__ import annotations


class Tombstone:
    """A pending delete. Each delete gets its own, so a commit only clears the pending state it wrote."""

    __slots__ = ()


class Corrupt:
    """Returned by reads when a record fails its checks (magic, format, checksum); never handed to clients."""

    __slots__ = ("key", "reason")

    def __init__(self, key: bytes, reason: str) -> None:
        self.key = key
        self.reason = reason
