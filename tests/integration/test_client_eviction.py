"""maxmemory-clients (client eviction) as Redis 7.0: CONFIG SET and GET texts, a client holding a half-received
value, unread replies, a MULTI queue or watched keys past the limit is closed and counted (INFO evicted_clients),
a client with CLIENT NO-EVICT counts in the total but is never closed (the others are), the flag in CLIENT LIST,
no eviction while the clients stay under the limit; tot-mem counts watched keys, subscriptions and BCAST
prefixes. Run against both targets."""

from __future__ import annotations

import contextlib

import pytest
import redis
from tests.conftest import encode_command

from integration.polling import wait_for
from integration.support import config_texts_as_redis

MB = 1024 * 1024


def _evicted(r: redis.Redis) -> int:
    return int(r.info("stats")["evicted_clients"])


@pytest.fixture
def guarded(make_server):
    """A fresh server and a client of it that maxmemory-clients never closes (it counts in the total)."""
    srv = make_server()
    r = srv.client(single_connection_client=True)
    assert r.execute_command("CLIENT", "NO-EVICT", "on") == b"OK"
    return srv, r


def test_config_texts_as_redis(r):
    try:
        config_texts_as_redis(r, "maxmemory-clients", [
            ("10%", "10%"), ("100%", "100%"), ("0%", "0"), ("1mb", "1048576"), ("1M", "1000000"), ("", "0"),
            ("300kb", "307200")], [
            ("101%", "percentage argument must be less or equal to 100"),
            ("-1", "argument must be a memory or percent value"),
            ("1.5%", "argument must be a memory or percent value"),
            ("5%x", "argument must be a memory or percent value"),
            ("abc", "argument must be a memory or percent value")])
    finally:
        r.config_set("maxmemory-clients", "0")


def test_a_client_receiving_a_large_value_past_the_limit_is_evicted(guarded):
    srv, r = guarded
    bystander = srv.raw()
    assert bystander.cmd("PING") == "PONG"
    assert r.config_set("maxmemory-clients", "1mb")
    assert _evicted(r) == 0
    hog = srv.raw()
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # it may be closed while it sends
        hog.send(encode_command("SET", "k", b"v" * (16 * MB))[: 3 * MB])  # and the rest never comes
    hog.read_until_closed(timeout=30)
    assert _evicted(r) == 1
    assert r.exists("k") == 0
    assert bystander.cmd("PING") == "PONG"  # the small client was enough under the limit to stay
    bystander.close()


def test_a_client_with_unread_replies_past_the_limit_is_evicted(guarded):
    srv, r = guarded
    r.set("big", b"x" * MB)
    assert r.config_set("maxmemory-clients", "4mb")
    reader = srv.raw()
    reader.send(encode_command("GET", "big") * 64)  # 64 MiB of replies, and it reads none
    reader.read_until_closed(timeout=30)
    assert _evicted(r) == 1


def test_a_client_queueing_large_commands_in_multi_is_evicted(guarded):
    """MULTI's queue is client memory (CLIENT LIST multi-mem, counted in tot-mem): past the limit its client is
    closed, and nothing it queued runs."""
    srv, r = guarded
    assert r.config_set("maxmemory-clients", "4mb")
    hog = srv.raw()
    assert hog.cmd("MULTI") == "OK"
    value = b"q" * (256 * 1024)
    for i in range(6):  # 1.5 MiB queued: under the limit, still open, its queue in tot-mem
        assert hog.cmd("SET", f"m{i}", value) == "QUEUED"
    line = next(c for c in r.client_list() if c["flags"] == "x")
    assert int(line["multi-mem"]) >= 6 * len(value)
    assert int(line["tot-mem"]) >= int(line["multi-mem"])
    assert _evicted(r) == 0
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        for i in range(6, 64):  # 16 MiB in all
            hog.send(encode_command("SET", f"m{i}", value))
    hog.read_until_closed(timeout=30)
    assert _evicted(r) == 1
    assert r.exists(*[f"m{i}" for i in range(64)]) == 0


