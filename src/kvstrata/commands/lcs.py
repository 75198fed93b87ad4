"""LCS: the longest common subsequence of two string values, with Redis 7.0's replies (the string, LEN, or IDX's
matching ranges with MINMATCHLEN and WITHMATCHLEN), its limits and its error texts.

Redis fills the whole (len1 + 1) x (len2 + 1) dynamic-programming table, refusing one larger than
proto-max-bulk-len, then walks it back from the end; which of several common subsequences it answers, and the
ranges IDX lists, depend on that walk's tie-breaking. The same table is built here a row at a time in numpy
(rows along the shorter string), and the walk follows Redis's rules step by step, except that a run of steps
along the longer string is found in one numpy search: a walk over a long and a short string would otherwise take
one Python step per byte.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvstrata.commands.args import parse_int
from kvstrata.commands.context import Context
from kvstrata.commands.registry import command
from kvstrata.commands.strings import max_bulk_len, string_value
from kvstrata.errors import CommandError, syntax_error

Buffer = bytes | bytearray | memoryview

_UINT32_MAX = 2**32 - 1
_FIRST_RUN = 256  # the first slice a run search looks at; each next one is twice as long


def _word(raw: bytes) -> bytes:
    """An option word as Redis's strcasecmp sees it: a C string (up to the first NUL), any case."""
    return raw.split(b"\0", 1)[0].lower()


def _dtype(most: int) -> type[np.unsignedinteger[Any]]:
    """The narrowest unsigned type that holds LCS lengths up to ``most``."""
    if most <= 0xFF:
        return np.uint8
    return np.uint16 if most <= 0xFFFF else np.uint32


