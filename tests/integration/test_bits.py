"""Bitmap commands (SETBIT, GETBIT, BITCOUNT, BITPOS, BITOP, BITFIELD, BITFIELD_RO) and LCS: replies and error
texts exactly as Redis 7.0 gives them. Every test runs against both targets (``KVSTRATA_TEST_TARGET=redis``);
the expectations were read off redis-server 7.0.15, so a test fails on either target if the two differ.

kvstrata holds strings only, so WRONGTYPE cases are left out."""

from __future__ import annotations

import random
import time

import pytest
import redis

NOT_INT = "ERR value is not an integer or out of range"
SYNTAX = "ERR syntax error"
BIT_OFFSET = "ERR bit offset is not an integer or out of range"
BIT_VALUE = "ERR bit is not an integer or out of range"
BITPOS_BIT = "ERR The bit argument must be 1 or 0."
BITFIELD_TYPE = "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is."
BITFIELD_RO_SET = "ERR BITFIELD_RO only supports the GET subcommand"
BITOP_NOT = "ERR BITOP NOT must be called with a single source key."
LCS_LEN_IDX = "ERR If you want both the length and indexes, please just use IDX."
LCS_TOO_BIG = "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len"
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
MB = 1024 * 1024


def arity(cmd):
    return f"ERR wrong number of arguments for '{cmd}' command"


@pytest.fixture
def small_bulk_len(r):
    """proto-max-bulk-len at its smallest (1 MiB, on both targets), put back afterwards."""
    old = r.config_get("proto-max-bulk-len")["proto-max-bulk-len"]
    r.config_set("proto-max-bulk-len", MB)
    yield MB
    r.config_set("proto-max-bulk-len", old)


def x(r, *args):
    return r.execute_command(*args)


# --------------------------------------------------------------------------------------------------------------
# SETBIT / GETBIT
# --------------------------------------------------------------------------------------------------------------


def test_setbit_returns_the_old_bit_and_grows_with_zeros(r):
    assert x(r, "SETBIT", "k", 7, 1) == 0
    assert r.get("k") == b"\x01"
    assert x(r, "SETBIT", "k", 7, 1) == 1
    assert x(r, "SETBIT", "k", 7, 0) == 1
    assert r.get("k") == b"\x00"
    assert x(r, "SETBIT", "k", 0, 0) == 0  # unchanged, still there
    assert r.get("k") == b"\x00"
    assert x(r, "SETBIT", "k", 33, 1) == 0
    assert r.get("k") == b"\x00\x00\x00\x00\x40"
    assert x(r, "SETBIT", "new", 20, 0) == 0  # clearing a bit of a missing key creates it, zeroed
    assert r.get("new") == b"\x00\x00\x00"
    r.set("s", "`")  # 0x60
    assert [x(r, "GETBIT", "s", i) for i in range(8)] == [0, 1, 1, 0, 0, 0, 0, 0]
    assert x(r, "GETBIT", "s", 8) == 0
    assert x(r, "GETBIT", "s", 2**32 - 1) == 0  # the largest offset: nothing is allocated to read it
    assert x(r, "GETBIT", "missing", 3) == 0
    assert r.exists("missing") == 0


def test_setbit_keeps_the_ttl(r):
    r.set("k", "a", ex=100)
    x(r, "SETBIT", "k", 100, 1)
    assert 0 < r.ttl("k") <= 100


@pytest.mark.parametrize("offset", ["-1", "4294967296", str(2**63), "abc", "1.5", "", " 1", "+1", "01", "#1"])
def test_bit_offset_errors(r, expect_error, offset):
    r.set("k", "a")
    for cmd, extra in (("SETBIT", ["1"]), ("GETBIT", [])):
        with expect_error(BIT_OFFSET):
            x(r, cmd, "k", offset, *extra)
    assert r.get("k") == b"a"


@pytest.mark.parametrize("bit", ["2", "-1", "x", "", "1.0", str(2**64)])
def test_setbit_bit_errors(r, expect_error, bit):
    with expect_error(BIT_VALUE):
        x(r, "SETBIT", "k", 1, bit)
    with expect_error(BIT_OFFSET):  # the offset is checked first
        x(r, "SETBIT", "k", -1, bit)
    assert r.exists("k") == 0


def test_setbit_getbit_arity(r, expect_error):
    with expect_error(arity("setbit")):
        x(r, "SETBIT", "k", 1)
    with expect_error(arity("getbit")):
        x(r, "GETBIT", "k", 1, 1)


def test_bit_offsets_are_bounded_by_proto_max_bulk_len(r, expect_error, small_bulk_len):
    last = small_bulk_len * 8 - 1
    assert x(r, "SETBIT", "k", last, 1) == 0
    assert r.strlen("k") == small_bulk_len
    assert x(r, "GETBIT", "k", last) == 1
    for cmd, extra in (("SETBIT", ["1"]), ("GETBIT", [])):
        with expect_error(BIT_OFFSET):
            x(r, cmd, "k", last + 1, *extra)
    with expect_error(BIT_OFFSET):
        x(r, "BITFIELD", "k", "GET", "u8", last + 1)
    with expect_error(BIT_OFFSET):
        x(r, "BITFIELD", "k", "GET", "u8", f"#{small_bulk_len}")
    # The field may reach past the limit: only its first bit's byte is checked, as in Redis.
    assert x(r, "BITFIELD", "k", "SET", "u16", last, 3) == [0x8000]
    assert r.strlen("k") == small_bulk_len + 2


