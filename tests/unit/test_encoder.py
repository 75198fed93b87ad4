"""Unit tests for kvstrata.protocol.encoder.encode: every reply type in RESP2 and RESP3, exact wire bytes, what
hiredis decodes from them, and the zero-copy emission of large bulk values."""

from __future__ import annotations

import enum
import math

import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstrata.protocol.encoder import (
    LARGE_REPLY,
    NULL_ARRAY,
    OK,
    PONG,
    ErrorReply,
    Status,
    Verbatim,
    encode,
    encode_bytes,
)

PROPERTY = settings(max_examples=200, deadline=None, database=None)


def wire(value, proto: int) -> bytes:
    out: list = []
    encode(value, proto, out)
    return b"".join(out)


_INCOMPLETE = object()


def decode(data: bytes):
    """One reply decoded by hiredis; nothing may be left over."""
    reader = hiredis.Reader(notEnoughData=_INCOMPLETE)
    reader.feed(data)
    reply = reader.gets()
    assert reply is not _INCOMPLETE, f"incomplete reply: {data!r}"
    assert reader.gets() is _INCOMPLETE, f"trailing bytes after the reply: {data!r}"
    return reply


class Color(enum.IntEnum):
    RED = 7


class Name(str):
    """A str subclass that is not one of the reply markers."""


# (value, RESP2 bytes, RESP3 bytes)
TABLE = [
    (b"hello", b"$5\r\nhello\r\n", b"$5\r\nhello\r\n"),
    (b"", b"$0\r\n\r\n", b"$0\r\n\r\n"),
    (b"a\r\nb", b"$4\r\na\r\nb\r\n", b"$4\r\na\r\nb\r\n"),
    (bytearray(b"ba"), b"$2\r\nba\r\n", b"$2\r\nba\r\n"),
    (memoryview(b"mv"), b"$2\r\nmv\r\n", b"$2\r\nmv\r\n"),
    ("héllo", b"$6\r\nh\xc3\xa9llo\r\n", b"$6\r\nh\xc3\xa9llo\r\n"),
    ("", b"$0\r\n\r\n", b"$0\r\n\r\n"),
    (Name("nm"), b"$2\r\nnm\r\n", b"$2\r\nnm\r\n"),
    (Status("OK"), b"+OK\r\n", b"+OK\r\n"),
    (OK, b"+OK\r\n", b"+OK\r\n"),
    (PONG, b"+PONG\r\n", b"+PONG\r\n"),
    (ErrorReply("ERR bad thing"), b"-ERR bad thing\r\n", b"-ERR bad thing\r\n"),
    (ErrorReply("ERR a\r\nb"), b"-ERR a  b\r\n", b"-ERR a  b\r\n"),
    (ErrorReply("ERR \xe9"), b"-ERR \xe9\r\n", b"-ERR \xe9\r\n"),  # latin-1 carries raw client bytes back
    (ErrorReply("ERR \u2603"), b"-ERR \xe2\x98\x83\r\n", b"-ERR \xe2\x98\x83\r\n"),
    (0, b":0\r\n", b":0\r\n"),
    (42, b":42\r\n", b":42\r\n"),
    (-7, b":-7\r\n", b":-7\r\n"),
    (2**63 - 1, b":9223372036854775807\r\n", b":9223372036854775807\r\n"),
    (-(2**63), b":-9223372036854775808\r\n", b":-9223372036854775808\r\n"),
    (Color.RED, b":7\r\n", b":7\r\n"),
    (None, b"$-1\r\n", b"_\r\n"),
    (NULL_ARRAY, b"*-1\r\n", b"_\r\n"),
    (True, b":1\r\n", b"#t\r\n"),
    (False, b":0\r\n", b"#f\r\n"),
    (1.5, b"$3\r\n1.5\r\n", b",1.5\r\n"),
    (3.0, b"$1\r\n3\r\n", b",3\r\n"),
    (-0.25, b"$5\r\n-0.25\r\n", b",-0.25\r\n"),
    (0.1, b"$3\r\n0.1\r\n", b",0.1\r\n"),
    (1e20, b"$5\r\n1e+20\r\n", b",1e+20\r\n"),
    (math.inf, b"$3\r\ninf\r\n", b",inf\r\n"),
    (-math.inf, b"$4\r\n-inf\r\n", b",-inf\r\n"),
    (math.nan, b"$3\r\nnan\r\n", b",nan\r\n"),
    ([], b"*0\r\n", b"*0\r\n"),
    ([b"a", 1, None], b"*3\r\n$1\r\na\r\n:1\r\n$-1\r\n", b"*3\r\n$1\r\na\r\n:1\r\n_\r\n"),
    ((b"t", b"u"), b"*2\r\n$1\r\nt\r\n$1\r\nu\r\n", b"*2\r\n$1\r\nt\r\n$1\r\nu\r\n"),
    ([[b"x", [1]], []], b"*2\r\n*2\r\n$1\r\nx\r\n*1\r\n:1\r\n*0\r\n", b"*2\r\n*2\r\n$1\r\nx\r\n*1\r\n:1\r\n*0\r\n"),
    ({b"k": 1, "s": b"v"}, b"*4\r\n$1\r\nk\r\n:1\r\n$1\r\ns\r\n$1\r\nv\r\n",
     b"%2\r\n$1\r\nk\r\n:1\r\n$1\r\ns\r\n$1\r\nv\r\n"),
    ({}, b"*0\r\n", b"%0\r\n"),
    ({b"only"}, b"*1\r\n$4\r\nonly\r\n", b"~1\r\n$4\r\nonly\r\n"),
    (frozenset({5}), b"*1\r\n:5\r\n", b"~1\r\n:5\r\n"),
    (set(), b"*0\r\n", b"~0\r\n"),
    (Verbatim("line1\r\nline2"), b"$12\r\nline1\r\nline2\r\n", b"=16\r\ntxt:line1\r\nline2\r\n"),
    (Verbatim(""), b"$0\r\n\r\n", b"=4\r\ntxt:\r\n"),
    ([Status("OK"), ErrorReply("ERR x"), True, 2.5],
     b"*4\r\n+OK\r\n-ERR x\r\n:1\r\n$3\r\n2.5\r\n", b"*4\r\n+OK\r\n-ERR x\r\n#t\r\n,2.5\r\n"),
]


