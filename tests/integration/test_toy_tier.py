"""Adding a tier takes one class and one registry line: a toy tier defined here, and nothing else changed.

``ToyTier`` is an in-process dict of copies with a byte budget that drops its oldest copy when full. It is
registered with one ``registry.register`` line and named in ``tier-order``; the engine (lookups, demotion,
deletes, listing, INFO, the metrics) and a real server on a real socket then use it as they use the SSD and the
pool, because they walk the configured list of tiers by the roles each tier declares.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import urllib.request
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from kvstrata.config import build_config
from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers import registry
from kvstrata.engine.tiers.base import TierRoles
from kvstrata.server.app import Server, build_store

TOY_BUDGET = 40_000
VALUE = 8_000


class ToyTier(TierRoles):
    """Copies in a dict, oldest dropped first beyond the budget (key + value bytes); read on the event loop."""

    name = "toy"
    in_process = True  # a dict: the loop reads it directly, the loader thread never does

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.records: OrderedDict[bytes, Entry] = OrderedDict()
        self.evictions = 0

    def lookup_pending(self, key: bytes) -> tuple[bool, Entry | None]:
        return True, self.records.get(key)

    def put(self, key: bytes, entry: Entry) -> int:
        size = len(key) + len(entry.value)
        if size > self.budget:
            return 0
        self.delete(key)
        while self.used + size > self.budget:
            old_key, old = self.records.popitem(last=False)
            self.used -= len(old_key) + len(old.value)
            self.evictions += 1
        # A copy of the bytes: a DRAM value may be an arena slot that is reused once DRAM lets it go.
        self.records[key] = Entry(bytes(entry.value), entry.version, entry.expire_at)
        self.used += size
        return 1

    def delete(self, key: bytes) -> bool:
        old = self.records.pop(key, None)
        if old is not None:
            self.used -= len(key) + len(old.value)
        return old is not None

    def holds(self, key: bytes, version: int) -> bool:
        rec = self.records.get(key)
        return rec is not None and rec.version == version

    def flush(self) -> None:
        self.records.clear()
        self.used = 0

    def info(self) -> dict[str, Any]:
        return {"evictions": self.evictions}

    def __len__(self) -> int:
        return len(self.records)


@pytest.fixture
def toy() -> Iterator[None]:
    registry.register("toy", lambda config, clock: ToyTier(TOY_BUDGET))  # the one registry line
    yield
    registry.unregister("toy")


def value(i: int) -> bytes:
    return bytes([i % 251]) * VALUE


def test_tier_order_takes_its_names_from_the_registry() -> None:
    with pytest.raises(ValueError, match="unknown tier 'toy'"):
        build_config({"tier-order": "dram,toy"}, {})
    registry.register("toy", lambda config, clock: ToyTier(TOY_BUDGET))
    try:
        assert build_config({"tier-order": "dram,toy"}, {}).get("tier-order") == "dram,toy"
        with pytest.raises(ValueError, match="leaves it out"):
            build_store(build_config({"tier-order": "dram,toy", "essd-path": "/nonexistent/x"}, {}))
    finally:
        registry.unregister("toy")


def test_dram_toy_demotes_reads_promotes_deletes(toy: None) -> None:
    store = build_store(build_config({"tier-order": "dram,toy", "dram-size": "40kb"}, {}))
    tier = store.lower[0]
    assert isinstance(tier, ToyTier) and store.keeper is None
    for i in range(12):
        store.put(b"k%d" % i, value(i))
        assert store.dram.used <= store.dram.budget and tier.used <= tier.budget
    # DRAM kept the newest; the rest went down as copies, and the toy tier dropped its oldest beyond its budget.
    in_dram = [i for i in range(12) if b"k%d" % i in store.dram.entries]
    in_toy = [i for i in range(12) if b"k%d" % i in tier.records]
    assert in_dram and in_toy and tier.evictions > 0
    assert not set(in_dram) & set(in_toy)  # each demoted key went to the toy tier, none stayed in DRAM
    assert sorted(in_dram + in_toy) == list(range(12 - len(in_dram) - len(in_toy), 12))
    lost = 12 - len(in_dram) - len(in_toy)
    assert store.tier_stats["dram"].demotions == 12 - len(in_dram)
    assert tier.evictions == lost
    for i in range(lost):  # dropped by DRAM, then by the toy tier: a miss in every tier
        assert store.get(b"k%d" % i) is None
    assert store.tier_stats["toy"].misses == lost

    # A read finds a toy copy and brings it up (a copy tier's hit is adopted); the copy stays below (the DRAM
    # key demoted to make room pushes the toy tier's oldest copy out, not this newest one).
    key = b"k%d" % in_toy[-1]
    entry = store.get(key)
    assert entry is not None and bytes(entry.value) == value(in_toy[-1])
    assert key in store.dram.entries and store.tier_of(key) == "dram" and key in tier.records
    assert store.tier_stats["toy"].hits == 1 and store.tier_stats["toy"].promotions == 1
    # A client write makes the copy stale: it is dropped, and the new value is what reads see.
    store.put(key, b"new")
    assert key not in tier.records and bytes(store.get(key).value) == b"new"  # type: ignore[union-attr]

    # A delete of a key only the toy tier holds removes it there.
    gone = next(k for k in tier.records if k not in store.dram.entries)
    assert store.tier_of(gone) == "toy"
    assert store.delete(gone) is True
    assert gone not in tier.records and store.get(gone) is None and store.delete(gone) is False

    rows = {row["name"]: row for row in store.tier_info()}
    assert rows["toy"]["keys"] == len(tier.records) and rows["toy"]["used"] == tier.used <= TOY_BUDGET
    assert rows["toy"]["budget"] == TOY_BUDGET and rows["toy"]["evictions"] == tier.evictions
    assert rows["toy"]["hits"] == 1 and rows["toy"]["demotions"] == store.tier_stats["toy"].demotions > 0
    store.flush()
    assert len(tier) == 0 and tier.used == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class InProcessServer:
    """A real kvstrata server on a real socket, run on its own thread here (the registry is this process's)."""

    def __init__(self, flags: dict[str, Any]) -> None:
        self.server = Server(build_config({"port": 0, "http-port": _free_port(), **flags}, {}))
        self.ready = threading.Event()
        self.thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self.thread.start()
        assert self.ready.wait(20), "the server did not start"

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.start()
        self.ready.set()
        await self.server._shutdown.wait()
        await self.server.close()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.server.port, socket_timeout=20)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.server.request_shutdown)
        self.thread.join(20)


