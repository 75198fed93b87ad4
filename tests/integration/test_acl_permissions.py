"""ACL read and write key permissions as Redis 7.0: ``%R~`` (read), ``%W~`` (write), ``~``/``%RW~`` (both), each
key checked by its key spec's flags (access: read; insert, delete, update: write; neither, as EXISTS: any
pattern), SET's and BITFIELD's by their arguments. Rules' syntax, errors and how GETUSER and ACL LIST show them,
ACL DRYRUN and ACL LOG. Run against both targets; the KV-cache commands and the listings are kvstrata's."""

from __future__ import annotations

import pytest
import redis

from kvstrata.acl import merge_selectors

NOPERM_KEY = "this user has no permissions to access one of the keys used as arguments"


@pytest.fixture
def tenant(acl_server, admin):
    """User ``u``: reads r:*, writes w:*, both on rw:* and both:*; every command but the dangerous ones."""
    assert admin.execute_command("ACL", "SETUSER", "u", "on", ">pw", "+@all", "-@dangerous", "%R~r:*", "%W~w:*",
                                 "~rw:*", "%RW~both:*") == b"OK"
    c = acl_server.client(username="u", password="pw")
    yield c
    c.close()


def _refused(fn, *args) -> str:
    with pytest.raises(redis.exceptions.NoPermissionError) as exc:
        fn(*args)
    return str(exc.value)


def _keys_rule(admin, *rules: str) -> bytes:
    admin.execute_command("ACL", "SETUSER", "p", "reset", *rules)
    user = admin.execute_command("ACL", "GETUSER", "p")
    return dict(zip(user[::2], user[1::2], strict=True))[b"keys"]


def test_each_key_needs_what_its_command_does_with_it(admin, tenant):
    admin.mset({"r:1": "a", "rw:1": "b", "w:1": "c"})
    assert tenant.get("r:1") == b"a"
    assert tenant.strlen("r:1") == 1 and tenant.exists("w:1") == 1  # no access flag: any pattern
    assert _refused(tenant.set, "r:1", "x") == NOPERM_KEY
    assert tenant.set("w:1", "x") and tenant.append("w:1", "y") == 2 and tenant.mset({"w:a": 1, "w:b": 2})
    assert _refused(tenant.get, "w:1") == NOPERM_KEY
    assert _refused(tenant.mget, "w:a") == NOPERM_KEY
    assert _refused(tenant.incr, "w:2") == NOPERM_KEY  # reads the old value
    assert _refused(lambda: tenant.set("w:1", "v", get=True)) == NOPERM_KEY  # SET ... GET reads it
    assert tenant.set("rw:1", "v", get=True) == b"b"
    assert tenant.copy("r:1", "w:copy") and _refused(tenant.copy, "w:1", "r:copy") == NOPERM_KEY
    assert _refused(tenant.rename, "r:1", "w:3") == NOPERM_KEY  # the source is read and deleted
    assert tenant.rename("rw:1", "w:3")
    assert tenant.execute_command("BITFIELD_RO", "r:1", "GET", "u8", "0") == [ord("a")]
    assert _refused(tenant.execute_command, "BITFIELD", "w:b", "GET", "u8", "0") == NOPERM_KEY
    assert _refused(tenant.execute_command, "BITFIELD", "w:b", "SET", "u8", "0", "1") == NOPERM_KEY
    assert tenant.execute_command("BITFIELD", "both:b", "SET", "u8", "0", "1") == [0]
    assert tenant.delete("w:1") == 1 and _refused(tenant.delete, "r:1") == NOPERM_KEY
    assert _refused(tenant.getdel, "w:a") == NOPERM_KEY and tenant.getdel("rw:none") is None
    assert admin.get("r:1") == b"a"  # nothing refused changed anything


def test_dryrun_and_log_name_the_key(admin, tenant):
    dry = lambda *cmd: admin.execute_command("ACL", "DRYRUN", "u", *cmd)  # noqa: E731
    assert dry("SET", "w:1", "v") == b"OK"
    assert dry("GET", "w:1") == b"This user has no permissions to access the 'w:1' key"
    assert dry("SET", "r:1", "v", "GET") == b"This user has no permissions to access the 'r:1' key"
    assert dry("SET", "rw:1", "v", "GET") == b"OK"
    _refused(tenant.get, "w:secret")
    entry = admin.acl_log()[0]
    assert (entry["reason"], entry["object"], entry["username"]) == ("key", "w:secret", "u")


