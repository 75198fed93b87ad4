"""Watch tickets: how a lower tier tells the engine that a key it loaded off the event loop changed meanwhile.

The engine takes a ticket for the keys it is about to read in a worker thread; every write or delete of one of
those keys on the owner's thread marks the ticket stale, and a stale load is done again. Used by every tier whose
reads run off the loop (SSD, pool).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class Watchers:
    def __init__(self) -> None:
        self._by_key: dict[bytes, list[list[Any]]] = {}

    def watch(self, keys: Iterable[bytes]) -> list[Any]:
        """A ticket ``[stale, keys]`` that turns stale when any of ``keys`` is touched before ``unwatch``."""
        ticket: list[Any] = [False, list(keys)]
        for key in ticket[1]:
            self._by_key.setdefault(key, []).append(ticket)
        return ticket

    def unwatch(self, ticket: list[Any]) -> None:
        for key in ticket[1]:
            lst = self._by_key.get(key)
            if lst is not None:
                lst.remove(ticket)
                if not lst:
                    del self._by_key[key]

    def touched(self, key: bytes) -> None:
        lst = self._by_key.get(key)
        if lst:
            for ticket in lst:
                ticket[0] = True

    def touch_all(self) -> None:
        for lst in self._by_key.values():
            for ticket in lst:
                ticket[0] = True
