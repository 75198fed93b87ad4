"""Redis's DUMP payload format for string values: what DUMP writes and RESTORE reads, so keys move between kvstrata
and Redis or Valkey in both directions (DUMP on one, RESTORE on the other; redis-cli, RIOT, redis-shake).

A payload is ``[RDB type][RDB string][RDB version: u16 LE][CRC-64 of everything before it: u64 LE]``. The string
is a length (6, 14, 32 or 64 bits) and the bytes, an integer (8, 16 or 32 bits, when that is how the decimal
text round-trips), or LZF-compressed (Redis compresses strings over 20 bytes when they shrink). kvstrata writes
integers and plain strings, never LZF: KV-cache values do not shrink, and a plain string is what every version
reads. It writes RDB version 9 (Redis 5.0 to 6.2; every later Redis and Valkey reads it) and reads versions up to
12 (Redis 7.4): a string's encoding is the same in all of them. Only strings: other types are refused by name.

The checksum and LZF loops are native (``kvstrata.native._rdb``) where the build had a compiler; the Python
fallbacks below give the same answers, slowly (a second for a few megabytes).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from kvstrata.errors import CommandError

WRITE_VERSION = 9
READ_VERSION = 12
RDB_TYPE_STRING = 0
_ENC_INT8, _ENC_INT16, _ENC_INT32, _ENC_LZF = 0, 1, 2, 3
# Redis's other value types, to name them when refusing one (rdb.h; 8 was never used).
_TYPE_NAMES = {1: "list", 2: "set", 3: "zset", 4: "hash", 5: "zset", 6: "module", 7: "module", 9: "hash",
               10: "list", 11: "set", 12: "zset", 13: "hash", 14: "list", 15: "stream", 16: "hash", 17: "zset",
               18: "list", 19: "stream"}
_CRC64_POLY = 0x95AC9329AC4BC9B5  # Jones, bit-reversed (Redis's crc64.c)
# LZF's densest step: a three-byte back reference writes 264 bytes.
_LZF_MAX_RATIO = 88


class PayloadError(CommandError):
    """A payload RESTORE cannot take: Redis's wording, so clients that match on it keep working."""


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC64_POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc_table()


def crc64_python(data: bytes | memoryview, crc: int = 0) -> int:
    table = _TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc


def lzf_decompress_python(data: bytes | memoryview, length: int) -> bytes:
    src = bytes(data)
    out = bytearray()
    i, end = 0, len(src)
    while i < end:
        ctrl = src[i]
        i += 1
        if ctrl < 32:
            run = ctrl + 1
            if len(out) + run > length or i + run > end:
                raise ValueError("invalid LZF data")
            out += src[i:i + run]
            i += run
            continue
        n = ctrl >> 5
        if i >= end:
            raise ValueError("invalid LZF data")
        if n == 7:
            n += src[i]
            i += 1
            if i >= end:
                raise ValueError("invalid LZF data")
        back = ((ctrl & 0x1F) << 8) + src[i] + 1
        i += 1
        n += 2
        if back > len(out) or len(out) + n > length:
            raise ValueError("invalid LZF data")
        start = len(out) - back
        for k in range(n):  # one byte at a time: the reference may overlap what it writes
            out.append(out[start + k])
    if len(out) != length:
        raise ValueError("invalid LZF data")
    return bytes(out)


crc64: Callable[..., int]
lzf_decompress: Callable[[bytes | memoryview, int], bytes]
try:
    from kvstrata.native._rdb import crc64, lzf_decompress
except ImportError:  # built without a compiler or Python headers (hatch_build.py)
    crc64, lzf_decompress = crc64_python, lzf_decompress_python


def _length(n: int) -> bytes:
    if n < 1 << 6:
        return bytes((n,))
    if n < 1 << 14:
        return bytes((0x40 | n >> 8, n & 0xFF))
    if n < 1 << 32:
        return b"\x80" + n.to_bytes(4, "big")
    return b"\x81" + n.to_bytes(8, "big")


def _as_int(value: bytes | memoryview) -> int | None:
    """The integer a value is the canonical decimal text of, when Redis saves it as one (at most 11 bytes)."""
    if not 0 < len(value) <= 11:
        return None
    text = bytes(value)
    try:
        n = int(text)
    except ValueError:
        return None
    return n if str(n).encode() == text and -(1 << 31) <= n < 1 << 31 else None


