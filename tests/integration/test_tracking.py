"""Client-side caching (CLIENT TRACKING) as Redis 7.0 does it, run against both targets with the exact bytes each
sends: default mode (a key read is invalidated once, on its first change; a failed SET NX or a DEL of a missing key
changes nothing), a client's own writes (after the reply; NOLOOP: none), transactions, flushes, OPTIN/OPTOUT with
CLIENT CACHING, BCAST prefixes, redirection to a RESP2 subscriber and a broken redirection, the table limit, the
errors; and a history: writers and a reader serving GETs from a cache kept by the invalidations, checked for
linearizability per key. On kvstrata only: keys that expire, the last tier's evictions (a demotion to the SSD is
no change), and a tiered server.

Synchronisation: an invalidation caused by another client's command is sent before any reply the tracking client
gets afterwards, so a PING on the tracking connection is the barrier (``pushes_before_pong``); no sleeps.
"""

from __future__ import annotations

import math
import random
import threading
import time

import pytest

from integration.linearizability import Op, check
from integration.polling import wait_for

PONG3 = b"+PONG\r\n"
PONG_SUBSCRIBED = b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"


def inval(*keys: str) -> bytes:
    body = b"".join(b"$%d\r\n%b\r\n" % (len(k), k.encode()) for k in keys)
    return b">2\r\n$10\r\ninvalidate\r\n*%d\r\n" % len(keys) + body


def pushes_before_pong(conn, pong: bytes = PONG3) -> list[bytes]:
    """Send PING and return every frame that arrives before its reply."""
    conn.send(b"*1\r\n$4\r\nPING\r\n")
    frames = []
    while True:
        frame = conn.read_raw()
        if frame == pong:
            return frames
        frames.append(frame)


@pytest.fixture
def tracker(raw):
    """A RESP3 connection with tracking on, and another client (RESP2) that writes."""
    a = raw()
    assert a.cmd_raw("HELLO", "3").startswith(b"%")
    assert a.cmd_raw("CLIENT", "TRACKING", "on") == b"+OK\r\n"
    return a, raw()


def test_a_read_key_is_invalidated_once_on_its_first_change(tracker):
    a, b = tracker
    assert a.cmd_raw("GET", "k") == b"_\r\n"
    assert a.cmd_raw("MGET", "k2", "k3") == b"*2\r\n_\r\n_\r\n"
    assert a.cmd_raw("STRLEN", "k4") == b":0\r\n"
    assert b.cmd_raw("SET", "k", "1") == b"+OK\r\n"
    assert pushes_before_pong(a) == [inval("k")]
    b.cmd_raw("SET", "k", "2")
    assert pushes_before_pong(a) == []  # forgotten once told: read it again to be told again
    b.cmd_raw("MSET", "k2", "x", "k3", "y", "k4", "z")
    assert pushes_before_pong(a) == [inval("k2"), inval("k3"), inval("k4")]
    # Commands that change nothing send nothing (as Redis: only a real change signals the key).
    a.cmd_raw("GET", "k")
    a.cmd_raw("GET", "nx")
    assert b.cmd_raw("DEL", "missing") == b":0\r\n"
    assert b.cmd_raw("SET", "k", "3", "NX") == b"$-1\r\n"
    assert b.cmd_raw("EXPIRE", "nx", "100") == b":0\r\n"
    assert pushes_before_pong(a) == []
    # Expiry changes, deletes, renames are changes.
    b.cmd_raw("EXPIRE", "k", "100")
    assert pushes_before_pong(a) == [inval("k")]
    a.cmd_raw("GET", "k")
    b.cmd_raw("RENAME", "k", "k5")
    assert pushes_before_pong(a) == [inval("k")]
    a.cmd_raw("GET", "k5")
    b.cmd_raw("DEL", "k5")
    assert pushes_before_pong(a) == [inval("k5")]


