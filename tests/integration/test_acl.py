"""ACL: Redis's commands and texts (run against real Redis too), and tenant isolation by key patterns for the
KV-cache commands through redis-py and redis-cli."""

from __future__ import annotations

import hashlib

import pytest
import redis

NOPERM_KEY = "NOPERM this user has no permissions to access one of the keys used as arguments"
WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."


def test_setuser_getuser_list_users_whoami(acl_server, admin, expect_error):
    assert admin.execute_command("ACL", "SETUSER", "alice", "on", ">pa", "~app:*", "+get", "+set") == b"OK"
    user = admin.execute_command("ACL", "GETUSER", "alice")
    info = dict(zip(user[::2], user[1::2], strict=True))
    assert info[b"flags"] == [b"on"]
    assert info[b"passwords"] == [hashlib.sha256(b"pa").hexdigest().encode()]
    assert sorted(info[b"commands"].split()) == [b"+get", b"+set", b"-@all"]  # Redis may reorder the rules
    assert info[b"keys"] == b"~app:*"
    assert admin.execute_command("ACL", "GETUSER", "nobody") is None
    assert sorted(admin.execute_command("ACL", "USERS")) == [b"alice", b"default"]
    lines = admin.execute_command("ACL", "LIST")  # in name order
    assert lines[1] == b"user default on #" + hashlib.sha256(b"adminpw").hexdigest().encode() + b" ~* &* +@all"
    assert lines[0].startswith(b"user alice on #") and b" ~app:* resetchannels -@all +" in lines[0]
    alice = acl_server.client(username="alice", password="pa")
    try:
        assert alice.set("app:1", "v") and alice.get("app:1") == b"v"
        with expect_error(NOPERM_KEY):
            alice.get("other:1")
        with expect_error("NOPERM this user has no permissions to run the 'del' command"):
            alice.delete("app:1")
        with expect_error("NOPERM this user has no permissions to run the 'acl|whoami' command"):
            alice.execute_command("ACL", "WHOAMI")
    finally:
        alice.close()
    assert admin.execute_command("ACL", "WHOAMI") == b"default"
    with expect_error("ERR Error in ACL SETUSER modifier '+nosuch': Unknown command or category name in ACL"):
        admin.execute_command("ACL", "SETUSER", "x", "+nosuch")
    with expect_error("ERR Error in ACL SETUSER modifier 'bogus': Syntax error"):
        admin.execute_command("ACL", "SETUSER", "x", "bogus")
    assert b"x" not in admin.execute_command("ACL", "USERS")  # a failed SETUSER creates nothing
    with expect_error("ERR The 'default' user cannot be removed"):
        admin.execute_command("ACL", "DELUSER", "default")


def test_names_patterns_and_errors_keep_their_bytes(acl_server, admin, expect_error):
    """Redis takes any user name without whitespace or NUL (UTF-8, other bytes) and answers with the bytes it was
    sent: ACL LIST, GETUSER, USERS, WHOAMI, LOG, and errors quoting them (one such error closed the connection)."""
    name, key = "jos\u00e9".encode(), b"k\xff"
    assert admin.execute_command("ACL", "SETUSER", name, "on", ">p\xff".encode("latin-1"), b"~k\xff*", "+get",
                                 "+acl|whoami") == b"OK"
    assert admin.execute_command("ACL", "SETUSER", b"\xfe\x01", "on") == b"OK"
    with expect_error("ERR Usernames can't contain spaces or null characters"):
        admin.execute_command("ACL", "SETUSER", b"a\x0bb", "on")
    assert sorted(admin.execute_command("ACL", "USERS")) == [b"default", name, b"\xfe\x01"]
    user = admin.execute_command("ACL", "GETUSER", name)
    assert dict(zip(user[::2], user[1::2], strict=True))[b"keys"] == b"~k\xff*"
    lines = admin.execute_command("ACL", "LIST")
    assert b"user \xfe\x01 on resetchannels -@all" in lines
    assert any(line.startswith(b"user " + name + b" on #") and b" ~k\xff* " in line for line in lines)
    assert admin.execute_command("ACL", "DRYRUN", name, "get", key + b"z") == b"OK"
    with expect_error("ERR Unknown category '\ufffd'"):  # redis-py decodes the byte 0xff so
        admin.execute_command("ACL", "CAT", b"\xff")
    with expect_error("ERR User '\ufffd' not found"):
        admin.execute_command("ACL", "DRYRUN", b"\xff", "get", "k")
    tenant = acl_server.client(username=name, password=b"p\xff")
    try:
        assert tenant.execute_command("ACL", "WHOAMI") == name
        assert tenant.get(key + b"z") is None
        with expect_error(NOPERM_KEY):
            tenant.get(b"o\xff")
    finally:
        tenant.close()
    entry = admin.execute_command("ACL", "LOG")[0]
    info = dict(zip(entry[::2], entry[1::2], strict=True))
    assert (info[b"object"], info[b"username"]) == (b"o\xff", name)
    assert admin.ping()


