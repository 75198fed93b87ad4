"""The interface every tier implements, so the engine can stack DRAM, SSD, pool and HBM tiers the same way."""

from __future__ import annotations

from typing import Protocol

from kvstrata.engine.entry import Entry


class Tier(Protocol):
    name: str

    @property
    def used(self) -> int:
        """Bytes this tier holds (what is charged against its budget)."""
        ...

    @property
    def budget(self) -> int: ...

    def get(self, key: bytes) -> Entry | None: ...

    def put(self, key: bytes, entry: Entry) -> None: ...

    def delete(self, key: bytes) -> bool: ...

    def contains(self, key: bytes) -> bool: ...

    def __len__(self) -> int: ...
