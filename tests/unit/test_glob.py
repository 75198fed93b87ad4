"""The glob matcher (kvstrata.engine.keyspace): Redis's stringmatchlen answers at a bounded cost.

Patterns that made the former regex translation backtrack for ever (issue 13) must come back at once with
Redis's answer; random patterns are compared with a real redis-server in tests/integration/test_hostile_input.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstrata.engine.keyspace import MAX_NESTING, Glob, glob_match

PROPERTY = settings(max_examples=300, deadline=None, database=None)


def reference(pattern: bytes, text: bytes, nocase: bool = False) -> bool:
    """A line-by-line port of Redis's recursive stringmatchlen_impl (util.c), for small inputs only."""
    skip = [False]

    def signed(c: int) -> int:
        return c - 256 if c >= 128 else c

    def low(c: int) -> int:
        return c + 32 if 65 <= c <= 90 else c

    def at(p: int) -> int:
        return pattern[p] if p < len(pattern) else 0

    def impl(p: int, s: int, nesting: int) -> bool:
        if nesting > MAX_NESTING:
            return False
        n, m = len(pattern), len(text)
        while p < n and s < m:
            c = pattern[p]
            if c == 42:
                while p < n and at(p + 1) == 42:
                    p += 1
                if n - p == 1:
                    return True
                while s < m:
                    if impl(p + 1, s, nesting + 1):
                        return True
                    if skip[0]:
                        return False
                    s += 1
                skip[0] = True
                return False
            if c == 63:
                s += 1
            elif c == 91:
                p += 1
                neg = at(p) == 94
                if neg:
                    p += 1
                match = False
                while True:
                    if at(p) == 92 and n - p >= 2:
                        p += 1
                        match |= pattern[p] == text[s]
                    elif at(p) == 93:
                        break
                    elif n - p == 0:
                        p -= 1
                        break
                    elif n - p >= 3 and pattern[p + 1] == 45:
                        lo, hi, ch = signed(pattern[p]), signed(pattern[p + 2]), signed(text[s])
                        if lo > hi:
                            lo, hi = hi, lo
                        if nocase:
                            lo, hi, ch = low(lo), low(hi), low(ch)
                        p += 2
                        match |= lo <= ch <= hi
                    else:
                        match |= (low(pattern[p]) == low(text[s])) if nocase else pattern[p] == text[s]
                    p += 1
                if neg:
                    match = not match
                if not match:
                    return False
                s += 1
            else:
                if c == 92 and n - p >= 2:
                    p += 1
                if (low(pattern[p]) != low(text[s])) if nocase else pattern[p] != text[s]:
                    return False
                s += 1
            p += 1
            if s == m:
                while at(p) == 42:
                    p += 1
                break
        return p == n and s == m

    return impl(0, 0, 0)


PATTERN_BYTES = st.sampled_from(list(b"ab*?[]^-\\") + [0x80, 0xFF, 0x00, ord("A"), ord("z")])
TEXT_BYTES = st.sampled_from(list(b"abAz-[]*?\\^") + [0x80, 0xFF, 0x00, 0x7F])


@PROPERTY
@given(pattern=st.lists(PATTERN_BYTES, min_size=1, max_size=12).map(bytes),
       text=st.lists(TEXT_BYTES, max_size=12).map(bytes), nocase=st.booleans())
def test_same_answer_as_redis_stringmatchlen(pattern, text, nocase):
    if pattern == b"*":
        return  # KEYS/SCAN treat a lone '*' as "everything" before matching, as Redis does
    assert glob_match(pattern, text, nocase=nocase) is reference(pattern, text, nocase)


def test_many_stars_against_a_short_key():
    """'a*a*...*b' against 40 a's: exponential for a backtracking regex, immediate here."""
    assert glob_match(b"a*" * 20 + b"b", b"a" * 40) is False
    assert glob_match(b"a*" * 20 + b"a", b"a" * 40) is True


def test_star_question_repeated_against_a_long_key():
    """'*?' x 50,000 against a 50,000-byte key: Redis gives up past 1000 stars deep, so must we."""
    assert glob_match(b"*?" * 50_000, b"a" * 50_000) is False
    assert glob_match(b"*?" * 50_000, b"a" * 500) is False  # too short for 50,000 '?'
    assert glob_match(b"*?" * 400 + b"*", b"a" * 500) is True


@pytest.mark.parametrize("stars,expected", [(MAX_NESTING - 1, True), (MAX_NESTING, True),
                                            (MAX_NESTING + 1, False)])
def test_nesting_limit(stars, expected):
    text = b"a" * 3000
    assert glob_match(b"*a" * stars, text) is expected
    assert glob_match(b"*a" * stars + b"*", text) is expected


def test_long_literal_segments_use_a_linear_search():
    text = b"a" * 50_000
    assert glob_match(b"*" + b"a" * 25_000 + b"b*", text) is False
    assert glob_match(b"*" + b"[a]" * 2_500 + b"b*", text) is False
    assert glob_match(b"*" + b"a" * 25_000 + b"*", text) is True


def test_tokenising_stops_past_the_nesting_limit():
    g = Glob(b"*x" * 100_000)
    assert g.stars == MAX_NESTING + 1


def test_signed_char_ranges_and_case():
    assert glob_match(b"[a-\xff]", b"\xff") is True  # -1..'a' as C's signed char
    assert glob_match(b"[a-\xff]", b"b") is False
    assert glob_match(b"[A-C]x", b"bX", nocase=True) is True
    assert glob_match(b"[A-C]x", b"bX") is False


def test_matcher_compiles_once_and_star_matches_the_empty_key():
    from kvstrata.engine.keyspace import glob_matcher

    assert glob_matcher(b"*")(b"") is True
    assert glob_match(b"**", b"") is False  # only a lone '*' is special-cased, as in Redis
    big = bytearray(b"k" + b"?" * 10_000 + b"*")
    matches = glob_matcher(big)
    assert matches(b"k" + b"x" * 10_001) is True
    assert matches(b"k" + b"x" * 9_999) is False


def test_large_pattern_cache_is_bounded():
    from kvstrata.engine import keyspace

    for i in range(40):
        keyspace.compile_glob(bytes([65 + i % 26]) * (4 * 1024 * 1024) + b"%d" % i)
    assert sum(len(p) for p, _ in keyspace._large) <= keyspace._LARGE_CACHE_BYTES
