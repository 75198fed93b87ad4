"""The pool tier without a pool server: record format, URLs, hybrid-logical-clock versions, and a pool that is
down from the start (every operation degrades at once; STRONG checks and deletes raise -TRYAGAIN)."""

from __future__ import annotations

import socket
import struct

import pytest
from tests.integration.polling import wait_for

from kvstrata.clock import ManualClock
from kvstrata.engine.entry import Entry
from kvstrata.engine.store import HLC_LOGICAL_BITS, NODE_BITS, Store
from kvstrata.engine.tiers import pool_pubsub
from kvstrata.engine.tiers.pool import (
    FLAG_TOMBSTONE,
    HEADER_SIZE,
    Corrupt,
    PoolDeleted,
    PoolTier,
    PoolUnavailableError,
    decode_head,
    decode_header,
    decode_record,
    encode_record,
    parse_url,
)
from kvstrata.engine.tiers.pool_url import parse_pool_url
from kvstrata.engine.tiers.ssd import SsdTier


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_record_round_trip_and_checksum():
    rec = encode_record(b"k", b"value", 42, 1234)
    assert rec[:2] == b"KP" and len(rec) == HEADER_SIZE + 5
    assert decode_header(rec) == (42, 1234)
    entry = decode_record(b"k", rec)
    assert isinstance(entry, Entry) and (entry.value, entry.version, entry.expire_at) == (b"value", 42, 1234)
    # The key is covered by the checksum: a record stored under another key is refused.
    assert isinstance(decode_record(b"other", rec), Corrupt)
    flipped = bytearray(rec)
    flipped[-1] ^= 1
    assert decode_record(b"k", bytes(flipped)).reason == "checksum mismatch"
    assert decode_record(b"k", b"KP\x01").reason == "short record"
    assert decode_record(b"k", b"XX" + rec[2:]).reason == "bad magic"
    assert decode_header(b"not a record at all, long enough...") is None


def test_version_sits_big_endian_at_offset_4():
    rec = encode_record(b"k", b"", 0x0102030405060708, 0)
    assert rec[4:12] == bytes(range(1, 9))


@pytest.mark.parametrize("url, expected", [
    ("redis://127.0.0.1:6379", (False, [("127.0.0.1", 6379)], None)),
    ("redis-cluster://a:1,b:2,c:3", (True, [("a", 1), ("b", 2), ("c", 3)], None)),
    ("redis://:secret@h:7000", (False, [("h", 7000)], "secret")),
])
def test_parse_url(url, expected):
    assert parse_url(url) == expected


@pytest.mark.parametrize("url", ["http://h:1", "redis://a:1,b:2", "redis-cluster://h:x",
                                 "redis-cluster://h:1/3", "redis-sentinel://h:1", "redis-sentinel://h:1/svc/x",
                                 "redis-sentinel://h:1/svc/1/2", "redis-sentinel://h:x/svc"])
def test_parse_url_rejects(url):
    with pytest.raises(ValueError):
        parse_url(url)


def test_pool_urls_like_redis_py():
    u = parse_pool_url("redis://kv:s3cret@h:7000/2")
    assert (u.cluster, u.nodes) == (False, [("h", 7000)])
    assert u.kwargs == {"username": "kv", "password": "s3cret", "db": 2}
    assert "s3cret" not in u.safe and u.safe == "redis://kv:***@h:7000/2"
    v = parse_pool_url("valkey://h:1")
    assert v.nodes == [("h", 1)] and not v.cluster
    t = parse_pool_url("rediss://h:1?ssl_ca_certs=/ca.pem")
    assert t.kwargs["ssl_ca_certs"] == "/ca.pem" and t.kwargs["connection_class"].__name__ == "SSLConnection"
    x = parse_pool_url("unix:///tmp/r.sock?db=1")
    assert x.kwargs["path"] == "/tmp/r.sock" and x.kwargs["db"] == 1 and x.nodes == []
    c = parse_pool_url("redis-cluster://kv:pw@a:1,b:2")
    assert c.cluster and c.nodes == [("a", 1), ("b", 2)]
    assert c.kwargs == {"username": "kv", "password": "pw"} and "pw" not in c.safe
    assert parse_pool_url("rediss-cluster://a:1").kwargs == {"ssl": True}
    pool = PoolTier("redis://kv:s3cret@127.0.0.1:1", 1 << 20, threaded=False)
    try:
        assert "s3cret" not in pool.url and "s3cret" not in repr(pool.info())
    finally:
        pool.close()


def test_sentinel_urls():
    u = parse_pool_url("redis-sentinel://kv:s3cret@a:26379,b:26380/mymaster/2?sentinel_password=sp%26w")
    assert (u.cluster, u.nodes, u.service) == (False, [("a", 26379), ("b", 26380)], "mymaster")
    assert u.kwargs == {"username": "kv", "password": "s3cret", "db": 2}
    assert u.sentinel_kwargs == {"password": "sp&w"}
    assert u.safe == "redis-sentinel://kv:***@a:26379,b:26380/mymaster/2?sentinel_password=***"
    v = parse_pool_url("valkey-sentinel://h:1/svc?sentinel_username=s&socket_keepalive=true")
    assert v.service == "svc" and v.kwargs == {"db": 0, "socket_keepalive": True}
    assert v.sentinel_kwargs == {"username": "s"}
    assert parse_pool_url("redis://h:1").service is None
    pool = PoolTier("redis-sentinel://:s3cret@127.0.0.1:1/m?sentinel_password=sp", 1 << 20, threaded=False)
    try:
        assert "s3cret" not in pool.url and "sp" not in pool.url.split("?")[1]
        assert "s3cret" not in repr(pool.info())
    finally:
        pool.close()


