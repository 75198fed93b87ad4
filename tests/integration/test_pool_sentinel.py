"""``--pool redis-sentinel://...`` against a real Sentinel setup (tests/integration/sentinels.py): a master with
``requirepass``, a replica, three sentinels (quorum 2) with their own password, all real processes (redis-server, or
``$KVSTRATA_POOL_SERVER``=valkey-server).

Covered: a node demotes to the service's master and reads back; two nodes share chunks; the data nodes' and
the sentinels' passwords are masked in CONFIG GET pool, INFO and the log; a wrong service name or no answering
sentinel stops the start with a clear message (or starts degraded with the flag); the master SIGKILLed, the
sentinel promotes the replica, and writes, reads and invalidations go through the new master within a bounded
time, both nodes reporting the pool healthy again.

Waits are polls with a deadline, never fixed sleeps.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
import redis
from polling import wait_for
from sentinels import LocalSentinel
from tests.integration.support import tier, value_for

from kvstrata.bench.cluster import HOST, free_port, server_binary

pytestmark = [
    pytest.mark.kvstrata_only,
    pytest.mark.skipif(shutil.which(server_binary()) is None or shutil.which("redis-cli") is None,
                       reason="needs redis-server (or $KVSTRATA_POOL_SERVER) and redis-cli"),
]

KB = 1024
PASSWORD = "data-s3cret"
SENTINEL_PASSWORD = "sentinel-s3cret"


@pytest.fixture(scope="module")
def sentinel():
    s = LocalSentinel(3, password=PASSWORD, sentinel_password=SENTINEL_PASSWORD).start()
    yield s
    s.stop()


@pytest.fixture
def node(make_server, sentinel):
    def start(config=None):
        # The URL also names a sentinel that is not running: any listed sentinel that answers is enough.
        cfg = {"dram-size": "256kb", "pool": sentinel.url(extra_hosts=(f"{HOST}:{free_port()}",)),
               "pool-timeout": 300, "pool-connect-timeout": 200, "pool-backoff-max": 300, "http-port": 0}
        cfg.update(config or {})
        return make_server(cfg)

    return start


def master_client(sentinel):
    return redis.Redis(host=HOST, port=sentinel.master_port(), password=PASSWORD, socket_timeout=5)


def log_without_argv(srv) -> str:
    # The harness writes the command line ("$ kvstrata serve --pool ...") first; the server's own output follows.
    return "\n".join(line for line in srv.log_text().splitlines() if not line.startswith("$ "))


def test_demotes_to_the_master_and_reads_back_with_passwords_masked(node, sentinel):
    srv = node()
    a = srv.client()
    keys = [f"sn:demote:{i}" for i in range(30)]
    for k in keys:
        a.execute_command("TAIR.KV.SETEX", k, 0, value_for(k, 16 * KB))
    wait_for(lambda: a.info("tier_pool")["pending"] == 0, what="the pool writer to drain")
    in_pool = [k for k in keys if tier(a, k) == "pool"]
    assert in_pool  # 30 x 16 KB do not fit in 256 KB of DRAM
    m = master_client(sentinel)
    try:
        assert all(m.get(b"kvs:" + k.encode()) is not None for k in in_pool)  # held by the service's master
    finally:
        m.close()
    assert a.get(in_pool[0]) == value_for(in_pool[0], 16 * KB)
    info = a.info("tier_pool")
    assert info["pool_degraded"] == 0 and info["hits"] >= 1
    shown = a.config_get("pool")["pool"]
    assert shown.startswith("redis-sentinel://:***@") and "sentinel_password=***" in shown
    seen = shown + str(info) + log_without_argv(srv)
    assert PASSWORD not in seen and SENTINEL_PASSWORD not in seen


def test_two_nodes_share_chunks(node):
    a, b = node().client(), node().client()
    chunks = {f"sn:share:{i}": value_for(f"sn:share:{i}", 24 * KB) for i in range(6)}
    versions = {k: a.execute_command("TAIR.KV.SETEX", k, 0, v) for k, v in chunks.items()}
    got = b.execute_command("TAIR.KV.MGET", *chunks, "CONSISTENCY_LEVEL", "EVENTUAL", "WITHVERSIONS")
    assert [g[0] for g in got] == list(chunks.values())
    assert [g[1] for g in got] == [versions[k] for k in chunks]
    assert b.info("tier_pool")["hits"] == len(chunks)


def _start_fails(pool: str) -> str:
    args = [sys.executable, "-m", "kvstrata", "serve", "--port", str(free_port()), "--bind", HOST,
            "--pool", pool, "--pool-connect-timeout", "200", "--http-port", "0"]
    proc = subprocess.run(args, capture_output=True, timeout=60, check=False)
    assert proc.returncode != 0
    return (proc.stdout + proc.stderr).decode(errors="replace")


def test_wrong_service_sentinel_or_password_stops_the_start(sentinel, node):
    out = _start_fails(sentinel.url(service="nosuch"))
    assert "no sentinel knows the service 'nosuch'" in out
    assert PASSWORD not in out and SENTINEL_PASSWORD not in out
    out = _start_fails(f"redis-sentinel://:{PASSWORD}@{HOST}:{free_port()}/mymaster")
    assert "no sentinel answers" in out and PASSWORD not in out
    out = _start_fails(sentinel.url().replace(SENTINEL_PASSWORD, "wrong-sentinel-pw"))
    assert "sentinel authentication failed" in out and "wrong-sentinel-pw" not in out
    out = _start_fails(sentinel.url().replace(f":{PASSWORD}@", ":wrong-data-pw@"))
    assert "authentication failed" in out and "sentinel authentication" not in out
    assert "wrong-data-pw" not in out and SENTINEL_PASSWORD not in out
    srv = node({"pool": sentinel.url(service="nosuch"), "pool-start-degraded": "yes"})
    assert srv.client().info("tier_pool")["pool_degraded"] == 1
    assert "starting with the pool degraded" in srv.log_text()


def test_failover_to_the_promoted_replica(node, sentinel):
    """Runs last: it kills the module's master."""
    # A waits for the replica (WAIT) before acknowledging, so its writes survive the master's death.
    a = node({"pool-ack": "replicas", "pool-replicas": 1}).client()
    b = node().client()
    before = {f"sn:fo:{i}": value_for(f"sn:fo:{i}", 4 * KB) for i in range(20)}
    for k, v in before.items():
        a.execute_command("TAIR.KV.SETEX", k, 0, v)
    sentinel.kill_master()
    killed = time.monotonic()
    refused = []

    def written_and_read():
        try:
            b.execute_command("TAIR.KV.SETEX", "sn:after", 0, b"new master")
            return a.execute_command("TAIR.KV.MGET", "sn:after", "CONSISTENCY_LEVEL", "STRONG") == [b"new master"]
        except redis.exceptions.TryAgainError as exc:  # while the master is down and not yet replaced
            refused.append(str(exc))
            return False

    wait_for(written_and_read, timeout=30, interval=0.1, what="a write and a STRONG read through the new master")
    print(f"\nsentinel failover: pool written and read again {time.monotonic() - killed:.1f}s after the kill "
          f"({len(refused)} writes refused meanwhile)")
    assert sentinel.master_port() == sentinel.replica_port
    got = b.execute_command("TAIR.KV.MGET", *before, "CONSISTENCY_LEVEL", "STRONG")
    assert got == list(before.values())  # replica-acknowledged writes survived the failover
    # B's writes were refused while the master was down (its pool degraded) and its probe found the new master.
    assert refused and b.info("tier_pool")["recoveries"] >= 1
    assert a.info("tier_pool")["pool_degraded"] == 0 and b.info("tier_pool")["pool_degraded"] == 0
    # Invalidations follow the new master too: once A's subscription is back (it was lost with the master, and
    # what is published while it is down is missed: invalidation_gaps), a delete through B reaches A's copy.
    wait_for(lambda: a.info("tier_pool")["invalidation_subscribed"] == 1, timeout=15,
             what="A's invalidation subscription to come back")
    assert a.info("tier_pool")["invalidation_gaps"] >= 1
    assert b.delete("sn:after") == 1
    wait_for(lambda: a.execute_command("TAIR.KV.MGET", "sn:after", "CONSISTENCY_LEVEL", "EVENTUAL") == [None],
             timeout=10, what="A to drop its copy after B's delete")