def _tot_mem(r: redis.Redis, client_id: int) -> int:
    return int(next(c for c in r.client_list() if int(c["id"]) == client_id)["tot-mem"])


@pytest.mark.parametrize("held", ["watch", "psubscribe", "bcast"])
def test_watched_keys_subscriptions_and_prefixes_count_in_tot_mem(make_server, held):
    """What a client's WATCH, PSUBSCRIBE and BCAST prefixes hold is in its tot-mem (Redis counts their overhead),
    and leaves it when they end: 20,000 names of 16 bytes add at least their bytes."""
    srv = make_server()
    admin = srv.client(single_connection_client=True)
    c = srv.raw()
    cid = c.cmd("CLIENT", "ID")
    base = _tot_mem(admin, cid)
    names = [b"%016d" % i for i in range(20_000)]
    if held == "watch":
        assert c.cmd("WATCH", *names) == "OK"
    elif held == "psubscribe":
        c.send(encode_command("PSUBSCRIBE", *names))
        for _ in names:
            c.read_reply()
    else:
        assert c.cmd("HELLO", "3")
        prefixes = [part for name in names for part in (b"PREFIX", name)]
        assert c.cmd("CLIENT", "TRACKING", "on", "BCAST", *prefixes) == "OK"
    assert _tot_mem(admin, cid) >= base + 16 * len(names)
    if held == "watch":
        assert c.cmd("UNWATCH") == "OK"
    elif held == "psubscribe":
        c.send(encode_command("PUNSUBSCRIBE"))
        for _ in names:
            c.read_reply()
    else:
        assert c.cmd("CLIENT", "TRACKING", "off") == "OK"
    assert _tot_mem(admin, cid) < base + 64 * 1024


def test_a_client_watching_past_the_limit_is_evicted(guarded):
    srv, r = guarded
    assert r.config_set("maxmemory-clients", "2mb")
    watcher = srv.raw()
    watcher.send(encode_command("WATCH", *[b"%016d" % i for i in range(100_000)]))
    watcher.read_until_closed(timeout=30)
    assert _evicted(r) == 1


def test_no_evict_counts_but_is_never_closed(guarded):
    srv, r = guarded
    value = bytes(range(256)) * (12 * 4096)  # 12 MiB
    assert r.config_set("maxmemory-clients", "1mb")
    small = srv.raw()
    assert small.cmd("PING") == "PONG"
    keeper = srv.raw()
    keeper_id = keeper.cmd("CLIENT", "ID")
    for mode, flags in (("on", "e"), ("off", "N"), ("on", "e")):
        assert keeper.cmd("CLIENT", "NO-EVICT", mode) == "OK"
        assert next(c["flags"] for c in r.client_list() if int(c["id"]) == keeper_id) == flags
    request = encode_command("SET", "k", value)
    keeper.send(request[: 6 * MB])
    # The keeper's half-received value puts the total past the limit: the evictable client goes, it stays.
    small.read_until_closed(timeout=30)
    wait_for(lambda: _evicted(r) == 1, what="the eviction to be counted")
    keeper.send(request[6 * MB:])
    assert keeper.read_reply(timeout=30) == "OK"
    assert r.get("k") == value
    assert _evicted(r) == 1
    keeper.close()


def test_nothing_is_evicted_under_the_limit(guarded):
    srv, r = guarded
    assert r.config_set("maxmemory-clients", "64mb")
    clients = [srv.raw() for _ in range(20)]
    value = b"y" * MB
    for i, c in enumerate(clients):
        assert c.cmd("SET", f"k{i}", value) == "OK"
        assert c.cmd("GET", f"k{i}") == value
    assert _evicted(r) == 0
    for c in clients:
        assert c.cmd("PING") == "PONG"
        c.close()
