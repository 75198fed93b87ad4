"""The interface the tiers below DRAM share, and the roles a tier declares, so the engine walks them as one list.

Each lower tier keeps its newest not-yet-applied state in memory (``lookup_pending``), reads in batches off the
event loop (``read_many``, called from the loader thread; ``probe_many``: record headers only; ``read_resident``:
either on the loop, when it cannot wait for a disk), queues writes and
answers with a completion sequence number (``put``, ``delete``), tells the engine when a key it is loading changed (``watch``/``unwatch``), has a
byte budget, and describes itself for INFO and the metrics (``info``; ``info_row`` is the whole INFO section).

A tier declares its role with class attributes (``TierRoles``), and the Store (``kvstrata.engine.store``) walks
its ordered list of tiers (``Store.lower``, built from ``tier-order`` by ``kvstrata.engine.tiers.registry``)
by role, never by name, for lookups, demotion, deletes, FLUSHALL, listing, expiry, INFO and the metrics:

- ``authoritative``: the tier can hold a key's only copy (DRAM's demotions land there and it is listed by SCAN,
  KEYS and DBSIZE). At most one per stack; today the SSD tier has that role, with its write-back/write-through
  duty (``Entry.on_ssd``), its pending writes and checkpoints, which the Store reaches as ``store.ssd``.
- otherwise the tier **holds copies**: a demotion puts a copy there when it sits above the authoritative tier
  (or the tier is the lowest there is), a hit is adopted into DRAM, and a client write or delete replaces or
  drops its copy (a ``shared`` tier is written with every client write instead: the pool, ``store.pool``).
- ``in_process``: reading it never blocks, so the event loop reads it directly and the loader never does.
- ``evicts``: it drops its oldest records to stay within its budget (not an error).
- ``shared``: other nodes read and write it (versions are decided there, invalidations come from it).

DRAM is not a lower tier: its API is the entries dict the hot path reads directly (``tiers/dram.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from kvstrata.engine.entry import Entry, Meta
from kvstrata.engine.tiers.markers import Corrupt
from kvstrata.engine.tiers.watch import Ticket


class TierRoles:
    """A lower tier's declared role (class attributes) and the defaults every lower tier may inherit."""

    name: str = ""
    authoritative: bool = False
    in_process: bool = False
    evicts: bool = True
    shared: bool = False

    @property
    def active(self) -> bool:
        """False while the tier cannot be read (a degraded pool): lookups then skip it."""
        return True

    def likely(self, key: bytes) -> bool:
        """Worth reading before the tiers below (a copy tier above the authoritative one); the pool: its own
        records."""
        return True

    def read(self, key: bytes) -> Entry | Corrupt | None:
        """One record, read synchronously (the event loop's fallback for a key nobody loaded)."""
        return self.read_many([key]).get(key)

    def read_many(self, keys: list[bytes]) -> dict[bytes, Entry | Corrupt | None]:
        """Records of ``keys``; an in-process tier answers from its lookup."""
        return {k: self.lookup_pending(k)[1] for k in keys}

    def probe_many(self, keys: list[bytes]) -> dict[bytes, Meta | Entry | Corrupt | None]:
        """What EXISTS, TYPE and the TTL family need of ``keys``' records (version, expiry, value length); a tier
        without a cheaper way reads the whole records."""
        return self.read_many(keys)

    def read_resident(self, keys: list[bytes], max_bytes: int,
                      probe: bool = False) -> dict[bytes, Meta | Entry | Corrupt | None] | None:
        """``read_many`` (``probe_many`` with ``probe``) on the event loop when it cannot wait (at most ``max_bytes``
        copied); None when it could: the loader thread reads instead. A tier that cannot tell answers None."""
        return None

    def lookup_pending(self, key: bytes) -> tuple[bool, Entry | None]:
        return False, None

    def holds(self, key: bytes, version: int) -> bool:
        """True when the tier is known to hold ``version`` of ``key`` already (a demotion need not write it)."""
        return False

    def set_delivery(self, deliver: Callable[[Callable[[], None]], None]) -> None:
        """How a writer thread hands completions to the owner's thread (tiers without one ignore it)."""

    def flush(self) -> Any:
        """FLUSHALL: forget every record."""

    def sweep_expired(self, now_ms: int, limit: int = 1000) -> int:
        """Reclaim expired records (active expiry); the default relies on lazy expiry at lookup."""
        return 0

    def close(self) -> None:
        """Stop any thread and release the tier's resources."""

    def info(self) -> dict[str, Any]:
        return {}

    def info_row(self, stats: dict[str, int]) -> dict[str, Any]:
        """The tier's INFO section after name/used/budget/keys: the engine's counters, then the tier's own."""
        return {**stats, **self.info()}


@runtime_checkable
class LowerTier(Protocol):
    name: str
    budget: int
    used: int
    authoritative: bool
    in_process: bool
    evicts: bool
    shared: bool

    @property
    def active(self) -> bool: ...

    def lookup_pending(self, key: bytes) -> tuple[bool, Entry | None]:
        """(known, entry) from memory alone: known is true when no read of the tier is needed (always, for an
        ``in_process`` tier)."""
        ...

    def read_many(self, keys: list[bytes]) -> dict[bytes, Entry | Corrupt | None]:
        """Records of ``keys`` (any thread; the loader's)."""
        ...

    def probe_many(self, keys: list[bytes]) -> dict[bytes, Meta | Entry | Corrupt | None]:
        """Record headers (``Meta``) of ``keys``, or whole records where the tier has no cheaper way (loader)."""
        ...

    def read_resident(self, keys: list[bytes], max_bytes: int,
                      probe: bool = False) -> dict[bytes, Meta | Entry | Corrupt | None] | None:
        """``read_many`` or ``probe_many`` on the event loop, or None when that could wait for a disk."""
        ...

    def put(self, key: bytes, entry: Entry) -> int:
        """Keep a snapshot of ``entry`` (queued or at once); its completion sequence number (0: not kept)."""
        ...

    def delete(self, key: bytes) -> Any: ...

    def holds(self, key: bytes, version: int) -> bool: ...

    def watch(self, keys: Iterable[bytes]) -> Ticket: ...

    def unwatch(self, ticket: Ticket) -> None: ...

    def set_delivery(self, deliver: Callable[[Callable[[], None]], None]) -> None:
        """How the writer thread hands completions to the owner's thread."""
        ...

    def flush(self) -> Any: ...

    def sweep_expired(self, now_ms: int, limit: int = 1000) -> int: ...

    def info(self) -> dict[str, Any]:
        """This tier's own INFO fields (beyond name, used, budget, keys and the engine's hit counters)."""
        ...

    def info_row(self, stats: dict[str, int]) -> dict[str, Any]: ...

    def close(self) -> None: ...

    def __len__(self) -> int: ...