def test_rules_syntax_and_how_they_are_shown(admin):
    assert _keys_rule(admin, "%R~a", "%W~b", "~c", "%RW~d", "%wr~e") == b"%R~a %W~b ~c ~d ~e"
    assert _keys_rule(admin, "~a", "%R~a") == b"~a"  # a pattern given again gains permissions, keeps its place
    assert _keys_rule(admin, "%R~a", "%W~b", "%W~a") == b"~a %W~b"
    assert _keys_rule(admin, "%R~*") == b"%R~*"  # reading every key is not allkeys
    assert _keys_rule(admin, "%R~a", "~*") == b"~*"
    assert _keys_rule(admin, "%R") == b"%R~"
    listed = [line for line in admin.acl_list() if line.startswith("user p ")]
    assert len(listed) == 1 and " %R~ " in listed[0]
    admin.execute_command("ACL", "SETUSER", "p", "reset", "%R~a", "%W~b")
    admin.execute_command("ACL", "SETUSER", "p", "on", ">pw")  # later rules keep the permissions as they were
    user = admin.execute_command("ACL", "GETUSER", "p")
    assert dict(zip(user[::2], user[1::2], strict=True))[b"keys"] == b"%R~a %W~b"
    for rule in ("%X~a", "%RR~a", "%~a", "%R~a b", "~a b"):
        with pytest.raises(redis.ResponseError) as exc:
            admin.execute_command("ACL", "SETUSER", "p", rule)
        assert str(exc.value) == f"Error in ACL SETUSER modifier '{rule}': Syntax error"
    for rules in (("~*", "~a"), ("allkeys", "%R~a"), ("allkeys", "%X~a")):
        with pytest.raises(redis.ResponseError) as exc:
            admin.execute_command("ACL", "SETUSER", "p", "reset", *rules)
        assert str(exc.value) == (
            f"Error in ACL SETUSER modifier '{rules[1]}': Adding a pattern after the * pattern (or the 'allkeys' "
            "flag) is not valid and does not have any effect. Try 'resetkeys' to start with an empty list of "
            "patterns")


def test_read_everything_write_nothing(acl_server, admin):
    admin.execute_command("ACL", "SETUSER", "reader", "on", ">pw", "+@all", "-@dangerous", "%R~*")
    admin.set("k", "v")
    reader = acl_server.client(username="reader", password="pw")
    assert reader.get("k") == b"v" and reader.mget("k", "other") == [b"v", None]
    for call in (lambda: reader.set("k", "x"), lambda: reader.delete("k"), lambda: reader.expire("k", 5)):
        assert _refused(call) == NOPERM_KEY
    assert admin.get("k") == b"v" and admin.ttl("k") == -1
    reader.close()


@pytest.mark.kvstrata_only
def test_kv_cache_commands_and_listings(acl_server, admin, tenant):
    admin.mset({"r:1": "a", "w:1": "c", "rw:1": "b"})
    assert tenant.execute_command("TAIR.KV.MGET", "r:1") == [b"a"]
    assert _refused(tenant.execute_command, "TAIR.KV.MGET", "w:1") == NOPERM_KEY
    assert _refused(tenant.execute_command, "TAIR.KV.SETEX", "r:2", "0", "v") == NOPERM_KEY
    assert tenant.execute_command("TAIR.KV.SETEX", "w:2", "0", "v") >= 1
    # A listing shows only the keys the user may read.
    assert sorted(tenant.scan_iter("*")) == [b"r:1", b"rw:1"]


def _words(line: str) -> list[str]:
    """An ACL LIST line's words but Redis's sanitize-payload flag, selectors kept whole."""
    return [w for w in merge_selectors(line.split()) if w != "sanitize-payload"]


def test_selectors_allow_a_command_that_one_of_them_allows_whole(acl_server, admin):
    """Redis 7's selectors: the root rules, then each ``(...)`` in turn; a command runs when one of them allows
    the command, every key and every channel."""
    assert admin.execute_command("ACL", "SETUSER", "s", "on", ">pw", "+get", "~a*", "(+set", "~b*)",
                                 "(+get %R~c* &news* +publish)") == b"OK"
    user = admin.execute_command("ACL", "GETUSER", "s")
    info = dict(zip(user[::2], user[1::2], strict=True))
    assert (info[b"keys"], info[b"channels"]) == (b"~a*", b"")
    selectors = [dict(zip(s[::2], s[1::2], strict=True)) for s in info[b"selectors"]]
    assert [(s[b"keys"], s[b"channels"], sorted(s[b"commands"].split())) for s in selectors] == [
        (b"~b*", b"", [b"+set", b"-@all"]), (b"%R~c*", b"&news*", [b"+get", b"+publish", b"-@all"])]
    line = next(u for u in admin.acl_list() if u.startswith("user s "))
    assert "(~b* resetchannels -@all +set)" in _words(line)
    s = acl_server.client(username="s", password="pw")
    admin.mset({"a1": "1", "b1": "2", "c1": "3"})
    assert s.get("a1") == b"1" and s.get("c1") == b"3" and s.set("b1", "x")
    assert s.publish("news.eu", "m") == 0
    for call in (lambda: s.get("b1"), lambda: s.set("a1", "x"), lambda: s.set("c1", "x"),
                 lambda: s.mget("a1", "c1"), lambda: s.publish("other", "m")):
        _refused(call)
    with pytest.raises(redis.exceptions.NoPermissionError, match="run the 'del' command"):
        s.delete("b1")
    # Which refusal is logged: a channel over a key over the command, as Redis picks it.
    admin.acl_log_reset()
    for call in (lambda: s.publish("other", "m"), lambda: s.set("c1", "x"), lambda: s.delete("b1")):
        _refused(call)
    assert [(e["reason"], e["object"]) for e in admin.acl_log()][:3] == [
        ("command", "del"), ("key", "c1"), ("channel", "other")]
    dry = lambda *cmd: admin.execute_command("ACL", "DRYRUN", "s", *cmd)  # noqa: E731
    assert dry("PUBLISH", "other", "m") == b"This user has no permissions to access the 'other' channel"
    assert dry("SET", "c1", "x") == b"This user has no permissions to access the 'c1' key"
    assert dry("GET", "c1") == b"OK"
    # clearselectors (and reset) leave the root rules only.
    assert admin.execute_command("ACL", "SETUSER", "s", "clearselectors") == b"OK"
    with pytest.raises(redis.exceptions.NoPermissionError, match="run the 'set' command"):
        s.set("b1", "y")
    assert s.get("a1") == b"1"
    s.close()