@pytest.mark.parametrize("value,resp2,resp3", TABLE, ids=[repr(v)[:40] for v, _, _ in TABLE])
def test_exact_bytes(value, resp2, resp3):
    assert wire(value, 2) == resp2
    assert wire(value, 3) == resp3
    assert encode_bytes(value, 2) == resp2
    assert encode_bytes(value, 3) == resp3


def test_encode_appends_to_out():
    out = [b"before"]
    encode(b"x", 2, out)
    encode(1, 2, out)
    assert out[0] == b"before"
    assert b"".join(out) == b"before$1\r\nx\r\n:1\r\n"


@pytest.mark.parametrize("proto", [2, 3])
def test_status_cache_returns_same_bytes(proto):
    first = wire(Status("QUEUED"), proto)
    for _ in range(3):
        assert wire(Status("QUEUED"), proto) == first == b"+QUEUED\r\n"
    for i in range(100):  # beyond the cache size: still right
        assert wire(Status(f"S{i}"), proto) == b"+S%d\r\n" % i


def test_unsupported_type_raises_type_error():
    for value in (object(), 1 + 2j, {1: object()}):
        with pytest.raises(TypeError):
            wire(value, 2)


# ----------------------------------------------------------------------------------------------------------------
# hiredis decodes what we send
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,expected", [
    (b"hello", b"hello"),
    ("héllo", "héllo".encode()),
    (Status("OK"), b"OK"),
    (7, 7),
    (None, None),
    (NULL_ARRAY, None),
    (True, 1),
    (False, 0),
    (1.5, b"1.5"),
    (math.inf, b"inf"),
    ([b"a", [1, [None, "x"]], ()], [b"a", [1, [None, b"x"]], []]),
    ({b"k": b"v", b"n": 2}, [b"k", b"v", b"n", 2]),
    ({b"s"}, [b"s"]),
    (Verbatim("txt"), b"txt"),
])
def test_resp2_decodes_with_hiredis(value, expected):
    assert decode(wire(value, 2)) == expected