def test_tombstone_records_round_trip():
    raw = encode_record(b"k", b"", 77, 0, FLAG_TOMBSTONE)
    assert decode_head(raw) == (77, 0, FLAG_TOMBSTONE)
    got = decode_record(b"k", raw)
    assert isinstance(got, PoolDeleted) and got.version == 77
    # The flags are under the checksum: a tombstone cannot be turned into a value (or back) by a bit flip.
    flipped = raw[:3] + b"\x00" + raw[4:]
    assert isinstance(decode_record(b"k", flipped), Corrupt)


def test_unreachable_pool_degrades_without_raising():
    clock = ManualClock()
    pool = PoolTier(f"redis://127.0.0.1:{closed_port()}", 1 << 20, connect_timeout_ms=100, timeout_ms=100,
                    backoff_max_ms=400, threaded=False, monotonic=clock.monotonic)
    try:
        assert pool.active
        assert pool.read_many([b"a", b"b"]) == {}
        assert not pool.active and pool.errors == 1 and "read" in pool.degraded
        # Degraded: writes are skipped at once (no I/O), reads answer "unknown".
        assert pool.put(b"a", Entry(b"v", 1)) == 0
        assert pool.skipped_writes == 1 and pool.used == 0 and len(pool) == 0
        # STRONG checks and deletes never guess: they fail with -TRYAGAIN while the pool is away.
        with pytest.raises(PoolUnavailableError, match="^TRYAGAIN"):
            pool.check_versions({b"a": 0})
        with pytest.raises(PoolUnavailableError):
            pool.delete(b"a", 5)
        # Probes back off: the read's failure waits 100 ms, then 200, 400, 400, 400 (the cap), on the injected
        # clock (which the probes' real connection attempts do not move).
        assert pool.next_probe == clock.monotonic() + 0.1
        assert not pool.probe_due()
        clock.advance(0.1)
        assert pool.probe_due()
        waits = []
        for _ in range(4):
            before = clock.monotonic()
            assert not pool.probe()
            waits.append(pool.next_probe - before)
            clock.advance(waits[-1])
        assert waits == pytest.approx([0.2, 0.4, 0.4, 0.4])
        assert pool.retries == 4 and pool.recoveries == 0
    finally:
        pool.close()


def test_budget_evicts_this_nodes_oldest_records():
    pool = PoolTier("redis://127.0.0.1:1", 3 * 1024, threaded=False)
    # Delivery never happens (no writer thread ran against a server), so look at the accounting only.
    pool._process = lambda batch: None  # type: ignore[method-assign]
    try:
        for i in range(5):
            pool.put(b"k%d" % i, Entry(b"x" * 900, i + 1))
        assert pool.used <= pool.budget
        assert list(pool.index) == [b"k2", b"k3", b"k4"][-len(pool.index):]
        assert pool.evictions == 5 - len(pool.index)
    finally:
        pool.close()


def test_hlc_versions_are_comparable_across_nodes(tmp_path):
    clock = ManualClock()
    stores = []
    for node_id in (1, 2):
        pool = PoolTier(f"redis://127.0.0.1:{closed_port()}", 1 << 20, threaded=False)
        ssd = SsdTier(str(tmp_path / str(node_id)), 1 << 24, threaded=False)
        stores.append(Store(1 << 20, clock=clock, ssd=ssd, pool=pool, node_id=node_id))
    a, b = stores
    try:
        va = a.next_version()
        assert va & ((1 << NODE_BITS) - 1) == 1
        assert va >> (NODE_BITS + HLC_LOGICAL_BITS) == clock.now_ms()
        assert a.next_version() > va  # same millisecond: the logical counter moves
        # B's clock is behind A's versions until it sees one of them; then its next write is higher.
        vb = b.next_version()
        assert vb & ((1 << NODE_BITS) - 1) == 2
        seen = a.next_version()
        b.observe_version(seen)
        assert b.next_version() > seen
        clock.advance(1.0)
        assert a.next_version() >> (NODE_BITS + HLC_LOGICAL_BITS) == clock.now_ms()
    finally:
        for s in stores:
            s.pool.close()
            s.ssd.close()


def test_forwarded_messages_are_parsed_not_trusted_and_dropped_when_the_pool_is_away(monkeypatch):
    """The pool's Pub/Sub frames (origin | channel length | channel | message): another node's are delivered, this
    node's own and malformed ones are not; a pool that cannot be reached drops (and counts) what PUBLISH queued,
    without blocking the caller; the queue is bounded."""
    pool = PoolTier(f"redis://127.0.0.1:{closed_port()}", 1 << 20, connect_timeout_ms=100, timeout_ms=100,
                    backoff_max_ms=100, threaded=False)
    try:
        got = []
        pool.on_publish = lambda channel, message: got.append((channel, message))
        other = b"\x01" * 8
        pool._received_publish(other + struct.pack(">I", 4) + b"news" + b"hello\x00")
        pool._received_publish(pool.origin + struct.pack(">I", 4) + b"news" + b"mine")
        pool._received_publish(other + struct.pack(">I", 99) + b"news")  # declares more than it has
        pool._received_publish(b"short")
        assert got == [(b"news", b"hello\x00")] and pool.pubsub_received == 1
        monkeypatch.setattr(pool_pubsub, "FORWARD_MAX_BYTES", 100)
        pool.forward(b"news", b"x" * 80)
        pool.forward(b"news", b"x" * 80)  # over the bound while the first is queued, or failed as it did
        wait_for(lambda: pool.pubsub_dropped == 2, what="both messages to be dropped")
        assert pool.pubsub_forwarded == 0 and pool.info()["pubsub_dropped"] == 2
    finally:
        pool.close()
