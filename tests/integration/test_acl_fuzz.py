"""Differential fuzzing of ACL permissions against a real redis-server: a seeded generator makes users from random
rules (commands and categories, key patterns with %R~/%W~ permissions, channels, selectors) and asks both servers
``ACL DRYRUN`` for random commands on a small set of keys and channels. The exact replies must be the same: which
command, key or channel is refused, and the text that says so. SETUSER's own reply (a refused rule) too. Not drawn:
FLUSHALL/FLUSHDB, which kvstrata gives only to users with allkeys (docs/security.md)."""

from __future__ import annotations

import random
import shutil

import pytest
from tests.conftest import TARGET

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None or TARGET != "kvstrata",
                                reason="needs redis-server beside kvstrata")

COMMAND_RULES = ["+@all", "-@all", "+@read", "+@write", "+@string", "+@keyspace", "-@dangerous", "+@pubsub",
                 "+get", "+set", "-set", "+del", "+mget", "+publish", "+subscribe", "+psubscribe", "+copy",
                 "+rename", "+bitfield", "+exists", "+getdel", "+incr", "-get", "+@fast", "-@write"]
KEY_RULES = ["~a*", "%R~b*", "%W~c*", "%RW~d*", "~*", "%R~*", "%W~*", "allkeys", "resetkeys", "~e?", "%R~f",
             "%W~a1", "~{t}*"]
CHANNEL_RULES = ["&n*", "&*", "resetchannels", "allchannels", "&x", "&o?her"]
KEYS = ["a1", "b1", "c1", "d1", "e1", "f", "zz", "{t}k"]
CHANNELS = ["n1", "x", "other", "n*"]


def _rules(rng: random.Random) -> list[str]:
    return [rng.choice(pool) for pool in (COMMAND_RULES, KEY_RULES, CHANNEL_RULES) * 2 if rng.random() < 0.7]


def _user(rng: random.Random) -> list[str]:
    rules = ["reset", "on", "nopass", *_rules(rng)]
    for _ in range(rng.choice([0, 0, 1, 2])):
        rules.append("(" + " ".join(_rules(rng)) + ")")
    return rules


def _command(rng: random.Random) -> list[str]:
    k = lambda: rng.choice(KEYS)  # noqa: E731
    return rng.choice([
        lambda: ["GET", k()], lambda: ["SET", k(), "v"], lambda: ["SET", k(), "v", "GET"], lambda: ["DEL", k(), k()],
        lambda: ["MGET", k(), k(), k()], lambda: ["EXISTS", k()], lambda: ["COPY", k(), k()],
        lambda: ["RENAME", k(), k()], lambda: ["BITFIELD", k(), "GET", "u8", "0"],
        lambda: ["BITFIELD", k(), "SET", "u8", "0", "1"], lambda: ["BITFIELD_RO", k(), "GET", "u8", "0"],
        lambda: ["APPEND", k(), "x"], lambda: ["INCR", k()], lambda: ["GETDEL", k()], lambda: ["STRLEN", k()],
        lambda: ["TYPE", k()], lambda: ["EXPIRE", k(), "100"], lambda: ["TTL", k()], lambda: ["SETNX", k(), "v"],
        lambda: ["MSET", k(), "1", k(), "2"], lambda: ["LCS", k(), k()], lambda: ["GETEX", k(), "PERSIST"],
        lambda: ["PUBLISH", rng.choice(CHANNELS), "m"], lambda: ["SUBSCRIBE", rng.choice(CHANNELS)],
        lambda: ["PSUBSCRIBE", rng.choice(CHANNELS), rng.choice(CHANNELS)], lambda: ["SPUBLISH", k(), "m"],
        lambda: ["OBJECT", "ENCODING", k()], lambda: ["PING"], lambda: ["KEYS", "*"],
    ])()


@pytest.mark.parametrize("seed", range(6))
def test_acl_refuses_what_redis_refuses(pair, seed: int) -> None:
    rng = random.Random(5000 + seed)
    users = checks = 0
    for _ in range(40):
        rules = _user(rng)
        made = [conn.cmd_raw("ACL", "SETUSER", "fz", *rules) for conn in pair]
        assert made[0] == made[1], (seed, rules, made)
        if made[0] != b"+OK\r\n":
            continue
        users += 1
        for _ in range(40):
            cmd = _command(rng)
            got = [conn.cmd_raw("ACL", "DRYRUN", "fz", *cmd) for conn in pair]
            assert got[0] == got[1], (seed, rules, cmd, got[0], got[1])
            checks += 1
    assert users >= 20 and checks >= 800  # the generator makes mostly valid users
