"""The cluster memory pool against a real 3-master Redis Cluster (redis-server processes on loopback ports).

Covered: demotion from DRAM to the pool and promotion back; two kvstrata nodes sharing chunks; hash-tag
placement (every chunk of a shard key on one master, checked with CLUSTER KEYSLOT and CLUSTER NODES); STRONG
reads across nodes after a write; highest version wins in the pool; pool TTL; a master killed in the middle of a
load (every request still answered) and the pool used again once it is back on the same port.

Waits are polls with a deadline, never fixed sleeps.
"""

from __future__ import annotations

import shutil
import threading

import pytest
import redis
from polling import wait_for
from tests.integration.support import pool_info, tier, value_for

from kvstrata.bench.cluster import LocalCluster
from kvstrata.engine.tiers.pool import HEADER_SIZE, PoolTier, decode_header, decode_record

pytestmark = [
    pytest.mark.kvstrata_only,
    pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                       reason="needs redis-server and redis-cli (.ci/run installs them)"),
]

KB = 1024
PREFIX = b"kvs:"


@pytest.fixture
def node(make_server, tmp_path, cluster):
    """``node("a", {...}) -> ServerProc``: a kvstrata node with an SSD tier and the cluster as its pool."""
    counter = iter(range(1000))

    def start(config=None, name=None):
        cfg = {"essd-path": str(tmp_path / (name or f"n{next(counter)}")), "dram-size": "256kb",
               "pool": cluster.url, "pool-timeout": 500, "pool-connect-timeout": 200,
               "pool-backoff-max": 300, "http-port": 0}
        cfg.update(config or {})
        return make_server(cfg)

    return start


def pool_record(pool_client, key):
    raw = pool_client.get(PREFIX + (key.encode() if isinstance(key, str) else key))
    return None if raw is None else decode_record(key.encode() if isinstance(key, str) else key, raw)


def pool_settled(r):
    wait_for(lambda: pool_info(r)["pending"] == 0, what="the pool writer to drain")


# --------------------------------------------------------------------------------------------------------------


def test_demotion_to_pool_and_promotion_back(node, pool_client):
    a = node().client()
    keys = [f"demote:{i}" for i in range(30)]
    for k in keys:
        a.execute_command("TAIR.KV.SETEX", k, 0, value_for(k, 16 * KB))
    pool_settled(a)
    tiers = {k: tier(a, k) for k in keys}
    in_pool = [k for k, t in tiers.items() if t == "pool"]
    assert in_pool, tiers  # 30 x 16 KB do not fit in 256 KB of DRAM
    assert pool_info(a)["demotions"] + pool_info(a)["writes"] >= len(in_pool)
    for k in in_pool:
        rec = pool_record(pool_client, k)
        assert rec is not None and rec.value == value_for(k, 16 * KB)
    k = in_pool[0]
    assert a.get(k) == value_for(k, 16 * KB)
    assert tier(a, k) == "dram"
    info = pool_info(a)
    assert info["hits"] >= 1 and info["promotions"] >= 1 and info["pool_degraded"] == 0


def test_transactions_with_the_pool(node):
    """MULTI is refused while the pool acknowledges writes (each write's reply waits for the pool); with
    pool-ack local a transaction runs and its writes reach the pool."""
    r = node().client()
    with pytest.raises(redis.ResponseError, match="MULTI is not supported while the pool acknowledges writes"):
        r.execute_command("MULTI")
    local = node({"pool-ack": "local"}).client()
    with local.pipeline() as p:
        assert p.set("tx:a", "1").incr("tx:a").get("tx:a").execute() == [True, 2, b"2"]
    pool_settled(local)
    assert r.get("tx:a") == b"2"  # the other node reads it from the pool
    r.close()
    local.close()


def test_tier_order_dram_ssd_pool_keeps_demotions_local(node):
    a = node({"tier-order": "dram,ssd,pool"}).client()
    keys = [f"order:{i}" for i in range(30)]
    for k in keys:
        a.execute_command("TAIR.KV.SETEX", k, 0, value_for(k, 16 * KB))
    pool_settled(a)
    tiers = {tier(a, k) for k in keys}
    assert tiers == {"dram", "ssd"}  # read from LMDB first; the pool only after an LMDB miss
    info = pool_info(a)
    assert info["demotions"] == 0 and info["writes"] == len(keys)  # writes are still published
    assert a.get(keys[0]) == value_for(keys[0], 16 * KB)
    assert pool_info(a)["hits"] == 0


