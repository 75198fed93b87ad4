"""MIGRATE from kvstrata: keys move to a real redis-server (and to another kvstrata) with their TTLs, as Redis's own
MIGRATE moves them: each script is run from a redis-server source and from a kvstrata source against fresh targets,
and the replies and both sides' keys must agree. A slow target (a socket that holds its replies) shows the two
things only kvstrata has to care about: other clients are served meanwhile, and a key written here while its
RESTORE was in flight is not deleted."""

from __future__ import annotations

import os
import shutil
import socket
import threading

import pytest
import redis
from tests.conftest import ServerProc
from tests.integration.support import reply_text

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (.ci/run)")


def _state(client: redis.Redis) -> dict:
    return {k: (client.get(k), client.pttl(k) > 0) for k in sorted(client.keys())}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_replies_and_keys_as_redis_migrate():
    big = os.urandom(300_000)
    servers = {name: ServerProc(target=target).start()
               for name, target in (("kv", "kvstrata"), ("rd", "redis"), ("t1", "redis"), ("t2", "redis"))}
    try:
        results = []
        for source, target in (("rd", "t1"), ("kv", "t2")):
            src, dst = servers[source].client(), servers[target].client()
            dst.config_set("requirepass", "tpw")
            dst = servers[target].client(password="tpw")
            src.set("a", "1")
            src.set("b", big, px=60_000)
            src.set("c", "3")
            src.set("d", "4")
            dst.set("c", "theirs")
            host, port = servers[target].host, servers[target].port
            base = ("MIGRATE", host, port)
            script = [
                (*base, "a", 0, 5000),  # no AUTH: the target refuses
                (*base, "a", 0, 5000, "AUTH", "tpw"),
                (*base, "a", 0, 5000, "AUTH", "tpw"),  # gone from the source: NOKEY
                (*base, "", 0, 5000, "AUTH2", "default", "tpw", "KEYS", "b", "c", "d"),  # c: BUSYKEY, b and d move
                (*base, "", 0, 5000, "AUTH", "tpw", "REPLACE", "COPY", "KEYS", "c", "missing"),
                (*base, "x", 0, 5000, "KEYS", "c"), (*base, "c", 0, 5000, "BOGUS"), (*base, "c", 0, 5000, "AUTH"),
                (*base, "c", 0, "t", "AUTH", "tpw"), (*base, "c", "db", 5000), (*base, "c", 99, 5000, "AUTH", "tpw"),
                ("MIGRATE", "127.0.0.1", _closed_port(), "c", 0, 200),
            ]
            replies = [reply_text(src, *args) for args in script]
            results.append((replies, _state(src), _state(dst)))
            src.close()
            dst.close()
        (r_replies, r_src, r_dst), (k_replies, k_src, k_dst) = results
        for args, ours, theirs in zip(script, k_replies, r_replies, strict=True):
            assert ours == theirs, (args, ours, theirs)
        assert k_src == r_src and k_dst == r_dst
        assert k_dst[b"b"] == (big, True) and k_dst[b"c"] == (b"3", False) and k_src == {b"c": (b"3", False)}
    finally:
        for srv in servers.values():
            srv.stop()


class HeldTarget:
    """A socket that reads a MIGRATE's request and answers +OK to each command only once released (or never)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received = threading.Event()
        self.release = threading.Event()
        self.commands = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        data = b""
        with conn:
            conn.settimeout(10)
            while b"RESTORE" not in data or not data.endswith(b"\r\n"):
                chunk = conn.recv(1 << 16)
                if not chunk:
                    return
                data += chunk
            self.commands = data.count(b"\r\n*") + 1  # the commands sent (small values: no "*" inside them)
            self.received.set()
            if self.release.wait(10):
                conn.sendall(b"+OK\r\n" * self.commands)
                conn.recv(1)  # until the source closes

    def close(self) -> None:
        self.release.set()
        self.sock.close()


def test_a_key_written_during_the_transfer_stays_and_others_are_served(make_server):
    srv = make_server()
    c, other = srv.client(), srv.client()
    c.set("moving", "v1")
    c.set("kept", "k1")
    target = HeldTarget()
    try:
        pipe = srv.client()
        done: dict = {}
        t = threading.Thread(target=lambda: done.update(
            reply=reply_text(pipe, "MIGRATE", "127.0.0.1", target.port, "", 0, 10_000, "KEYS", "moving", "kept")))
        t.start()
        assert target.received.wait(10)
        assert other.get("kept") == b"k1"  # served while the MIGRATE waits for its target
        other.set("kept", "k2")  # written while its RESTORE is in flight
        target.release.set()
        t.join(10)
        assert done["reply"] == "OK"
        assert other.exists("moving") == 0  # restored there, deleted here
        assert other.get("kept") == b"k2"  # the newer write is not deleted
    finally:
        target.close()


def test_a_silent_target_times_out_and_nothing_is_deleted(make_server):
    srv = make_server()
    c = srv.client()
    c.set("k", "v")
    target = HeldTarget()
    try:
        assert reply_text(c, "MIGRATE", "127.0.0.1", target.port, "k", 0, 300) == \
            "-IOERR error or timeout reading to target instance"
        assert c.get("k") == b"v"
    finally:
        target.close()


def test_to_another_kvstrata_from_the_ssd_tier(make_server, tmp_path):
    a = make_server({"essd-path": str(tmp_path / "a"), "dram-size": "1mb", "http-port": 0})
    b = make_server()
    ca, cb = a.client(), b.client()
    value = os.urandom(256 << 10)
    ca.execute_command("TAIR.KV.SETEX", "cold", 60_000, value, "COLD_STORAGE")
    assert reply_text(ca, "MIGRATE", b.host, b.port, "cold", 0, 5000) == "OK"
    assert cb.get("cold") == value and 0 < cb.pttl("cold") <= 60_000
    assert ca.exists("cold") == 0
    with pytest.raises(redis.ResponseError, match="not allowed inside a transaction"):
        ca.execute_command("MULTI")
        ca.execute_command("MIGRATE", b.host, b.port, "cold", 0, 5000)