def dump(value: bytes | memoryview) -> bytes:
    """The DUMP payload of a string value."""
    n = _as_int(value)
    if n is None:
        head = bytes((RDB_TYPE_STRING,)) + _length(len(value))
        body: bytes | memoryview = value
    elif -128 <= n < 128:
        head, body = bytes((RDB_TYPE_STRING, 0xC0 | _ENC_INT8)) + struct.pack("<b", n), b""
    elif -32768 <= n < 32768:
        head, body = bytes((RDB_TYPE_STRING, 0xC0 | _ENC_INT16)) + struct.pack("<h", n), b""
    else:
        head, body = bytes((RDB_TYPE_STRING, 0xC0 | _ENC_INT32)) + struct.pack("<i", n), b""
    version = WRITE_VERSION.to_bytes(2, "little")
    crc = crc64(version, crc64(body, crc64(head)))
    return b"".join((head, body, version, crc.to_bytes(8, "little")))


def verify(payload: bytes | bytearray | memoryview) -> None:
    """Redis's check before it reads anything: a footer, a version it knows, the checksum."""
    if len(payload) < 10:
        raise PayloadError("DUMP payload version or checksum are wrong")
    view = memoryview(payload)
    footer = bytes(view[-10:])
    version = footer[0] | footer[1] << 8
    if version > READ_VERSION or crc64(view[:-8]) != int.from_bytes(footer[2:], "little"):
        raise PayloadError("DUMP payload version or checksum are wrong")


class _Reader:
    """Reads the payload as Redis does: over the whole buffer (the footer included; only the checksum bounds it)."""

    def __init__(self, payload: bytes | bytearray | memoryview) -> None:
        self.buf = memoryview(payload)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n > len(self.buf) - self.pos:
            raise PayloadError("Bad data format")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def length(self) -> tuple[int, bool]:
        """A length, or (for an encoded string) its encoding and True."""
        first = self.take(1)[0]
        kind = first >> 6
        if kind == 0:
            return first & 0x3F, False
        if kind == 1:
            return (first & 0x3F) << 8 | self.take(1)[0], False
        if kind == 3:
            return first & 0x3F, True
        if first == 0x80:
            return int.from_bytes(self.take(4), "big"), False
        if first == 0x81:
            return int.from_bytes(self.take(8), "big"), False
        raise PayloadError("Bad data format")


def load(payload: bytes | bytearray, max_len: int) -> bytes:
    """The string value of a verified payload; ``max_len``: the longest value accepted (proto-max-bulk-len).

    A plain string is copied out of the payload, never cut out of it in place: a large payload is a receive
    buffer the connection gives back to its pool once the command ran, with its size accounted there."""
    reader = _Reader(payload)
    found = _read_string(reader, max_len)
    if not isinstance(found, tuple):
        return found
    start, n = found
    return bytes(reader.buf[start:start + n])


def _read_string(reader: _Reader, max_len: int) -> bytes | tuple[int, int]:
    """The value of an encoded string, or where a plain one lies in the payload (start, length)."""
    kind = reader.take(1)[0]
    if kind != RDB_TYPE_STRING:
        name = _TYPE_NAMES.get(kind)
        if name is None:
            raise PayloadError("Bad data format")
        raise PayloadError(f"Bad data format: the payload holds a {name} (RDB type {kind}); kvstrata stores "
                           "strings only")
    n, encoded = reader.length()
    if not encoded:
        start = reader.pos
        reader.take(n)  # no longer than the payload, which the protocol's limit bounded
        return start, n
    if n == _ENC_INT8:
        return str(struct.unpack("<b", reader.take(1))[0]).encode()
    if n == _ENC_INT16:
        return str(struct.unpack("<h", reader.take(2))[0]).encode()
    if n == _ENC_INT32:
        return str(struct.unpack("<i", reader.take(4))[0]).encode()
    if n != _ENC_LZF:
        raise PayloadError("Bad data format")
    clen = reader.length()[0]  # an "encoded" length is read as its low six bits, as Redis's rdbLoadLen does
    size = reader.length()[0]
    packed = reader.take(clen)
    if size == 0:
        return b""  # liblzf reports 0 bytes for any input then, which Redis takes as the length it expected
    if size > _LZF_MAX_RATIO * clen:
        raise PayloadError("Bad data format")  # more than LZF can expand to: never allocated
    if size > max_len:
        raise CommandError("string exceeds maximum allowed size (proto-max-bulk-len)")
    try:
        return lzf_decompress(packed, size)
    except ValueError:
        raise PayloadError("Bad data format") from None
