"""Every write command's reply waits for the pool under ``pool-ack pool`` (the default), not only TAIR.KV.SETEX's.

Plain Redis writes (SET, MSET, INCR, APPEND, SETRANGE, COPY, RENAME's new key...) were acknowledged at once while
the pool write followed, and the outcome the pool writer kept for each of them was never taken: one dict entry
per write, forever (INFO tier_pool ``acks_held``). Now the server acknowledges them once the handler returned
(``pool_acks.after_command_writes``): the reply comes once the pool holds every key the command wrote, and is
-TRYAGAIN when the pool is away or did not take a write; nothing is left in ``acks_held``. Real 3-master Redis
Cluster (or a standalone Redis for the faults); waits are polls with a deadline.
"""

from __future__ import annotations

import shutil

import pytest
import redis
from polling import wait_for
from tests.integration.support import once_the_pool_has_room, pool_info, refused

from kvstrata.bench.cluster import LocalCluster
from kvstrata.engine.tiers.pool import decode_record

pytestmark = [
    pytest.mark.kvstrata_only,
    pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                       reason="needs redis-server and redis-cli (.ci/run installs them)"),
]

PREFIX = b"kvs:"
POOL_CFG = {"dram-size": "256kb", "pool-timeout": 500, "pool-connect-timeout": 200, "pool-backoff-max": 300,
            "http-port": 0}


def pool_value(pool_client, key: bytes) -> bytes | None:
    raw = pool_client.get(PREFIX + key)
    return None if raw is None else decode_record(key, raw).value


def test_plain_writes_are_in_the_pool_when_acknowledged_and_leave_no_outcome_behind(make_server, cluster,
                                                                                     pool_client):
    r = make_server({**POOL_CFG, "pool": cluster.url}).client()
    # Each reply comes once the pool holds what the command wrote: read straight from the pool right after it.
    assert r.set("ack:set", b"s1")
    assert pool_value(pool_client, b"ack:set") == b"s1"
    assert r.mset({"ack:m1": b"a", "ack:m2": b"b", "ack:m3": b"c"})
    assert [pool_value(pool_client, k) for k in (b"ack:m1", b"ack:m2", b"ack:m3")] == [b"a", b"b", b"c"]
    assert r.incr("ack:n") == 1 and r.incr("ack:n") == 2
    assert pool_value(pool_client, b"ack:n") == b"2"
    assert r.append("ack:set", b"+") == 3
    assert pool_value(pool_client, b"ack:set") == b"s1+"
    assert r.setrange("ack:set", 0, b"S") == 3
    assert pool_value(pool_client, b"ack:set") == b"S1+"
    assert r.copy("ack:set", "ack:copy")
    assert pool_value(pool_client, b"ack:copy") == b"S1+"
    assert r.rename("ack:copy", "ack:renamed")
    assert pool_value(pool_client, b"ack:renamed") == b"S1+"
    assert r.execute_command("SETEX", "ack:ex", 100, b"e") and r.getset("ack:ex", b"f") == b"e"
    assert pool_value(pool_client, b"ack:ex") == b"f"
    # Many writes, pipelined, and the KV-cache commands that acknowledge their own writes.
    pipe = r.pipeline(transaction=False)
    for i in range(300):
        pipe.set(f"ack:bulk:{i}", b"v%d" % i)
    assert all(pipe.execute())
    assert r.execute_command("TAIR.KV.SETEX", "ack:kv", 0, b"kv") > 0
    assert r.delete("ack:m1") == 1
    assert pool_value(pool_client, b"ack:bulk:299") == b"v299"
    wait_for(lambda: pool_info(r)["pending"] == 0, what="the pool writer to drain")
    info = pool_info(r)
    assert info["acks_held"] == 0, info  # every outcome was taken by the reply that waited for it
    assert info["writes"] >= 300


def test_plain_writes_are_refused_while_the_pool_is_away(make_server):
    single = LocalCluster(standalone=True).start()
    try:
        r = make_server({**POOL_CFG, "pool": single.url}).client()
        assert r.set("away:k", b"v")
        single.kill(0)
        wait_for(lambda: pool_info(r)["pool_degraded"] == 1 or refused(lambda: r.set("away:probe", b"x")),
                 timeout=10, what="the pool to be seen away")
        wait_for(lambda: pool_info(r)["pool_degraded"] == 1, timeout=10, what="degraded")
        for write in (lambda: r.set("away:new", b"n"), lambda: r.mset({"away:a": b"1", "away:b": b"2"}),
                      lambda: r.incr("away:n")):
            with pytest.raises(redis.exceptions.TryAgainError, match="the pool is unavailable"):
                write()
        # A write the client was told failed is not served by this node either.
        assert r.get("away:new") is None and r.get("away:n") is None
        assert r.ping()
        assert pool_info(r)["acks_held"] == 0
    finally:
        single.stop()


def test_a_write_the_pool_refuses_is_an_error_not_an_acknowledgement(make_server):
    single = LocalCluster(standalone=True, maxmemory="3mb").start()
    try:
        r = make_server({**POOL_CFG, "dram-size": "64mb", "pool": single.url, "pool-timeout": 1000}).client()
        refused = 0
        for i in range(40):
            try:
                r.set(f"big:{i}", b"z" * 200_000)
            except redis.exceptions.TryAgainError as exc:
                assert "did not take the write" in str(exc) and "maxmemory" in str(exc), str(exc)
                refused += 1
        assert refused > 0
        info = pool_info(r)
        assert info["pool_degraded"] == 0 and info["refused_writes"] >= refused and info["acks_held"] == 0
        assert once_the_pool_has_room(lambda: r.set("small", b"s"))  # not an outage
    finally:
        single.stop()


