"""Consistency across kvstrata nodes sharing a real 3-master Redis Cluster pool (redis-server processes).

Covered: compare-and-set decided in the pool (one success across nodes, sequential and concurrent; the loser gets
-VERMISMATCH); TAIR.KV.VERSION ... STRONG after another node's write; deletes that stick (tombstones refuse older
writes and demotions, other nodes' copies invalidated within a measured bound); FLUSHALL's cross-node meaning;
deletes, CAS and STRONG reads refused with -TRYAGAIN while the pool is away; -OOM from the pool is a refused
write, not an outage; --pool-ack replicas without replicas is an error, never an ack; startup checks of the
pool endpoint. Waits are polls with a deadline, never fixed sleeps.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import threading
import time

import pytest
import redis
from polling import wait_for
from tests.integration.support import once_the_pool_has_room, refused

from kvstrata.bench.cluster import LocalCluster, free_port
from kvstrata.engine.tiers import pool_scripts
from kvstrata.engine.tiers.pool import FLAG_TOMBSTONE, decode_head, encode_record

pytestmark = [
    pytest.mark.kvstrata_only,
    pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                       reason="needs redis-server and redis-cli (.ci/run installs them)"),
]

PREFIX = b"kvs:"
INVALIDATION_BOUND_S = 1.0  # the bound docs/pool.md states for a copy on another node to disappear


@pytest.fixture
def node(make_server, cluster):
    """A diskless kvstrata node (DRAM + pool) on the shared cluster."""

    def start(config=None, url=None):
        cfg = {"dram-size": "256kb", "pool": url or cluster.url, "pool-timeout": 500,
               "pool-connect-timeout": 200, "pool-backoff-max": 300, "http-port": 0}
        cfg.update(config or {})
        return make_server(cfg)

    return start


def err(fn, *args):
    with pytest.raises(redis.ResponseError) as info:
        fn(*args)
    return str(info.value)


def test_cas_is_decided_in_the_pool_sequentially(node):
    a, b = node().client(), node().client()
    for i in range(20):
        key = f"cas:seq:{i}"
        v = a.execute_command("TAIR.KV.SETEX", key, 0, b"v1")
        assert b.execute_command("TAIR.KV.MGET", key) == [b"v1"]  # B holds a copy at version v
        v2 = a.execute_command("TAIR.KV.SETEX", key, 0, b"from-a", "VER", v)
        assert v2 > v
        # B's copy may still say v (or be invalidated already); the pool says v2: B's CAS on v is refused.
        assert "version mismatch" in err(b.execute_command, "TAIR.KV.SETEX", key, 0, b"from-b", "VER", v)
        assert b.execute_command("TAIR.KV.MGET", key, "CONSISTENCY_LEVEL", "STRONG") == [b"from-a"]
        # With the pool's version, B's CAS succeeds.
        assert b.execute_command("TAIR.KV.SETEX", key, 0, b"from-b", "VER", v2) > v2


def test_cas_concurrent_across_nodes_has_one_winner(node):
    a, b = node().client(), node().client()
    doubles = 0
    for i in range(30):
        key = f"cas:conc:{i}"
        v = a.execute_command("TAIR.KV.SETEX", key, 0, b"base")
        b.execute_command("TAIR.KV.MGET", key)
        results: dict[str, object] = {}

        def cas(name, client, key=key, v=v, results=results):
            try:
                results[name] = client.execute_command("TAIR.KV.SETEX", key, 0, name.encode(), "VER", v)
            except redis.ResponseError as exc:
                results[name] = exc

        threads = [threading.Thread(target=cas, args=(n, c)) for n, c in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        wins = [n for n, r in results.items() if isinstance(r, int)]
        assert len(results) == 2
        doubles += len(wins) > 1
        assert len(wins) == 1, results
        loser = next(r for r in results.values() if not isinstance(r, int))
        assert "VERMISMATCH version mismatch" in str(loser)
        assert a.execute_command("TAIR.KV.MGET", key, "CONSISTENCY_LEVEL", "STRONG") == [wins[0].encode()]
    assert doubles == 0


def test_version_strong_follows_the_pool(node):
    a, b = node().client(), node().client()
    v1 = a.execute_command("TAIR.KV.SETEX", "ver:k", 0, b"one")
    assert b.execute_command("TAIR.KV.VERSION", "ver:k") == v1
    v2 = a.execute_command("TAIR.KV.SETEX", "ver:k", 0, b"two")
    assert b.execute_command("TAIR.KV.VERSION", "ver:k", "CONSISTENCY_LEVEL", "STRONG") == v2
    assert a.delete("ver:k") == 1
    assert b.execute_command("TAIR.KV.VERSION", "ver:k", "CONSISTENCY_LEVEL", "STRONG") is None
    assert "CONSISTENCY_LEVEL" in err(b.execute_command, "TAIR.KV.VERSION", "ver:k", "CONSISTENCY_LEVEL", "X")


def test_deletes_stick_and_reach_other_nodes_within_the_bound(node, pool_client):
    a_srv, b_srv = node(), node()
    a, b = a_srv.client(), b_srv.client()
    keys = [f"del:{i}" for i in range(40)]
    for k in keys:
        a.execute_command("TAIR.KV.SETEX", k, 0, b"x" * 512)
    assert b.execute_command("TAIR.KV.MGET", *keys) == [b"x" * 512] * len(keys)  # B caches every key
    t0 = time.monotonic()
    assert a.delete(*keys) == len(keys)
    seen_gone: dict[str, float] = {}

    def gone_on_b():
        for k in keys:
            if k not in seen_gone and b.get(k) is None:
                seen_gone[k] = time.monotonic() - t0
        return len(seen_gone) == len(keys)

    wait_for(gone_on_b, timeout=10, what="B to drop its copies of the deleted keys")
    worst = max(seen_gone.values())
    assert worst < INVALIDATION_BOUND_S, worst
    print(f"invalidation: {len(keys)} deleted keys gone on the other node after at most {worst * 1000:.0f} ms")
    # Tombstones in the pool, versioned: an older write (a late demotion, a slow node) is refused.
    head = decode_head(pool_client.getrange(PREFIX + keys[0].encode(), 0, 27))
    assert head is not None and head[2] & FLAG_TOMBSTONE
    old = encode_record(keys[0].encode(), b"zombie", head[0] - 1, 0)
    got = pool_client.eval(pool_scripts.SET_IF_NEWER, 1, PREFIX + keys[0].encode(), old,
                           struct.pack(">Q", head[0] - 1), 60_000, b"__kvstrata_invalidate__:kvs:",
                           struct.pack(">Q", head[0] - 1) + b"\x00")
    assert got == struct.pack(">Q", head[0])  # refused: the pool's (tombstone) version is returned
    assert pool_client.ttl(PREFIX + keys[0].encode()) > 3600  # outlives any record (pool-ttl 3600 s)
    # B fills its DRAM: whatever it demotes now, the deleted keys never come back, on any node.
    for i in range(200):
        b.execute_command("TAIR.KV.SETEX", f"fill:{i}", 0, b"f" * 4096)
    assert a.execute_command("TAIR.KV.MGET", *keys, "CONSISTENCY_LEVEL", "STRONG") == [None] * len(keys)
    assert b.execute_command("TAIR.KV.MGET", *keys, "CONSISTENCY_LEVEL", "EVENTUAL") == [None] * len(keys)
    assert node().client().execute_command("TAIR.KV.MGET", *keys) == [None] * len(keys)


def test_flushall_across_nodes(node):
    a, b = node().client(), node().client()
    mine = [f"fl:a:{i}" for i in range(10)]
    theirs = [f"fl:b:{i}" for i in range(10)]
    for k in mine:
        a.execute_command("TAIR.KV.SETEX", k, 0, b"a")
    for k in theirs:
        b.execute_command("TAIR.KV.SETEX", k, 0, b"b")
    assert b.execute_command("TAIR.KV.MGET", *mine) == [b"a"] * 10
    assert a.flushall() is True
    # FLUSHALL on A: A's keys are deleted everywhere (tombstones, invalidations); keys A never saw stay.
    wait_for(lambda: b.execute_command("TAIR.KV.MGET", *mine) == [None] * 10, timeout=5,
             what="B to drop the flushed keys")
    assert b.execute_command("TAIR.KV.MGET", *mine, "CONSISTENCY_LEVEL", "STRONG") == [None] * 10
    assert b.execute_command("TAIR.KV.MGET", *theirs, "CONSISTENCY_LEVEL", "STRONG") == [b"b"] * 10
    assert a.execute_command("TAIR.KV.MGET", *theirs) == [b"b"] * 10


def test_pool_away_refuses_deletes_cas_and_strong_reads(make_server):
    single = LocalCluster(standalone=True).start()
    try:
        srv = make_server({"dram-size": "256kb", "pool": single.url, "pool-timeout": 300,
                           "pool-connect-timeout": 200, "pool-backoff-max": 300, "http-port": 0,
                           "pool-ack": "local"})
        r = srv.client()
        v = r.execute_command("TAIR.KV.SETEX", "away:k", 0, b"v")
        single.kill(0)
        # The first request that needs the pool finds it gone; from then on it is degraded.
        wait_for(lambda: r.info("tier_pool")["pool_degraded"] == 1 or
                 refused(lambda: r.execute_command("TAIR.KV.MGET", "away:k", "CONSISTENCY_LEVEL", "STRONG")),
                 timeout=10, what="the pool to be seen away")
        wait_for(lambda: r.info("tier_pool")["pool_degraded"] == 1, timeout=10, what="degraded")
        assert "the pool is unavailable" in err(r.delete, "away:k")
        assert r.get("away:k") == b"v"  # refused, so nothing was deleted
        assert "the pool is unavailable" in err(r.execute_command, "TAIR.KV.SETEX", "away:k", 0, b"w", "VER", v)
        assert "the pool is unavailable" in err(r.execute_command, "TAIR.KV.MGET", "away:k", "CONSISTENCY_LEVEL", "STRONG")
        # Plain writes under pool-ack local keep working locally.
        assert r.execute_command("TAIR.KV.SETEX", "away:other", 0, b"o") > 0
    finally:
        single.stop()


def test_oom_in_the_pool_is_a_refused_write_not_an_outage(make_server):
    single = LocalCluster(standalone=True, maxmemory="3mb").start()
    try:
        srv = make_server({"dram-size": "64mb", "pool": single.url, "pool-timeout": 1000, "http-port": 0})
        r = srv.client()
        assert "noeviction" in srv.log_text()  # warned at connect
        assert r.info("tier_pool")["maxmemory_policy"] == "noeviction"
        refused = 0
        for i in range(40):
            try:
                r.execute_command("TAIR.KV.SETEX", f"big:{i}", 0, b"z" * 200_000)
            except redis.ResponseError as exc:
                assert "the pool did not take the write" in str(exc) and "maxmemory" in str(exc)
                refused += 1
        assert refused > 0
        info = r.info("tier_pool")
        assert info["pool_degraded"] == 0 and info["refused_writes"] >= refused
        assert once_the_pool_has_room(lambda: r.execute_command("TAIR.KV.SETEX", "small", 0, b"s")) > 0  # no outage
    finally:
        single.stop()


def test_pool_ack_replicas_without_replicas_is_an_error(node):
    r = node({"pool-ack": "replicas", "pool-replicas": 1}).client()
    msg = err(r.execute_command, "TAIR.KV.SETEX", "rep:k", 0, b"v")
    assert "the pool did not take the write" in msg and "replicas" in msg
    assert r.info("tier_pool")["replica_waits_short"] >= 1


def _start_fails(cfg: dict) -> str:
    args = [sys.executable, "-m", "kvstrata", "serve", "--port", str(free_port()), "--bind", "127.0.0.1"]
    for name, value in cfg.items():
        args += [f"--{name}", str(value)]
    proc = subprocess.run(args, capture_output=True, timeout=60, check=False)
    assert proc.returncode != 0
    return (proc.stdout + proc.stderr).decode(errors="replace")


def test_startup_checks_the_pool_endpoint(cluster, make_server):
    secret = LocalCluster(standalone=True, password="s3cret").start()
    try:
        port = secret.ports[0]
        out = _start_fails({"pool": f"redis://:wrong@127.0.0.1:{port}", "http-port": 0})
        assert "authentication failed" in out and "wrong" not in out.replace("wrong-", "")
        out = _start_fails({"pool": f"redis://127.0.0.1:{cluster.ports[0]}", "http-port": 0})
        assert "is a Redis Cluster node: use redis-cluster://" in out
        out = _start_fails({"pool": f"redis-cluster://127.0.0.1:{port}", "http-port": 0})
        assert "s3cret" not in out and "pool" in out
        out = _start_fails({"pool": f"redis://127.0.0.1:{free_port()}", "pool-connect-timeout": 100,
                            "http-port": 0})
        assert "unreachable" in out
        # The right password (as a URL user:password, like redis-py) works; with the flag, a bad one starts
        # degraded and says so.
        ok = make_server({"pool": f"redis://default:s3cret@127.0.0.1:{port}", "http-port": 0}).client()
        assert ok.execute_command("TAIR.KV.SETEX", "auth:k", 0, b"v") > 0
        assert ok.info("tier_pool")["pool_degraded"] == 0
        deg = make_server({"pool": f"redis://:wrong@127.0.0.1:{port}", "pool-start-degraded": "yes",
                           "http-port": 0})
        assert deg.client().info("tier_pool")["pool_degraded"] == 1
        assert "starting with the pool degraded" in deg.log_text()
    finally:
        secret.stop()


@pytest.mark.slow
def test_master_killed_with_replica_promoted_loses_no_replica_acked_write(make_server):
    """pool-ack replicas: every write acknowledged before a master is killed is readable through another node
    after its replica takes over (the figure docs/pool.md reports)."""
    c = LocalCluster(masters=3, replicas=1, node_timeout_ms=1000).start()
    try:
        cfg = {"dram-size": "64kb", "pool": c.url, "pool-timeout": 1000, "pool-connect-timeout": 200,
               "pool-backoff-max": 300, "http-port": 0, "pool-ack": "replicas", "pool-replicas": 1}
        a, b = make_server(dict(cfg)).client(), make_server(dict(cfg)).client()
        # The replicas need their first sync before WAIT can count them: wait until a write on every master is
        # confirmed (one key per master through hash tags).
        warm = [f"{{w{i}}}" for i in range(64)]
        wait_for(lambda: all(not refused(lambda k=k: a.execute_command("TAIR.KV.SETEX", k, 0, b"w")) for k in warm),
                 timeout=30, what="the replicas to be in sync")
        acked = {}
        for i in range(150):
            k = f"rk:{i}"
            acked[k] = a.execute_command("TAIR.KV.SETEX", k, 0, k.encode() * 50)
        # 150 keys do not fit B's DRAM: a STRONG read still answers every one (from the records it loaded).
        pre = b.execute_command("TAIR.KV.MGET", *acked, "CONSISTENCY_LEVEL", "STRONG", "WITHVERSIONS")
        assert [g[1] if g else None for g in pre] == list(acked.values())
        victim = c.index_of_port(c.master_of_slot(c.keyslot("rk:0")))
        c.kill(victim)

        def all_read():
            try:
                names = list(acked)
                got = []
                for i in range(0, len(names), 10):  # batches that fit this node's small DRAM
                    got += b.execute_command("TAIR.KV.MGET", *names[i:i + 10], "CONSISTENCY_LEVEL", "STRONG",
                                             "WITHVERSIONS")
            except redis.ResponseError as exc:
                last_error[:] = [str(exc)]
                return False
            return got

        last_error: list[str] = []

        try:
            got = wait_for(all_read, timeout=40, what="B to read through the promoted replica")
        except AssertionError:
            raise AssertionError(f"no STRONG read after failover: {last_error}") from None
        lost = [k for k, g in zip(acked, got, strict=True) if g is None or g[1] != acked[k]]
        print(f"replica failover: {len(acked) - len(lost)}/{len(acked)} replica-acknowledged writes readable")
        assert lost == []
    finally:
        c.stop()


class _HeldNodes:
    """Two nodes' pool tiers on one standalone Redis: node A's writer batches wait in ``held`` until the test
    releases them (in the order it forces), node B writes at once; ``r`` reads the pool directly."""

    def __init__(self) -> None:
        from kvstrata.engine.tiers.pool import PoolTier

        self.single = LocalCluster(standalone=True).start()
        self.a = PoolTier(self.single.url, 1 << 20, threaded=False)
        self.b = PoolTier(self.single.url, 1 << 20, threaded=False)
        self.held: list = []
        self.a._process = self.held.append  # node A's writer thread: its batches wait here
        self.r = redis.Redis(host="127.0.0.1", port=self.single.ports[0])

    def release(self) -> None:
        """Node A's writer runs every batch held so far, in order."""
        from kvstrata.engine.tiers.pool_writer import PoolWriter

        while self.held:
            PoolWriter._process(self.a, self.held.pop(0))

    def fail_next(self) -> None:
        """Node A's next held batch fails as on a master that timed out."""
        self.a._committed(self.held.pop(0), "TimeoutError: simulated", [])

    def close(self) -> None:
        self.a.close()
        self.b.close()
        self.single.stop()