def test_server_with_dram_toy_ssd(toy: None, tmp_path: Any) -> None:
    srv = InProcessServer({"tier-order": "dram,toy,ssd", "dram-size": "40kb", "essd-path": str(tmp_path / "ssd"),
                           "promote-hits": 1})
    try:
        c = srv.client()
        store = srv.server.store
        assert [t.name for t in store.lower] == ["toy", "ssd"]
        for i in range(12):
            assert c.set(b"k%d" % i, value(i))
        tier = store.lower[0]
        # Every demoted key reached the SSD (the authoritative tier) and a copy the toy tier (above it).
        assert c.dbsize() == 12
        info = c.info("tier_toy")
        assert info["keys"] == len(tier.records) > 0 and info["used"] <= TOY_BUDGET == info["budget"]
        assert info["demotions"] == store.tier_stats["dram"].demotions > 0 and info["evictions"] > 0
        # Every value reads back: from DRAM, from a toy copy, or from the SSD for those the toy tier dropped
        # (newest first: each read brought up pushes a DRAM key down, and its copy the toy tier's oldest out).
        for i in reversed(range(12)):
            assert c.get(b"k%d" % i) == value(i)
        toy_hits = c.info("tier_toy")["hits"]
        assert toy_hits > 0 and c.info("tier_ssd")["hits"] > 0
        assert store.tier_stats["toy"].promotions == toy_hits
        assert tier.used <= TOY_BUDGET and store.dram.used <= store.dram.budget
        # A delete reaches every tier.
        key = next(iter(tier.records))
        assert c.delete(key) == 1 and key not in tier.records and c.get(key) is None
        assert c.dbsize() == 11
        # INFO all lists the section; the metrics carry the tier's series.
        conn = c.connection_pool.get_connection()
        try:
            conn.send_command("INFO", "all")
            assert "# Tier_toy\r\n" in conn.read_response().decode()
        finally:
            c.connection_pool.release(conn)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{srv.server.config.get('http-port')}/metrics",
                                         timeout=20).read().decode()
        assert f'kvstrata_tier_budget_bytes{{tier="toy"}} {float(TOY_BUDGET)}' in metrics
        assert 'kvstrata_tier_hits_total{tier="toy"}' in metrics
        c.close()
    finally:
        srv.stop()
