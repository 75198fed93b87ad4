"""Pub/Sub as Redis 7.0 has it: SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE and their UNSUBSCRIBEs, PUBLISH, SPUBLISH and
PUBSUB, with redis-py's own PubSub client and on raw sockets (exact bytes in RESP2 and RESP3), the RESP2
subscribed-mode rule, ACL channel rules, delivery order as a history, cleanup when a subscriber leaves. Run
against both targets; the output-limit test is kvstrata's."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from tests.conftest import encode_command

from integration.polling import wait_for


def _next_message(ps: redis.client.PubSub, timeout: float = 10.0) -> dict[str, Any]:
    got = wait_for(lambda: ps.get_message(ignore_subscribe_messages=True, timeout=0.05), timeout,
                   what="a pub/sub message")
    return got


def _replies(conn: Any, *args: Any, n: int) -> bytes:
    """The exact bytes of the ``n`` replies one command answers with (SUBSCRIBE a b: one per channel)."""
    conn.send(encode_command(*args))
    return b"".join(conn.read_raw() for _ in range(n))


def test_redis_py_pubsub_channels_and_patterns(server, r):
    ps = server.client().pubsub()
    ps.subscribe("news.eu", "news.us")
    ps.psubscribe("news.*", "x?")
    for _ in range(4):  # the four confirmations
        assert wait_for(lambda: ps.get_message(timeout=0.05), what="a confirmation")["type"] in (
            "subscribe", "psubscribe")
    assert r.publish("news.eu", "hello") == 2  # the channel and the pattern
    first, second = _next_message(ps), _next_message(ps)
    assert first == {"type": "message", "pattern": None, "channel": b"news.eu", "data": b"hello"}
    assert second == {"type": "pmessage", "pattern": b"news.*", "channel": b"news.eu", "data": b"hello"}
    assert r.publish("xy", b"\x00\xff binary") == 1
    assert _next_message(ps)["data"] == b"\x00\xff binary"
    assert r.publish("nobody", "lost") == 0
    assert sorted(r.pubsub_channels()) == [b"news.eu", b"news.us"]
    assert r.pubsub_channels("*us") == [b"news.us"]
    assert r.pubsub_numsub("news.eu", "nobody") == [(b"news.eu", 1), (b"nobody", 0)]
    assert r.pubsub_numpat() == 2
    info = r.info("stats")
    assert (info["pubsub_channels"], info["pubsub_patterns"]) == (2, 2)
    ps.unsubscribe("news.eu")
    ps.punsubscribe()
    wait_for(lambda: r.pubsub_numpat() == 0 and r.pubsub_channels() == [b"news.us"], what="the unsubscribes")
    ps.close()  # the connection goes: its last subscription with it
    wait_for(lambda: r.pubsub_channels() == [], what="the subscriber's cleanup")


def test_subscribe_replies_and_subscribed_mode_resp2(raw):
    c, pub = raw(), raw()
    assert _replies(c, "SUBSCRIBE", "a", "b", "a", n=3) == (
        b"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n"
        b"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:2\r\n")
    assert c.cmd_raw("PSUBSCRIBE", "a*") == b"*3\r\n$10\r\npsubscribe\r\n$2\r\na*\r\n:3\r\n"
    assert c.cmd_raw("GET", "k") == (b"-ERR Can't execute 'get': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / "
                                     b"QUIT / RESET are allowed in this context\r\n")
    assert c.cmd_raw("CLIENT", "ID").startswith(b"-ERR Can't execute 'client|id'")
    assert c.cmd_raw("PING") == b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"
    assert c.cmd_raw("PING", "x") == b"*2\r\n$4\r\npong\r\n$1\r\nx\r\n"
    assert pub.cmd("PUBLISH", "a", "m") == 2
    assert c.read_raw() == b"*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$1\r\nm\r\n"
    assert c.read_raw() == b"*4\r\n$8\r\npmessage\r\n$2\r\na*\r\n$1\r\na\r\n$1\r\nm\r\n"
    assert _replies(c, "UNSUBSCRIBE", "b", "never", n=2) == (
        b"*3\r\n$11\r\nunsubscribe\r\n$1\r\nb\r\n:2\r\n*3\r\n$11\r\nunsubscribe\r\n$5\r\nnever\r\n:2\r\n")
    assert c.cmd_raw("UNSUBSCRIBE") == b"*3\r\n$11\r\nunsubscribe\r\n$1\r\na\r\n:1\r\n"
    assert c.cmd_raw("PUNSUBSCRIBE") == b"*3\r\n$12\r\npunsubscribe\r\n$2\r\na*\r\n:0\r\n"
    assert c.cmd_raw("PUNSUBSCRIBE") == b"*3\r\n$12\r\npunsubscribe\r\n$-1\r\n:0\r\n"  # none left: a nil name
    assert c.cmd_raw("GET", "k") == b"$-1\r\n"  # out of subscribed mode
    assert c.cmd_raw("SUBSCRIBE", "z") == b"*3\r\n$9\r\nsubscribe\r\n$1\r\nz\r\n:1\r\n"
    assert c.cmd_raw("RESET") == b"+RESET\r\n"
    assert pub.cmd("PUBSUB", "NUMSUB", "z") == [b"z", 0]


def test_resp3_pushes_and_publishing_to_oneself(raw):
    c = raw()
    c.cmd("HELLO", "3")
    assert c.cmd_raw("SUBSCRIBE", "r3") == b">3\r\n$9\r\nsubscribe\r\n$2\r\nr3\r\n:1\r\n"
    assert c.cmd_raw("GET", "k") == b"_\r\n"  # RESP3: any command, its reply told apart from pushes
    # The message to itself comes before PUBLISH's own reply, as in Redis.
    c.send(b"*3\r\n$7\r\nPUBLISH\r\n$2\r\nr3\r\n$4\r\nself\r\n")
    assert c.read_raw() == b">3\r\n$7\r\nmessage\r\n$2\r\nr3\r\n$4\r\nself\r\n"
    assert c.read_raw() == b":1\r\n"
    assert c.cmd_raw("PING") == b"+PONG\r\n"


def test_shard_channels_are_their_own_namespace(raw):
    c, pub = raw(), raw()
    assert _replies(c, "SSUBSCRIBE", "s1", "s2", n=2) == (
        b"*3\r\n$10\r\nssubscribe\r\n$2\r\ns1\r\n:1\r\n*3\r\n$10\r\nssubscribe\r\n$2\r\ns2\r\n:2\r\n")
    assert pub.cmd("PUBLISH", "s1", "plain") == 0
    assert pub.cmd("SPUBLISH", "s1", "sharded") == 1
    assert c.read_raw() == b"*3\r\n$8\r\nsmessage\r\n$2\r\ns1\r\n$7\r\nsharded\r\n"
    assert sorted(pub.cmd("PUBSUB", "SHARDCHANNELS")) == [b"s1", b"s2"]
    assert pub.cmd("PUBSUB", "SHARDNUMSUB", "s1", "s3") == [b"s1", 1, b"s3", 0]
    assert pub.cmd("PUBSUB", "CHANNELS") == []
    assert c.cmd_raw("SUNSUBSCRIBE", "s1") == b"*3\r\n$12\r\nsunsubscribe\r\n$2\r\ns1\r\n:1\r\n"


def test_pubsub_errors_as_redis(r, expect_error):
    for args in (("SUBSCRIBE",), ("PSUBSCRIBE",), ("SSUBSCRIBE",), ("PUBLISH", "a"), ("SPUBLISH", "a", "b", "c")):
        with expect_error(f"ERR wrong number of arguments for '{args[0].lower()}' command"):
            r.execute_command(*args)
    with expect_error("ERR unknown subcommand or wrong number of arguments for 'CHANNELS'. Try PUBSUB HELP."):
        r.execute_command("PUBSUB", "CHANNELS", "a", "b")
    with expect_error("ERR wrong number of arguments for 'pubsub|numpat' command"):
        r.execute_command("PUBSUB", "NUMPAT", "x")
    with expect_error("ERR unknown subcommand 'foo'. Try PUBSUB HELP."):
        r.execute_command("PUBSUB", "foo")
    assert r.execute_command("PUBSUB", "HELP")[0].startswith(b"PUBSUB <subcommand>")


def test_acl_channel_rules(server, r, raw, expect_error):
    r.execute_command("ACL", "SETUSER", "feeds", "on", ">pw", "+@all", "~*", "resetchannels", "&news.*", "&ops")
    try:
        c = server.client(username="feeds", password="pw")
        assert c.publish("news.eu", "ok") == 0 and c.publish("ops", "ok") == 0
        noperm = "NOPERM this user has no permissions to access one of the channels used as arguments"
        for args in (("PUBLISH", "sports", "x"), ("SPUBLISH", "sports", "x")):
            with expect_error(noperm):
                c.execute_command(*args)
        sub = raw()
        assert sub.cmd("AUTH", "feeds", "pw") == "OK"
        # All or nothing: one channel refused refuses the command.
        assert sub.cmd_raw("SUBSCRIBE", "news.eu", "sports") == b"-" + noperm.encode() + b"\r\n"
        # A pattern must be one of the user's patterns, literally.
        assert sub.cmd_raw("PSUBSCRIBE", "news.e*") == b"-" + noperm.encode() + b"\r\n"
        assert sub.cmd_raw("PSUBSCRIBE", "news.*") == b"*3\r\n$10\r\npsubscribe\r\n$6\r\nnews.*\r\n:1\r\n"
        entry = r.acl_log(count=1)[0]
        assert (entry["reason"], entry["object"], entry["username"]) == ("channel", "news.e*", "feeds")
        rules = r.acl_getuser("feeds")["channels"]
        assert rules == ["&news.*", "&ops"]  # redis-py splits ACL GETUSER's string
        with expect_error("ERR Error in ACL SETUSER modifier '&x': Adding a pattern after the * pattern (or the "
                          "'allchannels' flag) is not valid and does not have any effect. Try 'resetchannels' to "
                          "start with an empty list of channels"):
            r.execute_command("ACL", "SETUSER", "feeds", "allchannels", "&x")
    finally:
        r.execute_command("ACL", "DELUSER", "feeds")


def test_delivery_history_per_publisher_order(server, r):
    """Three publishers pipelining 300 messages each, two subscribers (a channel, a pattern): every subscriber
    gets every message exactly once and each publisher's in the order published; PUBLISH counted both."""
    names = [f"p{i}" for i in range(3)]
    subs = [server.client().pubsub(), server.client().pubsub()]
    subs[0].subscribe("hist")
    subs[1].psubscribe("hi*")
    for ps in subs:
        wait_for(lambda ps=ps: ps.get_message(timeout=0.05), what="the confirmation")
    counts: list[int] = []

    def publisher(name: str) -> None:
        p = server.client().pipeline(transaction=False)
        for i in range(300):
            p.publish("hist", f"{name}:{i}")
        counts.extend(p.execute())

    threads = [threading.Thread(target=publisher, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert counts == [2] * 900
    for ps in subs:
        got: list[bytes] = []
        while len(got) < 900:
            got.append(_next_message(ps)["data"])
        assert ps.get_message(ignore_subscribe_messages=True, timeout=0.2) is None  # nothing more
        for name in names:
            assert [m for m in got if m.startswith(name.encode() + b":")] == [f"{name}:{i}".encode()
                                                                               for i in range(300)]
        ps.close()


def test_large_message_intact(server, r):
    ps = server.client().pubsub()
    ps.subscribe("big")
    wait_for(lambda: ps.get_message(timeout=0.05), what="the confirmation")
    payload = bytes(range(256)) * 4096  # 1 MiB
    assert r.publish("big", payload) == 1
    assert _next_message(ps)["data"] == payload
    ps.close()


@pytest.mark.kvstrata_only
def test_a_subscriber_that_does_not_read_is_closed(make_server):
    srv = make_server({"client-output-buffer-limit": "4mb"})
    r = srv.client()
    reader = srv.raw()
    reader.send(b"*2\r\n$9\r\nSUBSCRIBE\r\n$4\r\nslow\r\n")  # and never reads again
    wait_for(lambda: r.pubsub_numsub("slow") == [(b"slow", 1)], what="the subscription")
    chunk = b"x" * (256 * 1024)
    # Until the server closes it (its unread messages past the limit), the publisher is served each time.
    wait_for(lambda: r.publish("slow", chunk) == 0, timeout=30, what="the slow subscriber to be closed")
    assert int(r.info("stats")["client_output_buffer_limit_disconnections"]) >= 1
    assert r.ping()


def test_a_subscriber_whose_user_loses_the_channel_is_disconnected(server, r, raw):
    """As Redis 7: ACL SETUSER that takes a channel (or a pattern) away closes the connections of that user
    subscribed to it; the others stay."""
    r.execute_command("ACL", "SETUSER", "feeds", "on", ">pw", "+@all", "~*", "resetchannels", "&news.*", "&ops",
                      "&sport*")
    try:
        news, ops, sport = raw(), raw(), raw()
        for conn, kind, name in ((news, "SUBSCRIBE", "news.eu"), (ops, "SUBSCRIBE", "ops"),
                                 (sport, "PSUBSCRIBE", "sport*")):
            assert conn.cmd("AUTH", "feeds", "pw") == "OK"
            conn.cmd(kind, name)
        r.execute_command("ACL", "SETUSER", "feeds", "resetchannels", "&ops", "&sport*")
        news.read_until_closed()  # closed: news.eu is no longer allowed
        assert ops.cmd("PING") == [b"pong", b""] and sport.cmd("PING") == [b"pong", b""]
        r.execute_command("ACL", "SETUSER", "feeds", "resetchannels", "&ops", "&sports")  # not the pattern itself
        sport.read_until_closed()
        assert ops.cmd("PING") == [b"pong", b""]
        wait_for(lambda: r.pubsub_numsub("news.eu", "ops") == [(b"news.eu", 0), (b"ops", 1)],
                 what="the closed subscribers' cleanup")
    finally:
        r.execute_command("ACL", "DELUSER", "feeds")