@pytest.mark.kvstrata_only
def test_a_bitmap_no_tier_could_hold_is_refused_before_it_is_built(make_server):
    """A few bytes of request asking for hundreds of MB: -OOM at once, nothing allocated or created (as SETRANGE)."""
    srv = make_server({"dram-size": "4mb"})
    c = srv.client()
    try:
        c.set("s", "abc")
        for args in (("SETBIT", "s", 256 * MB * 8, 1), ("SETBIT", "new", 5 * MB * 8, 0),
                     ("BITFIELD", "new", "GET", "u8", 0, "SET", "i64", f"#{MB}", 1)):
            with pytest.raises(redis.exceptions.OutOfMemoryError, match="do not fit in the DRAM budget"):
                c.execute_command(*args)
        assert c.get("s") == b"abc" and c.exists("new") == 0
        assert c.execute_command("SETBIT", "s", 100, 1) == 0 and c.strlen("s") == 13
    finally:
        c.close()


def test_unchanged_setbit_does_not_touch_a_watched_key(server, r):
    r.set("w", "\x01")
    other = server.client()
    try:
        with r.pipeline() as p:
            p.watch("w")
            assert other.execute_command("SETBIT", "w", 7, 1) == 1  # already set: nothing changes
            p.multi()
            p.set("done", "1")
            assert p.execute() == [True]
        with r.pipeline() as p:
            p.watch("w")
            assert other.execute_command("SETBIT", "w", 7, 0) == 1
            p.multi()
            p.set("done", "2")
            with pytest.raises(Exception, match="Watched variable changed"):
                p.execute()
    finally:
        other.close()
    assert r.get("done") == b"1"


# --------------------------------------------------------------------------------------------------------------
# BITCOUNT
# --------------------------------------------------------------------------------------------------------------


def test_bitcount_ranges(r):
    r.set("k", "foobar")
    assert x(r, "BITCOUNT", "k") == 26
    assert x(r, "BITCOUNT", "k", 0, 0) == 4
    assert x(r, "BITCOUNT", "k", 1, 1) == 6
    assert x(r, "BITCOUNT", "k", 1, 1, "BYTE") == 6
    assert x(r, "BITCOUNT", "k", 5, 30, "BIT") == 17
    assert x(r, "BITCOUNT", "k", 5, 30, "bit") == 17
    assert x(r, "BITCOUNT", "k", 0, -1) == 26
    assert x(r, "BITCOUNT", "k", -2, -1) == 7  # "ar"
    assert x(r, "BITCOUNT", "k", -100, 100) == 26  # held inside the string
    assert x(r, "BITCOUNT", "k", 100, 200) == 0
    assert x(r, "BITCOUNT", "k", 3, 1) == 0
    assert x(r, "BITCOUNT", "k", -1, -2) == 0
    assert x(r, "BITCOUNT", "k", -1, -2, "NOSUCHUNIT") == 0  # an empty negative range answers before the unit
    assert x(r, "BITCOUNT", "k", -8, -1, "BIT") == 4  # 'r' = 0x72
    assert x(r, "BITCOUNT", "k", -1000, 1000, "BIT") == 26
    assert x(r, "BITCOUNT", "k", 0, 0, "BIT") == 0
    assert x(r, "BITCOUNT", "k", 1, 1, "BIT") == 1
    assert x(r, "BITCOUNT", "k", 47, 47, "BIT") == 0
    assert x(r, "BITCOUNT", "k", 46, 1000, "BIT") == 1
    assert x(r, "BITCOUNT", "k", INT64_MIN, INT64_MAX, "BIT") == 26
    r.set("empty", "")
    assert x(r, "BITCOUNT", "empty") == 0
    assert x(r, "BITCOUNT", "empty", 0, -1) == 0
    assert x(r, "BITCOUNT", "empty", 0, -1, "BIT") == 0


def test_bitcount_errors(r, expect_error):
    assert x(r, "BITCOUNT", "missing") == 0
    assert x(r, "BITCOUNT", "missing", "a") == 0  # a missing key answers 0 before its arguments are read
    assert x(r, "BITCOUNT", "missing", "a", "b", "c", "d") == 0
    r.set("k", "foobar")
    with expect_error(SYNTAX):
        x(r, "BITCOUNT", "k", 0)
    with expect_error(SYNTAX):
        x(r, "BITCOUNT", "k", 0, 1, "BIT", "x")
    with expect_error(SYNTAX):
        x(r, "BITCOUNT", "k", 0, 1, "bits")
    with expect_error(NOT_INT):
        x(r, "BITCOUNT", "k", "a", 1)
    with expect_error(NOT_INT):
        x(r, "BITCOUNT", "k", 0, "1.5", "BIT")
    with expect_error(NOT_INT):
        x(r, "BITCOUNT", "k", 0, str(2**63))
    with expect_error(arity("bitcount")):
        x(r, "BITCOUNT")