def test_under_pool_ack_local_plain_writes_answer_at_once_and_hold_nothing(make_server, cluster):
    r = make_server({**POOL_CFG, "pool": cluster.url, "pool-ack": "local"}).client()
    for i in range(100):
        assert r.set(f"local:{i}", b"v")
    wait_for(lambda: pool_info(r)["pending"] == 0, what="the pool writer to drain")
    assert pool_info(r)["acks_held"] == 0


def _raw(port: int, payload: bytes, replies: int, timeout: float = 20.0) -> list[bytes]:
    """Send ``payload`` (several commands at once: one pipeline) and read ``replies`` RESP2 simple lines
    (+, -, :) or bulk strings, in order."""
    import socket

    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sock.sendall(payload)
        f = sock.makefile("rb")
        out = []
        for _ in range(replies):
            line = f.readline()
            if line.startswith(b"$") and line != b"$-1\r\n":
                n = int(line[1:])
                line = line + f.read(n + 2)
            out.append(line)
        sock.settimeout(0.3)
        try:
            extra = sock.recv(1 << 16)
        except TimeoutError:
            extra = b""
        assert extra == b"", f"more replies than commands: {extra!r}"
        return out
    finally:
        sock.close()


def _cmd(*args: bytes | str | int) -> bytes:
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def test_a_pipeline_of_writes_waits_once_and_answers_in_order(make_server, cluster, pool_client, tmp_path):
    """The replies of a pipeline's writes are held in place while the commands after them run, and are sent, in
    order, once the pool holds every write of the batch: errors in their places, reads of what the batch wrote,
    a read that has to load from the SSD tier after held writes, CLIENT REPLY SKIP in the middle."""
    srv = make_server({**POOL_CFG, "pool": cluster.url, "essd-path": str(tmp_path / "ssd"), "dram-size": "64kb"})
    r = srv.client()
    cold = [f"pipe:cold:{i}" for i in range(12)]
    for k in cold:  # 12 x 16 KB through 64 KB of DRAM: the first ones are on the SSD now
        r.set(k, k.encode() * (16384 // len(k)))
    assert r.execute_command("TAIR.KV.TIER", cold[0]) in (b"ssd", b"pool")
    payload = b"".join([
        _cmd("SET", "pipe:a", "1"), _cmd("INCR", "pipe:a"), _cmd("GET", "pipe:a"), _cmd("INCR", "pipe:s"),
        _cmd("SET", "pipe:s", "text"), _cmd("INCR", "pipe:s"), _cmd("TAIR.KV.SETEX", "pipe:kv", 0, "kv"),
        _cmd("GET", cold[0]), _cmd("SET", "pipe:b", "2"), _cmd("CLIENT", "REPLY", "SKIP"), _cmd("SET", "pipe:c", "3"),
        _cmd("MSET", "pipe:d", "4", "pipe:e", "5"), _cmd("DEL", "pipe:a"), _cmd("GET", "pipe:a"), _cmd("PING"),
    ])
    got = _raw(srv.port, payload, 13)  # CLIENT REPLY SKIP answers nothing and skips the next reply
    expected_cold = cold[0].encode() * (16384 // len(cold[0]))
    assert got[:7] == [b"+OK\r\n", b":2\r\n", b"$1\r\n2\r\n", b":1\r\n", b"+OK\r\n",
                       b"-ERR value is not an integer or out of range\r\n", got[6]]
    assert got[6].startswith(b":") and int(got[6][1:]) > 0  # TAIR.KV.SETEX's version
    assert got[7] == b"$%d\r\n%s\r\n" % (len(expected_cold), expected_cold)
    assert got[8:] == [b"+OK\r\n", b"+OK\r\n", b":1\r\n", b"$-1\r\n", b"+PONG\r\n"]
    for key, value in ((b"pipe:b", b"2"), (b"pipe:c", b"3"), (b"pipe:d", b"4"), (b"pipe:e", b"5"),
                       (b"pipe:s", b"text"), (b"pipe:kv", b"kv")):
        assert pool_value(pool_client, key) == value, key
    wait_for(lambda: pool_info(r)["pending"] == 0, what="the pool writer to drain")
    assert pool_info(r)["acks_held"] == 0


def test_a_pipeline_of_writes_to_a_pool_that_is_away_answers_each_in_place(make_server):
    single = LocalCluster(standalone=True).start()
    try:
        srv = make_server({**POOL_CFG, "pool": single.url})
        r = srv.client()
        assert r.set("gone:warm", b"w")
        single.kill(0)
        wait_for(lambda: pool_info(r)["pool_degraded"] == 1 or refused(lambda: r.set("gone:probe", b"x")),
                 timeout=10, what="the pool to be seen away")
        payload = b"".join([_cmd("SET", "gone:a", "1"), _cmd("PING"), _cmd("SET", "gone:b", "2"), _cmd("ECHO", "e")])
        got = _raw(srv.port, payload, 4)
        assert got[0].startswith(b"-TRYAGAIN ") and got[2].startswith(b"-TRYAGAIN "), got
        assert got[1] == b"+PONG\r\n" and got[3] == b"$1\r\ne\r\n"
        assert r.get("gone:a") is None and r.get("gone:b") is None
    finally:
        single.stop()
