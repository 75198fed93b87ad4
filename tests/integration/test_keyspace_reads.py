"""Reads as Redis counts them, against a redis-server side by side: each command's change of INFO
keyspace_hits/keyspace_misses (a write's lookup counts nothing, EXISTS/TTL/TYPE/OBJECT count without touching the
key), and the keyspace events of classes m (keymiss: a counted read of a missing key) and n (new: a write that
created the key), on a DRAM-only server and on a tiered one whose keys are mostly on the SSD."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from tests.conftest import TARGET, ServerProc, twin_servers

from integration.polling import wait_for

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None or TARGET != "kvstrata",
                                reason="compares kvstrata with a redis-server it starts")

DUMP_OF_E2 = "<the DUMP payload of e2>"  # taken from the server under test, before the command
# Keys m* are absent before each command, e and e2 hold "10" and "20".
COMMANDS: list[tuple[str, ...]] = [
    ("GET", "e"), ("GET", "m"), ("MGET", "e", "m", "e2"), ("EXISTS", "e", "m"), ("STRLEN", "m"),
    ("GETRANGE", "e", "0", "1"), ("SUBSTR", "m", "0", "1"), ("TTL", "e"), ("PTTL", "m"), ("EXPIRETIME", "m"),
    ("PEXPIRETIME", "e"), ("TYPE", "e"), ("TYPE", "m"), ("DUMP", "m"), ("GETEX", "e"), ("GETEX", "m"),
    ("GETDEL", "m"), ("GETDEL", "e"), ("SET", "m", "v", "GET"), ("SET", "e", "v", "GET"), ("SET", "e", "w"),
    ("SET", "m", "w"), ("SET", "m", "w", "XX"), ("SETNX", "m", "v"), ("SETNX", "e", "v"), ("MSETNX", "m", "v"),
    ("MSET", "e", "1", "m", "2"), ("GETSET", "m", "v"), ("GETSET", "e", "v"), ("SETEX", "m", "100", "v"),
    ("INCR", "e"), ("INCR", "m"), ("DECRBY", "m", "2"), ("INCRBYFLOAT", "e", "1"), ("APPEND", "m", "x"),
    ("APPEND", "e", "x"), ("SETRANGE", "m", "0", "x"), ("SETRANGE", "e", "1", "x"), ("SETBIT", "m", "1", "1"),
    ("GETBIT", "m", "3"), ("BITCOUNT", "e"), ("BITPOS", "m", "1"), ("BITFIELD", "m", "GET", "u8", "0"),
    ("BITFIELD", "m", "SET", "u8", "0", "1"), ("BITFIELD_RO", "e", "GET", "u8", "0"),
    ("BITOP", "AND", "m2", "e", "m"), ("LCS", "e", "m"), ("EXPIRE", "m", "10"), ("EXPIRE", "e", "10"),
    ("PERSIST", "e"), ("OBJECT", "ENCODING", "m"), ("OBJECT", "ENCODING", "e"), ("OBJECT", "FREQ", "e"),
    ("OBJECT", "REFCOUNT", "m"), ("TOUCH", "e", "m"), ("DEL", "m", "e"), ("UNLINK", "e"), ("RENAME", "e", "m"),
    ("RENAME", "m", "e"), ("COPY", "e", "m"), ("COPY", "m", "m2"), ("MEMORY", "USAGE", "e"), ("RANDOMKEY",),
    ("KEYS", "e*"), ("SCAN", "0"), ("DBSIZE",), ("WATCH", "m"), ("RENAME", "e", "e2"), ("COPY", "e", "e2", "REPLACE"),
    ("RESTORE", "e", "0", DUMP_OF_E2, "REPLACE"), ("RESTORE", "m", "0", DUMP_OF_E2),
]


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProc]]:
    tiered = ServerProc({"essd-path": str(tmp_path_factory.mktemp("ssd")), "dram-size": "1mb"}, target="kvstrata")
    with twin_servers() as (kv, rd):
        try:
            yield {"kvstrata": kv, "tiered": tiered.start(), "redis": rd}
        finally:
            tiered.stop()


def _counts(r: redis.Redis) -> tuple[int, int]:
    stats = r.info("stats")
    return stats["keyspace_hits"], stats["keyspace_misses"]


def _subscribe(proc: ServerProc) -> Any:
    ps = proc.client().pubsub()
    ps.psubscribe("__key*__:*")
    ps.subscribe("mark")
    confirmed = []

    def both() -> bool:
        if ps.get_message(timeout=0.05) is not None:
            confirmed.append(1)
        return len(confirmed) == 2

    wait_for(both, what="the two subscriptions' confirmations")
    return ps


def _events(r: redis.Redis, ps: Any) -> list[tuple[bytes, bytes]]:
    """The keyspace events since the last call: everything before a message published now (the subscriber gets
    messages in order), so no wait guesses when they are all in."""
    r.publish("mark", "end")
    out = []
    while True:
        msg = ps.get_message(ignore_subscribe_messages=True, timeout=5)
        assert msg is not None, "the mark never came"
        if msg["channel"] == b"mark":
            return out
        out.append((msg["channel"], msg["data"]))


def _observe(proc: ServerProc, classes: str, commands: list[tuple[str, ...]],
             prepare: Callable[[redis.Redis, tuple[str, ...]], list[Any]] = lambda r, cmd: list(cmd),
             refusals: bool = False) -> list[tuple[Any, ...]]:
    """Each command's (hits, misses) change and its keyspace events (of ``classes``); ``prepare`` sets the
    keyspace up before each and gives the arguments to send; ``refusals``: an error reply is one outcome (else
    it fails the test)."""
    r = proc.client()
    r.config_set("notify-keyspace-events", classes)
    ps = _subscribe(proc)
    out = []
    try:
        for cmd in commands:
            args = prepare(r, cmd)  # before the counts: it may read (DUMP)
            _events(r, ps)
            before = _counts(r)
            try:
                r.execute_command(*args)
            except redis.ResponseError:
                if not refusals:
                    raise
            after = _counts(r)
            out.append((" ".join(cmd), (after[0] - before[0], after[1] - before[1]), _events(r, ps)))
    finally:
        ps.close()
        r.config_set("notify-keyspace-events", "")
    return out


def _fresh_keyspace(r: redis.Redis, cmd: tuple[str, ...]) -> list[Any]:
    r.delete("m", "m2")
    r.mset({"e": "10", "e2": "20"})
    return [r.dump("e2") if a is DUMP_OF_E2 else a for a in cmd]


def _replay(proc: ServerProc, classes: str) -> list[tuple[Any, ...]]:
    """Each command's (hits, misses) change and its keyspace events, from a fresh keyspace per command."""
    proc.client().flushall()
    return _observe(proc, classes, COMMANDS, _fresh_keyspace, refusals=True)


