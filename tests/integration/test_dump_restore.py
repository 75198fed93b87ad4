"""DUMP and RESTORE: string keys move between kvstrata and a real redis-server both ways (Redis's own payloads,
LZF-compressed and integer-encoded ones included), with Redis's replies and error texts; kvstrata's payloads for
values Redis would not compress are byte for byte Redis's, bar the RDB version it writes. A payload is client
input: corrupt ones are refused with Redis's errors and change nothing. Keys below DRAM are dumped from their tier
and checked for RESTORE's BUSYKEY by their record headers."""

from __future__ import annotations

import os
import random
import shutil
import struct

import pytest
import redis
from tests.conftest import ServerProc
from tests.integration.support import reply_text, tier, tier_info

from kvstrata.protocol import dump_payload

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (.ci/run)")

CHECKSUM = "DUMP payload version or checksum are wrong"
# Every string encoding Redis has: 8/16/32-bit integers and their edges, texts that look numeric and are not
# canonical, the 6/14/32-bit lengths, values Redis compresses (> 20 bytes, repetitive) and ones it cannot.
VALUES = [b"", b"0", b"-1", b"127", b"128", b"-128", b"-129", b"32767", b"32768", b"-32769", b"2147483647",
          b"2147483648", b"-2147483648", b"-2147483649", b"01", b"-0", b"+5", b" 5", b"1_0", b"12345678901", b"abc",
          b"a" * 20, b"a" * 21, b"ab" * 5000, bytes(range(256)) * 64, os.urandom(63), os.urandom(64),
          os.urandom(16383), os.urandom(16384), os.urandom(3 << 20)]


@pytest.fixture(scope="module")
def pair():
    kv = ServerProc(target="kvstrata").start()
    rd = ServerProc(target="redis").start()
    k, r = kv.client(), rd.client()
    yield k, r
    k.close()
    r.close()
    kv.stop()
    rd.stop()


def _payload(body: bytes, version: int = 10) -> bytes:
    tail = body + struct.pack("<H", version)
    return tail + struct.pack("<Q", dump_payload.crc64(tail))


def test_values_cross_both_ways(pair):
    k, r = pair
    k.flushall()
    r.flushall()
    for i, value in enumerate(VALUES):
        k.set(f"v{i}", value)
        r.set(f"v{i}", value)
        ours, theirs = k.dump(f"v{i}"), r.dump(f"v{i}")
        assert k.restore(f"from-redis{i}", 0, theirs) and r.restore(f"from-kv{i}", 0, ours)
        assert k.get(f"from-redis{i}") == value and r.get(f"from-kv{i}") == value, (i, value[:24])
        assert ours[-10:-8] == b"\x09\x00"  # RDB version 9: every Redis from 5.0 and Valkey read it
        if theirs[1] != 0xC3:  # what Redis did not compress (LZF) is identical
            assert ours[:-10] == theirs[:-10], (i, value[:24])


