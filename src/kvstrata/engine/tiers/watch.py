"""Watch tickets: how a lower tier tells the engine that a key it loaded off the event loop changed meanwhile.

The engine takes a ticket for the keys it is about to read in a worker thread; every write or delete of one of
those keys on the owner's thread marks the ticket stale, and a stale load is done again. Used by every tier whose
reads run off the loop (SSD, pool).

Tickets are compared by identity: two clients loading the same keys hold two equal-looking tickets, and one's
``unwatch`` must never take the other's off the watch list (it would then never be marked stale).
"""

from __future__ import annotations

from collections.abc import Iterable


class Ticket:
    """The keys of one load and whether any of them changed since it was taken."""

    __slots__ = ("keys", "stale")

    def __init__(self, keys: list[bytes]) -> None:
        self.keys = keys
        self.stale = False

    # Identity semantics: a ticket equals only itself, whatever its keys and state.
    __eq__ = object.__eq__
    __hash__ = object.__hash__


class Watchers:
    def __init__(self) -> None:
        # key -> {id(ticket): ticket}: removal by identity in O(1), whatever other tickets watch the key.
        self._by_key: dict[bytes, dict[int, Ticket]] = {}

    def watch(self, keys: Iterable[bytes]) -> Ticket:
        """A ticket that turns stale when any of ``keys`` is touched before ``unwatch``."""
        ticket = Ticket(list(keys))
        tid = id(ticket)
        for key in ticket.keys:
            self._by_key.setdefault(key, {})[tid] = ticket
        return ticket

    def unwatch(self, ticket: Ticket) -> None:
        """Stop watching for ``ticket`` (and only it); calling it twice is harmless."""
        tid = id(ticket)
        for key in ticket.keys:
            watching = self._by_key.get(key)
            if watching is not None and watching.get(tid) is ticket:
                del watching[tid]
                if not watching:
                    del self._by_key[key]

    def touched(self, key: bytes) -> None:
        watching = self._by_key.get(key)
        if watching:
            for ticket in watching.values():
                ticket.stale = True

    def touch_all(self) -> None:
        for watching in self._by_key.values():
            for ticket in watching.values():
                ticket.stale = True

    def __len__(self) -> int:
        """Keys watched now (0 once every load has finished: tests check nothing leaks)."""
        return len(self._by_key)
