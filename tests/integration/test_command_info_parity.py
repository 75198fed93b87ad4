"""COMMAND INFO against a real redis-server, side by side: for every command and subcommand both serve, the arity,
the flags, the classic key triple, the ACL categories and the key specs (flags, notes, where the search begins and
how keys are found) must be Redis's, since clients and ACL rules (`+@transaction`, `-@dangerous`) act on them. The
differences kvstrata makes on purpose are listed with their reason; a new difference fails the test. Tips are not
compared (kvstrata sends none).
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
from tests.conftest import TARGET, ServerProc

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None or TARGET != "kvstrata",
                                reason="needs redis-server beside kvstrata")

# (command, field) -> why kvstrata differs.
ON_PURPOSE = {
    ("memory|doctor", "acl"): "@admin @dangerous: they show the top key prefixes of every tenant (docs/security.md)",
    ("memory|stats", "acl"): "@admin @dangerous: as MEMORY DOCTOR",
    ("migrate", "key_specs"): "keys found by a function (KEYS ...); no keyword key spec is declared",
    ("spublish", "triple"): "a node is one shard: shard channels are not keys here",
    ("ssubscribe", "triple"): "as SPUBLISH",
    ("sunsubscribe", "triple"): "as SPUBLISH",
    ("spublish", "key_specs"): "as SPUBLISH",
    ("ssubscribe", "key_specs"): "as SPUBLISH",
    ("sunsubscribe", "key_specs"): "as SPUBLISH",
}


def _text(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.decode()
    if isinstance(x, list):
        return [_text(i) for i in x]
    return x


def _fields(info: list[Any]) -> dict[str, Any]:
    name, arity, flags, first, last, step, acl, _tips, key_specs, _subs = _text(info)
    return {"arity": arity, "flags": sorted(map(str, flags)), "triple": (first, last, step),
            "acl": sorted(map(str, acl)), "key_specs": key_specs}


@pytest.fixture(scope="module")
def infos() -> dict[str, dict[str, Any]]:
    out = {}
    for target in ("kvstrata", "redis"):
        srv = ServerProc(target=target).start()
        try:
            conn = srv.raw()
            names = conn.cmd("COMMAND", "LIST")
            out[target] = {_text(n): _fields(conn.cmd("COMMAND", "INFO", n)[0]) for n in names}
        finally:
            srv.stop()
    return out


def test_command_info_is_redis_s(infos: dict[str, dict[str, Any]]) -> None:
    common = sorted(set(infos["kvstrata"]) & set(infos["redis"]))
    assert len(common) > 150
    differences = []
    for name in common:
        ours, theirs = infos["kvstrata"][name], infos["redis"][name]
        for field in ours:
            if ours[field] != theirs[field] and (name, field) not in ON_PURPOSE:
                differences.append((name, field, ours[field], theirs[field]))
    assert differences == []
    # Every difference kept on purpose is still one (the list does not outlive its reasons).
    stale = [k for k in ON_PURPOSE if infos["kvstrata"][k[0]][k[1]] == infos["redis"][k[0]][k[1]]]
    assert stale == []


SAMPLES = [
    ("GET", "k"), ("SET", "k", "v"), ("SET", "k", "v", "GET"), ("SET", "k", "v", "EX", "10", "get"),
    ("MSET", "a", "1", "b", "2"), ("MGET", "a", "b", "c"), ("DEL", "a", "b"), ("UNLINK", "a"), ("EXISTS", "a", "b"),
    ("COPY", "s", "d", "REPLACE"), ("RENAME", "s", "d"), ("RENAMENX", "s", "d"), ("BITOP", "AND", "d", "s1", "s2"),
    ("BITFIELD", "k", "GET", "u8", "0"), ("BITFIELD", "k", "OVERFLOW", "SAT", "GET", "u8", "0"),
    ("BITFIELD", "k", "SET", "u8", "0", "1"), ("BITFIELD", "k", "GET", "u8"), ("BITFIELD_RO", "k", "GET", "u8", "0"),
    ("GETEX", "k", "PERSIST"), ("GETDEL", "k"), ("INCRBYFLOAT", "k", "1"), ("APPEND", "k", "v"),
    ("SETNX", "k", "v"), ("MSETNX", "a", "1"), ("LCS", "a", "b"), ("OBJECT", "ENCODING", "k"),
    ("MEMORY", "USAGE", "k"), ("WATCH", "a", "b"), ("RESTORE", "k", "0", "x"), ("TOUCH", "a"),
    ("PING", "x"), ("ECHO", "x"), ("NOSUCH", "x"), ("GET",), ("GET", "a", "b"), ("SETRANGE", "k", "0", "v"),
]


@pytest.mark.parametrize("sub", ["GETKEYS", "GETKEYSANDFLAGS"])
def test_command_getkeys_and_flags_as_redis(pair: tuple[Any, Any], sub: str) -> None:
    """COMMAND GETKEYS and GETKEYSANDFLAGS give Redis's keys, flags (SET with and without GET, BITFIELD read-only
    or not) and errors, exact bytes."""
    for sample in SAMPLES:
        ours, theirs = (conn.cmd_raw("COMMAND", sub, *sample) for conn in pair)
        assert ours == theirs, (sub, sample)
