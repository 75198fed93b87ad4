"""The interface the tiers below DRAM share (SSD, pool), so the engine treats their common parts one way.

Each lower tier keeps its newest not-yet-applied state in memory (``lookup_pending``), reads in batches off the
event loop (``read_many``, called from the loader thread), queues writes to its own writer thread and answers
with a completion sequence number (``put``, ``delete``), tells the engine when a key it is loading changed
(``watch``/``unwatch``), has a byte budget, and describes itself for INFO and the metrics (``info``).

DRAM is not a lower tier: its API is the entries dict the hot path reads directly (``tiers/dram.py``).

What is not generic yet: the Store still holds its lower tiers as ``store.ssd`` and ``store.pool`` and gives
each its role (the SSD is authoritative, the pool holds copies); see docs/architecture.md, "Tiers".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.markers import Corrupt
from kvstrata.engine.tiers.watch import Ticket


@runtime_checkable
class LowerTier(Protocol):
    name: str
    budget: int
    used: int
    committed_seq: int

    def lookup_pending(self, key: bytes) -> tuple[bool, Entry | None]:
        """(known, entry) from memory alone: known is true when no read of the tier is needed."""
        ...

    def read_many(self, keys: list[bytes]) -> dict[bytes, Entry | Corrupt | None]:
        """Records of ``keys`` (any thread; the loader's)."""
        ...

    def put(self, key: bytes, entry: Entry) -> int:
        """Queue a write of a snapshot of ``entry``; its completion sequence number (0: skipped)."""
        ...

    def delete(self, key: bytes) -> Any: ...

    def watch(self, keys: Iterable[bytes]) -> Ticket: ...

    def unwatch(self, ticket: Ticket) -> None: ...

    def set_delivery(self, deliver: Callable[[Callable[[], None]], None]) -> None:
        """How the writer thread hands completions to the owner's thread."""
        ...

    def info(self) -> dict[str, Any]:
        """This tier's own INFO fields (beyond name, used, budget, keys and the engine's hit counters)."""
        ...

    def close(self) -> None: ...

    def __len__(self) -> int: ...
