"""String commands: replies and error texts exactly as Redis 7 gives them."""

import time

import pytest

NOT_INT = "ERR value is not an integer or out of range"
NOT_FLOAT = "ERR value is not a valid float"
SYNTAX = "ERR syntax error"
OVERFLOW = "ERR increment or decrement would overflow"
NAN_INF = "ERR increment would produce NaN or Infinity"
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
FAR_FUTURE_S = 4102444800  # 2100-01-01T00:00:00Z


def arity(cmd):
    return f"ERR wrong number of arguments for '{cmd}' command"


def expire_err(cmd):
    return f"ERR invalid expire time in '{cmd}' command"


# --------------------------------------------------------------------------------------------------------------
# GET / SET
# --------------------------------------------------------------------------------------------------------------


def test_get_missing_is_nil(r):
    assert r.get("nope") is None


def test_set_get_roundtrip(r, raw):
    assert r.set("k", "v") is True
    assert r.get("k") == b"v"
    assert r.set("k", "v2") is True
    assert r.get("k") == b"v2"
    c = raw()
    assert c.cmd_raw("SET", "k", "v3") == b"+OK\r\n"
    assert c.cmd_raw("GET", "k") == b"$2\r\nv3\r\n"
    assert c.cmd_raw("GET", "missing") == b"$-1\r\n"


def test_set_binary_safe_and_empty(r):
    value = bytes(range(256)) + b"\r\n$3\r\n*1\r\n\x00"
    key = b"\x00k\xff\r\n y"
    assert r.set(key, value)
    assert r.get(key) == value
    assert r.set("empty", b"")
    assert r.get("empty") == b""
    assert r.exists("empty") == 1
    assert r.strlen("empty") == 0


def test_set_large_value(r):
    value = b"0123456789abcdef" * 65536  # 1 MiB
    assert r.set("big", value)
    assert r.get("big") == value
    assert r.strlen("big") == len(value)


def test_set_clears_existing_ttl(r):
    r.set("k", "v", ex=100)
    assert r.ttl("k") > 0
    r.set("k", "w")
    assert r.ttl("k") == -1


def test_set_ex_px(r):
    assert r.set("a", "1", ex=100)
    assert 99 <= r.ttl("a") <= 100
    assert 99_000 < r.pttl("a") <= 100_000
    assert r.set("b", "1", px=100_000)
    assert 99 <= r.ttl("b") <= 100
    assert 99_000 < r.pttl("b") <= 100_000


def test_set_exat_pxat(r):
    assert r.set("a", "1", exat=FAR_FUTURE_S)
    assert r.expiretime("a") == FAR_FUTURE_S
    assert r.set("b", "1", pxat=FAR_FUTURE_S * 1000 + 123)
    assert r.pexpiretime("b") == FAR_FUTURE_S * 1000 + 123


def test_set_exat_in_the_past_deletes(r):
    assert r.set("k", "v", exat=1) is True
    assert r.exists("k") == 0
    assert r.get("k") is None
    assert r.set("k", "v", pxat=int(time.time() * 1000) - 10_000) is True
    assert r.exists("k") == 0


def test_set_nx_xx(r):
    assert r.set("k", "1", xx=True) is None
    assert r.exists("k") == 0
    assert r.set("k", "1", nx=True) is True
    assert r.set("k", "2", nx=True) is None
    assert r.get("k") == b"1"
    assert r.set("k", "3", xx=True) is True
    assert r.get("k") == b"3"


def test_set_nx_xx_raw_replies(raw):
    c = raw()
    assert c.cmd_raw("SET", "k", "1", "NX") == b"+OK\r\n"
    assert c.cmd_raw("SET", "k", "1", "NX") == b"$-1\r\n"
    assert c.cmd_raw("SET", "k2", "1", "XX") == b"$-1\r\n"
    assert c.cmd_raw("SET", "k", "1", "xx", "ex", "10") == b"+OK\r\n"


def test_set_keepttl(r):
    r.set("k", "v", ex=100)
    assert r.set("k", "w", keepttl=True)
    assert r.get("k") == b"w"
    assert 99 <= r.ttl("k") <= 100
    assert r.set("p", "v", keepttl=True)
    assert r.ttl("p") == -1