# --------------------------------------------------------------------------------------------------------------
# BITPOS
# --------------------------------------------------------------------------------------------------------------


def test_bitpos_ranges(r):
    r.set("k", b"\xff\xf0\x00")
    assert x(r, "BITPOS", "k", 0) == 12
    r.set("k", b"\x00\xff\xf0")
    assert x(r, "BITPOS", "k", 1, 0) == 8
    assert x(r, "BITPOS", "k", 1, 2) == 16
    assert x(r, "BITPOS", "k", 1, 2, -1, "BYTE") == 16
    assert x(r, "BITPOS", "k", 1, 7, 15, "BIT") == 8
    assert x(r, "BITPOS", "k", 1, 7, -3, "BIT") == 8
    assert x(r, "BITPOS", "k", 0, 8, 15, "BIT") == -1
    assert x(r, "BITPOS", "k", 0, 8, 23, "BIT") == 20
    assert x(r, "BITPOS", "k", 1, 9, 11, "BIT") == 9
    assert x(r, "BITPOS", "k", 1, 20, 100, "BIT") == -1
    assert x(r, "BITPOS", "k", 0, 3, 1) == -1  # an empty range holds neither
    assert x(r, "BITPOS", "k", 1, -1) == 16
    assert x(r, "BITPOS", "k", 1, -100, -3) == -1  # byte 0 alone
    assert x(r, "BITPOS", "k", 1, -100, -2) == 8
    r.set("zeros", b"\x00\x00\x00")
    assert x(r, "BITPOS", "zeros", 1) == -1
    assert x(r, "BITPOS", "zeros", 0) == 0
    assert x(r, "BITPOS", "zeros", 0, 1, 1) == 8


def test_bitpos_clear_bit_on_all_ones(r):
    """Looking for a 0 in all ones: past the end (the string counts as padded with zeros) unless an end was
    given."""
    r.set("k", b"\xff\xff\xff")
    assert x(r, "BITPOS", "k", 0) == 24
    assert x(r, "BITPOS", "k", 0, 0) == 24
    assert x(r, "BITPOS", "k", 0, 1) == 24
    assert x(r, "BITPOS", "k", 0, -1) == 24
    assert x(r, "BITPOS", "k", 0, 0, -1) == -1
    assert x(r, "BITPOS", "k", 0, 0, 2) == -1
    assert x(r, "BITPOS", "k", 0, 0, 100) == -1
    assert x(r, "BITPOS", "k", 0, 0, -1, "BYTE") == -1
    assert x(r, "BITPOS", "k", 0, 0, -1, "BIT") == -1
    assert x(r, "BITPOS", "k", 0, 5) == -1  # start past the end: an empty range
    assert x(r, "BITPOS", "k", 1, 0, -1, "BIT") == 0


def test_bitpos_missing_and_empty(r, expect_error):
    assert x(r, "BITPOS", "missing", 0) == 0
    assert x(r, "BITPOS", "missing", 1) == -1
    assert x(r, "BITPOS", "missing", 1, "x", "y", "z", "w") == -1  # answered before the range is read
    r.set("empty", "")
    assert x(r, "BITPOS", "empty", 0) == -1
    assert x(r, "BITPOS", "empty", 1) == -1
    assert x(r, "BITPOS", "empty", 0, 0) == -1
    with expect_error(BITPOS_BIT):
        x(r, "BITPOS", "missing", 2)


def test_bitpos_errors(r, expect_error):
    r.set("k", "foo")
    for bit in ("2", "-1"):
        with expect_error(BITPOS_BIT):
            x(r, "BITPOS", "k", bit)
    with expect_error(NOT_INT):
        x(r, "BITPOS", "k", "x")
    with expect_error(NOT_INT):
        x(r, "BITPOS", "k", 1, "a")
    with expect_error(NOT_INT):
        x(r, "BITPOS", "k", 1, 0, "a")
    with expect_error(SYNTAX):
        x(r, "BITPOS", "k", 1, 0, "a", "BITS")  # the unit is read before the end
    with expect_error(NOT_INT):
        x(r, "BITPOS", "k", 1, 0, "a", "BIT")
    with expect_error(SYNTAX):
        x(r, "BITPOS", "k", 1, 0, 1, "BIT", "x")
    with expect_error(arity("bitpos")):
        x(r, "BITPOS", "k")


# --------------------------------------------------------------------------------------------------------------
# BITOP
# --------------------------------------------------------------------------------------------------------------