def _table(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """T[i, j]: the LCS length of ``rows[:i]`` and ``cols[:j]``.

    A row at once: T[i, j] = max(T[i-1, j], T[i, j-1], T[i-1, j-1] + (rows[i-1] == cols[j-1])), and unrolling
    T[i, j-1] makes it the running maximum over k <= j of max(T[i-1, k], T[i-1, k-1] + match(k))."""
    table = np.zeros((len(rows) + 1, len(cols) + 1), dtype=_dtype(min(len(rows), len(cols))))
    for i in range(1, len(rows) + 1):
        prev = table[i - 1]
        step = np.maximum(prev[1:], prev[:-1] + (cols == rows[i - 1]))
        np.maximum.accumulate(step, out=table[i, 1:])
    return table


def _length(rows: np.ndarray, cols: np.ndarray) -> int:
    """The LCS length alone (LEN): two rows of the table, never all of it."""
    prev = np.zeros(len(cols) + 1, dtype=_dtype(min(len(rows), len(cols))))
    row = prev.copy()
    for c in rows:
        np.maximum.accumulate(np.maximum(prev[1:], prev[:-1] + (cols == c)), out=row[1:])
        prev, row = row, prev
    return int(prev[-1])


def _run_end(go_on: Any, start: int) -> int:
    """The largest k <= ``start`` for which ``go_on(lo, hi)`` (a boolean array for k in lo .. hi) is False, or 0:
    how far a walk that keeps stepping down while ``go_on`` holds gets. Searched backwards in growing slices."""
    hi = start
    size = _FIRST_RUN
    while hi > 0:
        lo = max(hi - size + 1, 1)
        stops = np.flatnonzero(~go_on(lo, hi))
        if len(stops):
            return lo + int(stops[-1])
        hi = lo - 1
        size *= 2
    return 0


def _walk(a: np.ndarray, b: np.ndarray, table: np.ndarray, a_rows: bool, idx: bool, minmatchlen: int,
          withmatchlen: bool) -> tuple[bytes, list[list[Any]]]:
    """Redis's walk back from (len(a), len(b)): the common subsequence, and the matching ranges when ``idx``.

    ``a_rows``: ``table`` has a row per byte of ``a`` (a is the shorter), else it is transposed."""
    alen, blen = len(a), len(b)

    def cell(i: int, j: int) -> int:
        return int(table[i, j] if a_rows else table[j, i])

    total = cell(alen, blen)
    result = bytearray(total)
    matches: list[list[Any]] = []
    unset = alen  # Redis's mark for "no range open"
    a_start, a_end, b_start, b_end = unset, 0, 0, 0
    i, j = alen, blen
    k = total
    while i > 0 and j > 0:
        emit = False
        if a[i - 1] == b[j - 1]:
            result[k - 1] = a[i - 1]
            if a_start == unset:
                a_start = a_end = i - 1
                b_start = b_end = j - 1
            elif a_start == i and b_start == j:  # contiguous: the range grows backwards
                a_start -= 1
                b_start -= 1
            else:
                emit = True
            if a_start == 0 or b_start == 0:
                emit = True
            k -= 1
            i -= 1
            j -= 1
        else:
            if cell(i - 1, j) > cell(i, j - 1):
                i -= 1
                if not a_rows:  # i runs along the longer string: skip the steps that go on the same way
                    jj = j
                    i = _run_end(lambda lo, hi, jj=jj: (a[lo - 1 : hi] != b[jj - 1])
                                 & (table[jj, lo - 1 : hi] > table[jj - 1, lo : hi + 1]), i)
            else:
                j -= 1
                if a_rows:
                    ii = i
                    j = _run_end(lambda lo, hi, ii=ii: (b[lo - 1 : hi] != a[ii - 1])
                                 & (table[ii - 1, lo : hi + 1] <= table[ii, lo - 1 : hi]), j)
            if a_start != unset:
                emit = True
        if emit:
            length = a_end - a_start + 1
            if idx and (minmatchlen == 0 or length >= minmatchlen):
                match: list[Any] = [[a_start, a_end], [b_start, b_end]]
                if withmatchlen:
                    match.append(length)
                matches.append(match)
            a_start = unset
    return bytes(result), matches


@command("lcs", -3, "readonly", keys=(1, 2, 1), group="string", since="7.0.0",
         summary="Finds the longest common substring.",
         syntax="LCS key1 key2 [LEN] [IDX] [MINMATCHLEN min-match-len] [WITHMATCHLEN]")
def lcs(ctx: Context, args: list[bytes]) -> Any:
    first = string_value(ctx, args[1])
    second = string_value(ctx, args[2])
    want_len = want_idx = withmatchlen = False
    minmatchlen = 0
    j = 3
    while j < len(args):
        opt = _word(args[j])
        if opt == b"idx":
            want_idx = True
        elif opt == b"len":
            want_len = True
        elif opt == b"withmatchlen":
            withmatchlen = True
        elif opt == b"minmatchlen" and j + 1 < len(args):
            minmatchlen = max(parse_int(args[j + 1]), 0)
            j += 1
        else:
            raise syntax_error()
        j += 1
    if want_len and want_idx:
        raise CommandError("If you want both the length and indexes, please just use IDX.")
    a: Buffer = b"" if first is None else first
    b: Buffer = b"" if second is None else second
    if len(a) >= _UINT32_MAX - 1 or len(b) >= _UINT32_MAX - 1:
        raise CommandError("String too long for LCS")
    if (len(a) + 1) * (len(b) + 1) * 4 > max_bulk_len(ctx):  # Redis's table: a uint32 per cell
        raise CommandError("Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len")
    av = np.frombuffer(a, dtype=np.uint8)
    bv = np.frombuffer(b, dtype=np.uint8)
    a_rows = len(a) <= len(b)
    rows, cols = (av, bv) if a_rows else (bv, av)
    try:
        if want_len:
            return _length(rows, cols)
        table = _table(rows, cols)
    except MemoryError:
        raise CommandError("Insufficient memory, failed allocating transient memory for LCS") from None
    common, matches = _walk(av, bv, table, a_rows, want_idx, minmatchlen, withmatchlen)
    if want_idx:
        return {"matches": matches, "len": int(table[-1, -1])}
    return common
