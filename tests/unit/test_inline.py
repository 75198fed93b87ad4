"""Unit tests for kvstrata.protocol.inline.split_inline: Redis's sdssplitargs quoting rules.

Expected values follow Redis 7 ``sdssplitargs`` (src/sds.c): double quotes with ``\\n \\r \\t \\b \\a \\xHH`` and
``\\<any>`` escapes, single quotes with only ``\\'``, a closing quote must be followed by a space or the end, and
unbalanced quotes are an error (``None`` here).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstrata.protocol.inline import split_inline

PROPERTY = settings(max_examples=200, deadline=None, database=None)


@pytest.mark.parametrize("line,expected", [
    (b"", []),
    (b"   ", []),
    (b"\t \r\n", []),
    (b"PING", [b"PING"]),
    (b"SET k v", [b"SET", b"k", b"v"]),
    (b"  SET   k \t v  ", [b"SET", b"k", b"v"]),
    (b'SET k "hello world"', [b"SET", b"k", b"hello world"]),
    (b"SET k 'hello world'", [b"SET", b"k", b"hello world"]),
    (b'""', [b""]),
    (b"''", [b""]),
    (b'a "" b', [b"a", b"", b"b"]),
    (b'"a\\nb"', [b"a\nb"]),
    (b'"\\r\\t\\b\\a"', [b"\r\t\b\a"]),
    (b'"\\x41\\x62\\xff\\x00"', [b"Ab\xff\x00"]),
    (b'"\\xAf"', [b"\xaf"]),
    (b'"\\x4"', [b"x4"]),  # not two hex digits: '\x' is just 'x'
    (b'"\\xZZ"', [b"xZZ"]),
    (b'"\\""', [b'"']),
    (b'"\\\\"', [b"\\"]),
    (b'"\\q"', [b"q"]),  # an unknown escape is the character itself
    (b"'it\\'s'", [b"it's"]),
    (b"'a\\nb'", [b"a\\nb"]),  # no escapes in single quotes but \'
    (b"'a\"b'", [b'a"b']),
    (b"\"a'b\"", [b"a'b"]),
    (b'ab"c d"', [b"abc d"]),  # a quote inside a word starts a quoted part
    (b"ab'c d'", [b"abc d"]),
    (b'"a"\tb', [b"a", b"b"]),
    (b'"a"\r', [b"a"]),
    (b'x"a b"', [b"xa b"]),
    (b"\xff\xfe \x80", [b"\xff\xfe", b"\x80"]),
    (b"a\\b", [b"a\\b"]),  # no escapes outside quotes
])
def test_split(line, expected):
    assert split_inline(line) == expected


@pytest.mark.parametrize("line", [
    b'"abc',
    b"'abc",
    b'"abc\\"',
    b"'abc\\'",
    b'"a"b',
    b"'a'b",
    b'SET "a"b c',
    b'"abc\\',
    b'"',
    b"'",
    b'a "b',
])
def test_unbalanced_quotes(line):
    assert split_inline(line) is None


def _repr(arg: bytes) -> bytes:
    """Quote like Redis's sdscatrepr, whose output sdssplitargs reads back."""
    out = bytearray(b'"')
    for c in arg:
        ch = bytes([c])
        if ch in b'\\"':
            out += b"\\" + ch
        elif ch in b"\n\r\t\a\b":
            out += {b"\n": b"\\n", b"\r": b"\\r", b"\t": b"\\t", b"\a": b"\\a", b"\b": b"\\b"}[ch]
        elif 32 <= c < 127:
            out += ch
        else:
            out += b"\\x%02x" % c
    return bytes(out + b'"')


@PROPERTY
@given(args=st.lists(st.binary(max_size=40), max_size=8),
       seps=st.lists(st.sampled_from([b" ", b"  ", b"\t", b" \t "]), min_size=1, max_size=3))
def test_repr_roundtrip(args, seps):
    line = b"".join(_repr(a) + seps[i % len(seps)] for i, a in enumerate(args))
    assert split_inline(line) == args


@PROPERTY
@given(words=st.lists(st.text(alphabet="abcxyz019-_:.{}[]*?!@#$%^&()+=,<>/|~`", min_size=1, max_size=10),
                      max_size=8))
def test_bare_words_split_on_spaces(words):
    line = " ".join(words).encode()
    assert split_inline(line) == [w.encode() for w in words]


@PROPERTY
@given(args=st.lists(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
                     max_size=6))
def test_single_quoted_roundtrip(args):
    args = [a for a in args if not a.endswith("\\") and "\\'" not in a]
    line = b" ".join(b"'" + a.encode().replace(b"'", b"\\'") + b"'" for a in args)
    assert split_inline(line) == [a.encode() for a in args]


@pytest.mark.parametrize("line,expected", [(b"a\x0bb", [b"a\x0bb"]), (b"SET k a\x0cb", [b"SET", b"k", b"a\x0cb"])],
                         ids=["vt", "ff"])
def test_vertical_tab_and_form_feed_inside_a_word(line, expected):
    assert split_inline(line) == expected


def test_vertical_tab_and_form_feed_between_words_are_blanks():
    assert split_inline(b"\x0b\x0ca \x0b\x0c b") == [b"a", b"b"]


# ---- NUL and every byte value (issue 13: a NUL once made the splitter loop forever) ----

@pytest.mark.parametrize("line,expected", [
    (b"PI\x00NG", [b"PI"]),  # the line is a C string for Redis: it ends at the NUL
    (b"\x00", []),
    (b"\x00PING", []),
    (b"SET k \x00 v", [b"SET", b"k"]),
    (b'ECHO "a\x00b"', None),  # the quote is never closed before the NUL
    (b"ECHO 'a\x00", None),
    (b"ECHO a\x00'", [b"ECHO", b"a"]),
])
def test_nul_ends_the_line(line, expected):
    assert split_inline(line) == expected


@pytest.mark.parametrize("byte", range(256))
def test_every_byte_value_alone_and_inside_words(byte):
    b = bytes([byte])
    for line in (b, b"x" + b + b"y", b + b" z", b"'" + b + b"'", b'"' + b + b'"'):
        got = split_inline(line)
        assert got is None or all(isinstance(a, bytes) for a in got)
    if byte not in b" \t\n\r\x0b\x0c\x00\"'":
        assert split_inline(b"x" + b + b"y") == [b"x" + b + b"y"]


@PROPERTY
@given(line=st.binary(max_size=200))
def test_any_line_splits_into_pieces_of_it(line):
    got = split_inline(line)
    if got is not None:
        assert sum(map(len, got)) <= len(line)
        assert len(got) <= len(line)