def test_bitop_operations_pad_shorter_keys_with_zeros(r):
    r.set("a", b"\xff\x0f\xaa")
    r.set("b", b"\x0f")
    r.set("c", b"\xf0\xff\x55\x01")
    assert x(r, "BITOP", "AND", "d", "a", "b") == 3
    assert r.get("d") == b"\x0f\x00\x00"
    assert x(r, "BITOP", "OR", "d", "a", "b", "c") == 4
    assert r.get("d") == b"\xff\xff\xff\x01"
    assert x(r, "BITOP", "XOR", "d", "a", "c") == 4
    assert r.get("d") == b"\x0f\xf0\xff\x01"
    assert x(r, "BITOP", "xor", "d", "a", "a", "a") == 3
    assert r.get("d") == b"\xff\x0f\xaa"
    assert x(r, "BITOP", "NOT", "d", "a") == 3
    assert r.get("d") == b"\x00\xf0\x55"
    assert x(r, "BITOP", "and", "a", "a", "c") == 4  # the destination may be a source
    assert r.get("a") == b"\xf0\x0f\x00\x00"
    big = bytes(range(256)) * 8  # past the short-value paths
    r.set("big", big)
    assert x(r, "BITOP", "NOT", "d", "big") == len(big)
    assert r.get("d") == bytes(255 - b for b in big)
    assert x(r, "BITOP", "AND", "d", "big", "d") == len(big)
    assert r.get("d") == bytes(len(big))


def test_bitop_missing_keys_count_as_empty(r):
    r.set("a", b"\xff\xff")
    assert x(r, "BITOP", "AND", "d", "a", "missing") == 2
    assert r.get("d") == b"\x00\x00"
    assert x(r, "BITOP", "OR", "d", "missing", "a") == 2
    assert r.get("d") == b"\xff\xff"
    assert x(r, "BITOP", "XOR", "d", "missing", "a", "missing") == 2
    assert r.get("d") == b"\xff\xff"


def test_bitop_empty_result_deletes_the_destination(r):
    r.set("d", "old", ex=100)
    assert x(r, "BITOP", "AND", "d", "missing1", "missing2") == 0
    assert r.exists("d") == 0
    assert x(r, "BITOP", "OR", "d", "missing") == 0
    assert r.exists("d") == 0
    r.set("empty", "")
    r.set("d", "old")
    assert x(r, "BITOP", "NOT", "d", "empty") == 0
    assert r.exists("d") == 0
    assert x(r, "BITOP", "NOT", "d", "missing") == 0
    assert r.exists("d") == 0


def test_bitop_clears_the_destination_ttl(r):
    r.set("a", "x")
    r.set("d", "old", ex=100)
    assert x(r, "BITOP", "OR", "d", "a") == 1
    assert r.get("d") == b"x"
    assert r.ttl("d") == -1


def test_bitop_errors(r, expect_error):
    r.set("a", "x")
    with expect_error(BITOP_NOT):
        x(r, "BITOP", "NOT", "d", "a", "a")
    with expect_error(SYNTAX):
        x(r, "BITOP", "NAND", "d", "a")
    with expect_error(SYNTAX):
        x(r, "BITOP", "ANDX", "d", "a", "a")
    with expect_error(arity("bitop")):
        x(r, "BITOP", "AND", "d")
    with expect_error(arity("bitop")):
        x(r, "BITOP", "NOT", "d")
    assert r.exists("d") == 0


# --------------------------------------------------------------------------------------------------------------
# BITFIELD / BITFIELD_RO
# --------------------------------------------------------------------------------------------------------------


def test_bitfield_get_set_incrby(r):
    assert x(r, "BITFIELD", "k", "INCRBY", "i5", 100, 1, "GET", "u4", 0) == [1, 0]
    assert r.get("k") == b"\x00" * 13 + b"\x80"
    assert x(r, "BITFIELD", "k", "SET", "i8", 0, -100, "GET", "i8", 0, "GET", "u8", 0, "GET", "u4", 0) == [
        0, -100, 156, 9]
    assert x(r, "BITFIELD", "k", "SET", "u8", "#1", 255, "GET", "u8", 8, "GET", "i8", "#1") == [0, 255, -1]
    assert x(r, "BITFIELD", "k", "get", "u16", 0, "set", "u1", 3, 1, "incrby", "u2", 3, 1) == [0x9CFF, 1, 0]
    assert x(r, "BITFIELD", "k", "GET", "i64", 0, "GET", "u63", 1, "GET", "u8", 200) == [
        (0x84FF << 48) - 2**64, 0x04FF << 48, 0]
    assert x(r, "BITFIELD", "k") == []
    assert x(r, "BITFIELD", "k", "OVERFLOW", "SAT") == []
    assert x(r, "BITFIELD", "missing", "GET", "u8", 0, "GET", "i64", 1000) == [0, 0]
    assert r.exists("missing") == 0  # GETs alone create nothing


def test_bitfield_incrby_overflow_example(r):
    args = ("BITFIELD", "k", "INCRBY", "u2", 100, 1, "OVERFLOW", "SAT", "INCRBY", "u2", 102, 1)
    assert [x(r, *args) for _ in range(4)] == [[1, 1], [2, 2], [3, 3], [0, 3]]
    assert x(r, "BITFIELD", "k", "OVERFLOW", "FAIL", "INCRBY", "u2", 102, 1) == [None]