@pytest.mark.parametrize("classes", ["KEA", "KEAmn", "Kmn"])
def test_counts_and_events_of_each_command_as_redis(twins, classes):
    expected = _replay(twins["redis"], classes)
    assert _replay(twins["kvstrata"], classes) == expected


def test_reads_of_keys_on_the_ssd_count_as_redis(twins):
    """A tiered server with 1 MB of DRAM: most of the 100 values of 64 KiB are read from the SSD."""
    seqs = [("GET", "t1"), ("EXISTS", "t2", "t3", "nope"), ("TTL", "t4"), ("TYPE", "t5"), ("STRLEN", "t6"),
            ("GET", "nope"), ("MGET", "t7", "nope2", "t8"), ("APPEND", "t9", "y"), ("INCR", "cnt"),
            ("SET", "t10", "z", "GET"), ("COPY", "t11", "c11"), ("OBJECT", "ENCODING", "t12"),
            ("GETRANGE", "t13", "0", "3"), ("SET", "t14", "w"), ("GETDEL", "t15"), ("TOUCH", "t16")]

    def run(proc: ServerProc) -> list[Any]:
        r = proc.client()
        r.flushall()
        for i in range(100):
            r.set(f"t{i}", b"x" * 65536)
        return _observe(proc, "KEAmn", seqs)

    expected = run(twins["redis"])
    tiered = twins["tiered"].client()
    got = run(twins["tiered"])
    assert tiered.info("memory")["dram_used"] <= 1024 * 1024  # most of the 6.4 MB of values are below DRAM
    wait_for(lambda: tiered.info("memory")["ssd_used"] > 4 * 1024 * 1024, what="the values on the SSD")
    assert got == expected


def test_resetstat_clears_the_keyspace_counts(twins):
    for proc in twins.values():
        r = proc.client()
        r.set("e", "v")
        r.get("e")
        r.get("m")
        assert _counts(r) >= (1, 1)
        r.config_resetstat()
        assert _counts(r) == (0, 0), proc.target


def test_migrate_counts_its_reads_as_redis(twins):
    """MIGRATE reads its keys as Redis's does (a hit, or a miss and a keymiss event): each server copies to the
    other."""
    seen = []
    for source, target in (("redis", "kvstrata"), ("kvstrata", "redis")):
        r = twins[source].client()
        r.flushall()
        r.set("e", "10")
        r.config_set("notify-keyspace-events", "KEAm")
        ps = _subscribe(twins[source])
        try:
            _events(r, ps)
            before = _counts(r)
            assert r.execute_command("MIGRATE", "127.0.0.1", twins[target].port, "", 0, 5000, "COPY", "REPLACE",
                                     "KEYS", "e", "m") == b"OK"
            after = _counts(r)
            seen.append(((after[0] - before[0], after[1] - before[1]), _events(r, ps)))
        finally:
            ps.close()
            r.config_set("notify-keyspace-events", "")
    assert seen[0] == seen[1]
    assert seen[0][0] == (1, 1)
