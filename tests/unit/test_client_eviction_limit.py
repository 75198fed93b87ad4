"""Unit tests of kvstrata.server.client_eviction: a maxmemory-clients setting in bytes, as Redis's
getClientEvictionLimit computes it (a percentage of maxmemory, a floor of 128 KiB, 0 off), and the eviction's
order and its stop when only CLIENT NO-EVICT clients are left."""

from __future__ import annotations

import types

from kvstrata.config import Config
from kvstrata.server.client_eviction import MIN_LIMIT, ClientEviction, limit_of


def test_limit_of_bytes_percentages_and_the_floor():
    assert limit_of("0", 10**9) == 0
    assert limit_of("1048576", 0) == 1048576
    assert limit_of("10%", 10**9) == 10**8
    assert limit_of("100%", 10**9) == 10**9
    assert limit_of("1", 10**9) == MIN_LIMIT == 128 * 1024
    assert limit_of("1%", 1000) == MIN_LIMIT


def test_settings_as_config_keeps_them():
    cfg = Config()
    for raw, kept in (("5%", "5%"), ("0%", "0"), ("2mb", "2097152"), (4096, "4096"), ("", "0")):
        cfg.set("maxmemory-clients", raw)
        assert cfg.get("maxmemory-clients") == kept


class _Conn:
    """What ClientEviction reads of a connection: its memory, whether it may be evicted, whether it is closed."""

    def __init__(self, cid: int, mem: int, no_evict: bool) -> None:
        self.client = types.SimpleNamespace(id=cid, addr="", name=b"", no_evict=no_evict)
        self.mem, self.mem_counted, self.closed, self.asked = mem, 0, False, 0

    def memory(self) -> tuple[int, int, int, int, int, int]:
        self.asked += 1
        return 0, 0, 0, 0, 0, self.mem

    def evict(self) -> None:
        self.closed = True


def test_eviction_closes_the_biggest_and_stops_walking_when_only_no_evict_clients_are_left():
    keeper, big, small = _Conn(1, 400_000, True), _Conn(2, 100_000, False), _Conn(3, 10_000, False)
    server = types.SimpleNamespace(clients={c.client.id: c for c in (keeper, big, small)},
                                   stats=types.SimpleNamespace(evicted_clients=0))
    eviction = ClientEviction(server)
    eviction.configure("262144", 0)  # 256 KiB: the keeper alone is over it
    assert big.closed and small.closed and not keeper.closed  # biggest first, until none is left
    assert server.stats.evicted_clients == 2
    for c in (big, small):
        del server.clients[c.client.id]
        eviction.forget(c)
    asked = keeper.asked
    for _ in range(100):  # the keeper's own events: the same total, nothing to evict, no walk of every client
        eviction.account(keeper)
    assert keeper.asked == asked + 100 and eviction.total == 400_000
    keeper.mem = 500_000  # it grows: one more walk
    eviction.account(keeper)
    assert keeper.asked == asked + 102