@pytest.mark.parametrize(("kind", "start", "incr", "wrap", "sat"), [
    ("u8", 255, 1, 0, 255),
    ("u8", 0, -1, 255, 0),
    ("u8", 200, 300, 244, 255),
    ("u8", 10, INT64_MIN, 10, 0),
    ("i8", 127, 1, -128, 127),
    ("i8", -128, -1, 127, -128),
    ("i8", 100, INT64_MAX, 99, 127),
    ("i64", INT64_MAX, 1, INT64_MIN, INT64_MAX),
    ("i64", INT64_MIN, -1, INT64_MAX, INT64_MIN),
    ("i64", -1, INT64_MIN, INT64_MAX, INT64_MIN),
    ("u63", 2**63 - 1, 1, 0, 2**63 - 1),
    ("u63", 0, -1, 2**63 - 1, 0),
    ("u63", 5, INT64_MAX, 4, 2**63 - 1),
    ("i1", 0, 1, -1, 0),
    ("u1", 1, 1, 0, 1),
])
def test_bitfield_incrby_overflow_modes(r, kind, start, incr, wrap, sat):
    for mode, expected in (("WRAP", wrap), ("SAT", sat), ("FAIL", None)):
        x(r, "BITFIELD", "k", "SET", kind, 3, start)
        assert x(r, "BITFIELD", "k", "OVERFLOW", mode, "INCRBY", kind, 3, incr) == [expected], mode
        assert x(r, "BITFIELD", "k", "GET", kind, 3) == [start if expected is None else expected]


@pytest.mark.parametrize(("kind", "value", "wrap", "sat"), [
    ("u8", 255, 255, 255),  # fits: every mode stores it
    ("i64", INT64_MIN, INT64_MIN, INT64_MIN),
    ("u8", 256, 0, 255),
    ("u8", 511, 255, 255),
    ("u8", -1, 255, 255),  # Redis checks the value as unsigned 64 bits: a negative one is past the top
    ("u8", INT64_MIN, 0, 255),
    ("i8", 128, -128, 127),
    ("i8", -129, 127, -128),
    ("i8", 200, -56, 127),
    ("i8", INT64_MIN, 0, 127),  # Redis's check wraps around in 64 bits: far below counts as past the top
    ("i61", -8285246714414713927, 938125322440061881, 2**60 - 1),
    ("i61", -(2**60) - 1, 2**60 - 1, -(2**60)),
    ("u63", -1, 2**63 - 1, 2**63 - 1),
])
def test_bitfield_set_overflow_modes(r, kind, value, wrap, sat):
    fits = wrap == value
    for mode, expected in (("WRAP", wrap), ("SAT", sat), ("FAIL", value if fits else None)):
        x(r, "BITFIELD", "k", "SET", kind, 5, 1)
        assert x(r, "BITFIELD", "k", "OVERFLOW", mode, "SET", kind, 5, value) == [None if expected is None else 1]
        assert x(r, "BITFIELD", "k", "GET", kind, 5) == [1 if expected is None else expected], mode


def test_bitfield_overflow_applies_to_the_operations_after_it(r):
    assert x(r, "BITFIELD", "k", "SET", "u4", 0, 15, "INCRBY", "u4", 0, 1, "OVERFLOW", "FAIL",
             "INCRBY", "u4", 0, -1, "OVERFLOW", "SAT", "INCRBY", "u4", 0, -1, "OVERFLOW", "WRAP",
             "INCRBY", "u4", 0, -1) == [0, 0, None, 0, 15]


def test_bitfield_write_creates_the_key_even_when_it_fails(r):
    assert x(r, "BITFIELD", "k", "OVERFLOW", "FAIL", "SET", "u8", 8, 256) == [None]
    assert r.get("k") == b"\x00\x00"  # padded up to the field, as Redis does before running the operations
    assert x(r, "BITFIELD", "k", "OVERFLOW", "FAIL", "INCRBY", "i8", 20, -1000) == [None]
    assert r.get("k") == b"\x00\x00\x00\x00"
    r.set("t", "abc", ex=100)
    assert x(r, "BITFIELD", "t", "SET", "u8", 0, ord("x")) == [ord("a")]
    assert r.get("t") == b"xbc"
    assert 0 < r.ttl("t") <= 100  # a write keeps the TTL


@pytest.mark.parametrize("kind", ["u64", "i65", "i0", "u0", "x8", "I8", "U8", "i", "", "i08", "u-1", "i+8", "8"])
def test_bitfield_invalid_types(r, expect_error, kind):
    for op in (("GET", kind, 0), ("SET", kind, 0, 1), ("INCRBY", kind, 0, 1)):
        with expect_error(BITFIELD_TYPE):
            x(r, "BITFIELD", "k", *op)
    with expect_error(BITFIELD_TYPE):
        x(r, "BITFIELD_RO", "k", "GET", kind, 0)
    assert r.exists("k") == 0


