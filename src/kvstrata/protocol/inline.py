"""Inline commands (``SET a "b c"``), split with the quoting rules of Redis's sdssplitargs.

Redis hands the line to sdssplitargs as a C string, so a NUL byte ends it: whatever follows a NUL is not part
of the command. (The parser never even gets such a line: Redis finds the end of an inline request with strchr,
which stops at a NUL too; see ``inline_end``.)
"""

from __future__ import annotations

_ESCAPES = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}
_HEX = b"0123456789abcdefABCDEF"
_SPACE = b" \n\r\t\v\f"  # C's isspace: skipped between arguments and required after a closing quote
_WORD_END = b" \n\r\t"  # what ends an unquoted argument (and NUL, the end of the C string)


def inline_end(buf: bytes | bytearray, start: int, end: int) -> int:
    """Where the inline request starting at ``start`` ends (its '\\n'), or -1 while it is incomplete.

    Redis searches with strchr, which stops at the first NUL: a NUL before the newline means "no newline yet"
    (the request waits for more data until it exceeds the inline limit).
    """
    eol = buf.find(b"\n", start, end)
    if eol < 0:
        return -1
    return -1 if buf.find(b"\x00", start, eol) >= 0 else eol


def split_inline(line: bytes) -> list[bytes] | None:
    """Arguments of one inline request line, or None for unbalanced quotes."""
    nul = line.find(b"\x00")
    if nul >= 0:
        line = line[:nul]
    args: list[bytes] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in _SPACE:
            i += 1
        if i >= n:
            return args
        cur = bytearray()
        in_dq = in_sq = False
        while True:
            if in_dq:
                if i >= n:
                    return None
                c = line[i]
                if (c == 92 and i + 3 < n and line[i + 1] == ord("x") and line[i + 2] in _HEX
                        and line[i + 3] in _HEX):
                    cur.append(int(line[i + 2 : i + 4], 16))
                    i += 3
                elif c == 92 and i + 1 < n:
                    i += 1
                    cur.append(_ESCAPES.get(line[i], line[i]))
                elif c == 34:
                    if i + 1 < n and line[i + 1] not in _SPACE:
                        return None
                    in_dq = False
                    i += 1
                    break
                else:
                    cur.append(c)
            elif in_sq:
                if i >= n:
                    return None
                c = line[i]
                if c == 92 and i + 1 < n and line[i + 1] == 39:
                    i += 1
                    cur.append(39)
                elif c == 39:
                    if i + 1 < n and line[i + 1] not in _SPACE:
                        return None
                    in_sq = False
                    i += 1
                    break
                else:
                    cur.append(c)
            else:
                if i >= n:
                    break
                c = line[i]
                if c in _WORD_END:
                    i += 1
                    break
                if c == 34:
                    in_dq = True
                elif c == 39:
                    in_sq = True
                else:
                    cur.append(c)
            i += 1
        args.append(bytes(cur))