def test_set_get_option(r):
    assert r.set("k", "1", get=True) is None
    assert r.get("k") == b"1"
    assert r.set("k", "2", get=True) == b"1"
    assert r.get("k") == b"2"
    # Redis 7: GET combines with NX/XX; the reply is the old value whether or not the write happened.
    assert r.set("k", "3", nx=True, get=True) == b"2"
    assert r.get("k") == b"2"
    assert r.set("k", "4", xx=True, get=True) == b"2"
    assert r.get("k") == b"4"
    assert r.set("new", "1", xx=True, get=True) is None
    assert r.exists("new") == 0
    assert r.set("k", "5", ex=100, get=True) == b"4"
    assert r.ttl("k") > 0


@pytest.mark.parametrize(
    "opts",
    [
        ["NX", "XX"],
        ["XX", "NX"],
        ["EX", "10", "PX", "10000"],
        ["EX", "10", "EXAT", str(FAR_FUTURE_S)],
        ["PX", "10", "PXAT", str(FAR_FUTURE_S)],
        ["KEEPTTL", "EX", "10"],
        ["PX", "10", "KEEPTTL"],
        ["EX"],
        ["PX"],
        ["EXAT"],
        ["PERSIST"],
        ["FOO"],
        ["EX", "10", "FOO"],
    ],
    ids=lambda o: "-".join(o),
)
def test_set_syntax_errors(r, expect_error, opts):
    r.set("k", "old")
    with expect_error(SYNTAX):
        r.execute_command("SET", "k", "v", *opts)
    assert r.get("k") == b"old"