def test_bitfield_errors(r, expect_error):
    cases = [
        (("GET", "u8"), SYNTAX),
        (("SET", "u8", 0), SYNTAX),
        (("INCRBY", "u8", 0), SYNTAX),
        (("OVERFLOW",), SYNTAX),
        (("NOSUCH", "u8", 0), SYNTAX),
        (("OVERFLOW", "BAD", "GET", "u8", 0), "ERR Invalid OVERFLOW type specified"),
        (("GET", "u8", -1), BIT_OFFSET),
        (("GET", "u8", "#-1"), BIT_OFFSET),
        (("GET", "u8", "#"), BIT_OFFSET),
        (("GET", "u8", "# 1"), BIT_OFFSET),
        (("GET", "u8", "x"), BIT_OFFSET),
        (("GET", "u8", 2**32), BIT_OFFSET),
        (("GET", "u8", "#536870912"), BIT_OFFSET),
        (("SET", "u8", 0, "x"), NOT_INT),
        (("INCRBY", "u8", 0, "1.5"), NOT_INT),
        (("SET", "u8", 0, str(2**63)), NOT_INT),
        # every operation is checked before any runs: nothing is written
        (("SET", "u8", 0, 1, "GET", "u8"), SYNTAX),
        (("SET", "u8", 0, 1, "GET", "x8", 0), BITFIELD_TYPE),
        (("SET", "u8", 0, 1, "OVERFLOW", "SATX"), "ERR Invalid OVERFLOW type specified"),
    ]
    for args, error in cases:
        with expect_error(error):
            x(r, "BITFIELD", "k", *args)
    assert r.exists("k") == 0
    with expect_error(arity("bitfield")):
        x(r, "BITFIELD")


def test_bitfield_ro(r, expect_error):
    r.set("k", b"\x12\x34")
    assert x(r, "BITFIELD_RO", "k", "GET", "u8", 0, "GET", "i4", "#3", "get", "u16", 4) == [0x12, 4, 0x2340]
    assert x(r, "BITFIELD_RO", "k") == []
    assert x(r, "BITFIELD_RO", "missing", "GET", "u8", 0) == [0]
    assert x(r, "BITFIELD_RO", "k", "OVERFLOW", "FAIL", "GET", "u8", 0) == [0x12]
    for op in (("SET", "u8", 0, 1), ("INCRBY", "u8", 0, 1), ("GET", "u8", 0, "SET", "u8", 0, 1)):
        with expect_error(BITFIELD_RO_SET):
            x(r, "BITFIELD_RO", "k", *op)
    with expect_error(SYNTAX):  # argument errors come first
        x(r, "BITFIELD_RO", "k", "SET", "u8", 0)
    with expect_error(BIT_OFFSET):
        x(r, "BITFIELD_RO", "k", "SET", "u8", -1, 1)
    with expect_error(arity("bitfield_ro")):
        x(r, "BITFIELD_RO")
    assert r.get("k") == b"\x12\x34"


# --------------------------------------------------------------------------------------------------------------
# LCS
# --------------------------------------------------------------------------------------------------------------


def test_lcs_options(r):
    r.mset({"key1": "ohmytext", "key2": "mynewtext"})
    assert x(r, "LCS", "key1", "key2") == b"mytext"
    assert x(r, "LCS", "key1", "key2", "LEN") == 6
    assert x(r, "LCS", "key1", "key2", "IDX") == [b"matches", [[[4, 7], [5, 8]], [[2, 3], [0, 1]]], b"len", 6]
    assert x(r, "LCS", "key1", "key2", "idx", "MINMATCHLEN", 4, "WITHMATCHLEN") == [
        b"matches", [[[4, 7], [5, 8], 4]], b"len", 6]
    assert x(r, "LCS", "key1", "key2", "IDX", "WITHMATCHLEN") == [
        b"matches", [[[4, 7], [5, 8], 4], [[2, 3], [0, 1], 2]], b"len", 6]
    assert x(r, "LCS", "key1", "key2", "IDX", "MINMATCHLEN", -5) == x(r, "LCS", "key1", "key2", "IDX")
    assert x(r, "LCS", "key1", "key2", "IDX", "MINMATCHLEN", 100) == [b"matches", [], b"len", 6]
    assert x(r, "LCS", "key1", "key2", "LEN", "LEN", "MINMATCHLEN", 3, "WITHMATCHLEN") == 6
    assert x(r, "LCS", "key2", "key1") == b"mytext"
    assert x(r, "LCS", "key1", "key1") == b"ohmytext"


def test_lcs_tie_breaking_and_ranges(r):
    """Several common subsequences of the same length: Redis's walk picks one; the ranges follow it."""
    r.mset({"a": "abcabcabc", "b": "cbacbacba"})
    assert x(r, "LCS", "a", "b") == b"cbabc"
    assert x(r, "LCS", "a", "b", "IDX", "WITHMATCHLEN") == [
        b"matches", [[[8, 8], [6, 6], 1], [[7, 7], [4, 4], 1], [[6, 6], [2, 2], 1], [[4, 4], [1, 1], 1],
                     [[2, 2], [0, 0], 1]], b"len", 5]
    r.mset({"a": "GATTACA" * 5, "b": "TAGACCA" * 4})
    assert x(r, "LCS", "a", "b") == b"TAGACATAGACAGATACA"
    assert x(r, "LCS", "a", "b", "LEN") == 18


