"""Client-side caching (CLIENT TRACKING): which clients may hold which keys, and the invalidation messages that tell
them a key changed, as Redis 7.0 sends them.

Default mode: the keys a tracking client reads (a ``readonly`` command's keys; OPTIN: only after CLIENT CACHING YES,
OPTOUT: unless CLIENT CACHING NO) go into a table of key -> client ids; the first change of such a key sends each
of those clients one invalidation and forgets the key. BCAST mode: no table; every key changed under one of the
client's prefixes is collected, and once the loop's turn ends each prefix sends its clients the keys changed in it
(sorted, as Redis's radix tree gives them). An invalidation is a RESP3 push (``invalidate`` and an array of keys),
or, for a client redirecting to a RESP2 connection in subscribed mode, a message on ``__redis__:invalidate``; a
flush sends a null instead of keys. A client's invalidation caused by its own command comes after that command's
reply (NOLOOP: not at all).

Changes come from the store (``Store.on_modified``: every write, delete, expiry change, flush and pool
invalidation; and, through the server, which hands them to the loop from loader and writer threads, expired keys
and keys the last tier evicted). A demotion to a lower tier is not a change. The table is bounded by
``tracking-table-max-keys``: past it, the oldest keys are forgotten and their clients told, as if the keys had
changed (after the reply of the read that went past it; Redis picks random keys before the next command).
"""

from __future__ import annotations

import asyncio
import bisect
from typing import Any

from kvstrata.commands.context import held

ON, BCAST, OPTIN, OPTOUT, CACHING, NOLOOP, BROKEN_REDIR = 1, 2, 4, 8, 16, 32, 64

_PUSH = b">2\r\n$10\r\ninvalidate\r\n"
_MESSAGE = b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n"
_NULL = {2: b"$-1\r\n", 3: b"_\r\n"}