def test_two_nodes_share_chunks(node):
    a, b = node().client(), node().client()
    chunks = {f"share:{i}": value_for(f"share:{i}", 24 * KB) for i in range(6)}
    versions = {k: a.execute_command("TAIR.KV.SETEX", k, 0, v) for k, v in chunks.items()}
    got = b.execute_command("TAIR.KV.MGET", *chunks, "CONSISTENCY_LEVEL", "EVENTUAL", "WITHVERSIONS")
    assert [g[0] for g in got] == list(chunks.values())
    assert [g[1] for g in got] == [versions[k] for k in chunks]
    assert all(tier(b, k) == "dram" for k in chunks)  # promoted locally on B
    assert pool_info(b)["hits"] == len(chunks)
    # A key nobody wrote is a miss on both, not an error.
    assert b.execute_command("TAIR.KV.MGET", "share:none", "CONSISTENCY_LEVEL", "EVENTUAL") == [None]


def test_a_write_on_another_node_invalidates_client_caches(node):
    """CLIENT TRACKING across nodes: a client of node B caching a chunk it read is told when node A rewrites or
    deletes it (the pool's invalidation reaches B's tracking table), within the deadline."""
    a, b = node().client(), node()
    a.execute_command("TAIR.KV.SETEX", "csc:k", 0, b"v1")
    reader = b.raw()
    reader.cmd_raw("HELLO", "3")
    assert reader.cmd_raw("CLIENT", "TRACKING", "on") == b"+OK\r\n"
    assert reader.cmd_raw("GET", "csc:k") == b"$2\r\nv1\r\n"
    a.execute_command("TAIR.KV.SETEX", "csc:k", 0, b"v2")
    assert reader.read_raw(timeout=10) == b">2\r\n$10\r\ninvalidate\r\n*1\r\n$5\r\ncsc:k\r\n"
    assert reader.cmd_raw("GET", "csc:k") == b"$2\r\nv2\r\n"
    a.delete("csc:k")
    assert reader.read_raw(timeout=10) == b">2\r\n$10\r\ninvalidate\r\n*1\r\n$5\r\ncsc:k\r\n"
    reader.close()


def test_prefetch_brings_pool_chunks_into_dram(node):
    a, b = node().client(), node().client()
    keys = [f"prefetch:{i}" for i in range(4)]
    for k in keys:
        a.execute_command("TAIR.KV.SETEX", k, 0, value_for(k, 8 * KB))
    assert {tier(b, k) for k in keys} == {"pool"}  # found there, not promoted by TIER
    assert b.execute_command("TAIR.KV.PREFETCH", *keys) == len(keys)
    wait_for(lambda: all(k in b.execute_command("KEYS", "prefetch:*") for k in (k.encode() for k in keys)),
             what="the prefetched chunks to be local on B")
    assert {tier(b, k) for k in keys} == {"dram"}
    assert pool_info(b)["promotions"] >= len(keys)


def test_hash_tag_keeps_a_shard_key_on_one_master(node, cluster):
    a = node().client()
    tagged = [f"{{user42}}:chunk:{i}" for i in range(12)]
    plain = [f"plain:chunk:{i}" for i in range(12)]
    for k in tagged + plain:
        a.execute_command("TAIR.KV.SETEX", k, 0, value_for(k, 2 * KB))
    pool_settled(a)
    slots = {cluster.keyslot(PREFIX + k.encode()) for k in tagged}
    assert len(slots) == 1
    master = cluster.master_of_slot(slots.pop())
    direct = redis.Redis(host="127.0.0.1", port=master)
    try:
        # Read straight from that master (no cluster redirects): it holds every chunk of the shard key.
        assert all(direct.exists(PREFIX + k.encode()) for k in tagged)
    finally:
        direct.close()
    masters = {cluster.master_of_slot(cluster.keyslot(PREFIX + k.encode())) for k in plain}
    assert len(masters) >= 2  # without a tag, chunks spread by their own hash


def test_sdk_shard_key_puts_a_sessions_chunks_on_one_master(node, cluster):
    import numpy as np

    from kvstrata.client import KVCacheClient

    srv = node()
    tokens = list(range(64))
    kv = np.arange(64 * 8, dtype=np.float32).reshape(1, 1, 1, 64, 8)  # L K H T D, T = tokens
    client = KVCacheClient(f"redis://127.0.0.1:{srv.port}", "shard-test", chunk_size=16, shard_key="user-7")
    try:
        assert client.store(tokens, kv) == 4
        keys = client.keys(tokens)
        assert client.lookup(tokens) == 64
    finally:
        client.close()
    a = srv.client()
    pool_settled(a)
    slots = {cluster.keyslot(PREFIX + k) for k in keys}
    assert len(slots) == 1
    direct = redis.Redis(host="127.0.0.1", port=cluster.master_of_slot(slots.pop()))
    try:
        assert all(direct.exists(PREFIX + k) for k in keys)
    finally:
        direct.close()