@pytest.fixture
def held_nodes():
    nodes = _HeldNodes()
    yield nodes
    nodes.close()


@pytest.mark.parametrize("order", ["write_queued_then_tombstone_refused", "tombstone_refused_then_write_queued",
                                   "tombstone_failed_with_write_queued"])
def test_delete_is_acknowledged_only_once_its_tombstone_is_in_the_pool(order, held_nodes):
    """The race of test_pool_history's hist:a failure, forced: node A's DEL and a CAS of the same key through A
    (another client) are in A's writer queue together while node B's CAS lands first with a higher version. The
    tombstone is refused (OLDER); A's CAS is refused (MISMATCH). Before the fix the DEL was acknowledged with no
    effect (``pending`` held the CAS, so no retry and no wait) and B's next CAS of the pre-DEL value succeeded."""
    from kvstrata.engine.entry import Entry
    from kvstrata.engine.tiers.pool import FAILED, MISMATCH, OK
    from kvstrata.engine.tiers.pool_writer import PoolWriter

    def v(ms: int, node: int) -> int:
        return (ms << 20) | node

    a, b, held, r = held_nodes.a, held_nodes.b, held_nodes.held, held_nodes.r
    key = b"race:del-cas"

    def pool_head() -> tuple[bool, int]:
        raw = r.get(PREFIX + key)
        return bool(raw[3] & FLAG_TOMBSTONE), struct.unpack(">Q", raw[4:12])[0]

    assert b.take_outcome(b.put(key, Entry(b"v0", v(1000, 2)), track=True))[0] == OK
    seq_del = a.delete(key, v(1500, 1), track=True)  # A's clock is behind B's
    assert b.take_outcome(b.put(key, Entry(b"v1", v(2000, 2)), track=True, expected=v(1000, 2)))[0] == OK
    stale_cas = lambda: a.put(key, Entry(b"a", v(2001, 1)), track=True, expected=v(999, 1))  # noqa: E731
    if order == "write_queued_then_tombstone_refused":
        seq_cas = stale_cas()
    elif order == "tombstone_refused_then_write_queued":
        PoolWriter._process(a, held.pop(0))
        seq_cas = stale_cas()
    else:
        seq_cas = stale_cas()
        held_nodes.fail_next()  # the tombstone's master timed out
    at_ack = None
    while held:
        PoolWriter._process(a, held.pop(0))
        if at_ack is None and seq_del in a.outcomes:
            at_ack = pool_head()
    outcome = a.take_outcome(seq_del)[0]
    assert a.take_outcome(seq_cas)[0] == MISMATCH
    second = b.take_outcome(b.put(key, Entry(b"v2", v(3000, 2)), track=True, expected=v(2000, 2)))[0]
    if order == "tombstone_failed_with_write_queued":
        assert outcome == FAILED  # the client hears -TRYAGAIN: the delete's effect is unknown
    else:
        assert outcome == OK and at_ack is not None and at_ack[0], (outcome, at_ack)
        assert at_ack[1] > v(2000, 2)
        assert second == MISMATCH  # the pool holds the tombstone: a CAS of the pre-DEL value is refused