def keys_array(keys: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(keys) + b"".join(b"$%d\r\n%b\r\n" % (len(k), k) for k in keys)


class _Prefix:
    """A BCAST prefix: its clients, and the keys changed under it this turn with the connection that changed each
    last (NOLOOP clients are not told of their own)."""

    __slots__ = ("clients", "changed")

    def __init__(self) -> None:
        self.clients: dict[int, Any] = {}
        self.changed: dict[bytes, Any] = {}


class Tracking:
    """The server's tracking state: the key table, the BCAST prefixes and the count of tracking clients."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.table: dict[bytes, dict[int, None]] = {}  # insertion order: the oldest keys are trimmed first
        self.items = 0  # client ids across the table (INFO tracking_total_items)
        self.prefixes: dict[bytes, _Prefix] = {}
        self._lengths: dict[int, int] = {}  # prefix length -> prefixes of that length
        self._sorted_lengths: list[int] = []
        self.clients = 0
        self.max_keys = 1_000_000
        # The tracking connection whose handler runs now (its own invalidations wait for its reply; NOLOOP).
        self.current: Any = None
        self._broadcast_due = False

    def sizes(self) -> tuple[int, int, int]:
        """Keys in the table, client ids across it, BCAST prefixes (INFO's tracking_total_*)."""
        return len(self.table), self.items, len(self.prefixes)

    # ---- a client's mode (CLIENT TRACKING, RESET, a closed connection) ----
    def enable(self, conn: Any, redirect: int, options: int, prefixes: list[bytes]) -> None:
        client = conn.client
        if not client.tracking:
            self.clients += 1
            self.server.store.on_modified = self.modified
        # As Redis's enableTracking: the other modes are replaced, a CLIENT CACHING given before is kept.
        client.tracking = ON | options | (client.tracking & CACHING)
        client.tracking_redirect = redirect
        if options & BCAST:
            for prefix in prefixes or [b""]:
                state = self.prefixes.get(prefix)
                if state is None:
                    self.prefixes[prefix] = state = _Prefix()
                    self._counted(len(prefix), 1)
                if client.id not in state.clients:
                    state.clients[client.id] = conn
                    client.tracking_prefixes.append(prefix)
                    client.held_bytes += held(prefix)

    def _counted(self, length: int, delta: int) -> None:
        left = self._lengths.get(length, 0) + delta
        if left:
            if length not in self._lengths:
                bisect.insort(self._sorted_lengths, length)
            self._lengths[length] = left
        elif self._lengths.pop(length, None) is not None:
            self._sorted_lengths.remove(length)

    def disable(self, conn: Any) -> None:
        client = conn.client
        for prefix in client.tracking_prefixes:
            state = self.prefixes.get(prefix)
            if state is not None:
                state.clients.pop(client.id, None)
                if not state.clients:
                    del self.prefixes[prefix]
                    self._counted(len(prefix), -1)
        client.held_bytes -= sum(map(held, client.tracking_prefixes))
        client.tracking_prefixes = []
        conn.tracking_pending = None
        if self.current is conn:
            self.current = None
        if client.tracking:
            client.tracking = 0
            self.clients -= 1
            if not self.clients:
                # Nobody tracks: the table names only clients that stopped (Redis keeps it until the keys change).
                self.table.clear()
                self.items = 0
                self.server.store.on_modified = None

    # ---- reads ----
    def remember(self, client: Any, spec: Any, args: list[Any]) -> None:
        """After a read-only command of a tracking client in default mode: its keys may now be cached there."""
        flags = client.tracking
        if flags & BCAST or (flags & OPTIN and not flags & CACHING) or (flags & OPTOUT and flags & CACHING):
            return
        if (spec.parent or spec).group == "pubsub":  # shard channels are keys only for routing
            return
        table = self.table
        cid = client.id
        for key in spec.keys(args):
            key = bytes(key)
            ids = table.get(key)
            if ids is None:
                table[key] = ids = {}
            if cid not in ids:
                ids[cid] = None
                self.items += 1

    def _trim(self, running: Any) -> None:
        """Past ``tracking-table-max-keys``: the oldest keys are forgotten, their clients told."""
        table = self.table
        while len(table) > self.max_keys:
            self._invalidate(next(iter(table)), None, running)

    # ---- changes ----
    def modified(self, key: bytes | None) -> None:
        """A key changed (None: every key, a flush); on the loop (the server hands it the store's events from
        other threads)."""
        if key is None:
            self.flushed()
            return
        if self.prefixes:
            self._changed_under_prefixes(key)
        if key in self.table:
            self._invalidate(key, self.current, self.current)

    def _invalidate(self, key: bytes, current: Any, running: Any) -> None:
        """Tell the clients that may cache ``key``; ``current``: the tracking connection whose command changed it
        (told after its reply, or not at all with NOLOOP); ``running``: the connection running now (see ``send``)."""
        ids = self.table.pop(key)
        self.items -= len(ids)
        clients = self.server.clients
        for cid in ids:
            conn = clients.get(cid)
            if conn is None:
                continue
            flags = conn.client.tracking
            if not flags & ON or flags & BCAST:
                continue
            if conn is current:
                if flags & NOLOOP:
                    continue
                # After the reply of the command that changed it, as Redis's tracking_pending_keys.
                if conn.tracking_pending is None:
                    conn.tracking_pending = []
                conn.tracking_pending.append(keys_array([key]))
            else:
                self.send(conn, keys_array([key]), running)

    def flushed(self) -> None:
        """Every key is gone: each tracking client is sent a null (as Redis, in its own protocol's form)."""
        current = self.current
        for conn in list(self.server.clients.values()):
            client = conn.client
            if client.tracking:
                null = _NULL[3 if client.proto == 3 else 2]
                if conn is current:
                    if conn.tracking_pending is None:
                        conn.tracking_pending = []
                    conn.tracking_pending.append(null)
                else:
                    self.send(conn, null, current)
        self.table.clear()
        self.items = 0

    def _changed_under_prefixes(self, key: bytes) -> None:
        """One lookup per distinct prefix length, not one comparison per prefix (Redis walks them all: a client
        with a hundred thousand prefixes would cost every write milliseconds)."""
        current = self.current
        prefixes = self.prefixes
        size = len(key)
        for n in self._sorted_lengths:
            if n > size:
                break
            state = prefixes.get(key[:n])
            if state is not None:
                state.changed[key] = current
                if not self._broadcast_due:
                    self._broadcast_due = True
                    asyncio.get_running_loop().call_soon(self.broadcast)

    def broadcast(self) -> None:
        """BCAST: each prefix's changed keys to its clients, once per loop turn (Redis's beforeSleep)."""
        self._broadcast_due = False
        for prefix in sorted(self.prefixes):
            state = self.prefixes[prefix]
            if not state.changed:
                continue
            changed, state.changed = state.changed, {}
            keys = sorted(changed)
            everyone = keys_array(keys)
            for conn in list(state.clients.values()):
                client = conn.client
                mine = keys
                if client.tracking & NOLOOP:
                    mine = [k for k in mine if changed[k] is not conn]
                user = client.user
                if user is not None and not user.allkeys:  # names of keys it may not read are not its business
                    mine = [k for k in mine if user.may_read(k)]
                if mine:
                    self.send(conn, everyone if mine is keys else keys_array(mine), None)

    # ---- delivery ----
    def send(self, conn: Any, body: bytes, running: Any) -> None:
        """One invalidation (``body``: the keys array or a null) for tracking client ``conn``, to it or to the
        client it redirects to. ``running``: the connection whose command runs now (its messages go in its
        replies, in order; the others' are queued for the end of the loop's turn)."""
        client = conn.client
        redirect = client.tracking_redirect
        redirected = False
        if redirect:
            target = self.server.clients.get(redirect)
            if target is None:
                client.tracking |= BROKEN_REDIR
                if client.proto == 3:
                    conn.deliver(b">2\r\n$21\r\ntracking-redir-broken\r\n:%d\r\n" % redirect, running)
                return
            conn, redirected = target, True
        if conn.client.proto == 3:
            conn.deliver(_PUSH + body, running)
        elif redirected and conn.client.subscribed:
            conn.deliver(_MESSAGE + body, running)
        # else: a RESP2 connection without redirection cannot be sent anything (as Redis)

    def after_command(self, conn: Any) -> None:
        """After each command of a tracking client: its own invalidations, behind the reply; CLIENT CACHING's
        choice lasts for one command (or one transaction), as Redis's resetClient."""
        pending = conn.tracking_pending
        if pending:
            conn.tracking_pending = None
            for body in pending:
                self.send(conn, body, conn)
        if self.max_keys and len(self.table) > self.max_keys:  # after the reply of the read that filled it
            self._trim(conn)
        client = conn.client
        if client.tracking & CACHING and client.multi is None:
            last = client.last_cmd
            if getattr(last, "parent", None) is None or last.parent.name != "client":
                client.tracking &= ~CACHING