def test_selector_rules_errors(admin):
    def refused(*rules: str) -> str:
        with pytest.raises(redis.ResponseError) as exc:
            admin.execute_command("ACL", "SETUSER", "e", *rules)
        return str(exc.value)

    assert refused("on", "(+get", "~x") == "Unmatched parenthesis in acl selector starting at '(+get'."
    assert refused("(+get ~x) extra)") == "Error in ACL SETUSER modifier '(+get ~x) extra)': Syntax error"
    assert refused("(nosuchrule)") == "Error in ACL SETUSER modifier '(nosuchrule)': Syntax error"
    assert refused("(+nosuch)") == ("Error in ACL SETUSER modifier '(+nosuch)': Unknown command or category "
                                    "name in ACL")
    assert refused("(~* ~a)").startswith("Error in ACL SETUSER modifier '(~* ~a)': Adding a pattern after the *")
    assert admin.execute_command("ACL", "GETUSER", "e") is None  # nothing was created
    assert admin.execute_command("ACL", "SETUSER", "e", "()", "(+@all ~*)") == b"OK"
    user = admin.execute_command("ACL", "GETUSER", "e")
    assert len(dict(zip(user[::2], user[1::2], strict=True))[b"selectors"]) == 2


def test_a_subscriber_keeps_a_channel_a_selector_allows(acl_server, admin):
    admin.execute_command("ACL", "SETUSER", "sub", "on", ">pw", "+@all", "~*", "(+subscribe &feed)")
    conn = acl_server.raw()
    assert conn.cmd("AUTH", "sub", "pw") == "OK"
    assert conn.cmd("SUBSCRIBE", "feed") == [b"subscribe", b"feed", 1]
    assert admin.publish("feed", "m") == 1
    admin.execute_command("ACL", "SETUSER", "sub", "clearselectors")  # the only rule allowing it goes
    conn.read_until_closed(timeout=10)
    conn.close()


@pytest.mark.kvstrata_only
def test_selectors_and_permissions_survive_acl_save_and_load(make_server, tmp_path):
    path = tmp_path / "users.acl"
    path.write_text("user default on nopass ~* &* +@all\n"
                    "user t on nopass %R~r:* +get (+set %W~w:* ~x:*) (&ch* +publish)\n")
    srv = make_server({"aclfile": path})
    admin = srv.client()
    t = srv.client(username="t", password="any")
    assert t.set("w:1", "v") and _refused(lambda: t.get("w:1")) == NOPERM_KEY
    assert admin.execute_command("ACL", "SAVE") == b"OK"
    before = admin.execute_command("ACL", "LIST")
    assert "(%W~w:* ~x:* resetchannels -@all +set)" in path.read_text()
    assert admin.execute_command("ACL", "LOAD") == b"OK"
    assert admin.execute_command("ACL", "LIST") == before
    path.write_text("user t on nopass (+get ~a*\n")
    with pytest.raises(redis.ResponseError, match="Unmatched parenthesis in selector definition"):
        admin.execute_command("ACL", "LOAD")
    assert admin.execute_command("ACL", "LIST") == before