@pytest.mark.parametrize("fault", [False, True])
def test_del_reply_waits_for_its_tombstone_when_a_cas_is_queued_behind_it(fault, held_nodes):
    """The same race through the DEL and TAIR.KV.SETEX ... VER handlers of one node (pool-ack pool): DEL's reply
    (``after_pool_delete``) must not be inferred from ``pending``, which a CAS queued behind the tombstone replaces.
    Without a fault the DEL answers once the tombstone (sent again above node B's version) is in the pool; with
    one it answers -TRYAGAIN (unknown effect). Before the fix it answered 1 with the pool still holding B's value."""
    from kvstrata.commands.context import ClientState, Context
    from kvstrata.commands.keyspace import del_
    from kvstrata.commands.tairkv import kv_setex
    from kvstrata.commands.waits import Suspend
    from kvstrata.config import Config
    from kvstrata.engine.entry import Entry
    from kvstrata.engine.store import Store
    from kvstrata.engine.tiers.pool import MISMATCH, OK, PoolUnavailableError

    a, b, r = held_nodes.a, held_nodes.b, held_nodes.r
    key = b"race:del-reply"
    store = Store(1 << 20, pool=a, node_id=1)
    c0, c2 = (Context(store, Config(), ClientState(id=i), server=object()) for i in (0, 2))
    future = (int(time.time() * 1000) + 60_000) << 20  # node B's clock is ahead of A's
    assert b.take_outcome(b.put(key, Entry(b"v0", future | 2), track=True))[0] == OK
    sus_del = del_(c0, [b"DEL", key])
    assert isinstance(sus_del, Suspend)
    assert b.take_outcome(b.put(key, Entry(b"v1", future + (1 << 20) | 2), track=True,
                                expected=future | 2))[0] == OK
    sus_cas = kv_setex(c2, [b"TAIR.KV.SETEX", key, b"0", b"c2", b"VER", b"12345"])  # stale: refused
    if fault:
        held_nodes.fail_next()
    reply: object = sus_del
    while isinstance(reply, Suspend):
        held_nodes.release()
        if fault:
            with pytest.raises(PoolUnavailableError):
                sus_del.then(None)
            return
        reply = reply.then(None)
    raw = r.get(PREFIX + key)
    assert raw[3] & FLAG_TOMBSTONE, "DEL acknowledged while the pool still holds node B's value"
    with pytest.raises(Exception, match="version mismatch"):
        sus_cas.then(None)
    late = b.put(key, Entry(b"v2", future + (2 << 20) | 2), track=True, expected=future + (1 << 20) | 2)
    assert b.take_outcome(late)[0] == MISMATCH