def test_restore_options_ttl_and_busykey_as_redis(pair):
    k, r = pair
    k.flushall()
    r.flushall()
    for c in (k, r):
        c.set("src", "hello world")
    good = r.dump("src")
    script = [
        ("restore", "a", 0, good), ("restore", "a", 0, good), ("restore", "a", 0, good, "REPLACE"),
        ("restore", "b", 0, good, "REPLACE", "IDLETIME"), ("restore", "b", 0, good, "FREQ", 256),
        ("restore", "b", 0, good, "FREQ", -1), ("restore", "b", 0, good, "IDLETIME", -1),
        ("restore", "b", 0, good, "IDLETIME", "x"), ("restore", "b", 0, good, "IDLETIME", 5, "FREQ", 5),
        ("restore", "b", 0, good, "FREQ", 5, "IDLETIME", 5), ("restore", "b", 0, good, "bogus"),
        ("restore", "b", -1, good), ("restore", "b", "x", good), ("restore", "a", "x", good),
        ("restore", "b", 0, good, "IDLETIME", 0, "REPLACE", "ABSTTL"), ("restore", "c", 0, good, "FREQ", 255),
        ("restore", "d", 1, good, "ABSTTL"), ("exists", "d"), ("restore", "a", 1, good, "ABSTTL", "REPLACE"),
        ("exists", "a"), ("restore", "e", 10**9, good), ("restore", "f", 4102444800000, good, "ABSTTL"),
        ("pexpiretime", "f"), ("get", "b"), ("get", "c"), ("dump", "missing"), ("restore", "g", 0),
        ("restore", "g", 0, b"short"), ("restore", "g", 0, good[:-1] + bytes([good[-1] ^ 1])),
        ("restore", "g", 0, good[:-10] + b"\x0b\x00" + good[-8:]), ("exists", "g"), ("dbsize",),
    ]
    for args in script:
        assert reply_text(k, *args) == reply_text(r, *args), args
    assert 0 < k.pttl("e") <= 10**9


@pytest.mark.parametrize("body", [
    b"", b"\x00", b"\x00\x05ab", b"\x00\xc4", b"\x00\xc5", b"\x00\x82", b"\x08", b"\x00\xc0", b"\x00\xc1\x01",
    b"\x00\xc3\x05\x0a\x00abc", b"\x00\xc3\x02\x03\x01ab", b"\x00\xc3\x00\x00", b"\x00\xc3\x03\x05\x01ab",
    b"\x00\xc3\x03\x05\x20\x00a", b"\x00\x40\x05ab", b"\x00\x81" + b"\xff" * 8, b"\x00\xc3\x02\x81" + b"\xff" * 8,
], ids=lambda b: b.hex() or "empty")
def test_corrupt_bodies_with_valid_checksums_refused_as_redis(pair, body):
    k, r = pair
    for c in (k, r):
        c.set("kept", "old")
    payload = _payload(body)
    ours, theirs = reply_text(k, "restore", "kept", 0, payload, "REPLACE"), reply_text(r, "restore", "kept", 0, payload,
                                                                                 "REPLACE")
    assert ours.startswith("-") == theirs.startswith("-"), (ours, theirs)
    if theirs.startswith("-"):
        assert ours.startswith(theirs)  # Redis's text; kvstrata may say more after it
        assert k.get("kept") == r.get("kept") == b"old"  # a refused payload replaced nothing
    else:
        assert k.get("kept") == r.get("kept")


def test_other_types_refused_by_name(pair):
    k, r = pair
    r.delete("l")
    r.rpush("l", "a", "b")
    with pytest.raises(redis.ResponseError, match=r"^Bad data format: the payload holds a list \(RDB type \d+\)"):
        k.restore("l", 0, r.dump("l"))
    assert k.exists("l") == 0


def test_python_fallbacks_agree_with_the_native_loops():
    data = os.urandom(100_003)
    assert dump_payload.crc64_python(data) == dump_payload.crc64(data)
    assert dump_payload.crc64_python(b"123456789") == 0xE9C6D914C4B8D9CA  # the check value of Redis's crc64.c
    packed = b"\x02abc\xe0\x05\x02"  # "abc", then a 14-byte match one back: "abc" + "c" * 14
    assert dump_payload.lzf_decompress_python(packed, 17) == dump_payload.lzf_decompress(packed, 17)
    for bad_len in (16, 18):
        for fn in (dump_payload.lzf_decompress_python, dump_payload.lzf_decompress):
            with pytest.raises(ValueError):
                fn(packed, bad_len)