def test_strong_read_across_nodes_sees_the_latest_write(node):
    a, b = node().client(), node().client()
    v1 = a.execute_command("TAIR.KV.SETEX", "strong:k", 0, b"first")
    assert b.execute_command("TAIR.KV.MGET", "strong:k", "CONSISTENCY_LEVEL", "STRONG", "WITHVERSIONS") == \
        [[b"first", v1]]
    v2 = a.execute_command("TAIR.KV.SETEX", "strong:k", 0, b"second")
    assert v2 > v1
    # B's local copy is stale until A's invalidation reaches it (EVENTUAL may answer from it meanwhile); STRONG
    # checks the pool's version and answers with the newer record.
    assert b.execute_command("TAIR.KV.MGET", "strong:k", "CONSISTENCY_LEVEL", "EVENTUAL") in ([b"first"],
                                                                                              [b"second"])
    assert b.execute_command("TAIR.KV.MGET", "strong:k", "CONSISTENCY_LEVEL", "STRONG", "WITHVERSIONS") == \
        [[b"second", v2]]
    assert b.execute_command("TAIR.KV.MGET", "strong:k", "CONSISTENCY_LEVEL", "EVENTUAL") == [b"second"]
    # A write on B after seeing A's version gets a higher version (hybrid logical clock), and A sees it.
    v3 = b.execute_command("TAIR.KV.SETEX", "strong:k", 0, b"third")
    assert v3 > v2
    assert a.execute_command("TAIR.KV.MGET", "strong:k", "CONSISTENCY_LEVEL", "STRONG") == [b"third"]


def test_strong_read_of_ssd_keys_stays_off_the_event_loop(node):
    """A STRONG read suspends for the pool's versions; the SSD records loaded before it are kept for its second
    run, so no LMDB read happens on the event loop (ssd_sync_reads stays put)."""
    srv = node({"tier-order": "dram,ssd,pool"})
    a = srv.client()
    keys = [f"sync:{i}" for i in range(30)]
    for k in keys:
        a.execute_command("TAIR.KV.SETEX", k, 0, value_for(k, 16 * KB))
    on_ssd = [k for k in keys if tier(a, k) == "ssd"]
    assert on_ssd
    before = a.info("stats")["ssd_sync_reads"]
    got = a.execute_command("TAIR.KV.MGET", *on_ssd[:4], "CONSISTENCY_LEVEL", "STRONG")
    assert got == [value_for(k, 16 * KB) for k in on_ssd[:4]]
    assert a.info("stats")["ssd_sync_reads"] == before


def test_highest_version_wins_in_the_pool(cluster, pool_client):
    pool = PoolTier(cluster.url, 1 << 30, threaded=False)
    try:
        from kvstrata.engine.entry import Entry

        pool.put(b"conflict", Entry(b"newer", 1000))
        pool.put(b"conflict", Entry(b"older", 10))  # arrives later, lower version: refused by the pool
        rec = pool_record(pool_client, "conflict")
        assert rec.value == b"newer" and rec.version == 1000
        assert pool.conflicts == 1
        assert pool.check_versions({b"conflict": 999})[b"conflict"].value == b"newer"
        assert pool.check_versions({b"conflict": 1000})[b"conflict"] is None
    finally:
        pool.close()


def test_pool_records_expire_with_their_ttl(node, pool_client):
    a = node({"pool-ttl": 0.5}).client()
    a.execute_command("TAIR.KV.SETEX", "ttl:k", 0, b"short-lived")
    pool_settled(a)
    assert 0 < pool_client.pttl(PREFIX + b"ttl:k") <= 500
    wait_for(lambda: pool_client.exists(PREFIX + b"ttl:k") == 0, timeout=5, what="the pool record to expire")
    wait_for(lambda: pool_info(a)["keys"] == 0, timeout=5, what="the node to forget the expired record")
    assert a.execute_command("TAIR.KV.MGET", "ttl:k") == [b"short-lived"]  # the local copy stays
    # An entry's own TTL caps the pool's.
    a.execute_command("TAIR.KV.SETEX", "ttl:own", 200, b"x")
    pool_settled(a)
    assert 0 < pool_client.pttl(PREFIX + b"ttl:own") <= 200


