"""maxmemory-clients (Redis 7.0's client eviction): the memory all clients hold together (request bytes received,
arguments, replies not yet sent, MULTI queues, watched keys, subscriptions: CLIENT LIST's tot-mem) is kept under
a limit by closing the clients that hold the most.

Each connection reports its memory where it changes (bytes received, replies written, a message pushed, the
transport draining) and the total is kept from the differences, so nothing is summed per command. When the total
reaches the limit every client's memory is taken afresh and the largest evictable clients are closed, biggest
first, until it is under, as Redis's evictClients. A client with CLIENT NO-EVICT counts in the total and is never
closed. The limit is bytes or a percentage of maxmemory (dram-size), at least 128 KiB as Redis's; 0 is off, and
then nothing is counted at all.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvstrata.server.app import Server
    from kvstrata.server.connection import Connection

log = logging.getLogger("kvstrata.server")

# Redis's floor: a smaller limit would leave no room to talk to the server at all.
MIN_LIMIT = 128 * 1024


def limit_of(setting: str, maxmemory: int) -> int:
    """The limit in bytes (0: off) of a maxmemory-clients setting (``"1048576"`` or ``"10%"``)."""
    if setting.endswith("%"):
        limit = maxmemory * int(setting[:-1]) // 100
    else:
        limit = int(setting)
    return max(limit, MIN_LIMIT) if limit else 0


class ClientEviction:
    """The running total of clients' memory and the eviction that keeps it under the limit."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.limit = 0
        self.total = 0
        # The total an eviction could not go below (only CLIENT NO-EVICT clients were left): evicting again before
        # the total grows past it would walk every client for nothing, on every event.
        self._stuck = 0

    def configure(self, setting: str, maxmemory: int) -> None:
        was = self.limit
        self.limit = limit_of(setting, maxmemory)
        if self.limit and not was:  # the connections' counts are stale from while it was off: count afresh
            self.total = 0
            for conn in list(self.server.clients.values()):
                conn.mem_counted = 0
                self.account(conn)
        elif self.limit and self.total >= self.limit:
            self.evict()

    def account(self, conn: Connection) -> bool:
        """Take ``conn``'s memory now; evict if the total reached the limit. True when ``conn`` was closed."""
        mem = conn.memory()[5]
        self.total += mem - conn.mem_counted
        conn.mem_counted = mem
        if self.total < self.limit:
            self._stuck = 0
            return False
        if self.total > self._stuck:
            self.evict()
            return conn.closed
        return False

    def forget(self, conn: Connection) -> None:
        """``conn`` is gone: its memory leaves the total."""
        self.total -= conn.mem_counted
        conn.mem_counted = 0

    def evict(self) -> None:
        sizes: list[tuple[int, Connection]] = []
        total = 0
        for conn in list(self.server.clients.values()):
            mem = 0 if conn.closed else conn.memory()[5]
            conn.mem_counted = mem
            total += mem
            if mem and not conn.client.no_evict:
                sizes.append((mem, conn))
        self.total = total
        sizes.sort(key=lambda item: item[0], reverse=True)
        for mem, conn in sizes:
            if self.total < self.limit:
                return
            log.info("Evicting client: id=%d addr=%s name=%s tot-mem=%d", conn.client.id, conn.client.addr,
                     conn.client.name.decode(errors="replace"), mem)
            self.server.stats.evicted_clients += 1
            self.forget(conn)
            conn.evict()
        if self.total >= self.limit:
            if not self._stuck:
                log.warning("Over client maxmemory after evicting all evictable clients")
            self._stuck = self.total