def test_keys_below_dram(make_server, tmp_path):
    """A key on the SSD tier is dumped from it, and RESTORE's BUSYKEY check reads its record header only."""
    srv = make_server({"essd-path": str(tmp_path / "ssd"), "dram-size": "1mb", "http-port": 0,
                       "prefetch-predict": "no"})  # the SSD reads counted are the commands' own
    c = srv.client()
    big = os.urandom(256 << 10)
    c.execute_command("TAIR.KV.SETEX", "cold", 0, big, "COLD_STORAGE")
    c.execute_command("TAIR.KV.SETEX", "cold2", 0, big, "COLD_STORAGE")
    assert tier(c, "cold") == "ssd"
    payload = c.dump("cold")
    reads = tier_info(c, "ssd")["reads"]
    with pytest.raises(redis.ResponseError, match="^BUSYKEY Target key name already exists"):
        c.restore("cold2", 0, payload)
    assert tier_info(c, "ssd")["reads"] == reads  # cold2's value was never read
    assert c.dump("missing") is None
    assert c.restore("cold2", 0, payload, replace=True)
    assert c.get("cold2") == big
    c.close()


def test_random_string_bodies_answer_as_redis(pair):
    """Random bodies of the string type (lengths and encodings mixed with random bytes) under valid checksums and
    RDB versions: every reply and every stored value as Redis's."""
    k, r = pair
    rng = random.Random(7)
    tokens = [0xC0, 0xC1, 0xC2, 0xC3, 0x40, 0x80, 0x81, 0x01, 0x05, 0x20, 0xE0, 0x1F]
    for _ in range(1500):
        n = rng.choice([0, 1, 2, 3, 4, 5, 6, 8, 12, 20, 40])
        body = b"\x00" + bytes(rng.choice([rng.randrange(256), *tokens]) for _ in range(n))
        payload = _payload(body, rng.choice([0, 1, 9, 10]))
        ours, theirs = reply_text(k, "restore", "f", 0, payload, "REPLACE"), reply_text(r, "restore", "f", 0, payload,
                                                                              "REPLACE")
        assert ours == theirs or (theirs.startswith("-") and ours.startswith(theirs)), (body.hex(), ours, theirs)
        assert k.get("f") == r.get("f"), body.hex()
        k.delete("f")
        r.delete("f")


def test_redis_migrates_keys_into_kvstrata(make_server):
    """redis-server's own MIGRATE (SELECT, then RESTORE with the remaining TTL) moves keys into kvstrata, with AUTH,
    COPY and REPLACE; a key the target holds already is refused with Redis's BUSYKEY and stays at the source."""
    kv = make_server({"requirepass": "pw"})
    rd = ServerProc(target="redis").start()
    try:
        src, dst = rd.client(), kv.client(password="pw")
        src.set("m1", "hello")
        src.set("m2", 12345)
        m3 = os.urandom(30_000)  # above the unauthenticated bulk limit (random: LZF does not shrink it)
        src.set("m3", m3, px=100_000)
        big = os.urandom(1 << 20)
        src.set("m4", big)
        dst.set("m2", "old")
        args = ("MIGRATE", kv.host, kv.port, "", 0, 5000, "AUTH", "pw")
        with pytest.raises(redis.ResponseError, match="^Target instance replied with error: BUSYKEY"):
            src.execute_command(*args, "KEYS", "m1", "m2", "m3")
        # Redis goes on past the refused key: the others moved (deleted at the source), m2 stayed on both sides.
        assert src.exists("m1", "m3") == 0 and src.get("m2") == b"12345" and dst.get("m2") == b"old"
        assert src.execute_command(*args, "REPLACE", "KEYS", "m2") == b"OK"
        assert src.execute_command(*args, "COPY", "KEYS", "m4") == b"OK"
        assert dst.mget("m1", "m2", "m3", "m4") == [b"hello", b"12345", m3, big]
        assert 0 < dst.pttl("m3") <= 100_000
        assert src.exists("m1", "m2", "m3") == 0 and src.get("m4") == big  # COPY leaves the source's key
        assert src.execute_command(*args, "KEYS", "absent") == b"NOKEY"
        src.close()
        dst.close()
    finally:
        rd.stop()