def test_auth_forms_on_off_nopass_resetpass(acl_server, admin, raw, resp):
    admin.execute_command("ACL", "SETUSER", "bob", "on", ">one", ">two", "allkeys", "+@all")
    c = raw(acl_server)
    assert c.cmd("AUTH", "bob", "one") == "OK"
    assert c.cmd("AUTH", "bob", "two") == "OK"
    assert c.cmd("AUTH", "bob", "nope") == resp.Error(WRONGPASS)
    assert c.cmd("ACL", "WHOAMI") == b"bob"  # a failed AUTH keeps the current user
    assert c.cmd("HELLO", "3", "AUTH", "bob", "two")[b"proto"] == 3
    admin.execute_command("ACL", "SETUSER", "bob", "<one")
    assert raw(acl_server).cmd("AUTH", "bob", "one") == resp.Error(WRONGPASS)
    admin.execute_command("ACL", "SETUSER", "bob", "off")
    assert raw(acl_server).cmd("AUTH", "bob", "two") == resp.Error(WRONGPASS)
    admin.execute_command("ACL", "SETUSER", "bob", "on", "nopass")
    assert raw(acl_server).cmd("AUTH", "bob", "anything") == "OK"
    admin.execute_command("ACL", "SETUSER", "bob", "resetpass")
    assert raw(acl_server).cmd("AUTH", "bob", "anything") == resp.Error(WRONGPASS)
    entries = admin.execute_command("ACL", "LOG")
    auth_entries = [dict(zip(e[::2], e[1::2], strict=True)) for e in entries]
    assert any(e[b"reason"] == b"auth" and e[b"username"] == b"bob" for e in auth_entries)
    # Deleting a user closes its connections.
    admin.execute_command("ACL", "SETUSER", "carol", "on", ">c", "+@all", "~*")
    carol = acl_server.client(username="carol", password="c")
    assert carol.ping()
    assert admin.execute_command("ACL", "DELUSER", "carol", "nobody") == 1
    with pytest.raises(redis.ConnectionError):
        carol.ping()
    carol.close()


def test_requirepass_is_the_default_users_password(acl_server, admin, raw, resp):
    c = raw(acl_server)
    assert c.cmd("AUTH", "default", "adminpw") == "OK"
    admin.config_set("requirepass", "changed")
    try:
        assert raw(acl_server).cmd("AUTH", "adminpw") == resp.Error(WRONGPASS)
        assert raw(acl_server).cmd("AUTH", "changed") == "OK"
    finally:
        admin.config_set("requirepass", "adminpw")