def test_header_layout_is_stable(pool_client, node):
    a = node().client()
    v = a.execute_command("TAIR.KV.SETEX", "hdr:k", 0, b"payload")
    pool_settled(a)
    raw = pool_client.get(PREFIX + b"hdr:k")
    assert raw[:2] == b"KP" and raw[HEADER_SIZE:] == b"payload"
    assert decode_header(raw) == (v, 0)
    assert pool_client.getrange(PREFIX + b"hdr:k", 4, 11) == v.to_bytes(8, "big")


@pytest.mark.slow
def test_master_killed_mid_load_then_back(make_server, tmp_path):
    """Kill one of three masters while two nodes write and read; with --pool-ack local every request is answered
    (from local tiers where needed), the degradation is reported, and the pool is used again when the master is
    back."""
    c = LocalCluster(masters=3, node_timeout_ms=1000).start()
    try:
        cfg = {"dram-size": "1mb", "pool": c.url, "pool-timeout": 300, "pool-connect-timeout": 200,
               "pool-backoff-max": 300, "http-port": 0, "pool-ack": "local"}
        a = make_server({**cfg, "essd-path": str(tmp_path / "a")}).client()
        b = make_server({**cfg, "essd-path": str(tmp_path / "b")}).client()
        errors: list[BaseException] = []
        strong_refused: list[str] = []
        done = threading.Event()
        written: dict[str, bytes] = {}

        def load() -> None:
            i = 0
            try:
                while not done.is_set():
                    k = f"load:{i}"
                    v = value_for(k, 4 * KB)
                    a.execute_command("TAIR.KV.SETEX", k, 0, v)
                    written[k] = v
                    assert a.execute_command("TAIR.KV.MGET", k, "CONSISTENCY_LEVEL", "EVENTUAL") == [v]
                    try:
                        # pool-ack local: the pool may not have it (a miss); never another value. Without the
                        # pool a STRONG read says -TRYAGAIN instead of guessing.
                        got = b.execute_command("TAIR.KV.MGET", k, "CONSISTENCY_LEVEL", "STRONG")
                        assert got in ([v], [None])
                    except redis.exceptions.TryAgainError as exc:
                        assert "pool" in str(exc)
                        strong_refused.append(k)
                    i += 1
            except BaseException as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=load)
        t.start()
        wait_for(lambda: len(written) >= 20, what="some load before the kill")
        c.kill(1)
        # Only the killed master's slots are degraded (partial failure is partial), not the whole pool.
        wait_for(lambda: pool_info(a)["pool_masters_degraded"] == 1, what="node A to notice")
        n = len(written)
        wait_for(lambda: len(written) >= n + 20 or errors, what="load to go on without the master")
        c.restart(1)
        c.wait_ok(30)
        wait_for(lambda: pool_info(a)["pool_masters_degraded"] == 0, timeout=20, what="node A to use the pool again")
        done.set()
        t.join(30)
        assert not errors, [(type(e).__name__, str(e)) for e in errors]
        info = pool_info(a)
        assert info["errors"] >= 1 and info["master_recoveries"] >= 1 and info["retries"] >= 1
        # Everything written through A is still answered by A, from its local tiers.
        sample = list(written)[:: max(1, len(written) // 50)]
        assert a.execute_command("TAIR.KV.MGET", *sample, "CONSISTENCY_LEVEL", "EVENTUAL") == \
            [written[k] for k in sample]
        # Back in use: a new chunk written through A is found by B through the pool.
        wait_for(lambda: pool_info(b)["pool_masters_degraded"] == 0 and pool_info(b)["pool_degraded"] == 0,
                 timeout=20, what="node B to use the pool again")
        a.execute_command("TAIR.KV.SETEX", "after:k", 0, b"back")
        pool_settled(a)  # pool-ack local: the reply did not wait for the pool
        hits = pool_info(b)["hits"]
        assert b.execute_command("TAIR.KV.MGET", "after:k", "CONSISTENCY_LEVEL", "EVENTUAL") == [b"back"]
        assert pool_info(b)["hits"] == hits + 1
    finally:
        c.stop()


def test_metrics_and_info_report_the_pool(node):
    import urllib.request

    from conftest import free_port

    port = free_port()
    srv = node({"http-port": port})
    a = srv.client()
    a.execute_command("TAIR.KV.SETEX", "metrics:k", 0, b"v")
    pool_settled(a)
    raw = srv.raw()
    text = raw.cmd("INFO", "tier_pool").decode()
    raw.close()
    assert text.startswith("# Tier_pool\r\n") and "pool_degraded:0" in text and "writes:1" in text
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body = resp.read().decode()
    assert "kvstrata_pool_degraded 0.0" in body
    assert 'kvstrata_tier_used_bytes{tier="pool"}' in body
    # Every pool counter is exported (issue 16): writes, refusals, conflicts, tombstones, invalidations, ...
    for name in ("writes_total 1.0", "skipped_writes_total", "conflicts_total", "refused_writes_total",
                 "cas_refused_total", "timeouts_total", "recoveries_total", "tombstones_total",
                 "invalidations_total", "pending 0.0", "deletes_to_replay 0.0", "resyncs_total",
                 "resync_dropped_total", "resync_running 0.0"):
        assert f"kvstrata_pool_{name}" in body, name
    # Levels are gauges, not counters (a counter that goes back to 0 would read as a reset).
    for gauge in ("invalidation_subscribed", "acks_held", "resync_running", "resync_last_ms"):
        assert f"# TYPE kvstrata_pool_{gauge} gauge" in body, gauge


def test_write_through_keeps_adopted_chunks_on_ssd(node, make_server, tmp_path):
    """Under write-through, a chunk node B got from the pool is also on B's SSD: B restarted without the pool
    still has it. SETEX acknowledges after both the SSD and the pool have the value."""
    a = node({"durability": "write-through"}).client()
    b_srv = node({"durability": "write-through"}, name="b-wt")
    b = b_srv.client()
    v = a.execute_command("TAIR.KV.SETEX", "wt:k", 0, value_for("wt:k", 32 * KB))
    assert b.execute_command("TAIR.KV.MGET", "wt:k", "WITHVERSIONS") == [[value_for("wt:k", 32 * KB), v]]
    wait_for(lambda: b.info("tier_ssd")["pending"] == 0, what="B's SSD writer")
    b.close()
    b_srv.stop()
    again = make_server({"essd-path": str(tmp_path / "b-wt"), "dram-size": "256kb", "http-port": 0}).client()
    assert again.execute_command("TAIR.KV.MGET", "wt:k", "WITHVERSIONS") == [[value_for("wt:k", 32 * KB), v]]


def test_single_redis_pool_down_and_back(make_server, tmp_path):
    """``--pool redis://`` with ``--pool-ack local``: writes go on from local tiers while the pool is down, a
    STRONG read elsewhere says -TRYAGAIN instead of guessing, and the pool is used again once it answers."""
    single = LocalCluster(standalone=True).start()
    try:
        cfg = {"dram-size": "256kb", "pool": single.url, "pool-timeout": 300, "pool-connect-timeout": 200,
               "pool-backoff-max": 200, "http-port": 0, "pool-ack": "local"}
        a = make_server({**cfg, "essd-path": str(tmp_path / "a")}).client()
        b = make_server({**cfg, "essd-path": str(tmp_path / "b")}).client()
        a.execute_command("TAIR.KV.SETEX", "single:1", 0, b"one")
        # --pool-ack local acknowledges before the pool has the record: B sees it once A's writer put it there.
        wait_for(lambda: b.execute_command("TAIR.KV.MGET", "single:1") == [b"one"], what="B to read A's write")
        single.kill(0)
        assert a.execute_command("TAIR.KV.SETEX", "single:2", 0, b"two")  # acknowledged from local tiers
        assert a.execute_command("TAIR.KV.MGET", "single:2", "CONSISTENCY_LEVEL", "EVENTUAL") == [b"two"]
        with pytest.raises(redis.ResponseError, match="pool"):
            b.execute_command("TAIR.KV.MGET", "single:2", "CONSISTENCY_LEVEL", "STRONG")
        assert pool_info(a)["pool_degraded"] == 1 and pool_info(a)["skipped_writes"] >= 1
        single.restart(0)
        wait_for(lambda: pool_info(a)["pool_degraded"] == 0, what="node A to use the pool again")
        wait_for(lambda: pool_info(b)["pool_degraded"] == 0, what="node B to use the pool again")
        a.execute_command("TAIR.KV.SETEX", "single:3", 0, b"three")
        wait_for(lambda: b.execute_command("TAIR.KV.MGET", "single:3", "CONSISTENCY_LEVEL", "EVENTUAL") == [b"three"],
                 what="B to read A's write through the pool again")
    finally:
        single.stop()


def test_mpull_replies_once_the_pool_holds_every_value(node, pool_client, tmp_path):
    """TAIR.KV.MPULL under pool-ack pool: each value's reply element waits for its own pool write (the chain of
    acknowledgements), so every record is in the pool when the reply arrives, at the version replied."""
    import os

    import numpy as np

    from kvstrata.client.pull_store import PullWriter, address

    path = str(tmp_path / "kv.sock")
    a = node({"dram-size": "64mb", "unixsocket": path, "pull-store": "yes", "stage-offload-min": "1mb"})
    w = PullWriter(path)
    try:
        assert w.multi
        values = [np.frombuffer(os.urandom(n), np.uint8) for n in (2 * 1024 * KB, 40 * KB, 1536 * KB)]
        args = []
        for i, v in enumerate(values):
            args += [b"mp:%d" % i, 0, b"", np.array([[address(v), v.nbytes]], "<u8").tobytes()]
        reply = w.call(b"TAIR.KV.MPULL", -1, *args)
        assert len(reply) == 3 and all(isinstance(v, int) for v in reply)
        for i, v in enumerate(values):  # no wait: the reply came after the pool held each of them
            rec = pool_record(pool_client, b"mp:%d" % i)
            assert rec is not None and rec.version == reply[i] and rec.value == v.tobytes()
        assert a.client().get(b"mp:1") == values[1].tobytes()
    finally:
        w.close()


def test_publish_reaches_the_subscribers_of_every_node(node):
    """PUBLISH on one node reaches subscribers on the others, through the pool's Pub/Sub (as Redis Cluster forwards
    it): every message once, in the publisher's order, patterns included; PUBLISH counts the local receivers (as a
    Redis Cluster node does); SPUBLISH stays on its node; with pool-pubsub no nothing is forwarded."""
    a, b = node(), node()
    ra = a.client()
    sub_b = b.raw()
    assert sub_b.cmd_raw("SUBSCRIBE", "news").startswith(b"*3\r\n$9\r\nsubscribe\r\n")
    psub_b = b.raw()
    assert psub_b.cmd_raw("PSUBSCRIBE", "n*").startswith(b"*3\r\n$10\r\npsubscribe\r\n")
    sub_a = a.raw()
    assert sub_a.cmd_raw("SUBSCRIBE", "news").startswith(b"*3\r\n$9\r\nsubscribe\r\n")
    wait_for(lambda: pool_info(ra)["invalidation_subscribed"] == 1, what="A's pool subscription")
    wait_for(lambda: pool_info(b.client())["invalidation_subscribed"] == 1, what="B's pool subscription")
    big = value_for("big", 256 * KB)
    with ra.pipeline(transaction=False) as p:
        for i in range(200):
            p.publish("news", f"m{i}")
        p.publish("news", big)
        assert p.execute() == [1] * 201  # A's own subscriber; B's are not counted here
    expect = [f"m{i}".encode() for i in range(200)] + [big]
    for conn, frame in ((sub_b, lambda m: b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$%d\r\n%b\r\n" % (len(m), m)),
                        (psub_b, lambda m: b"*4\r\n$8\r\npmessage\r\n$2\r\nn*\r\n$4\r\nnews\r\n$%d\r\n%b\r\n"
                         % (len(m), m)),
                        (sub_a, lambda m: b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$%d\r\n%b\r\n" % (len(m), m))):
        assert [conn.read_raw() for _ in expect] == [frame(m) for m in expect]
        assert conn.nothing_pending(0.3)  # each once: A does not get its own back through the pool
    assert ra.execute_command("SPUBLISH", "news", "local") == 0  # a shard channel: its node only
    rb = b.client()
    assert rb.config_set("pool-pubsub", "no")
    assert rb.publish("news", "stays") == 2  # B's own two subscriptions
    assert sub_b.read_raw() == b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nstays\r\n"
    assert ra.publish("news", "goes") == 1
    assert sub_b.read_raw() == b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$4\r\ngoes\r\n"  # B still receives
    assert sub_a.read_raw() == b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$4\r\ngoes\r\n"
    assert sub_a.nothing_pending(0.3)  # "stays" did not leave B
    assert pool_info(ra)["pubsub_forwarded"] >= 202 and pool_info(rb)["pubsub_received"] >= 202
