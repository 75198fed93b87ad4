"""Expire-time arguments (EX/PX/EXAT/PXAT, the TAIR.KV commands' ``ttl_ms``) turned into absolute wall-clock
milliseconds, with Redis's errors."""

from __future__ import annotations

from kvstrata.commands.args import INT64_MAX, parse_int
from kvstrata.errors import CommandError

UNIT_MS = {b"EX": 1000, b"PX": 1, b"EXAT": 1000, b"PXAT": 1}
ABSOLUTE = {b"EXAT", b"PXAT"}


def expire_at_ms(kind: bytes, raw: bytes, now_ms: int, command: str, *, allow_nonpositive: bool = False) -> int:
    """Absolute expiry for ``kind raw`` (e.g. ``EX 10``); ``allow_nonpositive`` is EXPIRE's rule (past = delete)."""
    value = parse_int(raw)
    invalid = CommandError(f"invalid expire time in '{command}' command")
    if value <= 0 and not allow_nonpositive:
        raise invalid
    unit = UNIT_MS[kind]
    # Redis's bounds: a unit conversion that overflows, or a relative time whose sum with now does; milliseconds
    # have no lower one (PEXPIRE key -9223372036854775808 is a time in the past, not an error).
    if value > INT64_MAX // unit or (unit > 1 and value < -(INT64_MAX // unit)):
        raise invalid
    ms = value * unit
    if kind not in ABSOLUTE:
        if ms > INT64_MAX - now_ms:
            raise invalid
        ms += now_ms
    return ms


def ttl_ms_arg(raw: bytes, now_ms: int, command: str) -> int:
    """A TAIR.KV command's relative ``ttl_ms`` (0: no expiry). Refused, as Redis refuses SET's PX, when negative or
    when the expiry time it makes would not fit in 64 bits: every tier stores that time as a signed 64-bit
    integer, and one that did not fit was acknowledged, then failed the SSD writer's batch (every write in it)."""
    ttl = parse_int(bytes(raw))
    if ttl < 0 or ttl > INT64_MAX - now_ms:
        raise CommandError(f"invalid expire time in '{command}' command")
    return ttl


def ttl_expires_at(ttl_ms: int, now_ms: int) -> int:
    """The expiry time of a ``ttl_ms`` checked by ``ttl_ms_arg`` (0: none), taken ``now_ms`` (later than the check:
    held at the 64-bit limit)."""
    return min(now_ms + ttl_ms, INT64_MAX) if ttl_ms else 0