def test_own_writes_are_told_after_the_reply_and_never_with_noloop(tracker):
    a, _ = tracker
    a.cmd_raw("GET", "k")
    a.send(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n")
    assert a.read_raw() == b"+OK\r\n"  # the reply first, then the invalidation it caused
    assert a.read_raw() == inval("k")
    a.cmd_raw("GET", "k")
    assert a.cmd_raw("MULTI") == b"+OK\r\n"
    for cmd in (("GET", "k"), ("SET", "k", "2"), ("GET", "k")):
        assert a.cmd_raw(*cmd) == b"+QUEUED\r\n"
    assert a.cmd_raw("EXEC") == b"*3\r\n$1\r\n1\r\n+OK\r\n$1\r\n2\r\n"
    assert pushes_before_pong(a) == [inval("k")]  # once, after EXEC's reply; k is tracked again (the last GET)
    assert a.cmd_raw("CLIENT", "TRACKING", "on", "NOLOOP") == b"+OK\r\n"
    a.cmd_raw("SET", "k", "3")
    assert pushes_before_pong(a) == []


def test_a_flush_invalidates_everything_with_a_null(tracker, raw):
    a, b = tracker
    a2 = raw()  # a RESP2 tracking client without redirection: nothing can be sent to it, as Redis
    a2.cmd_raw("CLIENT", "TRACKING", "on")
    a2.cmd_raw("GET", "k")
    a.cmd_raw("GET", "k")
    assert b.cmd_raw("FLUSHALL") == b"+OK\r\n"
    assert pushes_before_pong(a) == [b">2\r\n$10\r\ninvalidate\r\n_\r\n"]
    assert a2.cmd_raw("PING") == b"+PONG\r\n"
    b.cmd_raw("SET", "k", "1")
    assert pushes_before_pong(a) == []  # the flush emptied the table


def test_optin_and_optout_with_client_caching(tracker):
    a, b = tracker
    assert a.cmd_raw("CLIENT", "TRACKING", "off") == b"+OK\r\n"
    assert a.cmd_raw("CLIENT", "TRACKING", "on", "OPTIN") == b"+OK\r\n"
    a.cmd_raw("GET", "o1")
    assert a.cmd_raw("CLIENT", "CACHING", "yes") == b"+OK\r\n"
    assert a.cmd_raw("CLIENT", "TRACKINGINFO") == (
        b"%3\r\n$5\r\nflags\r\n~3\r\n$2\r\non\r\n$5\r\noptin\r\n$11\r\ncaching-yes\r\n"
        b"$8\r\nredirect\r\n:0\r\n$8\r\nprefixes\r\n*0\r\n")
    a.cmd_raw("GET", "o2")  # the one command CACHING yes covers
    a.cmd_raw("GET", "o3")
    b.cmd_raw("MSET", "o1", "1", "o2", "2", "o3", "3")
    assert pushes_before_pong(a) == [inval("o2")]
    assert a.cmd_raw("CLIENT", "TRACKING", "off") == b"+OK\r\n"
    assert a.cmd_raw("CLIENT", "TRACKING", "on", "OPTOUT") == b"+OK\r\n"
    assert a.cmd_raw("CLIENT", "CACHING", "no") == b"+OK\r\n"
    a.cmd_raw("GET", "o1")  # not tracked
    a.cmd_raw("GET", "o2")
    a.cmd_raw("MULTI")
    a.cmd_raw("CLIENT", "CACHING", "no")
    a.cmd_raw("GET", "o3")  # CACHING no given inside MULTI lasts for the transaction
    assert a.cmd_raw("EXEC").startswith(b"*2\r\n+OK\r\n")
    b.cmd_raw("MSET", "o1", "x", "o2", "x", "o3", "x")
    assert pushes_before_pong(a) == [inval("o2")]


def test_bcast_prefixes_and_noloop(tracker, raw):
    a, b = tracker
    a.cmd_raw("CLIENT", "TRACKING", "off")
    assert a.cmd_raw("CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "p:", "PREFIX", "q") == b"+OK\r\n"
    assert a.cmd_raw("CLIENT", "TRACKINGINFO") == (
        b"%3\r\n$5\r\nflags\r\n~2\r\n$2\r\non\r\n$5\r\nbcast\r\n$8\r\nredirect\r\n:0\r\n"
        b"$8\r\nprefixes\r\n*2\r\n$2\r\np:\r\n$1\r\nq\r\n")
    b.cmd_raw("MSET", "p:2", "1", "p:1", "1", "qq", "2", "z", "3")  # no read needed; sorted per prefix
    assert pushes_before_pong(a) == [inval("p:1", "p:2"), inval("qq")]
    c = raw()
    c.cmd_raw("HELLO", "3")
    assert c.cmd_raw("CLIENT", "TRACKING", "on", "BCAST", "NOLOOP") == b"+OK\r\n"  # every key
    c.cmd_raw("SET", "p:3", "1")
    b.cmd_raw("SET", "p:4", "1")
    assert pushes_before_pong(a) == [inval("p:3"), inval("p:4")]
    assert pushes_before_pong(c) == [inval("p:4")]  # not p:3, its own
    c.cmd_raw("MSET", "z1", "1", "z2", "2")
    assert pushes_before_pong(c) == []  # its own changes, NOLOOP
    assert pushes_before_pong(a) == []  # not under a's prefixes


@pytest.mark.kvstrata_only
def test_bcast_sends_a_restricted_user_only_the_keys_it_may_read(server, raw):
    """Unlike Redis 7.0 (which sends every key under the prefix), a user limited to some key patterns is not told
    the names of other keys, as KEYS and SCAN do not show them to it."""
    r = server.client()
    r.execute_command("ACL", "SETUSER", "tenant", "on", ">pw", "~t1:*", "+@all")
    try:
        a, b = raw(), raw()
        a.cmd_raw("HELLO", "3", "AUTH", "tenant", "pw")
        assert a.cmd_raw("CLIENT", "TRACKING", "on", "BCAST") == b"+OK\r\n"
        b.cmd_raw("MSET", "t1:a", "1", "t2:a", "2")
        b.cmd_raw("SET", "t2:b", "1")
        assert pushes_before_pong(a) == [inval("t1:a")]
    finally:
        r.execute_command("ACL", "DELUSER", "tenant")
        r.close()


def test_bcast_batches_the_changes_of_a_pipeline(tracker):
    a, b = tracker
    a.cmd_raw("CLIENT", "TRACKING", "off")
    a.cmd_raw("CLIENT", "TRACKING", "on", "BCAST")
    b.send(b"".join(b"*3\r\n$3\r\nSET\r\n$2\r\nb%d\r\n$1\r\nv\r\n" % i for i in range(3)))
    for _ in range(3):
        assert b.read_raw() == b"+OK\r\n"
    frames = pushes_before_pong(a)
    keys = sorted(k for f in frames for k in f.split(b"\r\n")[5::2] if k)
    assert keys == [b"b0", b"b1", b"b2"]  # one message per loop turn in which they changed, each key once
    assert 1 <= len(frames) <= 3


def test_redirection_to_a_resp2_subscriber_and_a_broken_one(raw):
    a, b, c = raw(), raw(), raw()
    cid = c.cmd("CLIENT", "ID")
    assert c.cmd_raw("SUBSCRIBE", "__redis__:invalidate").startswith(b"*3\r\n$9\r\nsubscribe\r\n")
    assert a.cmd_raw("CLIENT", "TRACKING", "on", "REDIRECT", str(cid)) == b"+OK\r\n"
    assert a.cmd("CLIENT", "GETREDIR") == cid
    assert f"redir={cid}".encode() in a.cmd_raw("CLIENT", "INFO") and b" flags=t " in a.cmd_raw("CLIENT", "INFO")
    a.cmd_raw("GET", "r1")
    b.cmd_raw("SET", "r1", "v")
    assert pushes_before_pong(c, PONG_SUBSCRIBED) == [
        b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*1\r\n$2\r\nr1\r\n"]
    d = raw()
    did = d.cmd("CLIENT", "ID")
    b.cmd_raw("HELLO", "3")
    b.cmd_raw("CLIENT", "TRACKING", "on", "REDIRECT", str(did))
    b.cmd_raw("GET", "bk")
    d.close()
    wait_for(lambda: b"id=%d " % did not in a.cmd_raw("CLIENT", "LIST", "ID", str(did)),
             what="the redirect target to go")
    a.cmd_raw("SET", "bk", "1")
    assert pushes_before_pong(b) == [b">2\r\n$21\r\ntracking-redir-broken\r\n:%d\r\n" % did]
    assert b.cmd_raw("CLIENT", "TRACKINGINFO") == (
        b"%%3\r\n$5\r\nflags\r\n~2\r\n$2\r\non\r\n$15\r\nbroken_redirect\r\n"
        b"$8\r\nredirect\r\n:%d\r\n$8\r\nprefixes\r\n*0\r\n" % did)
    assert b" flags=tR " in b.cmd_raw("CLIENT", "INFO")


def test_errors_as_redis(raw):
    a = raw()
    errors = {
        ("CLIENT", "TRACKING", "on", "REDIRECT", "999999"): "ERR The client ID you want redirect to does not exist",
        ("CLIENT", "TRACKING", "on", "REDIRECT", "x"): "ERR value is not an integer or out of range",
        ("CLIENT", "TRACKING", "on", "PREFIX", "a"): "ERR PREFIX option requires BCAST mode to be enabled",
        ("CLIENT", "TRACKING", "on", "BCAST", "OPTIN"): "ERR OPTIN and OPTOUT are not compatible with BCAST",
        ("CLIENT", "TRACKING", "on", "OPTIN", "OPTOUT"): "ERR You can't specify both OPTIN mode and OPTOUT mode",
        ("CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "ab", "PREFIX", "a"):
            "ERR Prefix 'ab' overlaps with another provided prefix 'a'. Prefixes for a single client must not "
            "overlap.",
        ("CLIENT", "TRACKING", "maybe"): "ERR syntax error",
        ("CLIENT", "TRACKING", "on", "bogus"): "ERR syntax error",
        ("CLIENT", "TRACKING", "on", "REDIRECT"): "ERR syntax error",
        ("CLIENT", "CACHING", "yes"): "ERR CLIENT CACHING can be called only when the client is in tracking mode "
                                      "with OPTIN or OPTOUT mode enabled",
        ("CLIENT", "TRACKING"): "ERR wrong number of arguments for 'client|tracking' command",
        ("CLIENT", "CACHING", "yes", "no"): "ERR wrong number of arguments for 'client|caching' command",
    }
    for cmd, text in errors.items():
        assert a.cmd_raw(*cmd) == f"-{text}\r\n".encode(), cmd
    assert a.cmd("CLIENT", "GETREDIR") == -1
    a.cmd_raw("CLIENT", "TRACKING", "on")
    for cmd, text in {
        ("CLIENT", "CACHING", "yes"): "ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.",
        ("CLIENT", "CACHING", "maybe"): "ERR syntax error",
        ("CLIENT", "TRACKING", "on", "BCAST"): "ERR You can't switch BCAST mode on/off before disabling tracking "
                                               "for this client, and then re-enabling it with a different mode.",
    }.items():
        assert a.cmd_raw(*cmd) == f"-{text}\r\n".encode(), cmd
    a.cmd_raw("CLIENT", "TRACKING", "on", "OPTIN")
    assert a.cmd_raw("CLIENT", "TRACKING", "on", "OPTOUT") == (
        b"-ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, and then re-enabling "
        b"it with a different mode.\r\n")
    a.cmd_raw("CLIENT", "TRACKING", "off")
    a.cmd_raw("CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "a")
    assert a.cmd_raw("CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "abc") == (
        b"-ERR Prefix 'abc' overlaps with an existing prefix 'a'. Prefixes for a single client must not "
        b"overlap.\r\n")


def test_info_counts_and_reset(server, raw):
    r = server.client()
    a, b = raw(), raw()
    base = r.info()["tracking_clients"]
    a.cmd_raw("CLIENT", "TRACKING", "on")
    b.cmd_raw("CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "x", "PREFIX", "y")
    a.cmd_raw("MGET", "i1", "i2")
    info = r.info()
    assert info["tracking_clients"] == base + 2
    assert (info["tracking_total_keys"], info["tracking_total_items"], info["tracking_total_prefixes"]) == (2, 2, 2)
    assert b" flags=tB " in b.cmd_raw("CLIENT", "INFO")
    assert b.cmd_raw("RESET") == b"+RESET\r\n"
    assert b.cmd_raw("CLIENT", "TRACKINGINFO").startswith(b"*6\r\n$5\r\nflags\r\n*1\r\n$3\r\noff\r\n")
    a.close()
    wait_for(lambda: r.info()["tracking_clients"] == base, what="the closed client to stop tracking")
    assert r.info()["tracking_total_prefixes"] == 0
    r.close()


def test_the_table_limit_forgets_keys_and_tells_their_clients(server, tracker):
    a, _ = tracker
    r = server.client()
    r.config_set("tracking-table-max-keys", 2)
    try:
        a.cmd_raw("MGET", "t1", "t2", "t3")
        frames = pushes_before_pong(a)  # Redis trims before the next command (a random key); kvstrata at once
        assert len(frames) == 1 and frames[0] in (inval("t1"), inval("t2"), inval("t3")), frames
        assert r.info()["tracking_total_keys"] == 2
    finally:
        r.config_set("tracking-table-max-keys", 1_000_000)
        r.close()


def test_cached_reads_are_linearizable_under_concurrent_writes(server, raw):
    """Three writers SET and DEL their own keys; a reader keeps a cache of the GET replies it had, drops entries
    the invalidations name, and serves a read from the cache after a PING barrier (the invalidations of every
    write acknowledged before the read began arrive before its PONG). Each key's history, with the cached reads as
    reads, must be linearizable; and the cache must have served reads (the test is not vacuous)."""
    keys = [f"h{w}:{i}" for w in range(3) for i in range(4)]
    ops: dict[str, list[Op]] = {k: [] for k in keys}
    lock = threading.Lock()
    stop = threading.Event()
    deadline = time.monotonic() + 3.0

    def writer(w: int) -> None:
        conn = raw()
        rnd = random.Random(w)
        n = 0
        while not stop.is_set() and time.monotonic() < deadline:
            key = f"h{w}:{rnd.randrange(4)}"
            n += 1
            t0 = time.monotonic()
            if rnd.random() < 0.15:
                reply = conn.cmd_raw("DEL", key)
                op = Op(t0, time.monotonic(), "delete", client=w)
                assert reply in (b":0\r\n", b":1\r\n")
            else:
                value = f"{w}-{n}"
                assert conn.cmd_raw("SET", key, value) == b"+OK\r\n"
                op = Op(t0, time.monotonic(), "write", value.encode(), client=w)
            with lock:
                ops[key].append(op)

    cache: dict[bytes, bytes | None] = {}
    stats = {"hits": 0, "misses": 0, "invalidations": 0}
    reader = raw()
    reader.cmd_raw("HELLO", "3")
    reader.cmd_raw("CLIENT", "TRACKING", "on")

    def apply(frame: bytes) -> bool:
        """Drop what an invalidation names; False when ``frame`` is not one."""
        if not frame.startswith(b">2\r\n$10\r\ninvalidate\r\n"):
            return False
        stats["invalidations"] += 1
        parts = frame.split(b"\r\n")
        if parts[3] == b"_":
            cache.clear()
        else:
            for name in parts[5::2][: int(parts[3][1:])]:
                cache.pop(name, None)
        return True

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    rnd = random.Random(7)
    try:
        while time.monotonic() < deadline:
            key = rnd.choice(keys)
            name = key.encode()
            t0 = time.monotonic()
            for frame in pushes_before_pong(reader):
                assert apply(frame), frame
            if name in cache:
                value = cache[name]
                stats["hits"] += 1
            else:
                reader.send(b"*2\r\n$3\r\nGET\r\n$%d\r\n%b\r\n" % (len(name), name))
                while True:
                    frame = reader.read_raw()
                    if not apply(frame):
                        break
                value = None if frame == b"_\r\n" else frame.split(b"\r\n")[1]
                cache[name] = value
                stats["misses"] += 1
            with lock:
                ops[key].append(Op(t0, time.monotonic(), "read", out=value, client=99))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert stats["hits"] > 50 and stats["misses"] > 20 and stats["invalidations"] > 20, stats
    for key, history in ops.items():
        history.sort(key=lambda op: op.call)
        assert check(history, budget=2_000_000) is None, (key, len(history))
    assert all(math.isfinite(op.ret) for h in ops.values() for op in h)


@pytest.mark.kvstrata_only
def test_expiry_and_last_tier_evictions_invalidate_but_demotions_do_not(make_server, tmp_path):
    """Expired keys and keys evicted by the last tier are changes (as Redis's expiry and eviction); a key demoted
    from DRAM to the SSD tier is still there, unchanged."""
    evicting = make_server({"dram-size": "64kb"})  # DRAM is the last tier: it evicts
    a = evicting.raw()
    a.cmd_raw("HELLO", "3")
    a.cmd_raw("CLIENT", "TRACKING", "on")
    a.cmd_raw("SET", "ttl", "v", "PX", "50")
    a.cmd_raw("GET", "ttl")
    assert a.read_raw(timeout=10) == inval("ttl")  # active expiry, within its deadline
    a.cmd_raw("SET", "first", b"x" * 8192)
    a.cmd_raw("GET", "first")
    w = evicting.raw()
    for i in range(40):
        w.cmd_raw("SET", f"fill{i}", b"y" * 8192)
    assert pushes_before_pong(a) == [inval("first")]

    tiered = make_server({"dram-size": "64kb", "essd-path": str(tmp_path / "ssd")})
    a = tiered.raw()
    a.cmd_raw("HELLO", "3")
    a.cmd_raw("CLIENT", "TRACKING", "on")
    a.cmd_raw("SET", "first", b"x" * 8192)
    a.cmd_raw("GET", "first")
    w = tiered.raw()
    for i in range(40):
        w.cmd_raw("SET", f"fill{i}", b"y" * 8192)
    assert pushes_before_pong(a) == []  # demoted, not evicted
    assert a.cmd_raw("GET", "first") == b"$8192\r\n" + b"x" * 8192 + b"\r\n"
    w.cmd_raw("SET", "first", "new")  # a change of a key that lives on the SSD
    assert pushes_before_pong(a) == [inval("first")]


@pytest.mark.kvstrata_only
def test_a_hundred_thousand_prefixes_do_not_hold_the_server(server, raw):
    """Redis compares every pair of prefixes (and every prefix per change): here one command with 100,000 BCAST
    prefixes is checked in O(n log n) and a change costs one lookup per distinct prefix length, so the command and
    the writes after it answer within the replies' deadline; an overlap among many is still found."""
    a, b = raw(), raw()
    a.cmd_raw("HELLO", "3")
    many = [f"p{i:06d}:" for i in range(100_000)]
    assert a.cmd_raw("CLIENT", "TRACKING", "on", "BCAST", *[w for p in many for w in ("PREFIX", p)]) == b"+OK\r\n"
    b.cmd_raw("SET", "p099999:x", "1")
    b.cmd_raw("SET", "other", "1")
    assert pushes_before_pong(a) == [inval("p099999:x")]
    reply = a.cmd_raw("CLIENT", "TRACKING", "on", "BCAST", *[w for i in range(300) for w in ("PREFIX", f"q{i}")],
                      "PREFIX", "p05")
    assert reply == (b"-ERR Prefix 'p05' overlaps with an existing prefix 'p050000:'. Prefixes for a single client "
                     b"must not overlap.\r\n")
    r = server.client()
    assert r.info()["tracking_total_prefixes"] >= 100_000
    r.close()
