"""The SSD tier's record format and LMDB data keys: encoding, decoding and verifying one record, nothing else.

A data key is ``bucket(2, BE) + tag + key``: tag ``k`` and the key itself when it fits LMDB's key limit, tag
``h`` and its xxh3-128 hash otherwise (the full key is then stored in the record). A record is
``header + [full key] + value``; the header (little-endian) is magic ``KS``, format, flags, version, expiry, the
write sequence number, an xxh3-64 checksum (over the header's first fields, the full key and the value) and the
full key's length. No pickle: a record is parsed and verified, never executed.
"""

from __future__ import annotations

import struct
from typing import Any

import xxhash

from kvstrata.engine.entry import Entry, Meta
from kvstrata.engine.keyspace import bucket_of
from kvstrata.engine.tiers.markers import Corrupt

MAGIC = b"KS"
FORMAT = 1
# magic, format, flags, version, expire_at, seq, checksum, full-key length
_HEADER = struct.Struct("<2sBBQqQQI")
_CHECKED = struct.Struct("<2sBBQqQ")
HEADER_SIZE = _HEADER.size
_U64 = struct.Struct(">Q")
_BUCKET = struct.Struct(">H")
RECORD_OVERHEAD = 64
MAX_INLINE_KEY = 400  # LMDB keys are limited to 511 bytes; longer keys are stored under their hash.


def data_key(key: bytes) -> bytes:
    prefix = _BUCKET.pack(bucket_of(key))
    if len(key) <= MAX_INLINE_KEY:
        return prefix + b"k" + key
    return prefix + b"h" + xxhash.xxh3_128_digest(key)


def _checksum(prefix: bytes, full_key: bytes, value: Any) -> int:
    h = xxhash.xxh3_64(prefix)
    if full_key:
        h.update(full_key)
    h.update(value)
    return h.intdigest()


def encode_record(key: bytes, value: Any, version: int, expire_at: int, seq: int) -> list[Any]:
    full_key = key if len(key) > MAX_INLINE_KEY else b""
    checked = _CHECKED.pack(MAGIC, FORMAT, 0, version, expire_at, seq)
    header = _HEADER.pack(MAGIC, FORMAT, 0, version, expire_at, seq, _checksum(checked, full_key, value),
                          len(full_key))
    return [header, full_key, value]


def _header(key: bytes, rec: Any) -> tuple[Any, ...] | Corrupt:
    """A record's unpacked header fields, or why they cannot be trusted (length, magic, format)."""
    if len(rec) < HEADER_SIZE:
        return Corrupt(key, "short record")
    head = _HEADER.unpack_from(rec)
    if head[0] != MAGIC:
        return Corrupt(key, "bad magic")
    if head[1] != FORMAT:
        return Corrupt(key, f"unknown record format {head[1]}")
    return head


def decode_record(key: bytes, rec: Any) -> Entry | Corrupt | None:
    """Parse and verify a record (bytes or a memoryview into the map); None when it belongs to another key."""
    head = _header(key, rec)
    if isinstance(head, Corrupt):
        return head
    _magic, fmt, _flags, version, expire_at, seq, checksum, klen = head
    mv = memoryview(rec)
    full_key = bytes(mv[HEADER_SIZE : HEADER_SIZE + klen])
    value_view = mv[HEADER_SIZE + klen :]
    checked = _CHECKED.pack(MAGIC, fmt, _flags, version, expire_at, seq)
    if _checksum(checked, full_key, value_view) != checksum:
        return Corrupt(key, "checksum mismatch")
    if klen and full_key != key:
        return None
    return Entry(bytes(value_view), version, expire_at)


def decode_meta(key: bytes, rec: Any) -> Meta | Corrupt | None:
    """A record's header only (a probe): version, expiry and value length, the value neither copied nor read.

    The checksum covers the value, so it is not verified here: a record whose value is damaged but whose header
    is intact reads as present until a full read (``decode_record``) finds the damage and drops it.
    """
    head = _header(key, rec)
    if isinstance(head, Corrupt):
        return head
    _magic, _fmt, _flags, version, expire_at, _seq, _checksum_, klen = head
    if len(rec) < HEADER_SIZE + klen:
        return Corrupt(key, "short record")
    if klen and bytes(memoryview(rec)[HEADER_SIZE : HEADER_SIZE + klen]) != key:
        return None
    return Meta(version, expire_at, len(rec) - HEADER_SIZE - klen)


def _record_key(lkey: bytes, rec: Any) -> bytes:
    if lkey[2:3] == b"k":
        return bytes(lkey[3:])
    klen = _HEADER.unpack_from(rec)[7]
    return bytes(memoryview(rec)[HEADER_SIZE : HEADER_SIZE + klen])

