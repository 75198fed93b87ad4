"""DRAM + pool without an SSD tier (a diskless GPU node: ``--pool`` and no ``--essd-path``), against a real
redis-server: it starts and serves, demotes to the pool and brings pool hits back, shares chunks between nodes,
answers STRONG reads across nodes, prefetches from the pool, and falls back to DRAM alone while the pool is down.
"""

from __future__ import annotations

import shutil

import pytest
import redis
from polling import wait_for
from tests.integration.support import pool_info, tier, value_for

from kvstrata.bench.cluster import LocalCluster

pytestmark = [
    pytest.mark.kvstrata_only,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (.ci/run installs it)"),
]

KB = 1024


@pytest.fixture(scope="module")
def single():
    s = LocalCluster(standalone=True).start()
    yield s
    s.stop()


@pytest.fixture
def node(make_server, single):
    def start(config=None):
        cfg = {"dram-size": "256kb", "pool": single.url, "pool-timeout": 300, "pool-connect-timeout": 200,
               "pool-backoff-max": 200, "http-port": 0}
        cfg.update(config or {})
        return make_server(cfg)

    return start


def test_diskless_node_demotes_to_the_pool_and_reads_back(node):
    a = node().client()
    assert "tier_ssd" not in a.info("everything") or not a.info("tier_ssd")
    keys = [f"dl:demote:{i}" for i in range(30)]
    for k in keys:
        a.execute_command("TAIR.KV.SETEX", k, 0, value_for(k, 16 * KB))
    wait_for(lambda: pool_info(a)["pending"] == 0, what="the pool writer to drain")
    tiers = {k: tier(a, k) for k in keys}
    in_pool = [k for k, t in tiers.items() if t == "pool"]
    assert in_pool and set(tiers.values()) <= {"dram", "pool"}, tiers  # 480 KB into 256 KB of DRAM
    assert pool_info(a)["demotions"] >= len(in_pool)
    # Every key reads back intact, from DRAM or through the pool (then promoted).
    for k in keys:
        assert a.get(k) == value_for(k, 16 * KB)
    assert pool_info(a)["hits"] >= 1 and pool_info(a)["promotions"] >= 1
    # Writes, deletes and expiries of pool-only keys work like local ones.
    k = next(k for k in keys if tier(a, k) == "pool")
    assert a.pexpire(k, 100_000) and 0 < a.pttl(k) <= 100_000
    k2 = next(k for k in keys if tier(a, k) == "pool")
    assert a.delete(k2) == 1 and a.get(k2) is None
    assert a.execute_command("TAIR.KV.MGET", "dl:none", "CONSISTENCY_LEVEL", "EVENTUAL") == [None]


def test_diskless_nodes_share_chunks_and_read_strong(node):
    a, b = node().client(), node().client()
    chunks = {f"dl:share:{i}": value_for(f"dl:share:{i}", 24 * KB) for i in range(4)}
    versions = {k: a.execute_command("TAIR.KV.SETEX", k, 0, v) for k, v in chunks.items()}
    got = b.execute_command("TAIR.KV.MGET", *chunks, "CONSISTENCY_LEVEL", "EVENTUAL", "WITHVERSIONS")
    assert [g[0] for g in got] == list(chunks.values())
    assert [g[1] for g in got] == [versions[k] for k in chunks]
    k = next(iter(chunks))
    v2 = a.execute_command("TAIR.KV.SETEX", k, 0, b"second")
    # B's old copy until A's invalidation reaches it (then the pool's)
    assert b.execute_command("TAIR.KV.MGET", k, "CONSISTENCY_LEVEL", "EVENTUAL") in ([chunks[k]], [b"second"])
    assert b.execute_command("TAIR.KV.MGET", k, "CONSISTENCY_LEVEL", "STRONG", "WITHVERSIONS") == [[b"second", v2]]


def test_diskless_prefetch_brings_pool_chunks_into_dram(node):
    a, b = node().client(), node().client()
    keys = [f"dl:prefetch:{i}" for i in range(4)]
    for k in keys:
        a.execute_command("TAIR.KV.SETEX", k, 0, value_for(k, 8 * KB))
    assert {tier(b, k) for k in keys} == {"pool"}
    assert b.execute_command("TAIR.KV.PREFETCH", *keys) == len(keys)
    wait_for(lambda: {tier(b, k) for k in keys} == {"dram"}, what="the prefetched chunks to be local on B")
    assert [b.get(k) for k in keys] == [value_for(k, 8 * KB) for k in keys]


def test_diskless_node_serves_from_dram_while_the_pool_is_down(make_server):
    own = LocalCluster(standalone=True).start()
    try:
        cfg = {"dram-size": "256kb", "pool": own.url, "pool-timeout": 300, "pool-connect-timeout": 200,
               "pool-backoff-max": 200, "http-port": 0, "pool-ack": "local"}
        a = make_server(cfg).client()
        a.execute_command("TAIR.KV.SETEX", "dl:down:1", 0, b"one")
        own.kill(0)
        assert a.execute_command("TAIR.KV.SETEX", "dl:down:2", 0, b"two")  # pool-ack local: acknowledged here
        assert a.execute_command("TAIR.KV.MGET", "dl:down:1", "dl:down:2", "CONSISTENCY_LEVEL", "EVENTUAL") == \
            [b"one", b"two"]
        # STRONG cannot be answered without the pool: an error, never a guess.
        wait_for(lambda: pool_info(a)["pool_degraded"] == 1, what="the node to see the pool down")
        with pytest.raises(redis.ResponseError, match="pool is unavailable"):
            a.execute_command("TAIR.KV.MGET", "dl:down:1", "CONSISTENCY_LEVEL", "STRONG")
        for i in range(30):  # more than DRAM holds: with the pool down, DRAM evicts
            a.set(f"dl:down:fill:{i}", b"x" * 16 * KB)
        assert a.get("dl:down:fill:29") == b"x" * 16 * KB
        assert pool_info(a)["pool_degraded"] == 1
        own.restart(0)
        wait_for(lambda: pool_info(a)["pool_degraded"] == 0, what="the node to use the pool again")
        a.execute_command("TAIR.KV.SETEX", "dl:down:3", 0, b"three")
        assert a.get("dl:down:3") == b"three"
    finally:
        own.stop()
