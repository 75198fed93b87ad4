"""Keyspace helpers shared by the tiers: the stable scan bucket of a key and Redis glob matching.

The glob matcher gives exactly the answers of Redis's ``stringmatchlen`` (util.c) at a bounded cost. The
pattern is cut at its stars into segments of one-byte atoms (a literal, ``?`` or a ``[...]`` class, parsed with
Redis's quirks: backslash escapes, reversed ranges swapped, C's signed ``char`` in range comparisons, an
unterminated class running to the end of the pattern). Redis tries the text after the innermost star at each
position and gives up as soon as a later star has tried every position (its ``skipLongerMatches``), so only the
innermost star ever moves and the first place where the next segment fits is the one it keeps: each segment is
one fixed-length regex (no quantifiers, so no backtracking) searched once per star. Redis's nesting limit (more
than 1000 stars deep is no match) is kept, which also bounds the work per key at 1000 searches.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from functools import lru_cache

# SCAN walks buckets in order; the cursor is the next bucket. A stable hash (not Python's salted hash()) keeps
# the bucket of a key the same in every tier and across restarts.
SCAN_BUCKET_BITS = 12
SCAN_BUCKETS = 1 << SCAN_BUCKET_BITS

# Redis's stringmatchlen: a match that must go more than this many stars deep is no match.
MAX_NESTING = 1000

_STAR, _BACKSLASH, _OPEN, _CLOSE, _CARET, _DASH, _QUESTION = b"*\\[]^-?"
_ALL = bytes(range(256))


def bucket_of(key: bytes) -> int:
    return zlib.crc32(key) & (SCAN_BUCKETS - 1)


def _signed(c: int) -> int:
    """A byte as C's (signed) ``char``: Redis compares class ranges this way."""
    return c - 256 if c >= 128 else c


def _lower(c: int) -> int:
    return c + 32 if 65 <= c <= 90 else c


def _atom_regex(members: bytearray) -> bytes:
    """A regex for one byte whose value is flagged in ``members`` (256 flags)."""
    count = sum(members)
    if count == 256:
        return b"."
    if count == 0:
        return b"(?!)"
    if count == 1:
        return re.escape(bytes([members.index(1)]))
    return b"[" + b"".join(re.escape(bytes([b])) for b in range(256) if members[b]) + b"]"


def _literal(c: int, nocase: bool) -> bytes:
    if nocase and _lower(c) != c:
        return b"[" + bytes([c, _lower(c)]) + b"]"
    if nocase and 97 <= c <= 122:
        return b"[" + bytes([c, c - 32]) + b"]"
    return re.escape(bytes([c]))


def _class(pattern: bytes, p: int, nocase: bool) -> tuple[bytes, int]:
    """The regex of the class whose '[' is at ``p``, and where the pattern continues after it (Redis's walk)."""
    n = len(pattern)
    p += 1
    negated = p < n and pattern[p] == _CARET
    if negated:
        p += 1
    members = bytearray(256)
    while True:
        if p < n and pattern[p] == _BACKSLASH and n - p >= 2:
            p += 1
            members[pattern[p]] = 1
        elif p < n and pattern[p] == _CLOSE:
            break
        elif p >= n:
            p -= 1  # an unterminated class runs to the end of the pattern
            break
        elif n - p >= 3 and pattern[p + 1] == _DASH:
            lo, hi = _signed(pattern[p]), _signed(pattern[p + 2])
            if lo > hi:
                lo, hi = hi, lo
            if nocase:
                lo, hi = _lower(lo), _lower(hi)
                for b in range(256):
                    if lo <= _lower(_signed(b)) <= hi:
                        members[b] = 1
            else:
                for v in range(lo, hi + 1):
                    members[v & 0xFF] = 1
            p += 2
        elif nocase:
            want = _lower(pattern[p])
            for b in (pattern[p], want, want - 32 if 97 <= want <= 122 else want):
                members[b] = 1
        else:
            members[pattern[p]] = 1
        p += 1
    if negated:
        members = bytearray(1 - m for m in members)
    return _atom_regex(members), p + 1


_SPECIAL = re.compile(rb"[*?\[\\]")


