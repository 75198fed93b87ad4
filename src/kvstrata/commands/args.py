"""Argument parsing shared by handlers: strict integers and floats, and option tables."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kvstrata.errors import NOT_FLOAT, NOT_INTEGER, CommandError, syntax_error

_INT = re.compile(rb"(0|-?[1-9][0-9]*)\Z")
_FLOAT = re.compile(rb"[+-]?(([0-9]+\.?[0-9]*)|(\.[0-9]+))([eE][+-]?[0-9]+)?\Z")
_FLOAT_SPECIAL = {b"inf": math.inf, b"+inf": math.inf, b"-inf": -math.inf, b"infinity": math.inf,
                  b"+infinity": math.inf, b"-infinity": -math.inf}
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def parse_int(raw: bytes, message: str = NOT_INTEGER) -> int:
    """A signed 64-bit integer spelled exactly as Redis accepts it (no spaces, no '+', no leading zeros)."""
    if len(raw) > 20 or not _INT.match(raw):
        raise CommandError(message)
    value = int(raw)
    if not INT64_MIN <= value <= INT64_MAX:
        raise CommandError(message)
    return value


def parse_timeout_ms(raw: bytes) -> int:
    """A timeout in milliseconds as Redis's getTimeoutFromObjectOrReply reads one (WAIT, CLIENT PAUSE)."""
    timeout = parse_int(raw, "timeout is not an integer or out of range")
    if timeout < 0:
        raise CommandError("timeout is negative")
    return timeout


def parse_db_index(raw: bytes) -> int:
    """A database index as Redis reads one (an int: SELECT, MOVE, COPY ... DB); only 0 exists here, as in a Redis
    with ``databases 1``: any other index is 'DB index is out of range'."""
    index = parse_int(raw)
    if not -2**31 <= index < 2**31:
        raise CommandError("value is out of range, value must between -2147483648 and 2147483647")
    if index != 0:
        raise CommandError("DB index is out of range")
    return index


def parse_float(raw: bytes, message: str = NOT_FLOAT) -> float:
    low = raw.lower()
    if low in _FLOAT_SPECIAL:
        return _FLOAT_SPECIAL[low]
    if not _FLOAT.match(raw):
        raise CommandError(message)
    value = float(raw)
    if math.isnan(value):
        raise CommandError(message)
    return value


@dataclass(frozen=True)
class Option:
    """One keyword option: how many values follow it, and which other options it excludes."""

    name: bytes
    nargs: int = 0
    excludes: tuple[bytes, ...] = ()


def parse_options(args: list[bytes], start: int, table: dict[bytes, Option]) -> dict[bytes, list[bytes]]:
    """Options from ``args[start:]`` by the table; unknown, repeated-conflicting or missing values: syntax error."""
    found: dict[bytes, list[bytes]] = {}
    i = start
    n = len(args)
    while i < n:
        word = args[i].upper()
        opt = table.get(word)
        if opt is None or i + opt.nargs >= n:
            raise syntax_error()
        if any(x in found for x in opt.excludes):
            raise syntax_error()
        found[word] = args[i + 1 : i + 1 + opt.nargs]
        i += 1 + opt.nargs
    return found