@pytest.mark.parametrize(
    "opts",
    [
        ["EX", "0"],
        ["EX", "-1"],
        ["PX", "0"],
        ["PX", "-100"],
        ["EXAT", "0"],
        ["PXAT", "0"],
        ["EXAT", "-5"],
        ["EX", str(INT64_MAX)],
        ["PX", str(INT64_MAX)],
        ["EX", str(INT64_MAX // 1000)],
    ],
    ids=lambda o: "-".join(o),
)
def test_set_invalid_expire(r, expect_error, opts):
    with expect_error(expire_err("set")):
        r.execute_command("SET", "k", "v", *opts)
    assert r.exists("k") == 0


@pytest.mark.parametrize("value", ["abc", "1.5", "", "10x", str(2**63)])
def test_set_expire_not_integer(r, expect_error, value):
    with expect_error(NOT_INT):
        r.execute_command("SET", "k", "v", "EX", value)


def test_set_get_arity(r, expect_error):
    with expect_error(arity("set")):
        r.execute_command("SET")
    with expect_error(arity("set")):
        r.execute_command("SET", "k")
    with expect_error(arity("get")):
        r.execute_command("GET", "a", "b")
    with expect_error(arity("get")):
        r.execute_command("GET")


# --------------------------------------------------------------------------------------------------------------
# SETEX / PSETEX / SETNX / GETSET / GETDEL
# --------------------------------------------------------------------------------------------------------------


def test_setex_psetex(r, raw):
    assert r.execute_command("SETEX", "a", "100", "v") is True
    assert r.get("a") == b"v"
    assert 99 <= r.ttl("a") <= 100
    assert r.psetex("b", 100_000, "w") is True
    assert r.get("b") == b"w"
    assert 99_000 < r.pttl("b") <= 100_000
    assert raw().cmd_raw("SETEX", "c", "10", "x") == b"+OK\r\n"


@pytest.mark.parametrize("cmd", ["SETEX", "PSETEX"])
@pytest.mark.parametrize("ttl", ["0", "-1", str(INT64_MAX)])
def test_setex_invalid_expire(r, expect_error, cmd, ttl):
    with expect_error(expire_err(cmd.lower())):
        r.execute_command(cmd, "k", ttl, "v")
    assert r.exists("k") == 0


@pytest.mark.parametrize("cmd", ["SETEX", "PSETEX"])
def test_setex_errors(r, expect_error, cmd):
    with expect_error(NOT_INT):
        r.execute_command(cmd, "k", "abc", "v")
    with expect_error(arity(cmd.lower())):
        r.execute_command(cmd, "k", "10")
    with expect_error(arity(cmd.lower())):
        r.execute_command(cmd, "k", "10", "v", "extra")


def test_setnx(r, expect_error):
    assert r.setnx("k", "1") is True
    assert r.setnx("k", "2") is False
    assert r.get("k") == b"1"
    assert r.execute_command("SETNX", "j", "1") == 1
    with expect_error(arity("setnx")):
        r.execute_command("SETNX", "k")


def test_getset(r, expect_error):
    assert r.getset("k", "1") is None
    assert r.get("k") == b"1"
    r.expire("k", 100)
    assert r.getset("k", "2") == b"1"
    assert r.get("k") == b"2"
    assert r.ttl("k") == -1
    with expect_error(arity("getset")):
        r.execute_command("GETSET", "k")


def test_getdel(r, expect_error):
    r.set("k", "v")
    assert r.getdel("k") == b"v"
    assert r.exists("k") == 0
    assert r.getdel("k") is None
    with expect_error(arity("getdel")):
        r.execute_command("GETDEL", "a", "b")


# --------------------------------------------------------------------------------------------------------------
# GETEX
# --------------------------------------------------------------------------------------------------------------


def test_getex_without_options_keeps_ttl(r):
    r.set("k", "v", ex=100)
    assert r.getex("k") == b"v"
    assert 99 <= r.ttl("k") <= 100
    r.set("p", "v")
    assert r.getex("p") == b"v"
    assert r.ttl("p") == -1


def test_getex_options(r):
    r.set("k", "v")
    assert r.getex("k", ex=100) == b"v"
    assert 99 <= r.ttl("k") <= 100
    assert r.getex("k", px=200_000) == b"v"
    assert 199_000 < r.pttl("k") <= 200_000
    assert r.getex("k", exat=FAR_FUTURE_S) == b"v"
    assert r.expiretime("k") == FAR_FUTURE_S
    assert r.getex("k", pxat=FAR_FUTURE_S * 1000 + 7) == b"v"
    assert r.pexpiretime("k") == FAR_FUTURE_S * 1000 + 7
    assert r.getex("k", persist=True) == b"v"
    assert r.ttl("k") == -1


def test_getex_missing(r):
    assert r.getex("nope") is None
    assert r.getex("nope", ex=10) is None
    assert r.getex("nope", persist=True) is None
    assert r.exists("nope") == 0


def test_getex_past_time_deletes(r):
    r.set("k", "v")
    assert r.getex("k", exat=1) == b"v"
    assert r.exists("k") == 0


@pytest.mark.parametrize(
    "opts",
    [["PERSIST", "EX", "10"], ["EX", "10", "PX", "10"], ["EX"], ["FOO"], ["KEEPTTL"], ["EX", "10", "PERSIST"]],
    ids=lambda o: "-".join(o),
)
def test_getex_syntax_errors(r, expect_error, opts):
    r.set("k", "v")
    with expect_error(SYNTAX):
        r.execute_command("GETEX", "k", *opts)


@pytest.mark.parametrize("opts", [["EX", "0"], ["PX", "-1"], ["EXAT", "0"], ["PXAT", "0"], ["EX", str(INT64_MAX)]])
def test_getex_invalid_expire(r, expect_error, opts):
    r.set("k", "v")
    with expect_error(expire_err("getex")):
        r.execute_command("GETEX", "k", *opts)
    assert r.ttl("k") == -1
    assert r.execute_command("GETEX", "missing", *opts) is None  # as Redis: nil before the time is checked


def test_getex_not_integer(r, expect_error):
    r.set("k", "v")
    with expect_error(NOT_INT):
        r.execute_command("GETEX", "k", "EX", "ten")
    with expect_error(arity("getex")):
        r.execute_command("GETEX")


# --------------------------------------------------------------------------------------------------------------
# MGET / MSET / MSETNX
# --------------------------------------------------------------------------------------------------------------


def test_mget(r, raw, expect_error):
    r.set("a", "1")
    r.set("c", "3")
    assert r.mget("a", "b", "c", "a") == [b"1", None, b"3", b"1"]
    assert raw().cmd_raw("MGET", "a", "b") == b"*2\r\n$1\r\n1\r\n$-1\r\n"
    with expect_error(arity("mget")):
        r.execute_command("MGET")


def test_mset(r, raw, expect_error):
    assert r.mset({"a": "1", "b": "2"}) is True
    assert r.mget("a", "b") == [b"1", b"2"]
    r.expire("a", 100)
    assert raw().cmd_raw("MSET", "a", "x", "a", "y", "c", "z") == b"+OK\r\n"
    assert r.get("a") == b"y"
    assert r.ttl("a") == -1
    for args in (["a"], ["a", "1", "b"], []):
        with expect_error(arity("mset")):
            r.execute_command("MSET", *args)


def test_msetnx(r, expect_error):
    assert r.msetnx({"a": "1", "b": "2"}) is True
    assert r.msetnx({"b": "x", "c": "3"}) is False
    assert r.mget("a", "b", "c") == [b"1", b"2", None]
    assert r.execute_command("MSETNX", "c", "3", "d", "4") == 1
    assert r.execute_command("MSETNX", "c", "x") == 0
    for args in (["a"], ["a", "1", "b"]):
        with expect_error(arity("msetnx")):
            r.execute_command("MSETNX", *args)


# --------------------------------------------------------------------------------------------------------------
# APPEND / STRLEN / GETRANGE / SETRANGE
# --------------------------------------------------------------------------------------------------------------


def test_append(r, expect_error):
    assert r.append("k", "Hello") == 5
    assert r.append("k", " World") == 11
    assert r.get("k") == b"Hello World"
    assert r.append("k", "") == 11
    assert r.append("e", "") == 0
    assert r.exists("e") == 1
    r.set("t", "v", ex=100)
    r.append("t", "w")
    assert r.ttl("t") > 0
    with expect_error(arity("append")):
        r.execute_command("APPEND", "k")


def test_append_to_integer_value(r):
    r.set("n", 10)
    assert r.append("n", "5") == 3
    assert r.incr("n") == 106


def test_strlen(r, expect_error):
    assert r.strlen("nope") == 0
    r.set("k", "héllo")
    assert r.strlen("k") == 6
    r.set("n", 12345)
    assert r.strlen("n") == 5
    with expect_error(arity("strlen")):
        r.execute_command("STRLEN")


@pytest.mark.parametrize(
    "start,end,expected",
    [
        (0, 3, b"This"),
        (-3, -1, b"ing"),
        (0, -1, b"This is a string"),
        (10, 100, b"string"),
        (5, 2, b""),
        (-1, -5, b""),
        (100, 200, b""),
        (-100, 3, b"This"),
        (0, 0, b"T"),
        (-1, -1, b"g"),
    ],
)
def test_getrange(r, start, end, expected):
    r.set("k", "This is a string")
    assert r.getrange("k", start, end) == expected


def test_getrange_missing_and_errors(r, raw, expect_error):
    assert r.getrange("nope", 0, -1) == b""
    assert raw().cmd_raw("GETRANGE", "nope", "0", "10") == b"$0\r\n\r\n"
    r.set("k", "abc")
    with expect_error(NOT_INT):
        r.execute_command("GETRANGE", "k", "0", "x")
    with expect_error(NOT_INT):
        r.execute_command("GETRANGE", "k", "a", "1")
    with expect_error(arity("getrange")):
        r.execute_command("GETRANGE", "k", "0")


def test_setrange(r):
    r.set("k", "Hello World")
    assert r.setrange("k", 6, "Redis") == 11
    assert r.get("k") == b"Hello Redis"
    assert r.setrange("k", 11, "!!") == 13
    assert r.get("k") == b"Hello Redis!!"
    assert r.setrange("k", 0, "") == 13


def test_setrange_zero_padding(r):
    assert r.setrange("k", 5, "abc") == 8
    assert r.get("k") == b"\x00\x00\x00\x00\x00abc"
    r.set("s", "ab")
    assert r.setrange("s", 4, "z") == 5
    assert r.get("s") == b"ab\x00\x00z"


def test_setrange_empty_value_on_missing_key_creates_nothing(r):
    assert r.setrange("k", 10, "") == 0
    assert r.exists("k") == 0


def test_setrange_limits(r, expect_error):
    r.set("k", "abc")
    with expect_error("ERR offset is out of range"):
        r.setrange("k", -1, "x")
    # The largest offset: 512 MiB - 1 is accepted when nothing has to be written.
    assert r.setrange("k", 512 * 1024 * 1024 - 1, "") == 3
    assert r.setrange("nope", 512 * 1024 * 1024 - 1, "") == 0
    with expect_error("ERR string exceeds maximum allowed size (proto-max-bulk-len)"):
        r.setrange("k", 512 * 1024 * 1024, "x")
    with expect_error("ERR string exceeds maximum allowed size (proto-max-bulk-len)"):
        r.setrange("k", 512 * 1024 * 1024 - 1, "xy")
    with expect_error(NOT_INT):
        r.execute_command("SETRANGE", "k", "one", "x")
    with expect_error(arity("setrange")):
        r.execute_command("SETRANGE", "k", "1")
    assert r.get("k") == b"abc"


# --------------------------------------------------------------------------------------------------------------
# INCR / DECR / INCRBY / DECRBY
# --------------------------------------------------------------------------------------------------------------


def test_incr_decr(r, raw):
    assert r.incr("n") == 1
    assert r.incr("n") == 2
    assert r.decr("n") == 1
    assert r.decr("m") == -1
    assert r.incrby("n", 10) == 11
    assert r.decrby("n", 20) == -9
    assert r.incrby("n", -1) == -10
    assert r.decrby("n", -10) == 0
    assert r.get("n") == b"0"
    assert raw().cmd_raw("INCR", "n") == b":1\r\n"


def test_incr_parses_stored_string(r):
    r.set("n", "41")
    assert r.incr("n") == 42
    r.set("n", "-5")
    assert r.incrby("n", 5) == 0
    assert r.get("n") == b"0"


def test_incr_keeps_ttl(r):
    r.set("n", 1, ex=100)
    r.incr("n")
    assert r.ttl("n") > 0


@pytest.mark.parametrize("value", ["abc", "1.5", "", " 1", "1 ", "01", "+1", "0x10", "1e3", str(2**63), "-0"])
def test_incr_not_an_integer_value(r, expect_error, value):
    r.set("n", value)
    for cmd, args in (("INCR", []), ("DECR", []), ("INCRBY", ["1"]), ("DECRBY", ["1"])):
        with expect_error(NOT_INT):
            r.execute_command(cmd, "n", *args)
    assert r.get("n") == value.encode()


@pytest.mark.parametrize("arg", ["abc", "1.5", "", " 5", "+5", str(2**63), "99999999999999999999"])
def test_incrby_not_an_integer_argument(r, expect_error, arg):
    r.set("n", "1")
    with expect_error(NOT_INT):
        r.execute_command("INCRBY", "n", arg)
    with expect_error(NOT_INT):
        r.execute_command("DECRBY", "n", arg)
    assert r.get("n") == b"1"


def test_incr_overflow(r, expect_error):
    r.set("n", INT64_MAX)
    with expect_error(OVERFLOW):
        r.incr("n")
    with expect_error(OVERFLOW):
        r.incrby("n", 1)
    with expect_error(OVERFLOW):
        r.decrby("n", -1)
    assert r.get("n") == str(INT64_MAX).encode()
    r.set("m", INT64_MIN)
    with expect_error(OVERFLOW):
        r.decr("m")
    with expect_error(OVERFLOW):
        r.incrby("m", -1)
    assert r.incrby("m", INT64_MAX) == -1
    assert r.incr("edge", INT64_MAX) == INT64_MAX
    assert r.decrby("low", INT64_MAX) == -INT64_MAX


def test_decrby_int64_min(r, expect_error):
    r.set("n", "1")
    with expect_error("ERR decrement would overflow"):
        r.execute_command("DECRBY", "n", str(INT64_MIN))
    assert r.incrby("z", INT64_MIN) == INT64_MIN


def test_incr_arity(r, expect_error):
    with expect_error(arity("incr")):
        r.execute_command("INCR")
    with expect_error(arity("incr")):
        r.execute_command("INCR", "a", "b")
    with expect_error(arity("incrby")):
        r.execute_command("INCRBY", "a")
    with expect_error(arity("decrby")):
        r.execute_command("DECRBY", "a", "1", "2")
    with expect_error(arity("decr")):
        r.execute_command("DECR")


# --------------------------------------------------------------------------------------------------------------
# INCRBYFLOAT
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "start,incr,expected",
    [
        (None, "0.1", b"0.1"),
        ("10.50", "0.1", b"10.6"),
        ("5.0e3", "2.0e2", b"5200"),
        ("3", "1.5", b"4.5"),
        ("4.5", "-4.5", b"0"),
        ("1", "1e2", b"101"),
        ("10", "-25", b"-15"),
        ("-1.5", "0.25", b"-1.25"),
        ("7", "0", b"7"),
        # strtold's hexadecimal floats, as increment and as the stored value (rounded to a long double's 64 bits)
        ("1", "0x10", b"17"),
        ("0", "-0x1p3", b"-8"),
        ("0", "0x.8", b"0.5"),
        ("0x1P-2", "0", b"0.25"),
        ("0", "0xffffffffffffffffffff", b"1208925819614629174706176"),
        ("0", "0x1fffffffffffffffe", b"36893488147419103230"),
    ],
)
def test_incrbyfloat(r, raw, start, incr, expected):
    if start is not None:
        r.set("f", start)
    c = raw()
    assert c.cmd_raw("INCRBYFLOAT", "f", incr) == b"$%d\r\n%s\r\n" % (len(expected), expected)
    assert r.get("f") == expected


def test_incrbyfloat_accumulates_without_binary_noise(r, raw):
    # Redis computes in long double and prints with 17 significant digits: 0.1 + 0.2 reads back as "0.3".
    c = raw()
    assert r.incrbyfloat("f", 0.1) == 0.1
    assert c.cmd("INCRBYFLOAT", "f", "0.2") == b"0.3"
    assert r.get("f") == b"0.3"
    assert c.cmd("INCRBYFLOAT", "f", "0.7") == b"1"


def test_incrbyfloat_on_integer_then_incr(r, raw, expect_error):
    c = raw()
    r.set("f", "5")
    assert c.cmd("INCRBYFLOAT", "f", "1.5") == b"6.5"
    with expect_error(NOT_INT):
        r.incr("f")
    assert c.cmd("INCRBYFLOAT", "f", "0.5") == b"7"
    assert r.incr("f") == 8


@pytest.mark.parametrize("value", ["abc", "", "1.5.5", " 1", "1 ", "nan", "1,5"])
def test_incrbyfloat_not_a_float_value(r, expect_error, value):
    r.set("f", value)
    with expect_error(NOT_FLOAT):
        r.execute_command("INCRBYFLOAT", "f", "1")
    assert r.get("f") == value.encode()


@pytest.mark.parametrize("arg", ["abc", "", "nan", " 1", "1 ", "1.0x", "0x", "0xg", " 0x1", "0x1 ", "0x1p99999",
                                 "0x1p-99999", "0x1p16384", "1" + "0" * 5200])
def test_incrbyfloat_not_a_float_argument(r, expect_error, arg):
    r.set("f", "1")
    with expect_error(NOT_FLOAT):
        r.execute_command("INCRBYFLOAT", "f", arg)
    assert r.get("f") == b"1"


@pytest.mark.parametrize("arg", ["inf", "-inf", "+inf", "Infinity"])
def test_incrbyfloat_infinity(r, expect_error, arg):
    r.set("f", "1")
    with expect_error(NAN_INF):
        r.execute_command("INCRBYFLOAT", "f", arg)
    assert r.get("f") == b"1"


def test_incrbyfloat_infinite_value(r, expect_error):
    r.set("f", "inf")
    with expect_error(NAN_INF):
        r.execute_command("INCRBYFLOAT", "f", "1")


def test_incrbyfloat_keeps_ttl_and_arity(r, expect_error):
    r.set("f", "1", ex=100)
    r.incrbyfloat("f", 1)
    assert r.ttl("f") > 0
    with expect_error(arity("incrbyfloat")):
        r.execute_command("INCRBYFLOAT", "f")


def test_incrbyfloat_overflow(r, expect_error):
    # Redis works in long double (80-bit on x86-64): 1e4932 is finite, twice that overflows to infinity.
    r.set("f", "1e4932")
    with expect_error(NAN_INF):
        r.execute_command("INCRBYFLOAT", "f", "1e4932")
    r.set("g", "-1e4932")
    with expect_error(NAN_INF):
        r.execute_command("INCRBYFLOAT", "g", "-1e4932")
    assert r.get("f") == b"1e4932"
    # Beyond the long double range the text is not a valid float at all.
    with expect_error(NOT_FLOAT):
        r.execute_command("INCRBYFLOAT", "f", "1e5000")
    r.set("h", "1e5000")
    with expect_error(NOT_FLOAT):
        r.execute_command("INCRBYFLOAT", "h", "1")
