"""The ACL model without a server: rules, passwords, categories, key and pattern checks, the ACL file."""

from __future__ import annotations

import hashlib
import random

import pytest

from kvstrata.acl import ALL, Acl, User, categories
from kvstrata.commands import REGISTRY
from kvstrata.commands.registry import resolve
from kvstrata.engine.keyspace import glob_match


def user(*rules: str) -> User:
    u = User("u")
    for r in rules:
        u.apply(r)
    return u


def test_passwords_are_hashes_compared_in_full():
    u = user("on", ">one", ">two")
    assert u.passwords == [hashlib.sha256(b"one").hexdigest(), hashlib.sha256(b"two").hexdigest()]
    assert u.check_password(b"one") and u.check_password(b"two") and not u.check_password(b"three")
    u.apply("<one")
    assert not u.check_password(b"one")
    u.apply("off")
    assert not u.check_password(b"two")  # a disabled user never authenticates
    with pytest.raises(ValueError, match="64 characters"):
        u.apply("#abc")
    assert user("on", "nopass").check_password(b"anything")
    assert not user("on", "nopass", "resetpass").check_password(b"")


def test_command_rules_in_order():
    get, keys = REGISTRY[b"get"], REGISTRY[b"keys"]
    client_list = REGISTRY[b"client"].subcommands[b"list"]
    u = user("+@all", "-@dangerous")
    assert get in u.allowed and keys not in u.allowed and client_list not in u.allowed
    u.apply("+client|list")
    assert client_list in u.allowed and REGISTRY[b"client"].subcommands[b"kill"] not in u.allowed
    u.apply("-@all")
    assert not u.allowed and u.commands_text() == "-@all"
    with pytest.raises(ValueError, match="Unknown command"):
        u.apply("+nosuch")
    with pytest.raises(ValueError, match="Unknown command"):
        u.apply("+@nosuch")
    assert user("allkeys", "allcommands", "allchannels").unrestricted and not user("~a*", "+@all").unrestricted
    assert not user("allkeys", "allcommands").unrestricted  # its channels are still checked


def test_categories_follow_the_table():
    assert categories(REGISTRY[b"get"]) == ["read", "string", "fast"]
    assert "write" in categories(REGISTRY[b"tair.kv.setex"]) and "kvcache" in categories(REGISTRY[b"tair.kv.setex"])
    for name in (b"flushall", b"keys", b"info"):
        assert "dangerous" in categories(REGISTRY[name])
    assert {"admin", "dangerous"} <= set(categories(REGISTRY[b"memory"].subcommands[b"stats"]))


def test_tairkv_options_are_not_keys():
    mget = REGISTRY[b"tair.kv.mget"]
    assert mget.keys([b"TAIR.KV.MGET", b"a", b"b", b"CONSISTENCY_LEVEL", b"STRONG", b"WITHVERSIONS"]) == [
        b"a", b"b"]
    prefetch = REGISTRY[b"tair.kv.prefetch"]
    assert prefetch.keys([b"TAIR.KV.PREFETCH", b"a", b"PRIORITY", b"5"]) == [b"a"]
    usage = REGISTRY[b"memory"]
    args = [b"MEMORY", b"USAGE", b"k"]
    assert resolve(usage, args).keys(args) == [b"k"]


def test_key_patterns():
    u = user("~kvs:A:*", "~exact", "~g?o*")
    assert u.key_ok(b"kvs:A:1", ALL) and u.key_ok(bytearray(b"kvs:A:"), ALL) and u.key_ok(b"exact", ALL)
    assert u.key_ok(b"gxo1", ALL)
    assert not u.key_ok(b"kvs:B:1", ALL) and not u.key_ok(b"exact2", ALL) and not u.key_ok(b"kvs:A", ALL)
    assert user("allkeys").key_ok(b"anything", ALL) and not user().key_ok(b"anything", ALL)


def test_pattern_ok_is_sound():
    """Every key a pattern accepted by pattern_ok can match is a key the user may access (random search)."""
    u = user("~kvs:A:*", "~x?y")
    assert u.pattern_ok(b"kvs:A:*", ALL) and u.pattern_ok(b"kvs:A:s7:*", ALL) and u.pattern_ok(b"x?y", ALL)
    for bad in (b"*", b"kvs:*", b"kvs:?:*", b"kvs:[AB]:*", b"kvs:A", b"xay", b"kvs:A*"):
        assert not u.pattern_ok(bad, ALL), bad
    rng = random.Random(7)
    alphabet = b"kvs:AB*?[]^-\\x"
    for _ in range(3000):
        pattern = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        if not u.pattern_ok(pattern, ALL):
            continue
        for _ in range(30):
            key = bytes(rng.choice(b"kvs:ABxy") for _ in range(rng.randint(0, 10)))
            key = b"kvs:A:" + key if rng.random() < 0.5 else key
            if glob_match(pattern, key):
                assert u.key_ok(key, ALL), (pattern, key)


def test_setuser_is_all_or_nothing_and_keeps_the_object(tmp_path):
    acl = Acl("pw")
    assert acl.default.check_password(b"pw") and not acl.open_default()
    acl.setuser("t", ["on", ">p", "~a*", "+get"])
    t = acl.users["t"]
    with pytest.raises(ValueError, match="'bogus'"):
        acl.setuser("t", ["~b*", "bogus"])
    assert t.patterns == [b"a*"]  # unchanged
    acl.setuser("t", ["~b*"])
    assert acl.users["t"] is t and t.patterns == [b"a*", b"b*"]
    acl.on_requirepass(None)
    assert acl.open_default()
    path = tmp_path / "users.acl"
    acl.aclfile = str(path)
    acl.save(str(path))
    text = path.read_text()
    assert "user t on #" + hashlib.sha256(b"p").hexdigest() in text and ">p" not in text
    fresh = Acl(None, str(path))
    assert fresh.users["t"].check_password(b"p") and fresh.users["t"].key_ok(b"b1", ALL)
    assert REGISTRY[b"get"] in fresh.users["t"].allowed and REGISTRY[b"set"] not in fresh.users["t"].allowed
    path.write_text("user t on +nosuch\n")
    with pytest.raises(ValueError, match="nosuch"):
        fresh.load(str(path))
    assert "t" in fresh.users and fresh.users["t"].check_password(b"p")  # a bad file changes nothing


def test_acl_file_users_start_with_the_configured_channels(tmp_path):
    path = tmp_path / "users.acl"
    path.write_text("user a on nopass +publish\nuser b on nopass resetchannels +publish\n")
    everything, none = Acl(aclfile=str(path), pubsub_default=True), Acl(aclfile=str(path))
    assert everything.users["a"].allchannels and not everything.users["b"].allchannels
    assert not none.users["a"].allchannels
