"""Keyspace helpers shared by the tiers: the stable scan bucket of a key and Redis glob matching."""

from __future__ import annotations

import re
import zlib
from functools import lru_cache

# SCAN walks buckets in order; the cursor is the next bucket. A stable hash (not Python's salted hash()) keeps
# the bucket of a key the same in every tier and across restarts.
SCAN_BUCKET_BITS = 12
SCAN_BUCKETS = 1 << SCAN_BUCKET_BITS


def bucket_of(key: bytes) -> int:
    return zlib.crc32(key) & (SCAN_BUCKETS - 1)


def _class_regex(items: list[tuple[int, int]], negated: bool) -> bytes:
    if not items:
        # "[]" matches nothing; "[^]" is a negated empty class, i.e. any one character (as in Redis).
        return b"." if negated else b"(?!)"
    parts = [re.escape(bytes([lo])) if lo == hi else re.escape(bytes([lo])) + b"-" + re.escape(bytes([hi]))
             for lo, hi in items]
    return b"[" + (b"^" if negated else b"") + b"".join(parts) + b"]"


@lru_cache(maxsize=256)
def _compile_glob(pattern: bytes) -> re.Pattern[bytes]:
    """Translate a Redis glob (``*``, ``?``, ``[a-z]``, ``[^x]``, backslash escapes) to a regex.

    Follows Redis's stringmatchlen: a reversed range is swapped, an unterminated class runs to the end of the
    pattern, and a backslash escapes the next character inside and outside classes.
    """
    out = bytearray()
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == 42:  # *
            out += b".*"
        elif c == 63:  # ?
            out += b"."
        elif c == 92 and i + 1 < n:  # backslash
            i += 1
            out += re.escape(pattern[i : i + 1])
        elif c == 91:  # [
            j = i + 1
            negated = j < n and pattern[j] == 94
            if negated:
                j += 1
            items: list[tuple[int, int]] = []
            while j < n and pattern[j] != 93:
                ch = pattern[j]
                if ch == 92 and j + 1 < n:
                    j += 1
                    items.append((pattern[j], pattern[j]))
                elif j + 2 < n and pattern[j + 1] == 45:  # a-z
                    lo, hi = ch, pattern[j + 2]
                    items.append((min(lo, hi), max(lo, hi)))
                    j += 2
                else:
                    items.append((ch, ch))
                j += 1
            out += _class_regex(items, negated)
            i = j
        else:
            out += re.escape(pattern[i : i + 1])
        i += 1
    return re.compile(bytes(out) + b"\\Z", re.DOTALL)


def glob_match(pattern: bytes, key: bytes) -> bool:
    if pattern == b"*":
        return True
    return _compile_glob(pattern).match(key) is not None
