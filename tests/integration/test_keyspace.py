"""Keyspace commands: DEL EXISTS expiry TYPE KEYS SCAN RENAME DBSIZE FLUSH*, checked against Redis 7."""

import time

import pytest

NOT_INT = "ERR value is not an integer or out of range"
SYNTAX = "ERR syntax error"
FAR_FUTURE_S = 4102444800  # 2100-01-01T00:00:00Z
FAR_FUTURE_MS = FAR_FUTURE_S * 1000
INT64_MAX = 2**63 - 1


def arity(cmd):
    return f"ERR wrong number of arguments for '{cmd}' command"


def wait_until_gone(r, key, timeout=5.0):
    """Poll (with a deadline) until ``key`` has expired; returns True when it has."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if r.exists(key) == 0:
            return True
        time.sleep(0.01)  # poll interval
    return False


# --------------------------------------------------------------------------------------------------------------
# DEL / UNLINK / EXISTS / TOUCH
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", ["DEL", "UNLINK"])
def test_del_unlink(r, expect_error, cmd):
    r.mset({"a": "1", "b": "2", "c": "3"})
    assert r.execute_command(cmd, "a") == 1
    assert r.execute_command(cmd, "a") == 0
    assert r.execute_command(cmd, "b", "b", "c", "nope") == 2
    assert r.dbsize() == 0
    with expect_error(arity(cmd.lower())):
        r.execute_command(cmd)


def test_exists_counts_duplicates(r, expect_error):
    r.set("a", "1")
    r.set("b", "")
    assert r.exists("a") == 1
    assert r.exists("nope") == 0
    assert r.exists("a", "a", "a") == 3
    assert r.exists("a", "b", "nope", "a") == 3
    with expect_error(arity("exists")):
        r.execute_command("EXISTS")


def test_touch(r, expect_error):
    r.mset({"a": "1", "b": "2"})
    assert r.touch("a", "b", "nope") == 2
    assert r.touch("a", "a") == 2
    assert r.touch("nope") == 0
    with expect_error(arity("touch")):
        r.execute_command("TOUCH")


# --------------------------------------------------------------------------------------------------------------
# TTL / PTTL / EXPIRE family
# --------------------------------------------------------------------------------------------------------------


def test_ttl_pttl_missing_and_persistent(r, raw):
    assert r.ttl("nope") == -2
    assert r.pttl("nope") == -2
    r.set("k", "v")
    assert r.ttl("k") == -1
    assert r.pttl("k") == -1
    c = raw()
    assert c.cmd_raw("TTL", "nope") == b":-2\r\n"
    assert c.cmd_raw("PTTL", "k") == b":-1\r\n"


def test_expire_and_pexpire(r, raw):
    r.set("k", "v")
    assert r.expire("k", 100) is True
    assert 99 <= r.ttl("k") <= 100
    assert 99_000 < r.pttl("k") <= 100_000
    assert r.pexpire("k", 50_000) is True
    assert 49 <= r.ttl("k") <= 50
    assert r.expire("nope", 100) is False
    assert raw().cmd_raw("EXPIRE", "k", "100") == b":1\r\n"
    assert raw().cmd_raw("PEXPIRE", "nope", "100") == b":0\r\n"


def test_expireat_and_pexpireat(r):
    r.set("k", "v")
    assert r.expireat("k", FAR_FUTURE_S) is True
    assert r.expiretime("k") == FAR_FUTURE_S
    assert r.pexpiretime("k") == FAR_FUTURE_MS
    assert r.pexpireat("k", FAR_FUTURE_MS + 1234) is True
    assert r.pexpiretime("k") == FAR_FUTURE_MS + 1234
    assert r.expireat("nope", FAR_FUTURE_S) is False
    assert r.pexpireat("nope", FAR_FUTURE_MS) is False


def test_expiretime_rounds_to_nearest_second(r):
    r.set("k", "v")
    r.pexpireat("k", FAR_FUTURE_MS + 499)
    assert r.expiretime("k") == FAR_FUTURE_S
    r.pexpireat("k", FAR_FUTURE_MS + 500)
    assert r.expiretime("k") == FAR_FUTURE_S + 1


def test_expiretime_missing_and_persistent(r, expect_error):
    assert r.expiretime("nope") == -2
    assert r.pexpiretime("nope") == -2
    r.set("k", "v")
    assert r.expiretime("k") == -1
    assert r.pexpiretime("k") == -1
    with expect_error(arity("expiretime")):
        r.execute_command("EXPIRETIME")


@pytest.mark.parametrize(
    "cmd,arg",
    [("PEXPIREAT", "1"), ("EXPIREAT", "1"), ("EXPIRE", "0"), ("EXPIRE", "-10"), ("PEXPIRE", "-1"),
     ("PEXPIREAT", "0")],
)
def test_expire_in_the_past_deletes_immediately(r, cmd, arg):
    r.set("k", "v")
    assert r.execute_command(cmd, "k", arg) == 1
    assert r.exists("k") == 0
    assert r.get("k") is None
    assert r.ttl("k") == -2
    assert r.dbsize() == 0


def test_pexpireat_now_minus_one(r):
    r.set("k", "v")
    assert r.pexpireat("k", int(time.time() * 1000) - 1) is True
    assert r.exists("k") == 0


def test_short_ttl_expires(r):
    r.set("k", "v", px=100)
    r.set("keep", "v")
    assert wait_until_gone(r, "k"), "key with PX 100 still exists after 5 s"
    assert r.get("k") is None
    assert r.ttl("k") == -2
    assert r.get("keep") == b"v"


def test_expired_key_not_listed(r, raw):
    r.set("untouched", "v", px=100)
    r.set("k", "v", px=100)
    r.set("keep", "v")
    assert wait_until_gone(r, "k")
    # "untouched" expired no later than "k"; whether or not it was deleted yet, nothing may show it.
    assert r.keys("*") == [b"keep"]
    assert raw().cmd("SCAN", "0", "COUNT", "100") == [b"0", [b"keep"]]
    assert r.get("untouched") is None
    assert r.dbsize() == 1


def test_expire_nx_xx_gt_lt(r):
    r.set("k", "v")
    # No TTL yet: XX and GT fail (no TTL counts as infinite), LT and NX succeed.
    assert r.expire("k", 100, xx=True) is False
    assert r.expire("k", 100, gt=True) is False
    assert r.ttl("k") == -1
    assert r.expire("k", 100, nx=True) is True
    assert r.expire("k", 200, nx=True) is False
    assert 99 <= r.ttl("k") <= 100
    assert r.expire("k", 50, gt=True) is False
    assert r.expire("k", 500, gt=True) is True
    assert 499 <= r.ttl("k") <= 500
    assert r.expire("k", 1000, lt=True) is False
    assert r.expire("k", 50, lt=True) is True
    assert r.expire("k", 70, xx=True) is True
    assert 69 <= r.ttl("k") <= 70
    assert r.persist("k") is True
    assert r.expire("k", 50, lt=True) is True
    assert r.expire("nope", 10, nx=True) is False


def test_pexpireat_options(r):
    r.set("k", "v")
    assert r.pexpireat("k", FAR_FUTURE_MS, xx=True) is False
    assert r.pexpireat("k", FAR_FUTURE_MS, nx=True) is True
    assert r.pexpireat("k", FAR_FUTURE_MS - 1, gt=True) is False
    assert r.pexpireat("k", FAR_FUTURE_MS + 1, gt=True) is True
    assert r.expireat("k", FAR_FUTURE_S + 10, lt=True) is False
    assert r.expireat("k", FAR_FUTURE_S - 10, lt=True) is True
    assert r.expiretime("k") == FAR_FUTURE_S - 10


@pytest.mark.parametrize("cmd", ["EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT"])
def test_expire_option_errors(r, expect_error, cmd):
    r.set("k", "v")
    arg = "100" if "AT" not in cmd else str(FAR_FUTURE_S)
    for opts in (["NX", "XX"], ["NX", "GT"], ["NX", "LT"], ["XX", "NX"]):
        with expect_error("ERR NX and XX, GT or LT options at the same time are not compatible"):
            r.execute_command(cmd, "k", arg, *opts)
    with expect_error("ERR GT and LT options at the same time are not compatible"):
        r.execute_command(cmd, "k", arg, "GT", "LT")
    with expect_error("ERR Unsupported option foo"):
        r.execute_command(cmd, "k", arg, "foo")
    with expect_error(NOT_INT):
        r.execute_command(cmd, "k", "soon")
    with expect_error(NOT_INT):
        r.execute_command(cmd, "k", "1.5")
    with expect_error(arity(cmd.lower())):
        r.execute_command(cmd, "k")
    with expect_error("ERR Unsupported option foo"):  # the options are checked before the time
        r.execute_command(cmd, "k", "soon", "foo")
    with expect_error("ERR NX and XX, GT or LT options at the same time are not compatible"):
        r.execute_command(cmd, "k", "soon", "NX", "XX")
    # the option's bytes as a C string (up to a NUL); line ends trimmed from the ends, spaces inside
    with expect_error("ERR Unsupported option a  b"):
        r.execute_command(cmd, "k", arg, b"a\r\nb\r\n")
    with expect_error("ERR Unsupported option ab"):
        r.execute_command(cmd, "k", arg, b"ab\x00cd")
    assert r.ttl("k") == -1


@pytest.mark.parametrize("cmd", ["PEXPIRE", "PEXPIREAT"])
def test_pexpire_at_the_lowest_64_bit_time(r, cmd):
    """Milliseconds have no lower bound: the lowest 64-bit time is in the past (0 for a missing key, else a
    delete), not an error."""
    low = str(-(2**63))
    assert r.execute_command(cmd, "missing", low) == 0
    r.set("k", "v")
    assert r.execute_command(cmd, "k", low) == 1
    assert r.exists("k") == 0


@pytest.mark.parametrize(
    "cmd,arg",
    [("EXPIRE", str(INT64_MAX)), ("EXPIRE", str(INT64_MAX // 10)), ("PEXPIRE", str(INT64_MAX)),
     ("EXPIREAT", str(INT64_MAX)), ("EXPIRE", str(-(2**63)))],
)
def test_expire_overflow(r, expect_error, cmd, arg):
    r.set("k", "v")
    with expect_error(f"ERR invalid expire time in '{cmd.lower()}' command"):
        r.execute_command(cmd, "k", arg)
    assert r.ttl("k") == -1


def test_persist(r, expect_error):
    assert r.persist("nope") is False
    r.set("k", "v")
    assert r.persist("k") is False
    r.expire("k", 100)
    assert r.persist("k") is True
    assert r.ttl("k") == -1
    assert r.get("k") == b"v"
    with expect_error(arity("persist")):
        r.execute_command("PERSIST")


def test_type(r, raw, expect_error):
    r.set("s", "v")
    assert r.type("s") == b"string"
    assert r.type("nope") == b"none"
    c = raw()
    assert c.cmd_raw("TYPE", "s") == b"+string\r\n"
    assert c.cmd_raw("TYPE", "nope") == b"+none\r\n"
    with expect_error(arity("type")):
        r.execute_command("TYPE")


# --------------------------------------------------------------------------------------------------------------
# KEYS
# --------------------------------------------------------------------------------------------------------------

KEY_SET = [b"a", b"b", b"c", b"d", b"ab", b"axb", b"a*b", b"a?b", b"hello", b"hallo", b"hbllo", b"h[llo",
           b"hxllo", b"foo:1", b"foo:2", b"foo:10", b"bar"]


@pytest.mark.parametrize(
    "pattern,expected",
    [
        ("*", KEY_SET),
        ("nomatch*", []),
        ("a", [b"a"]),
        ("?", [b"a", b"b", b"c", b"d"]),
        ("a?b", [b"axb", b"a*b", b"a?b"]),
        ("a*b", [b"ab", b"axb", b"a*b", b"a?b"]),
        ("a\\*b", [b"a*b"]),
        ("a\\?b", [b"a?b"]),
        ("[a-c]", [b"a", b"b", b"c"]),
        ("[c-a]", [b"a", b"b", b"c"]),
        ("[abd]", [b"a", b"b", b"d"]),
        ("h[ae]llo", [b"hello", b"hallo"]),
        ("h[^e]llo", [b"hallo", b"hbllo", b"h[llo", b"hxllo"]),
        ("h[a-b]llo", [b"hallo", b"hbllo"]),
        ("h\\[llo", [b"h[llo"]),
        ("foo:*", [b"foo:1", b"foo:2", b"foo:10"]),
        ("foo:?", [b"foo:1", b"foo:2"]),
        ("*o", [b"hello", b"hallo", b"hbllo", b"h[llo", b"hxllo"]),
        ("*:1*", [b"foo:1", b"foo:10"]),
        ("A", []),
    ],
)
def test_keys_glob(r, pattern, expected):
    r.mset({k: b"1" for k in KEY_SET})
    assert sorted(r.keys(pattern)) == sorted(expected)


def test_keys_bang_is_not_negation(r):
    # Redis' glob negates a class with '^' only; '!' is an ordinary member of the class.
    r.mset({"hello": 1, "hallo": 1, "h!llo": 1})
    assert sorted(r.keys("h[!e]llo")) == [b"h!llo", b"hello"]


def test_keys_empty_and_errors(r, raw, expect_error):
    assert r.keys("*") == []
    assert raw().cmd_raw("KEYS", "*") == b"*0\r\n"
    with expect_error(arity("keys")):
        r.execute_command("KEYS")
    with expect_error(arity("keys")):
        r.execute_command("KEYS", "a", "b")


# --------------------------------------------------------------------------------------------------------------
# SCAN
# --------------------------------------------------------------------------------------------------------------


def full_scan(conn, *args):
    """Iterate SCAN on a raw connection until the cursor is back to "0"; returns (keys seen, calls)."""
    cursor = b"0"
    seen = []
    calls = 0
    while True:
        reply = conn.cmd("SCAN", cursor, *args)
        assert isinstance(reply, list) and len(reply) == 2, reply
        cursor, keys = reply
        assert isinstance(cursor, bytes) and cursor.isdigit(), cursor
        assert all(isinstance(k, bytes) for k in keys)
        seen.extend(keys)
        calls += 1
        assert calls < 100_000
        if cursor == b"0":
            return seen, calls


def test_scan_full_iteration(r, raw):
    keys = {f"key:{i}".encode() for i in range(1000)}
    r.mset({k: b"v" for k in keys})
    seen, calls = full_scan(raw(), "COUNT", "10")
    assert set(seen) == keys  # every key at least once, nothing else
    assert calls > 1


def test_scan_default_count(r, raw):
    keys = {f"k{i}".encode() for i in range(100)}
    r.mset({k: b"v" for k in keys})
    seen, _ = full_scan(raw())
    assert set(seen) == keys


def test_scan_match(r, raw):
    r.mset({f"user:{i}": "1" for i in range(200)})
    r.mset({f"item:{i}": "1" for i in range(200)})
    seen, _ = full_scan(raw(), "MATCH", "user:1*", "COUNT", "20")
    expected = {f"user:{i}".encode() for i in range(200) if str(i).startswith("1")}
    assert set(seen) == expected


def test_scan_type(r, raw):
    r.mset({f"s{i}": "1" for i in range(50)})
    seen, _ = full_scan(raw(), "TYPE", "string")
    assert set(seen) == {f"s{i}".encode() for i in range(50)}
    seen, _ = full_scan(raw(), "TYPE", "list")
    assert seen == []
    seen, _ = full_scan(raw(), "MATCH", "s1*", "TYPE", "string", "COUNT", "5")
    assert set(seen) == {b"s1"} | {f"s{i}".encode() for i in range(10, 20)}


def test_scan_empty_db(r, raw):
    assert r.scan(0) == (0, [])
    assert raw().cmd_raw("SCAN", "0") == b"*2\r\n$1\r\n0\r\n*0\r\n"


@pytest.mark.parametrize("cursor", ["", "+5", "-0", "-1", "-18446744073709551615", "18446744073709551615"])
def test_scan_cursor_as_strtoul(r, cursor):
    """Redis reads the cursor with strtoul: a sign is taken (a minus wraps around 2**64), "" is 0."""
    r.set("k", "v")
    next_cursor, keys = r.execute_command("SCAN", cursor)
    assert isinstance(next_cursor, int) and next_cursor >= 0 and isinstance(keys, list)


def test_scan_redis_py_iter(r):
    keys = {f"x{i}".encode() for i in range(300)}
    r.mset({k: b"v" for k in keys})
    assert set(r.scan_iter(count=7)) == keys
    assert set(r.scan_iter(match="x1?")) == {f"x1{i}".encode() for i in range(10)}


@pytest.mark.parametrize(
    "args,error",
    [
        (["abc"], "ERR invalid cursor"),
        (["1.5"], "ERR invalid cursor"),
        (["18446744073709551616"], "ERR invalid cursor"),
        (["-18446744073709551616"], "ERR invalid cursor"),
        (["+"], "ERR invalid cursor"),
        (["0x10"], "ERR invalid cursor"),
        ([" 1"], "ERR invalid cursor"),
        (["0", "COUNT", "0"], SYNTAX),
        (["0", "COUNT", "-1"], SYNTAX),
        (["0", "COUNT", "abc"], NOT_INT),
        (["0", "MATCH"], SYNTAX),
        (["0", "COUNT"], SYNTAX),
        (["0", "FOO", "bar"], SYNTAX),
        ([], arity("scan")),
    ],
)
def test_scan_errors(r, expect_error, args, error):
    r.set("k", "v")
    with expect_error(error):
        r.execute_command("SCAN", *args)


# --------------------------------------------------------------------------------------------------------------
# RANDOMKEY / RENAME / RENAMENX / DBSIZE / FLUSH*
# --------------------------------------------------------------------------------------------------------------


def test_randomkey(r, raw, expect_error):
    assert r.randomkey() is None
    assert raw().cmd_raw("RANDOMKEY") == b"$-1\r\n"
    r.set("only", "1")
    assert r.randomkey() == b"only"
    r.mset({"a": 1, "b": 2, "c": 3})
    for _ in range(20):
        assert r.randomkey() in {b"only", b"a", b"b", b"c"}
    with expect_error(arity("randomkey")):
        r.execute_command("RANDOMKEY", "x")


def test_rename(r, raw):
    r.set("a", "1", ex=100)
    assert r.rename("a", "b") is True
    assert r.exists("a") == 0
    assert r.get("b") == b"1"
    assert 99 <= r.ttl("b") <= 100  # the TTL moves with the value
    r.set("c", "3")
    assert raw().cmd_raw("RENAME", "c", "b") == b"+OK\r\n"
    assert r.get("b") == b"3"
    assert r.ttl("b") == -1
    assert r.rename("b", "b") is True
    assert r.get("b") == b"3"


def test_rename_errors(r, expect_error):
    with expect_error("ERR no such key"):
        r.rename("nope", "x")
    with expect_error("ERR no such key"):
        r.renamenx("nope", "x")
    with expect_error("ERR no such key"):
        r.rename("nope", "nope")
    with expect_error(arity("rename")):
        r.execute_command("RENAME", "a")
    with expect_error(arity("renamenx")):
        r.execute_command("RENAMENX", "a", "b", "c")


def test_renamenx(r):
    r.mset({"a": "1", "b": "2"})
    assert r.renamenx("a", "b") is False
    assert r.get("a") == b"1"
    assert r.renamenx("a", "c") is True
    assert r.exists("a") == 0
    assert r.get("c") == b"1"
    assert r.renamenx("c", "c") is False
    assert r.execute_command("RENAMENX", "c", "d") == 1


def test_dbsize(r, raw, expect_error):
    assert r.dbsize() == 0
    r.mset({f"k{i}": i for i in range(25)})
    assert r.dbsize() == 25
    r.delete("k0")
    assert r.dbsize() == 24
    assert raw().cmd_raw("DBSIZE") == b":24\r\n"
    with expect_error(arity("dbsize")):
        r.execute_command("DBSIZE", "x")


@pytest.mark.parametrize("cmd", ["FLUSHDB", "FLUSHALL"])
@pytest.mark.parametrize("mode", [None, "SYNC", "ASYNC", "sync"])
def test_flush(r, raw, cmd, mode):
    r.mset({f"k{i}": i for i in range(50)})
    r.set("t", "v", ex=100)
    args = [cmd] if mode is None else [cmd, mode]
    assert raw().cmd_raw(*args) == b"+OK\r\n"
    assert r.dbsize() == 0
    assert r.keys("*") == []
    assert r.get("t") is None
    r.set("after", "1")
    assert r.get("after") == b"1"


@pytest.mark.parametrize("cmd", ["FLUSHDB", "FLUSHALL"])
def test_flush_errors(r, expect_error, cmd):
    r.set("k", "v")
    with expect_error(SYNTAX):
        r.execute_command(cmd, "foo")
    with expect_error(SYNTAX):
        r.execute_command(cmd, "SYNC", "ASYNC")
    assert r.get("k") == b"v"


def test_move_and_swapdb_with_one_database(r, expect_error):
    """MOVE and SWAPDB as Redis answers them with ``databases 1`` (the test servers' setting): database 0 is the
    only one, so a key moved to it is moved onto itself, and swapping it with itself changes nothing."""
    r.set("k", "v")
    for key in ("k", "missing"):
        with expect_error("ERR source and destination objects are the same"):
            r.execute_command("MOVE", key, 0)
        for db in (1, -1, 15):
            with expect_error("ERR DB index is out of range"):
                r.execute_command("MOVE", key, db)
    for db in ("x", "00", "99999999999999999999", "1.0"):
        with expect_error("ERR value is not an integer or out of range"):
            r.execute_command("MOVE", "k", db)
    for big in ("9999999999", "-2147483649"):
        for cmd in (("MOVE", "k", big), ("SELECT", big), ("COPY", "k", "k2", "DB", big)):
            with expect_error("ERR value is out of range, value must between -2147483648 and 2147483647"):
                r.execute_command(*cmd)
    assert r.execute_command("SWAPDB", 0, 0) is True
    for a, b, err in ((0, 1, "ERR DB index is out of range"), (1, 1, "ERR DB index is out of range"),
                      (0, -1, "ERR DB index is out of range"), ("x", 0, "ERR invalid first DB index"),
                      (9999999999, 0, "ERR invalid first DB index"), (0, "y", "ERR invalid second DB index"),
                      (1, "y", "ERR invalid second DB index"), (0, 9999999999, "ERR invalid second DB index")):
        with expect_error(err):
            r.execute_command("SWAPDB", a, b)
    assert r.get("k") == b"v" and r.exists("k2") == 0
