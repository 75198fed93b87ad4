"""The pool's record format: encoding and decoding one ``header + value`` record, nothing else.

The header (28 bytes, big-endian) is magic ``KP``, format, flags, version, expiry (wall ms, 0 = none) and an
xxh3-64 checksum over the header's first 20 bytes, the key and the value. No pickle: a record from another node
is parsed and verified, never executed. The version sits at byte offset 4 so the Lua scripts (``pool_scripts``)
can compare versions with ``GETRANGE key 4 11``. Flag bit 0 marks a *tombstone* (a versioned delete).
"""

from __future__ import annotations

import struct
from typing import Any

import xxhash

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.markers import Corrupt

MAGIC = b"KP"
FORMAT = 1
# magic, format, flags, version, expire_at, checksum
_HEADER = struct.Struct(">2sBBQqQ")
_CHECKED = struct.Struct(">2sBBQq")
HEADER_SIZE = _HEADER.size
VERSION_OFFSET = 4
RECORD_OVERHEAD = 96  # bytes charged per record beyond key and value: Redis's own per-key overhead, roughly

FLAG_TOMBSTONE = 1
ZERO_VERSION = bytes(8)


class PoolDeleted:
    """A STRONG check's answer for a key the pool holds a tombstone of, newer than the local copy."""

    __slots__ = ("version",)

    def __init__(self, version: int) -> None:
        self.version = version


def encode_record(key: bytes, value: Any, version: int, expire_at: int, flags: int = 0) -> bytes:
    checked = _CHECKED.pack(MAGIC, FORMAT, flags, version, expire_at)
    h = xxhash.xxh3_64(checked)
    h.update(key)
    h.update(value)
    return b"".join((_HEADER.pack(MAGIC, FORMAT, flags, version, expire_at, h.intdigest()), value))


def decode_head(raw: bytes) -> tuple[int, int, int] | None:
    """(version, expire_at, flags) from a record's first bytes, or None when it is not a pool record."""
    if len(raw) < HEADER_SIZE:
        return None
    magic, fmt, flags, version, expire_at, _ = _HEADER.unpack_from(raw)
    if magic != MAGIC or fmt != FORMAT:
        return None
    return version, expire_at, flags


def decode_header(raw: bytes) -> tuple[int, int] | None:
    """(version, expire_at) from a record's first bytes, or None when it is not a pool record."""
    if len(raw) < HEADER_SIZE:
        return None
    magic, fmt, _flags, version, expire_at, _ = _HEADER.unpack_from(raw)
    if magic != MAGIC or fmt != FORMAT:
        return None
    return version, expire_at


def decode_record(key: bytes, raw: bytes) -> Entry | Corrupt:
    if len(raw) < HEADER_SIZE:
        return Corrupt(key, "short record")
    magic, fmt, flags, version, expire_at, checksum = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        return Corrupt(key, "bad magic")
    if fmt != FORMAT:
        return Corrupt(key, f"unknown record format {fmt}")
    value = memoryview(raw)[HEADER_SIZE:]
    h = xxhash.xxh3_64(_CHECKED.pack(magic, fmt, flags, version, expire_at))
    h.update(key)
    h.update(value)
    if h.intdigest() != checksum:
        return Corrupt(key, "checksum mismatch")
    if flags & FLAG_TOMBSTONE:
        return PoolDeleted(version)  # type: ignore[return-value]
    return Entry(bytes(value), version, expire_at)