def test_lcs_missing_keys(r):
    r.set("a", "abc")
    assert x(r, "LCS", "a", "missing") == b""
    assert x(r, "LCS", "missing", "missing2") == b""
    assert x(r, "LCS", "missing", "a", "LEN") == 0
    assert x(r, "LCS", "a", "missing", "IDX", "WITHMATCHLEN") == [b"matches", [], b"len", 0]


def test_lcs_errors(r, expect_error, small_bulk_len):
    r.mset({"a": "abc", "b": "bcd"})
    with expect_error(LCS_LEN_IDX):
        x(r, "LCS", "a", "b", "LEN", "IDX")
    with expect_error(SYNTAX):
        x(r, "LCS", "a", "b", "MINMATCHLEN")
    with expect_error(NOT_INT):
        x(r, "LCS", "a", "b", "MINMATCHLEN", "x")
    with expect_error(SYNTAX):
        x(r, "LCS", "a", "b", "IDX", "NOSUCH")
    with expect_error(SYNTAX):  # options are read before LEN and IDX are compared
        x(r, "LCS", "a", "b", "LEN", "IDX", "NOSUCH")
    with expect_error(arity("lcs")):
        x(r, "LCS", "a")
    # Redis's table takes 4 bytes a cell: (600 + 1)^2 * 4 bytes is more than 1 MiB
    r.mset({"a": "x" * 600, "b": "y" * 600})
    with expect_error(LCS_TOO_BIG):
        x(r, "LCS", "a", "b", "LEN")
    r.set("b", "y" * 400)  # 601 * 401 * 4 bytes: under 1 MiB
    assert x(r, "LCS", "a", "b", "LEN") == 0


def test_lcs_resp3_is_a_map(r3):
    r3.mset({"key1": "ohmytext", "key2": "mynewtext"})
    assert r3.execute_command("LCS", "key1", "key2", "IDX", "MINMATCHLEN", 4) == {
        b"matches": [[[4, 7], [5, 8]]], b"len": 6}


def test_lcs_long_against_short(r):
    """A walk mostly along one string (long runs of steps skipped at once on kvstrata), against a simple model."""
    rng = random.Random(7)
    long = bytes(rng.choice(b"abcd") for _ in range(20000))
    r.mset({"s": "dcba", "l": long})
    expected = _lcs_model(b"dcba", long)
    assert x(r, "LCS", "s", "l") == expected[0]
    assert x(r, "LCS", "l", "s") == _lcs_model(long, b"dcba")[0]
    assert x(r, "LCS", "s", "l", "IDX", "WITHMATCHLEN") == [b"matches", expected[1], b"len", len(expected[0])]


def _lcs_model(a: bytes, b: bytes) -> tuple[bytes, list]:
    """Redis's algorithm, cell by cell (for the test above: a short string, so the table is small)."""
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = (table[i - 1][j - 1] + 1 if a[i - 1] == b[j - 1]
                           else max(table[i - 1][j], table[i][j - 1]))
    out = []
    ranges = []
    i, j = len(a), len(b)
    current = None
    while i > 0 and j > 0:
        if a[i - 1] == b[j - 1]:
            out.append(a[i - 1])
            current = [i - 1, current[1] if current else i - 1, j - 1, current[3] if current else j - 1]
            i, j = i - 1, j - 1
            if i == 0 or j == 0:
                ranges.append(current)
                current = None
        else:
            if table[i - 1][j] > table[i][j - 1]:
                i -= 1
            else:
                j -= 1
            if current:
                ranges.append(current)
                current = None
    matches = [[[s, e], [bs, be], e - s + 1] for s, e, bs, be in ranges]
    return bytes(reversed(out)), matches


# --------------------------------------------------------------------------------------------------------------
# Large values and a seeded random sequence
# --------------------------------------------------------------------------------------------------------------


def test_large_values(r):
    """64 MiB built on the server (no transfer): counting, searching and combining stay fast."""
    size = 64 * MB
    r.setrange("z", size - 1, b"\x01")
    r.set("ones", b"\xff" * MB)
    started = time.monotonic()
    assert x(r, "BITCOUNT", "z") == 1
    assert x(r, "BITCOUNT", "z", 0, -2) == 0
    assert x(r, "BITCOUNT", "z", 7, -1, "BIT") == 1
    assert x(r, "BITPOS", "z", 1) == size * 8 - 1
    assert x(r, "BITPOS", "z", 1, 0, -2) == -1
    assert x(r, "BITPOS", "z", 0, 5) == 40
    assert x(r, "BITPOS", "ones", 0) == MB * 8
    assert x(r, "BITPOS", "ones", 0, 0, -1) == -1
    assert time.monotonic() - started < 2.0
    assert x(r, "BITOP", "OR", "d", "z", "ones") == size
    assert x(r, "BITCOUNT", "d") == MB * 8 + 1
    assert x(r, "BITOP", "NOT", "d", "z") == size
    assert x(r, "BITCOUNT", "d") == size * 8 - 1
    assert x(r, "BITOP", "AND", "d", "d", "ones") == size
    assert x(r, "BITCOUNT", "d") == MB * 8
    assert x(r, "SETBIT", "z", size * 8 - 1, 0) == 1
    assert x(r, "BITFIELD", "z", "INCRBY", "u8", f"#{size - 1}", 5) == [5]
    assert x(r, "BITPOS", "z", 1) == size * 8 - 3  # 0x05
    r.delete("z", "d")


