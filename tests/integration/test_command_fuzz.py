"""Differential fuzzing of the string, bitmap and keyspace commands against a real redis-server, side by side.

A seeded generator draws commands from a small vocabulary of keys, values and edge-case numbers (0, -1, 2**63,
non-integers, empty strings, option words in the wrong place); each command goes to a kvstrata server and to a
redis-server 7 with ``databases 1``, both starting empty, and the exact RESP replies must be the same, error texts
included. Nothing in the vocabulary depends on the clock at the millisecond (TTLs are either none or hours, and
TTL/PTTL answers are compared by sign), so a difference is a difference in behaviour. Every reply is also checked
not to be kvstrata's "internal error" (a handler that raised), and after each run the reads both counted (INFO
keyspace_hits and keyspace_misses) must be equal. The same stream also drives CLIENT TRACKING (the invalidations
must be Redis's), WATCH (a MULTI/EXEC aborts exactly when Redis's does) and keyspace notifications (every class,
keymiss and new included: the same events in the same order).
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from typing import Any

import pytest
from tests.conftest import TARGET, RawConn, encode_command, twin_servers

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None or TARGET != "kvstrata",
                                reason="needs redis-server beside kvstrata")

KEYS = ["k1", "k2", "k3", "num", "bits", "{t}a", ""]
NUMBERS = ["0", "1", "-1", "7", "64", "100", "-100", "9223372036854775807", "-9223372036854775808",
           "9223372036854775808", "1.5", "abc", "", "01", "+1", " 1", "4294967295", "4294967296", "3600000"]
VALUES = ["", "v", "hello world", "123", "-5", "3.25", "1e3", "\x00\xff\x80", "x" * 70, "9223372036854775807",
          "inf", "0x10", "-0", " 5", "1e308", "0.1", "10.50", "-9223372036854775808", "nan"]
# Expiry times: none that ends during a run (an hour and more), or invalid ones.
TIMES = ["3600000", "7200", "0", "-1", "abc", "9223372036854775807", "1.5"]
WORDS = ["NX", "XX", "GT", "LT", "EX", "PX", "EXAT", "PXAT", "KEEPTTL", "GET", "PERSIST", "BYTE", "BIT", "LEN",
         "IDX", "WITHMATCHLEN", "MINMATCHLEN", "REPLACE", "AND", "OR", "XOR", "NOT", "OVERFLOW", "WRAP", "SAT",
         "FAIL", "u8", "i8", "u63", "i64", "u64", "#1", "GET", "SET", "INCRBY", "bogus"]


def _pick(rng: random.Random, pool: list[str], junk: float = 0.1) -> str:
    """One of ``pool``, or now and then a word from anywhere (an argument of the wrong kind)."""
    if rng.random() < junk:
        return rng.choice(KEYS + NUMBERS + VALUES + WORDS)
    return rng.choice(pool)


def _tail(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(WORDS + NUMBERS) for _ in range(rng.randint(0, n))]


GENERATORS: dict[str, Callable[[random.Random], list[str]]] = {
    "SET": lambda g: ["SET", _pick(g, KEYS), _pick(g, VALUES)] + g.choice(
        [[], ["NX"], ["XX"], ["GET"], ["EX", "3600"], ["PX", g.choice(TIMES)], ["KEEPTTL"], _tail(g, 3)]),
    "GET": lambda g: ["GET", _pick(g, KEYS)],
    "GETEX": lambda g: ["GETEX", _pick(g, KEYS)] + g.choice([[], ["PERSIST"], ["EX", "3600"], _tail(g, 2)]),
    "GETDEL": lambda g: ["GETDEL", _pick(g, KEYS)],
    "GETSET": lambda g: ["GETSET", _pick(g, KEYS), _pick(g, VALUES)],
    "SETNX": lambda g: ["SETNX", _pick(g, KEYS), _pick(g, VALUES)],
    "SETEX": lambda g: ["SETEX", _pick(g, KEYS), g.choice(TIMES), _pick(g, VALUES)],
    "MSET": lambda g: ["MSET"] + sum(([_pick(g, KEYS), _pick(g, VALUES)] for _ in range(g.randint(0, 3))), []),
    "MSETNX": lambda g: ["MSETNX"] + sum(([_pick(g, KEYS), _pick(g, VALUES)] for _ in range(g.randint(1, 3))), []),
    "MGET": lambda g: ["MGET"] + [_pick(g, KEYS) for _ in range(g.randint(1, 4))],
    "APPEND": lambda g: ["APPEND", _pick(g, KEYS), _pick(g, VALUES)],
    "STRLEN": lambda g: ["STRLEN", _pick(g, KEYS)],
    "GETRANGE": lambda g: ["GETRANGE", _pick(g, KEYS), _pick(g, NUMBERS), _pick(g, NUMBERS)],
    "SETRANGE": lambda g: ["SETRANGE", _pick(g, KEYS), g.choice(["0", "1", "5", "-1", "abc", "100"]),
                           _pick(g, VALUES)],
    "INCR": lambda g: ["INCR", _pick(g, KEYS)],
    "DECR": lambda g: ["DECR", _pick(g, KEYS)],
    "INCRBY": lambda g: ["INCRBY", _pick(g, KEYS), _pick(g, NUMBERS)],
    "DECRBY": lambda g: ["DECRBY", _pick(g, KEYS), _pick(g, NUMBERS)],
    "INCRBYFLOAT": lambda g: ["INCRBYFLOAT", _pick(g, KEYS), _pick(g, NUMBERS + ["0.1", "-2.5e3", "1e400"])],
    "SETBIT": lambda g: ["SETBIT", _pick(g, KEYS), g.choice(["0", "7", "8", "100", "-1", "x"]), g.choice(["0", "1",
                                                                                                          "2"])],
    "GETBIT": lambda g: ["GETBIT", _pick(g, KEYS), g.choice(["0", "7", "8", "100", "-1"])],
    "BITCOUNT": lambda g: ["BITCOUNT", _pick(g, KEYS)] + g.choice(
        [[], [_pick(g, NUMBERS), _pick(g, NUMBERS)], [_pick(g, NUMBERS), _pick(g, NUMBERS), g.choice(["BIT",
                                                                                                     "BYTE"])]]),
    "BITPOS": lambda g: ["BITPOS", _pick(g, KEYS), g.choice(["0", "1", "2"])] + _tail(g, 3),
    "BITOP": lambda g: ["BITOP", g.choice(["AND", "OR", "XOR", "NOT", "nand"]), _pick(g, KEYS)] + [
        _pick(g, KEYS) for _ in range(g.randint(1, 3))],
    "BITFIELD": lambda g: ["BITFIELD", _pick(g, KEYS)] + _tail(g, 6),
    "BITFIELD_RO": lambda g: ["BITFIELD_RO", _pick(g, KEYS)] + _tail(g, 4),
    "LCS": lambda g: ["LCS", _pick(g, KEYS), _pick(g, KEYS)] + _tail(g, 3),
    "DEL": lambda g: ["DEL"] + [_pick(g, KEYS) for _ in range(g.randint(1, 3))],
    "EXISTS": lambda g: ["EXISTS"] + [_pick(g, KEYS) for _ in range(g.randint(1, 3))],
    "TYPE": lambda g: ["TYPE", _pick(g, KEYS)],
    "EXPIRE": lambda g: ["EXPIRE", _pick(g, KEYS), g.choice(["3600", "7200", "-1", "0", "abc"])] + _tail(g, 1),
    "PERSIST": lambda g: ["PERSIST", _pick(g, KEYS)],
    "TTL": lambda g: ["TTL", _pick(g, KEYS)],
    "PTTL": lambda g: ["PTTL", _pick(g, KEYS)],
    "RENAME": lambda g: ["RENAME", _pick(g, KEYS), _pick(g, KEYS)],
    "RENAMENX": lambda g: ["RENAMENX", _pick(g, KEYS), _pick(g, KEYS)],
    "COPY": lambda g: ["COPY", _pick(g, KEYS), _pick(g, KEYS)] + _tail(g, 2),
    "MOVE": lambda g: ["MOVE", _pick(g, KEYS), _pick(g, NUMBERS)],
    "DBSIZE": lambda g: ["DBSIZE"],
    "SUBSTR": lambda g: ["SUBSTR", _pick(g, KEYS), _pick(g, NUMBERS), _pick(g, NUMBERS)],
    "TOUCH": lambda g: ["TOUCH"] + [_pick(g, KEYS) for _ in range(g.randint(1, 3))],
    "UNLINK": lambda g: ["UNLINK"] + [_pick(g, KEYS) for _ in range(g.randint(1, 3))],
    "EXPIRETIME": lambda g: ["EXPIRETIME", _pick(g, KEYS)],
    "PEXPIRE": lambda g: ["PEXPIRE", _pick(g, KEYS), g.choice(TIMES)] + _tail(g, 2),
    "EXPIREAT": lambda g: ["EXPIREAT", _pick(g, KEYS), g.choice(["1", "0", "-5", "99999999999", "x"])] + _tail(g, 1),
    "ECHO": lambda g: ["ECHO", _pick(g, VALUES)],
    "PSETEX": lambda g: ["PSETEX", _pick(g, KEYS), g.choice(TIMES), _pick(g, VALUES)],
    "PUBLISH": lambda g: ["PUBLISH", _pick(g, KEYS), _pick(g, VALUES)],
}


def _normalised(cmd: list[str], reply: bytes) -> bytes:
    """TTL/PTTL of a key with an expiry: its sign, not its value (the two servers read their clocks apart)."""
    if cmd[0] in ("TTL", "PTTL") and reply.startswith(b":") and int(reply[1:]) > 0:
        return b":positive\r\n"
    return reply


@pytest.mark.parametrize("seed", range(10))
def test_kvstrata_answers_as_redis(pair: tuple[RawConn, RawConn], seed: int) -> None:
    kv, rd = pair
    for conn in pair:
        assert conn.cmd_raw("FLUSHALL") == b"+OK\r\n"
        assert conn.cmd_raw("CONFIG", "RESETSTAT") == b"+OK\r\n"
    rng = random.Random(seed)
    names = sorted(GENERATORS)
    for step in range(600):
        cmd = GENERATORS[rng.choice(names)](rng)
        got: list[Any] = [_normalised(cmd, conn.cmd_raw(*cmd)) for conn in (kv, rd)]
        assert b"internal error" not in got[0], (seed, step, cmd, got[0])
        assert got[0] == got[1], (seed, step, cmd, got[0], got[1])
    # The reads counted as Redis counts them (INFO keyspace_hits/misses), before the checks below read more.
    assert _keyspace_counts(kv) == _keyspace_counts(rd), seed
    # The data, too: every key's value and type the same on both.
    for key in KEYS:
        assert kv.cmd_raw("GET", key) == rd.cmd_raw("GET", key), key


def _keyspace_counts(conn: RawConn) -> tuple[int, int]:
    info = dict(line.split(":", 1) for line in conn.cmd("INFO", "stats").decode().splitlines() if ":" in line)
    return int(info["keyspace_hits"]), int(info["keyspace_misses"])


@pytest.fixture(scope="module")
def tracked_pair():
    """Per target: a connection that runs the commands, one tracking every key it reads (default mode, RESP3) and
    one tracking every key in BCAST mode."""
    with twin_servers() as servers:
        conns = []
        for srv in servers:
            run, track, bcast = srv.raw(), srv.raw(), srv.raw()
            for conn, mode in ((track, ()), (bcast, ("BCAST",))):
                assert conn.cmd_raw("HELLO", "3").startswith(b"%")
                assert conn.cmd_raw("CLIENT", "TRACKING", "on", *mode) == b"+OK\r\n"
            conns.append((run, track, bcast))
        yield conns


def _pushes(conn: RawConn) -> list[bytes]:
    """The frames that arrive before the reply to a PING (the invalidations of every change made before it)."""
    conn.send(b"*1\r\n$4\r\nPING\r\n")
    frames = []
    while (frame := conn.read_raw()) != b"+PONG\r\n":
        frames.append(frame)
    return frames


@pytest.mark.parametrize("seed", range(4))
def test_tracking_invalidates_what_redis_invalidates(tracked_pair: list[tuple[RawConn, RawConn, RawConn]],
                                                     seed: int) -> None:
    """CLIENT TRACKING under the same command stream: before each command the tracking client reads every key (so
    each is in the table), and the invalidations both tracking clients get for it must be Redis's, in Redis's
    order: a command that changes nothing (a refused SET NX, an EXPIRE of a missing key, ...) must send none."""
    for run, _, _ in tracked_pair:
        assert run.cmd_raw("FLUSHALL") == b"+OK\r\n"
    for _, track, bcast in tracked_pair:
        _pushes(track)
        _pushes(bcast)
    rng = random.Random(1000 + seed)
    names = sorted(GENERATORS)
    told = [0, 0]  # steps with invalidations, default mode and BCAST: the stream does change keys
    for step in range(300):
        cmd = GENERATORS[rng.choice(names)](rng)
        seen = []
        for run, track, bcast in tracked_pair:
            assert track.cmd_raw("MGET", *KEYS).startswith(b"*%d\r\n" % len(KEYS))
            reply = _normalised(cmd, run.cmd_raw(*cmd))
            seen.append((reply, _pushes(track), _pushes(bcast)))
        assert seen[0] == seen[1], (seed, step, cmd, seen[0], seen[1])
        told[0] += bool(seen[0][1])
        told[1] += bool(seen[0][2])
    assert told[0] > 50 and told[1] > 50, told


@pytest.fixture(scope="module")
def watch_pair():
    """Per target: a connection that WATCHes and runs MULTI/EXEC, and one that changes keys meanwhile."""
    with twin_servers() as servers:
        yield [(srv.raw(), srv.raw()) for srv in servers]


@pytest.mark.parametrize("seed", range(4))
def test_watch_sees_the_changes_redis_sees(watch_pair: list[tuple[RawConn, RawConn]], seed: int) -> None:
    """WATCH under the same command stream: one client watches a few keys, the other runs up to two commands, then
    the first's MULTI/EXEC must abort (a nil) exactly when Redis's does, and otherwise answer as Redis's (a command
    that changes nothing, such as a refused SET NX or an EXPIRE of a missing key, does not touch a watched key)."""
    for watcher, _ in watch_pair:
        assert watcher.cmd_raw("FLUSHALL") == b"+OK\r\n"
    rng = random.Random(2000 + seed)
    names = sorted(GENERATORS)
    aborted = 0
    for step in range(250):
        watched = rng.sample(KEYS, rng.randint(1, 3))
        others = [GENERATORS[rng.choice(names)](rng) for _ in range(rng.randint(0, 2))]
        seen = []
        for watcher, changer in watch_pair:
            assert watcher.cmd_raw("WATCH", *watched) == b"+OK\r\n"
            replies = [_normalised(cmd, changer.cmd_raw(*cmd)) for cmd in others]
            assert watcher.cmd_raw("MULTI") == b"+OK\r\n"
            assert watcher.cmd_raw("MGET", *watched) == b"+QUEUED\r\n"
            seen.append((replies, watcher.cmd_raw("EXEC")))
        assert seen[0] == seen[1], (seed, step, watched, others, seen[0], seen[1])
        aborted += seen[0][1] == b"*-1\r\n"
    assert 5 < aborted < 245, aborted  # the stream both changes watched keys and leaves them alone


@pytest.fixture(scope="module")
def events_pair():
    """Per target, with every keyspace event class on (KEAmn): a connection that runs the commands and one
    subscribed to every keyspace channel and to a marker channel."""
    with twin_servers() as servers:
        conns = []
        for srv in servers:
            run, sub = srv.raw(), srv.raw()
            assert run.cmd_raw("CONFIG", "SET", "notify-keyspace-events", "KEAmn") == b"+OK\r\n"
            sub.send(encode_command("PSUBSCRIBE", "__key*__:*") + encode_command("SUBSCRIBE", "mark"))
            sub.read_raw()
            sub.read_raw()
            conns.append((run, sub))
        yield conns


def _events_until_mark(run: RawConn, sub: RawConn) -> list[bytes]:
    """The keyspace events since the last mark: the subscriber gets them in order, so publishing a mark now and
    reading up to it takes every event of the commands before it."""
    assert run.cmd_raw("PUBLISH", "mark", "m") == b":1\r\n"
    frames = []
    while b"mark" not in (frame := sub.read_raw()):
        frames.append(frame)
    return frames


@pytest.mark.parametrize("seed", range(4))
def test_keyspace_events_are_redis_s(events_pair: list[tuple[RawConn, RawConn]], seed: int) -> None:
    """Every command of the random stream sends the keyspace events Redis sends for it, in Redis's order, with
    every class on (including keymiss and new)."""
    for run, sub in events_pair:
        assert run.cmd_raw("FLUSHALL") == b"+OK\r\n"
        _events_until_mark(run, sub)
    rng = random.Random(3000 + seed)
    names = sorted(GENERATORS)
    with_events = 0
    for step in range(300):
        cmd = GENERATORS[rng.choice(names)](rng)
        seen = [(_normalised(cmd, run.cmd_raw(*cmd)), _events_until_mark(run, sub)) for run, sub in events_pair]
        assert seen[0] == seen[1], (seed, step, cmd, seen[0], seen[1])
        with_events += bool(seen[0][1])
    assert with_events > 100, with_events