@pytest.mark.parametrize("fault", [False, True])
@pytest.mark.parametrize("command", ["GETDEL", "PEXPIRE", "EXPIREAT"])
def test_getdel_and_expire_in_the_past_wait_for_their_tombstone(fault, command, held_nodes):
    """GETDEL, and EXPIRE-family commands with a time already past, delete the key: with the pool (pool-ack
    pool) their reply waits for the key's tombstone as DEL's does, and is -TRYAGAIN when the pool did not take it
    (before: they answered at once, while the pool still served the value to other nodes)."""
    from kvstrata.commands.context import ClientState, Context
    from kvstrata.commands.keyspace import expireat, pexpire
    from kvstrata.commands.strings import getdel
    from kvstrata.commands.waits import Suspend
    from kvstrata.config import Config
    from kvstrata.engine.store import Store
    from kvstrata.engine.tiers.pool import PoolUnavailableError

    r = held_nodes.r
    key = b"race:" + command.lower().encode()
    store = Store(1 << 20, pool=held_nodes.a, node_id=1)
    ctx = Context(store, Config(), ClientState(id=0), server=object())
    store.put(key, b"value")
    held_nodes.release()
    assert r.get(PREFIX + key) is not None and not r.get(PREFIX + key)[3] & FLAG_TOMBSTONE
    handler, args = {"GETDEL": (getdel, [b"GETDEL", key]), "PEXPIRE": (pexpire, [b"PEXPIRE", key, b"-1"]),
                     "EXPIREAT": (expireat, [b"EXPIREAT", key, b"1"])}[command]
    reply = handler(ctx, args)
    assert isinstance(reply, Suspend)  # not answered before the pool has the tombstone
    assert not r.get(PREFIX + key)[3] & FLAG_TOMBSTONE
    if fault:
        held_nodes.fail_next()
        with pytest.raises(PoolUnavailableError, match="did not take the delete"):
            reply.then(None)
        return
    held_nodes.release()
    assert reply.then(None) == (b"value" if command == "GETDEL" else 1)
    assert r.get(PREFIX + key)[3] & FLAG_TOMBSTONE
    assert store.get(key) is None