def test_acl_cat_and_dryrun(admin, expect_error):
    cats = admin.execute_command("ACL", "CAT")
    for cat in (b"keyspace", b"read", b"write", b"string", b"admin", b"dangerous", b"fast", b"slow", b"connection"):
        assert cat in cats
    assert b"get" in admin.execute_command("ACL", "CAT", "read")
    assert b"flushall" in admin.execute_command("ACL", "CAT", "dangerous")
    admin.execute_command("ACL", "SETUSER", "dave", "on", "nopass", "~a:*", "+@all", "-@dangerous")
    assert admin.execute_command("ACL", "DRYRUN", "dave", "get", "a:1") == b"OK"
    assert admin.execute_command("ACL", "DRYRUN", "dave", "get", "b:1") == \
        b"This user has no permissions to access the 'b:1' key"
    assert admin.execute_command("ACL", "DRYRUN", "dave", "keys", "*") == \
        b"This user has no permissions to run the 'keys' command"


# --------------------------------------------------------------------------------------------------------------
# Tenant isolation (kvstrata: KEYS/SCAN filtered, TAIR.KV.* keys and patterns checked)
# --------------------------------------------------------------------------------------------------------------

TENANT_RULES = ("on", ">pa", "~kvs:tenantA:*", "+@all", "-@admin", "+keys")


@pytest.mark.kvstrata_only
def test_tenant_cannot_touch_another_tenants_keys(acl_server, admin, expect_error):
    admin.execute_command("ACL", "SETUSER", "tenantA", *TENANT_RULES)
    admin.execute_command("TAIR.KV.SETEX", "kvs:tenantA:c1", "0", "a-value")
    admin.execute_command("TAIR.KV.SETEX", "kvs:tenantB:c1", "0", "b-secret")
    a = acl_server.client(username="tenantA", password="pa")
    try:
        assert a.execute_command("TAIR.KV.MGET", "kvs:tenantA:c1", "WITHVERSIONS")[0][0] == b"a-value"
        assert a.execute_command("TAIR.KV.MGET", "kvs:tenantA:c1", "CONSISTENCY_LEVEL", "EVENTUAL") == [b"a-value"]
        denied = [
            ("GET", "kvs:tenantB:c1"), ("TAIR.KV.MGET", "kvs:tenantA:c1", "kvs:tenantB:c1"),
            ("TAIR.KV.PREFETCH", "kvs:tenantB:c1", "PRIORITY", "1"), ("TAIR.KV.VERSION", "kvs:tenantB:c1"),
            ("TAIR.KV.TIER", "kvs:tenantB:c1"), ("DEL", "kvs:tenantB:c1"), ("UNLINK", "kvs:tenantB:c1"),
            ("EXPIRE", "kvs:tenantB:c1", "1"), ("RENAME", "kvs:tenantA:c1", "kvs:tenantB:c2"),
            ("TAIR.KV.SETEX", "kvs:tenantB:c1", "60", "overwritten"), ("EXISTS", "kvs:tenantB:c1"),
            ("TAIR.KV.MARKHOT", "kvs:*"), ("TAIR.KV.MARKHOT", "*"), ("TAIR.KV.MARKHOT", "kvs:tenant?:*"),
            ("TAIR.KV.UNMARKHOT", "kvs:tenantB:*"), ("MEMORY", "USAGE", "kvs:tenantB:c1"), ("FLUSHALL",),
            ("FLUSHDB", "ASYNC"),
        ]
        for cmd in denied:
            with expect_error(NOPERM_KEY):
                a.execute_command(*cmd)
        with expect_error("NOPERM this user has no permissions to run the 'memory|stats' command"):
            a.execute_command("MEMORY", "STATS")  # it shows every tenant's key prefixes
        with expect_error("NOPERM this user has no permissions to run the 'slowlog|get' command"):
            a.execute_command("SLOWLOG", "GET")  # it shows every tenant's commands
        assert a.keys("*") == [b"kvs:tenantA:c1"]
        cursor, seen = 0, []
        while True:
            cursor, found = a.scan(cursor, match="kvs:*", count=100)
            seen += found
            if cursor == 0:
                break
        assert seen == [b"kvs:tenantA:c1"]
        assert a.randomkey() in (None, b"kvs:tenantA:c1")
        assert a.execute_command("TAIR.KV.MARKHOT", "kvs:tenantA:*") == 1
        assert a.execute_command("TAIR.KV.PREFETCH", "kvs:tenantA:c1") >= 0
        assert admin.execute_command("TAIR.KV.MGET", "kvs:tenantB:c1") == [b"b-secret"]  # untouched
    finally:
        a.close()
    log = [dict(zip(e[::2], e[1::2], strict=True)) for e in admin.execute_command("ACL", "LOG", "50")]
    assert any(e[b"reason"] == b"key" and e[b"username"] == b"tenantA" for e in log)