def test_a_refused_channel_is_refused_when_queued(acl_server, admin, resp):
    admin.execute_command("ACL", "SETUSER", "m", "on", ">pw", "+@all", "~*", "resetchannels", "&ok")
    conn = acl_server.raw()
    assert conn.cmd("AUTH", "m", "pw") == "OK"
    assert conn.cmd("MULTI") == "OK"
    assert conn.cmd("PUBLISH", "no", "x") == resp.Error(
        "NOPERM this user has no permissions to access one of the channels used as arguments")
    assert conn.cmd("PUBLISH", "ok", "x") == "QUEUED"
    assert conn.cmd("EXEC") == resp.Error("EXECABORT Transaction discarded because of previous errors.")
    assert conn.cmd("PUBLISH", "ok", "x") == 0
    conn.close()


def test_a_user_of_twenty_thousand_rules(acl_server, admin):
    """Rules are indexed once, when a key is next checked, and a channel given again is found at once: a user of
    20,000 key patterns and 20,000 channels is made (and changed) within the client's usual reply timeout (it
    took minutes when every rule rebuilt the index)."""
    keys = [f"~p{i}:*" for i in range(20000)]
    channels = [f"&c{i}" for i in range(20000)]
    assert admin.execute_command("ACL", "SETUSER", "big", "on", ">pw", "+@all", *keys, *channels) == b"OK"
    assert admin.execute_command("ACL", "SETUSER", "big", "%R~extra:*") == b"OK"
    big = acl_server.client(username="big", password="pw")
    assert big.set("p19999:k", "v") and big.get("p0:k") is None
    assert _refused(lambda: big.set("extra:k", "v")) == NOPERM_KEY
    assert big.publish("c19999", "m") == 0
    big.close()


def test_acl_pubsub_default(acl_server, admin):
    """acl-pubsub-default: the channels a new user, a new selector and ``reset`` start with (Redis 7: none)."""
    assert admin.config_get("acl-pubsub-default") == {"acl-pubsub-default": "resetchannels"}

    def channels(name: str) -> list[bytes]:
        user = admin.execute_command("ACL", "GETUSER", name)
        info = dict(zip(user[::2], user[1::2], strict=True))
        return [info[b"channels"]] + [dict(zip(s[::2], s[1::2], strict=True))[b"channels"]
                                      for s in info[b"selectors"]]

    try:
        admin.execute_command("ACL", "SETUSER", "before", "on", "(+get)")
        assert admin.config_set("acl-pubsub-default", "allchannels")
        admin.execute_command("ACL", "SETUSER", "after", "on", ">pw", "+publish", "(+get)")
        admin.execute_command("ACL", "SETUSER", "before", "(+set)")
        assert channels("before") == [b"", b"", b"&*"]  # only what was made after the change
        assert channels("after") == [b"&*", b"&*"]
        assert acl_server.client(username="after", password="pw").publish("any", "m") == 0
        admin.execute_command("ACL", "SETUSER", "before", "reset")
        assert channels("before") == [b"&*"]
        with pytest.raises(redis.ResponseError) as exc:
            admin.config_set("acl-pubsub-default", "some")
        assert str(exc.value) == ("CONFIG SET failed (possibly related to argument 'acl-pubsub-default') - "
                                  "argument(s) must be one of the following: allchannels, resetchannels")
    finally:
        admin.config_set("acl-pubsub-default", "resetchannels")


def test_exec_checks_each_command_again(acl_server, admin, resp):
    """As Redis: a command queued while its user could run it is refused at EXEC when ACL SETUSER took the right
    away in between (the command, a key, a channel), with Redis's text, logged with context multi; the rest
    of the transaction runs."""
    admin.execute_command("ACL", "SETUSER", "t", "on", ">pw", "+@all", "~*", "&*")
    conn = acl_server.raw()
    assert conn.cmd("AUTH", "t", "pw") == "OK"
    assert conn.cmd("MULTI") == "OK"
    for cmd in (("SET", "gone", "v"), ("GET", "secret:1"), ("PUBLISH", "news", "m"), ("SET", "secret:2", "v"),
                ("SET", "kept", "v")):
        assert conn.cmd(*cmd) == "QUEUED"
    admin.execute_command("ACL", "SETUSER", "t", "resetkeys", "~gone", "~kept", "resetchannels", "-get")
    admin.acl_log_reset()
    prefix = ("NOPERM ACLs rules changed between the moment the transaction was accumulated and the EXEC call. "
              "This command is no longer allowed for the following reason: ")
    assert conn.cmd("EXEC") == ["OK", resp.Error(prefix + "no permission to execute the command or subcommand"),
                                resp.Error(prefix + "no permission to access one of the channels used as arguments"),
                                resp.Error(prefix + "no permission to touch the specified keys"), "OK"]
    assert admin.get("gone") == b"v" and admin.get("kept") == b"v" and admin.get("secret:2") is None
    log = admin.acl_log()
    assert [(e["reason"], e["context"], e["object"]) for e in log] == [
        ("key", "multi", "secret:2"), ("channel", "multi", "news"), ("command", "multi", "get")]
    conn.close()
