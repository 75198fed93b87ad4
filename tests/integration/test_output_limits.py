"""client-output-buffer-limit per client class, as Redis 7.0: CONFIG SET and GET texts and checks (a class not
named keeps its limits, a value with one bad class changes nothing), a subscriber closed at the pubsub class's
hard limit while a normal client with more pending is not, the soft limit's seconds. Run against both targets;
kvstrata's defaults and its bare-size form are kvstrata's."""

from __future__ import annotations

import time

import pytest
import redis
from tests.conftest import TARGET, encode_command

from integration.polling import wait_for

NAME = "client-output-buffer-limit"
MB = 1024 * 1024


def _limits(r: redis.Redis) -> str:
    return r.config_get(NAME)[NAME]


def _refused(r: redis.Redis, value: str) -> str:
    with pytest.raises(redis.ResponseError) as exc:
        r.config_set(NAME, value)
    return str(exc.value)


def _omem(r: redis.Redis, client_id: int) -> int:
    return next(int(c["omem"]) for c in r.client_list() if int(c["id"]) == client_id)


def _subscriber(srv, r: redis.Redis, channel: str):
    """A raw connection subscribed to ``channel`` that reads nothing after the confirmation, and its id."""
    sub = srv.raw()
    client_id = sub.cmd("CLIENT", "ID")
    assert sub.cmd("SUBSCRIBE", channel) == [b"subscribe", channel.encode(), 1]
    wait_for(lambda: r.pubsub_numsub(channel) == [(channel.encode(), 1)], what="the subscription")
    return sub, client_id


def test_config_set_and_get_as_redis(r):
    before = _limits(r)
    try:
        assert r.config_set(NAME, "normal 0 0 0 replica 256mb 64mb 60 pubsub 32mb 8mb 60")
        assert _limits(r) == "normal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60"
        # A class not named keeps its limits; units and class names in any case; k/m/g are powers of 1000.
        assert r.config_set(NAME, "PUBSUB 1MB 2k +5")
        assert _limits(r) == "normal 0 0 0 slave 268435456 67108864 60 pubsub 1048576 2000 5"
        assert r.config_set(NAME, "slave 1g 1 0 normal 3kb 1b 7")
        assert _limits(r) == "normal 3072 1 7 slave 1000000000 1 0 pubsub 1048576 2000 5"
        assert r.config_set(NAME, "")
        settled = _limits(r)
        assert settled == "normal 3072 1 7 slave 1000000000 1 0 pubsub 1048576 2000 5"
        prefix = f"CONFIG SET failed (possibly related to argument '{NAME}') - "
        bad = {
            "normal 1gb": "Wrong number of arguments in buffer limit configuration.",
            "normal 1 1 1 pubsub": "Wrong number of arguments in buffer limit configuration.",
            "master 1 1 1": "Invalid client class specified in buffer limit configuration.",
            "replicas 1 1 1": "Invalid client class specified in buffer limit configuration.",
            "normal 1.5mb 0 0": "Error in hard, soft or soft_seconds setting in buffer limit configuration.",
            "normal -1 0 0": "Error in hard, soft or soft_seconds setting in buffer limit configuration.",
            "normal 1 1tb 0": "Error in hard, soft or soft_seconds setting in buffer limit configuration.",
            "normal 1 1 -1": "Error in hard, soft or soft_seconds setting in buffer limit configuration.",
            "normal 1 1 3x": "Error in hard, soft or soft_seconds setting in buffer limit configuration.",
            # One bad class refuses the whole value: the good one before it is not taken either.
            "pubsub 9 9 9 normal x 0 0": "Error in hard, soft or soft_seconds setting in buffer limit configuration.",
        }
        for value, message in bad.items():
            assert _refused(r, value) == prefix + message, value
            assert _limits(r) == settled, value
    finally:
        r.config_set(NAME, before)


def test_a_subscriber_is_closed_at_the_pubsub_limit_and_a_normal_client_with_more_pending_is_not(make_server):
    srv = make_server()
    r = srv.client()
    assert r.config_set(NAME, "normal 0 0 0 pubsub 1mb 0 0")
    value = bytes(range(256)) * 4096  # 1 MiB
    r.set("big", value)
    normal = srv.raw()
    normal_id = normal.cmd("CLIENT", "ID")
    normal.send(encode_command("GET", "big") * 16)  # and reads nothing yet
    # More than the pubsub limit waits for the normal client (what the kernel's buffers did not take).
    wait_for(lambda: _omem(r, normal_id) > 2 * MB, what="the normal client's replies to pile up")
    sub, sub_id = _subscriber(srv, r, "slow")
    chunk = b"m" * (128 * 1024)
    published = 0

    def closed() -> bool:
        nonlocal published
        receivers = r.publish("slow", chunk)
        published += len(chunk) * receivers
        return receivers == 0

    wait_for(closed, timeout=30, what="the subscriber to be closed")
    assert published >= MB  # not before its limit
    assert sub_id not in [int(c["id"]) for c in r.client_list()]
    if TARGET == "kvstrata":  # Redis counts them from 7.2 on
        assert int(r.info("stats")["client_output_buffer_limit_disconnections"]) == 1
    for _ in range(16):  # the normal client kept every reply
        assert normal.read_reply(timeout=30) == value
    sub.close()
    normal.close()


def test_the_soft_limit_closes_a_subscriber_past_it_for_longer_than_its_seconds(make_server):
    srv = make_server()
    r = srv.client()
    assert r.config_set(NAME, "pubsub 0 512kb 2")
    sub, sub_id = _subscriber(srv, r, "slow")
    start = time.monotonic()
    chunk = b"m" * (64 * 1024)

    def past_soft() -> bool:
        assert r.publish("slow", chunk) == 1
        return _omem(r, sub_id) >= 512 * 1024

    wait_for(past_soft, timeout=30, what="the subscriber's messages to pass the soft limit")
    # The publish that passed the soft limit only started its clock: the subscriber is still there.
    assert r.pubsub_numsub("slow") == [(b"slow", 1)]
    # Each later message checks again; one that finds it past the limit for more than 2 s closes it.
    wait_for(lambda: r.publish("slow", b"x") == 0, timeout=30, what="the subscriber to be closed",
             interval=0.05)
    assert time.monotonic() - start >= 2
    assert sub_id not in [int(c["id"]) for c in r.client_list()]
    sub.close()


@pytest.mark.kvstrata_only
def test_kvstrata_defaults_and_a_bare_size(make_server):
    """kvstrata keeps Redis's replica and pubsub defaults and gives normal clients a 1 GiB hard limit (Redis: none),
    so that one client cannot hold the host's memory; a bare size, the form kvstrata took before classes, is the
    hard limit of every class."""
    srv = make_server({NAME: "pubsub 2mb 1mb 10"})  # a flag naming one class keeps the others' defaults
    r = srv.client()
    assert _limits(r) == "normal 1073741824 0 0 slave 268435456 67108864 60 pubsub 2097152 1048576 10"
    assert r.config_set(NAME, "4mb")
    assert _limits(r) == "normal 4194304 0 0 slave 4194304 0 0 pubsub 4194304 0 0"
