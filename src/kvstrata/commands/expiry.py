"""Expire-time arguments (EX/PX/EXAT/PXAT) turned into absolute wall-clock milliseconds, with Redis's errors."""

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
    if value > INT64_MAX // unit or value < -(INT64_MAX // unit):
        raise invalid
    ms = value * unit
    if kind not in ABSOLUTE:
        if ms > INT64_MAX - now_ms:
            raise invalid
        ms += now_ms
    return ms
