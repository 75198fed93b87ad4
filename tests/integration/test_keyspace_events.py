"""Keyspace notifications (notify-keyspace-events) as Redis 7.0 sends them: the same command script gives the same
events, in the same order, on both targets (run against both); expired keys; CONFIG SET's parsing and canonical
form; and, on kvstrata, evictions from the last tier (a demotion to the SSD is not one)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from integration.polling import wait_for

SCRIPT: list[tuple[Any, ...]] = [
    ("SET", "a", "1"), ("SET", "a", "2", "EX", "100"), ("SET", "a", "3", "KEEPTTL"), ("SET", "b", "1", "NX"),
    ("SET", "b", "1", "NX"), ("SET", "b", "2", "XX", "GET"), ("SETEX", "c", "100", "v"),
    ("PSETEX", "d", "100000", "v"), ("SETNX", "e", "v"), ("SETNX", "e", "v"), ("GETSET", "e", "w"),
    ("MSET", "f", "1", "g", "2"), ("MSETNX", "f", "1", "h", "2"), ("APPEND", "f", "x"), ("APPEND", "n1", "x"),
    ("SETRANGE", "g", "3", "zz"), ("SETRANGE", "g", "0", ""), ("SETRANGE", "n2", "0", ""), ("INCR", "i"),
    ("DECRBY", "i", "5"), ("INCRBYFLOAT", "i", "1.5"), ("GETDEL", "e"), ("GETDEL", "missing"),
    ("GETEX", "a", "PERSIST"), ("GETEX", "a", "PERSIST"), ("GETEX", "a", "EX", "100"), ("GETEX", "a"),
    ("DEL", "a", "b", "missing"), ("EXPIRE", "c", "100"), ("EXPIRE", "c", "100", "NX"), ("EXPIRE", "c", "0"),
    ("EXPIRE", "missing", "10"), ("PEXPIREAT", "d", "1"), ("SET", "d", "v", "PX", "100000"), ("PERSIST", "d"),
    ("PERSIST", "d"), ("RENAME", "f", "f2"), ("RENAME", "f2", "f2"), ("RENAMENX", "g", "f2"), ("COPY", "f2", "f3"),
    ("COPY", "f2", "f3"), ("UNLINK", "f2", "f3", "missing"), ("SETBIT", "bm", "7", "1"), ("SETBIT", "bm", "7", "1"),
    ("BITFIELD", "bm", "SET", "u8", "0", "255"), ("BITFIELD", "bm", "GET", "u8", "0"),
    ("BITFIELD", "bm", "OVERFLOW", "FAIL", "INCRBY", "u8", "0", "10"), ("BITOP", "AND", "dst", "bm", "bm"),
    ("BITOP", "AND", "dst2", "nokey"), ("BITOP", "OR", "dst", "nokey"), ("LCS", "bm", "bm"), ("FLUSHALL",),
]


def _events(ps: redis.client.PubSub) -> list[tuple[bytes, bytes]]:
    out = []
    while True:
        msg = ps.get_message(ignore_subscribe_messages=True, timeout=0.2)
        if msg is None:
            return out
        out.append((msg["channel"], msg["data"]))


@pytest.fixture
def events(server, r):
    r.config_set("notify-keyspace-events", "KEA")
    ps = server.client().pubsub()
    ps.psubscribe("__key*__:*")
    wait_for(lambda: ps.get_message(timeout=0.05), what="the confirmation")
    yield ps
    ps.close()
    r.config_set("notify-keyspace-events", "")


def test_the_events_of_a_command_script_are_redis_s(r, events):
    """Each command's events, in order; the expected list is what redis-server 7.0 sends for this script (the
    same test runs against it)."""
    got: list[tuple[str, list[tuple[bytes, bytes]]]] = []
    for cmd in SCRIPT:
        r.execute_command(*cmd)
        got.append((" ".join(cmd), _events(events)))
    space = [(" ".join(cmd), [(c.split(b":", 1)[1], m) for c, m in evs if c.startswith(b"__keyspace@0__:")])
             for cmd, evs in zip(SCRIPT, [e for _, e in got], strict=True)]
    # Every keyspace event has its keyevent twin, right after it.
    for cmd, evs in got:
        pairs = [(evs[i], evs[i + 1]) for i in range(0, len(evs), 2)]
        assert len(evs) % 2 == 0, cmd
        for (c1, m1), (c2, m2) in pairs:
            assert c1 == b"__keyspace@0__:" + m2 and c2 == b"__keyevent@0__:" + m1, cmd
    assert space == EXPECTED


EXPECTED = [
    ("SET a 1", [(b"a", b"set")]), ("SET a 2 EX 100", [(b"a", b"set"), (b"a", b"expire")]),
    ("SET a 3 KEEPTTL", [(b"a", b"set")]), ("SET b 1 NX", [(b"b", b"set")]), ("SET b 1 NX", []),
    ("SET b 2 XX GET", [(b"b", b"set")]), ("SETEX c 100 v", [(b"c", b"set"), (b"c", b"expire")]),
    ("PSETEX d 100000 v", [(b"d", b"set"), (b"d", b"expire")]), ("SETNX e v", [(b"e", b"set")]),
    ("SETNX e v", []), ("GETSET e w", [(b"e", b"set")]), ("MSET f 1 g 2", [(b"f", b"set"), (b"g", b"set")]),
    ("MSETNX f 1 h 2", []), ("APPEND f x", [(b"f", b"append")]), ("APPEND n1 x", [(b"n1", b"append")]),
    ("SETRANGE g 3 zz", [(b"g", b"setrange")]), ("SETRANGE g 0 ", []), ("SETRANGE n2 0 ", []),
    ("INCR i", [(b"i", b"incrby")]), ("DECRBY i 5", [(b"i", b"incrby")]),
    ("INCRBYFLOAT i 1.5", [(b"i", b"incrbyfloat")]), ("GETDEL e", [(b"e", b"del")]), ("GETDEL missing", []),
    ("GETEX a PERSIST", [(b"a", b"persist")]), ("GETEX a PERSIST", []), ("GETEX a EX 100", [(b"a", b"expire")]),
    ("GETEX a", []), ("DEL a b missing", [(b"a", b"del"), (b"b", b"del")]), ("EXPIRE c 100", [(b"c", b"expire")]),
    ("EXPIRE c 100 NX", []), ("EXPIRE c 0", [(b"c", b"del")]), ("EXPIRE missing 10", []),
    ("PEXPIREAT d 1", [(b"d", b"del")]), ("SET d v PX 100000", [(b"d", b"set"), (b"d", b"expire")]),
    ("PERSIST d", [(b"d", b"persist")]), ("PERSIST d", []),
    ("RENAME f f2", [(b"f", b"rename_from"), (b"f2", b"rename_to")]), ("RENAME f2 f2", []),
    ("RENAMENX g f2", []), ("COPY f2 f3", [(b"f3", b"copy_to")]), ("COPY f2 f3", []),
    ("UNLINK f2 f3 missing", [(b"f2", b"del"), (b"f3", b"del")]), ("SETBIT bm 7 1", [(b"bm", b"setbit")]),
    ("SETBIT bm 7 1", []), ("BITFIELD bm SET u8 0 255", [(b"bm", b"setbit")]), ("BITFIELD bm GET u8 0", []),
    ("BITFIELD bm OVERFLOW FAIL INCRBY u8 0 10", []), ("BITOP AND dst bm bm", [(b"dst", b"set")]),
    ("BITOP AND dst2 nokey", []), ("BITOP OR dst nokey", [(b"dst", b"del")]), ("LCS bm bm", []), ("FLUSHALL", []),
]


def test_restore_and_expired(r, events):
    r.set("src", "payload")
    payload = r.dump("src")
    _events(events)
    r.restore("dst", 0, payload)
    assert _events(events) == [(b"__keyspace@0__:dst", b"restore"), (b"__keyevent@0__:restore", b"dst")]
    r.set("short", "v", px=20)
    seen: list[tuple[bytes, bytes]] = []

    def expired() -> bool:
        r.exists("short")  # active expiry or this read removes it, whichever comes first
        seen.extend(_events(events))
        return (b"__keyspace@0__:short", b"expired") in seen

    wait_for(expired, what="the expired event")
    assert seen == [(b"__keyspace@0__:short", b"set"), (b"__keyevent@0__:set", b"short"),
                    (b"__keyspace@0__:short", b"expire"), (b"__keyevent@0__:expire", b"short"),
                    (b"__keyspace@0__:short", b"expired"), (b"__keyevent@0__:expired", b"short")]


def test_classes_select_the_events(server, r):
    ps = server.client().pubsub()
    ps.psubscribe("__key*__:*")
    wait_for(lambda: ps.get_message(timeout=0.05), what="the confirmation")
    try:
        r.config_set("notify-keyspace-events", "E$")  # keyevent channel only, string events only
        r.set("k", "v")
        r.expire("k", 100)  # generic: not selected
        r.append("k", "w")
        assert _events(ps) == [(b"__keyevent@0__:set", b"k"), (b"__keyevent@0__:append", b"k")]
        r.config_set("notify-keyspace-events", "Kg")
        r.set("k", "v2")
        r.delete("k")
        assert _events(ps) == [(b"__keyspace@0__:k", b"del")]
        r.config_set("notify-keyspace-events", "g$")  # neither K nor E: nothing is published
        r.set("k", "v3")
        assert _events(ps) == []
    finally:
        ps.close()
        r.config_set("notify-keyspace-events", "")


def test_config_set_notify_keyspace_events_as_redis(r, expect_error):
    for given, shown in (("KEA", "AKE"), ("Kx$gnm", "g$xnKm"), ("", ""), ("EgK", "gKE"), ("A", "A"),
                         ("g$lshzxetd", "A"), ("Ag", "A")):
        r.config_set("notify-keyspace-events", given)
        assert r.config_get("notify-keyspace-events") == {"notify-keyspace-events": shown}, given
    with expect_error("ERR CONFIG SET failed (possibly related to argument 'notify-keyspace-events') - Invalid "
                      "event class character. Use 'Ag$lshzxeKEtmdn'."):
        r.config_set("notify-keyspace-events", "KQ")
    r.config_set("notify-keyspace-events", "")


@pytest.mark.kvstrata_only
def test_only_the_last_tier_evicts(make_server, tmp_path):
    """A DRAM-only node evicts (each key once, as INFO counts them); with an SSD tier below, overflow is demoted,
    not evicted: no event."""
    for config, evicts in (({"dram-size": "1mb"}, True),
                           ({"dram-size": "1mb", "essd-path": str(tmp_path / "ssd")}, False)):
        srv = make_server({**config, "notify-keyspace-events": "Ee"})
        r = srv.client()
        ps = srv.client().pubsub()
        ps.subscribe("__keyevent@0__:evicted")
        wait_for(lambda ps=ps: ps.get_message(timeout=0.05), what="the confirmation")
        for i in range(40):
            r.set(f"chunk:{i}", b"x" * 64 * 1024)
        evicted = int(r.info("stats")["evicted_keys"])
        got = [m["data"] for m in iter(lambda ps=ps: ps.get_message(timeout=0.3), None) if m["type"] == "message"]
        assert (evicted > 0) == evicts
        assert len(got) == evicted and len(set(got)) == evicted
        assert all(r.exists(k) == 0 for k in got)
        if not evicts:
            assert r.dbsize() == 40
        ps.close()