@pytest.mark.kvstrata_only
def test_tenant_isolation_through_redis_cli(acl_server, admin, redis_cli):
    admin.execute_command("ACL", "SETUSER", "tenantA", *TENANT_RULES)
    admin.set("kvs:tenantA:x", "mine")
    admin.set("kvs:tenantB:x", "theirs")
    auth = ("--user", "tenantA", "--pass", "pa", "--no-auth-warning")
    assert redis_cli(acl_server.port, *auth, "GET", "kvs:tenantA:x").strip() == "mine"
    assert redis_cli(acl_server.port, *auth, "GET", "kvs:tenantB:x").strip() == NOPERM_KEY
    assert redis_cli(acl_server.port, *auth, "DEL", "kvs:tenantB:x").strip() == NOPERM_KEY
    assert redis_cli(acl_server.port, *auth, "TAIR.KV.MARKHOT", "kvs:tenantB:*").strip() == NOPERM_KEY
    assert redis_cli(acl_server.port, *auth, "KEYS", "*").split() == ["kvs:tenantA:x"]
    assert redis_cli(acl_server.port, *auth, "--scan").split() == ["kvs:tenantA:x"]
    assert admin.get("kvs:tenantB:x") == b"theirs"


@pytest.mark.kvstrata_only
def test_aclfile_load_and_save(make_server, tmp_path, raw, resp):
    path = tmp_path / "users.acl"
    digest = hashlib.sha256(b"tpw").hexdigest()
    path.write_text(f"user default on nopass ~* &* +@all\nuser tenant on #{digest} ~t:* +get +set\n")
    srv = make_server({"aclfile": path})
    c = raw(srv)
    assert c.cmd("AUTH", "tenant", "tpw") == "OK"
    assert c.cmd("GET", "u:1") == resp.Error(NOPERM_KEY)
    admin = srv.client()
    try:
        admin.execute_command("ACL", "SETUSER", "new", "on", ">np", "~n:*", "+get")
        admin.execute_command("ACL", "SETUSER", b"\xc3\xa9\xff", "on", b">p\xff", b"~\xff:*", "+get")
        assert admin.execute_command("ACL", "SAVE") == b"OK"
        before = admin.execute_command("ACL", "LIST")
        assert admin.execute_command("ACL", "LOAD") == b"OK"  # what SAVE wrote reads back the same
        assert admin.execute_command("ACL", "LIST") == before
        assert raw(srv).cmd("AUTH", b"\xc3\xa9\xff", b"p\xff") == "OK"
        text = path.read_bytes().decode("utf-8", "surrogateescape")  # user names may be any bytes
        assert "user new on #" in text and "np" not in text.replace("#", " ").split()
        path.write_text(f"user default on nopass ~* &* +@all\nuser tenant on #{digest} ~u:* +get\n")
        assert admin.execute_command("ACL", "LOAD") == b"OK"
        assert c.cmd("GET", "u:1") is None  # the connection follows its user's new rules
        assert raw(srv).cmd("AUTH", "new", "np") == resp.Error(WRONGPASS)
        path.write_text("user broken +nosuch\n")
        with pytest.raises(redis.ResponseError, match="nosuch"):
            admin.execute_command("ACL", "LOAD")
        assert c.cmd("GET", "u:1") is None  # a bad file changes nothing
    finally:
        admin.close()
