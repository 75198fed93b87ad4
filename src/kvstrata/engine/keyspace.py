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


@lru_cache(maxsize=256)
def _compile_glob(pattern: bytes) -> re.Pattern[bytes]:
    """Translate a Redis glob (``*``, ``?``, ``[a-z]``, ``[^x]``, backslash escapes) to a regex."""
    out = bytearray()
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i : i + 1]
        if c == b"*":
            out += b".*"
        elif c == b"?":
            out += b"."
        elif c == b"\\" and i + 1 < n:
            i += 1
            out += re.escape(pattern[i : i + 1])
        elif c == b"[":
            j = i + 1
            cls = bytearray(b"[")
            if j < n and pattern[j : j + 1] == b"^":
                cls += b"^"
                j += 1
            while j < n and pattern[j : j + 1] != b"]":
                ch = pattern[j : j + 1]
                if ch == b"\\" and j + 1 < n:
                    j += 1
                    cls += re.escape(pattern[j : j + 1])
                elif ch == b"-" and len(cls) > 1 and j + 1 < n and pattern[j + 1 : j + 2] != b"]":
                    # Redis accepts reversed ranges ([c-a] is [a-c]).
                    lo = cls[-1]
                    hi = pattern[j + 1]
                    if lo > hi:
                        cls[-1] = hi
                        hi = lo
                    cls += b"-" + re.escape(bytes([hi]))
                    j += 1
                else:
                    cls += re.escape(ch)
                j += 1
            if j >= n:
                # Redis treats an unterminated class as matching up to the end of the pattern.
                cls += b"]"
                out += cls
                i = n
                continue
            cls += b"]"
            out += cls if len(cls) > 2 else b"(?!)"
            i = j
        else:
            out += re.escape(c)
        i += 1
    return re.compile(bytes(out) + b"\\Z", re.DOTALL)


def glob_match(pattern: bytes, key: bytes) -> bool:
    if pattern == b"*":
        return True
    return _compile_glob(pattern).match(key) is not None
