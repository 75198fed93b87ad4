"""Partial failure is partial: one hung master of a real 3-master Redis Cluster pool (SIGSTOP) degrades only the
keys whose slots it serves. Keys on the other masters keep being written, read and STRONG-read through the pool
(another node reads them), keys on the hung master get -TRYAGAIN on STRONG reads, and once the master answers
again (SIGCONT) the node uses it again. Waits are polls with a deadline, never fixed sleeps.
"""

from __future__ import annotations

import shutil
import time

import pytest
import redis
from polling import wait_for
from redis.crc import key_slot

from kvstrata.bench.cluster import LocalCluster

pytestmark = [
    pytest.mark.kvstrata_only,
    pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                       reason="needs redis-server and redis-cli (.ci/run installs them)"),
]

PREFIX = b"kvs:"
POOL_TIMEOUT_MS = 300


def _keys_by_master(cluster: LocalCluster, n: int = 4) -> dict[int, list[str]]:
    """``n`` keys per master index (the pool key is PREFIX + key, which decides the slot)."""
    port_of_slot: dict[int, int] = {}
    out: dict[int, list[str]] = {i: [] for i in range(len(cluster.ports))}
    i = 0
    while any(len(v) < n for v in out.values()):
        key = f"part:{i}"
        i += 1
        slot = key_slot(PREFIX + key.encode())
        if slot not in port_of_slot:
            port_of_slot[slot] = cluster.master_of_slot(slot)
        idx = cluster.index_of_port(port_of_slot[slot])
        if len(out[idx]) < n:
            out[idx].append(key)
    return out


def _tryagain(fn, *args) -> str:
    """The error text of a reply that must be -TRYAGAIN (redis-py maps that code to TryAgainError)."""
    with pytest.raises(redis.exceptions.TryAgainError) as exc:
        fn(*args)
    return "TRYAGAIN " + str(exc.value)


def test_one_hung_master_degrades_only_its_keys(make_server):
    cluster = LocalCluster(masters=3, node_timeout_ms=5000).start()
    try:
        cfg = {"dram-size": "1mb", "pool": cluster.url, "pool-timeout": POOL_TIMEOUT_MS,
               "pool-connect-timeout": 200, "pool-backoff-max": 400, "http-port": 0, "pool-ack": "pool"}
        a_srv, b_srv = make_server(dict(cfg)), make_server(dict(cfg))
        a, b = a_srv.client(), b_srv.client()
        by_master = _keys_by_master(cluster)
        victim = 0
        hung = by_master[victim]
        healthy = [k for i, ks in by_master.items() if i != victim for k in ks]

        cluster.pause(victim)
        try:
            # The first request that touches the hung master costs one pool-timeout and marks that master only.
            assert "TRYAGAIN" in _tryagain(a.execute_command, "TAIR.KV.MGET", hung[0], "CONSISTENCY_LEVEL", "STRONG")
            wait_for(lambda: a.info("tier_pool")["masters_degraded"] == 1, timeout=10,
                     what="node A to mark the hung master")
            assert a.info("tier_pool")["pool_degraded"] == 0  # the pool as a whole is not degraded
            limit = POOL_TIMEOUT_MS / 1000 + 0.5  # one pool-timeout each (plus slack for a loaded machine)
            for key in healthy:
                t0 = time.monotonic()
                assert a.execute_command("SETEX", key, 60, f"v-{key}") in (True, b"OK")
                assert a.execute_command("GET", key) == f"v-{key}".encode()
                assert time.monotonic() - t0 < 2 * limit, key
            t0 = time.monotonic()
            got = a.execute_command("TAIR.KV.MGET", *healthy, "CONSISTENCY_LEVEL", "STRONG")
            assert got == [f"v-{k}".encode() for k in healthy]
            assert time.monotonic() - t0 < limit
            # Another node reads them from the pool (it never saw them), its own STRONG reads included.
            got = b.execute_command("TAIR.KV.MGET", *healthy, "CONSISTENCY_LEVEL", "STRONG")
            assert got == [f"v-{k}".encode() for k in healthy]
            assert [b.execute_command("GET", k) for k in healthy] == [f"v-{k}".encode() for k in healthy]
            # Keys on the hung master: STRONG reads and deletes refused with -TRYAGAIN, on both nodes.
            for client in (a, b):
                for key in hung:
                    assert "TRYAGAIN" in _tryagain(client.execute_command, "TAIR.KV.MGET", key,
                                                   "CONSISTENCY_LEVEL", "STRONG")
            assert "TRYAGAIN" in _tryagain(a.execute_command, "DEL", hung[1])
            assert a.execute_command("DEL", healthy[0]) == 1  # a healthy master's key is deleted
        finally:
            cluster.resume(victim)
        # The master answers again: within a bounded time both nodes use it again.
        for srv in (a_srv, b_srv):
            wait_for(lambda srv=srv: srv.client().info("tier_pool")["masters_degraded"] == 0, timeout=15,
                     what="the master to be used again")
        assert a.execute_command("SETEX", hung[0], 60, b"after") in (True, b"OK")
        assert b.execute_command("TAIR.KV.MGET", hung[0], "CONSISTENCY_LEVEL", "STRONG") == [b"after"]
        assert a.info("tier_pool")["master_recoveries"] >= 1
    finally:
        cluster.stop()