def test_resp2_error_decodes_as_reply_error():
    reply = decode(wire(ErrorReply("WRONGTYPE Operation against a key"), 2))
    assert isinstance(reply, hiredis.ReplyError)
    assert str(reply) == "WRONGTYPE Operation against a key"


@pytest.mark.parametrize("value,expected", [
    (None, None),
    (NULL_ARRAY, None),
    (True, True),
    (False, False),
    (1.5, 1.5),
    (-2.0, -2.0),
    (math.inf, math.inf),
    (-math.inf, -math.inf),
    ({b"k": 1, b"m": [b"x"]}, {b"k": 1, b"m": [b"x"]}),
    (Verbatim("hello"), b"hello"),  # hiredis strips the "txt:" format
    ([True, None, 2.5, {b"a": b"b"}], [True, None, 2.5, {b"a": b"b"}]),
])
def test_resp3_decodes_with_hiredis(value, expected):
    assert decode(wire(value, 3)) == expected


def test_resp3_nan_decodes_with_hiredis():
    assert math.isnan(decode(wire(math.nan, 3)))


def test_resp3_set_decodes_with_hiredis():
    members = {b"a", b"b", b"c"}
    assert sorted(decode(wire(members, 3))) == sorted(members)
    assert wire(members, 3).startswith(b"~3\r\n")


json_like = st.recursive(
    st.one_of(st.binary(max_size=30), st.integers(-(2**63), 2**63 - 1), st.none(),
              st.text(max_size=10)),
    lambda children: st.lists(children, max_size=5),
    max_leaves=25,
)


def _expected_resp2(value):
    if isinstance(value, list):
        return [_expected_resp2(v) for v in value]
    if isinstance(value, str):
        return value.encode()
    return value


@PROPERTY
@given(value=json_like)
def test_random_nested_values_decode_resp2(value):
    assert decode(wire(value, 2)) == _expected_resp2(value)


@PROPERTY
@given(value=json_like)
def test_random_nested_values_decode_resp3(value):
    assert decode(wire(value, 3)) == _expected_resp2(value)


@PROPERTY
@given(value=st.floats(allow_nan=False))
def test_floats_roundtrip_resp3(value):
    decoded = decode(wire(value, 3))
    assert decoded == value
    assert float(decode(wire(value, 2))) == value


# ----------------------------------------------------------------------------------------------------------------
# Large values: no copy
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
@pytest.mark.parametrize("size", [LARGE_REPLY, LARGE_REPLY + 1, 300 * 1024])
@pytest.mark.parametrize("proto", [2, 3])
def test_large_value_is_emitted_without_copy(kind, size, proto):
    assert LARGE_REPLY == 64 * 1024
    value = kind(b"v" * size)
    out: list = []
    encode(value, proto, out)
    assert len(out) == 3
    assert out[0] == b"$%d\r\n" % size
    assert out[1] is value
    assert out[2] == b"\r\n"
    assert decode(b"".join(out)) == b"v" * size


@pytest.mark.parametrize("proto", [2, 3])
def test_value_just_below_threshold_is_one_part(proto):
    value = b"s" * (LARGE_REPLY - 1)
    out: list = []
    encode(value, proto, out)
    assert out == [b"$%d\r\n" % len(value) + value + b"\r\n"]


def test_large_values_inside_arrays_are_not_copied():
    big1 = b"a" * LARGE_REPLY
    big2 = bytearray(b"b" * (LARGE_REPLY * 2))
    out: list = []
    encode([big1, b"small", [big2, None]], 2, out)
    assert any(part is big1 for part in out)
    assert any(part is big2 for part in out)
    assert decode(b"".join(out)) == [big1, b"small", [bytes(big2), None]]