class _Model:
    """A plain-Python bitmap store: the replies of the simple forms of the commands, bit by bit."""

    def __init__(self) -> None:
        self.values: dict[str, bytearray] = {}

    def bit(self, key: str, offset: int) -> int:
        v = self.values.get(key, bytearray())
        return (v[offset // 8] >> (7 - offset % 8)) & 1 if offset // 8 < len(v) else 0

    def setbit(self, key: str, offset: int, on: int) -> int:
        old = self.bit(key, offset)
        v = self.values.setdefault(key, bytearray())
        if len(v) <= offset // 8:
            v.extend(bytes(offset // 8 + 1 - len(v)))
        v[offset // 8] = (v[offset // 8] & ~(1 << (7 - offset % 8))) | (on << (7 - offset % 8))
        return old

    def bitcount(self, key: str, start: int, end: int) -> int:
        """Byte range: negative indexes from the end, then held inside the string (an end before it: byte 0)."""
        n = len(self.values.get(key, b""))
        if start < 0 and end < 0 and start > end:
            return 0
        start, end = max(start + n if start < 0 else start, 0), min(max(end + n if end < 0 else end, 0), n - 1)
        return sum(self.bit(key, i) for i in range(start * 8, (end + 1) * 8))

    def bitpos(self, key: str, bit: int) -> int:
        n = len(self.values.get(key, b""))
        if key in self.values and n == 0:
            return -1
        found = [i for i in range(n * 8) if self.bit(key, i) == bit]
        return found[0] if found else (-1 if bit else n * 8)

    def bitop(self, op: str, dest: str, keys: list[str]) -> int:
        srcs = [self.values.get(k, bytearray()) for k in keys]
        size = max(len(s) for s in srcs)
        out = bytearray()
        for i in range(size):
            column = [s[i] if i < len(s) else 0 for s in srcs]
            acc = column[0]
            for b in column[1:]:
                acc = acc & b if op == "AND" else acc | b if op == "OR" else acc ^ b
            out.append(acc ^ 0xFF if op == "NOT" else acc)
        if size:
            self.values[dest] = out
        else:
            self.values.pop(dest, None)
        return size

    def field(self, key: str, signed: bool, width: int, offset: int) -> int:
        value = 0
        for i in range(width):
            value = value << 1 | self.bit(key, offset + i)
        return value - (1 << width) if signed and value >> (width - 1) else value

    def set_field(self, key: str, signed: bool, width: int, offset: int, value: int) -> int:
        old = self.field(key, signed, width, offset)
        for i in range(width):
            self.setbit(key, offset + i, (value >> (width - 1 - i)) & 1)
        return old


def test_random_sequence_against_a_model(r):
    rng = random.Random(20240607)
    model = _Model()
    keys = ["a", "b", "c"]
    for step in range(600):
        key = rng.choice(keys)
        op = rng.randrange(6)
        if op == 0:
            offset, on = rng.randrange(300), rng.randrange(2)
            assert x(r, "SETBIT", key, offset, on) == model.setbit(key, offset, on), step
        elif op == 1:
            offset = rng.randrange(320)
            assert x(r, "GETBIT", key, offset) == model.bit(key, offset), step
        elif op == 2:
            start, end = rng.randint(-45, 45), rng.randint(-45, 45)
            assert x(r, "BITCOUNT", key, start, end) == model.bitcount(key, start, end), (step, start, end)
        elif op == 3:
            bit = rng.randrange(2)
            assert x(r, "BITPOS", key, bit) == model.bitpos(key, bit), step
        elif op == 4:
            kind = rng.choice(["AND", "OR", "XOR", "NOT"])
            sources = [rng.choice(keys + ["none"]) for _ in range(1 if kind == "NOT" else rng.randint(1, 3))]
            assert x(r, "BITOP", kind, key, *sources) == model.bitop(kind, key, sources), step
        else:
            signed = rng.random() < 0.5
            width = rng.randint(1, 64 if signed else 63)
            offset = rng.randrange(300)
            low, high = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
            value = rng.randint(low, high)
            kind = f"{'i' if signed else 'u'}{width}"
            assert x(r, "BITFIELD", key, "SET", kind, offset, value, "GET", kind, offset) == [
                model.set_field(key, signed, width, offset, value), value], step
        if step % 50 == 0:
            for k in keys:
                assert r.get(k) == (bytes(model.values[k]) if k in model.values else None), step