class Glob:
    """One compiled pattern: the segments between its stars, each compiled to a regex when first needed.

    Tokenising stops at the first star past Redis's nesting limit: nothing after it can decide a match.
    """

    __slots__ = ("_literals", "_regexes", "_sources", "lengths", "stars", "trailing_star")

    def __init__(self, pattern: bytes, nocase: bool = False) -> None:
        sources: list[bytearray] = [bytearray()]
        literals: list[bytearray | None] = [None if nocase else bytearray()]
        lengths = [0]
        n = len(pattern)
        p = 0
        trailing = False
        while p < n:
            special = _SPECIAL.search(pattern, p)
            stop = n if special is None else special.start()
            if stop > p:  # a run of plain bytes
                run = pattern[p:stop]
                sources[-1] += b"".join(_literal(c, nocase) for c in run) if nocase else re.escape(run)
                if literals[-1] is not None:
                    literals[-1] += run
                lengths[-1] += stop - p
                p = stop
                continue
            c = pattern[p]
            if c == _STAR:
                while p + 1 < n and pattern[p + 1] == _STAR:
                    p += 1
                if p == n - 1:
                    trailing = True
                    break
                sources.append(bytearray())
                literals.append(None if nocase else bytearray())
                lengths.append(0)
                if len(sources) > MAX_NESTING + 1:
                    break  # a match that gets here is refused (match() checks the depth first)
                p += 1
                continue
            if c == _QUESTION:
                q = p
                while q < n and pattern[q] == _QUESTION:
                    q += 1
                atom = b"." if q - p == 1 else b".{%d}" % (q - p)
                lengths[-1] += q - p - 1
                p = q
                literals[-1] = None
            elif c == _OPEN:
                atom, p = _class(pattern, p, nocase)
                literals[-1] = None
            else:
                if c == _BACKSLASH and n - p >= 2:
                    p += 1
                atom = _literal(pattern[p], nocase)
                if literals[-1] is not None:
                    literals[-1].append(pattern[p])
                p += 1
            sources[-1] += atom
            lengths[-1] += 1
        self._sources = [bytes(s) for s in sources]
        self._literals = [None if s is None else bytes(s) for s in literals]
        self._regexes: list[re.Pattern[bytes] | None] = [None] * len(sources)
        self.lengths = lengths
        self.stars = len(sources) - 1  # stars that have a segment after them
        self.trailing_star = trailing

    def _regex(self, i: int) -> re.Pattern[bytes]:
        rx = self._regexes[i]
        if rx is None:
            rx = self._regexes[i] = re.compile(self._sources[i], re.DOTALL)
        return rx

    def _find(self, i: int, text: bytes, pos: int) -> int:
        """Where segment ``i`` first fits in ``text`` at or after ``pos`` (its end), or -1."""
        lit = self._literals[i]
        if lit is not None:
            at = text.find(lit, pos)
            return -1 if at < 0 else at + len(lit)
        found = self._regex(i).search(text, pos)
        return -1 if found is None else found.end()

    def _fits(self, i: int, text: bytes, start: int) -> bool:
        """Whether segment ``i`` matches ``text`` from ``start`` to its end."""
        lit = self._literals[i]
        if lit is not None:
            return text.endswith(lit) if start + len(lit) == len(text) else False
        return self._regex(i).fullmatch(text, start) is not None

    def match(self, text: bytes) -> bool:
        m = len(text)
        lengths = self.lengths
        if m == 0:
            # Redis's loop never starts: only the empty pattern matches the empty string.
            return lengths[0] == 0 and self.stars == 0 and not self.trailing_star
        first = lengths[0]
        if first > m:
            return False
        if first:
            lit = self._literals[0]
            if lit is not None:
                if not text.startswith(lit):
                    return False
            elif self._regex(0).match(text) is None:
                return False
        if self.stars == 0:
            return first == m or (self.trailing_star and first < m)
        pos = first
        if pos == m:
            return False  # the text ended before a segment that must follow
        last = self.stars
        for i in range(1, last + 1):
            if i > MAX_NESTING:
                return False
            size = lengths[i]
            if size > m - pos:
                return False
            if i == last and not self.trailing_star:
                # The final segment must end the text.
                return self._fits(i, text, m - size)
            pos = self._find(i, text, pos)
            if pos < 0:
                return False
            if pos == m:
                return i == last and self.trailing_star
        return True  # a trailing star takes the rest


# Compiled patterns are cached: small ones in an LRU, large ones (a pattern may be as long as a bulk string) by a
# byte budget, so a client sending many huge patterns cannot make the cache hold them all.
_SMALL_PATTERN = 4096
_LARGE_CACHE_BYTES = 64 * 1024 * 1024
_large: dict[tuple[bytes, bool], Glob] = {}


@lru_cache(maxsize=256)
def _compile_small(pattern: bytes, nocase: bool) -> Glob:
    return Glob(pattern, nocase)


def compile_glob(pattern: bytes, nocase: bool = False) -> Glob:
    """The compiled form of ``pattern`` (cached)."""
    if len(pattern) <= _SMALL_PATTERN:
        return _compile_small(pattern, nocase)
    key = (pattern, nocase)
    glob = _large.get(key)
    if glob is None:
        glob = Glob(pattern, nocase)
        if len(pattern) <= _LARGE_CACHE_BYTES:
            while _large and sum(len(p) for p, _ in _large) + len(pattern) > _LARGE_CACHE_BYTES:
                del _large[next(iter(_large))]
            _large[key] = glob
    return glob


def _everything(key: bytes) -> bool:
    return True


def glob_matcher(pattern: bytes | bytearray, nocase: bool = False) -> Callable[[bytes], bool]:
    """``key -> bool`` for one pattern: compile once, then match many keys (KEYS, SCAN, MARKHOT).

    A lone ``*`` matches every key, the empty one included (Redis special-cases it before matching)."""
    pattern = bytes(pattern)
    if pattern == b"*":
        return _everything
    return compile_glob(pattern, nocase).match


def glob_match(pattern: bytes, key: bytes, nocase: bool = False) -> bool:
    """Whether ``key`` matches the Redis glob ``pattern`` (as Redis's stringmatchlen decides it)."""
    if pattern == b"*":
        return True
    return compile_glob(pattern if pattern.__class__ is bytes else bytes(pattern), nocase).match(key)
