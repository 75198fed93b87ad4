"""Reply encoding for RESP2 and RESP3.

Handlers return plain Python values; this module turns them into wire bytes:
bytes/bytearray/memoryview -> bulk string, str -> bulk string (UTF-8), Status -> simple string, ErrorReply ->
error, int -> integer, None -> null, float -> double (RESP3) or bulk (RESP2), bool -> boolean (RESP3) or
integer, list/tuple -> array, dict -> map (RESP3) or flat array, set/frozenset -> set (RESP3) or array.

Large bulk values are emitted as ``[header, value, b"\\r\\n"]`` so the value itself is never copied.
"""

from __future__ import annotations

import math
from typing import Any

CRLF = b"\r\n"
LARGE_REPLY = 64 * 1024


class Status(str):
    """A simple-string reply (``+OK``)."""


class ErrorReply(str):
    """An error reply; the text includes its prefix (``ERR ...``)."""


def _error_bytes(text: str) -> bytes:
    """An error text as bytes: latin-1 (raw client bytes carried as such), else UTF-8 with client bytes that were
    decoded with ``surrogateescape`` given back as they came; never an exception (one closed the connection)."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


class Verbatim(str):
    """A verbatim string (RESP3 ``=``, bulk in RESP2), used by INFO and CLIENT INFO in RESP3."""


OK = Status("OK")
PONG = Status("PONG")
_STATUS_CACHE: dict[str, bytes] = {}
_NULL2 = b"$-1\r\n"
_NULL_ARRAY2 = b"*-1\r\n"
_NULL3 = b"_\r\n"


class NullArray:
    """A RESP2 null array (``*-1``), e.g. for aborted transactions; RESP3 null."""


NULL_ARRAY = NullArray()


class NoReply:
    """The handler wrote its reply itself (TAIR.KV.ARENA sends it with a file descriptor attached)."""


NO_REPLY = NoReply()


class Push(list):  # type: ignore[type-arg]
    """An out-of-band message (pub/sub): a RESP3 push (``>``), an array in RESP2."""


class SetReply(list):  # type: ignore[type-arg]
    """A RESP3 set (an array in RESP2) whose members go out in the order given."""


class Replies(list):  # type: ignore[type-arg]
    """Several replies one after another (SUBSCRIBE a b answers once per channel)."""


def _format_double(x: float) -> bytes:
    if math.isinf(x):
        return b"inf" if x > 0 else b"-inf"
    if math.isnan(x):
        return b"nan"
    if x == int(x) and abs(x) < 1e17:
        return str(int(x)).encode()
    return repr(x).encode()


def encode(value: Any, proto: int, out: list[Any]) -> None:
    """Append the encoding of ``value`` to ``out`` (a list of bytes-like parts for writelines)."""
    t = type(value)
    if t is bytes or t is bytearray or t is memoryview:
        n = len(value)
        if n >= LARGE_REPLY:
            out.append(b"$%d\r\n" % n)
            out.append(value)
            out.append(CRLF)
        else:
            out.append(b"$%d\r\n%b\r\n" % (n, value))
    elif t is Status:
        data = _STATUS_CACHE.get(value)
        if data is None:
            data = b"+" + value.encode("utf-8", "surrogateescape") + CRLF
            if len(_STATUS_CACHE) < 64:
                _STATUS_CACHE[value] = data
        out.append(data)
    elif t is int:
        out.append(b":%d\r\n" % value)
    elif value is None:
        out.append(_NULL3 if proto == 3 else _NULL2)
    elif t is ErrorReply:
        # Error texts may quote raw client bytes, carried as latin-1 so they go back out unchanged.
        data = _error_bytes(value)
        # As Redis's addReplyErrorFormat: line ends trimmed from the ends, the ones inside made spaces.
        out.append(b"-" + data.strip(b"\r\n").replace(b"\r", b" ").replace(b"\n", b" ") + CRLF)
    elif t is str:
        # Names and patterns a client sent are decoded with surrogateescape: its bytes go back out as they came.
        data = value.encode("utf-8", "surrogateescape")
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    elif t is list or t is tuple:
        out.append(b"*%d\r\n" % len(value))
        for item in value:
            encode(item, proto, out)
    elif t is bool:
        if proto == 3:
            out.append(b"#t\r\n" if value else b"#f\r\n")
        else:
            out.append(b":1\r\n" if value else b":0\r\n")
    elif t is float:
        text = _format_double(value)
        if proto == 3:
            out.append(b"," + text + CRLF)
        else:
            out.append(b"$%d\r\n%b\r\n" % (len(text), text))
    elif isinstance(value, dict):
        if proto == 3:
            out.append(b"%%%d\r\n" % len(value))
        else:
            out.append(b"*%d\r\n" % (2 * len(value)))
        for k, v in value.items():
            encode(k, proto, out)
            encode(v, proto, out)
    elif t is set or t is frozenset or t is SetReply:
        out.append((b"~%d\r\n" if proto == 3 else b"*%d\r\n") % len(value))
        for item in value:
            encode(item, proto, out)
    elif t is Verbatim:
        data = value.encode("utf-8", "surrogateescape")
        if proto == 3:
            out.append(b"=%d\r\ntxt:%b\r\n" % (len(data) + 4, data))
        else:
            out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    elif t is Push:
        out.append((b">%d\r\n" if proto == 3 else b"*%d\r\n") % len(value))
        for item in value:
            encode(item, proto, out)
    elif t is Replies:
        for item in value:
            encode(item, proto, out)
    elif t is NullArray:
        out.append(_NULL3 if proto == 3 else _NULL_ARRAY2)
    elif t is NoReply:
        return
    elif isinstance(value, str):
        encode(str(value), proto, out)
    elif isinstance(value, int):
        encode(int(value), proto, out)
    else:
        raise TypeError(f"cannot encode reply of type {t.__name__}")


def encode_bytes(value: Any, proto: int = 2) -> bytes:
    out: list[Any] = []
    encode(value, proto, out)
    return b"".join(out)
