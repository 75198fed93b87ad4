"""String commands: GET, SET and friends, with Redis's semantics and error texts."""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np

from kvstrata.commands.args import INT64_MAX, INT64_MIN, Option, parse_float, parse_int, parse_options
from kvstrata.commands.context import Context
from kvstrata.commands.expiry import expire_at_ms
from kvstrata.commands.pool_acks import after_pool_delete, delete_tracked
from kvstrata.commands.registry import KeySpec, command
from kvstrata.errors import NOT_FLOAT, OVERFLOW, CommandError, wrong_arity
from kvstrata.protocol.encoder import OK
from kvstrata.server.notify import GENERIC, STRING, notify, set_events

_EXPIRES = (b"EX", b"PX", b"EXAT", b"PXAT")
_SET_OPTIONS = {
    b"NX": Option(b"NX", 0, (b"XX",)),
    b"XX": Option(b"XX", 0, (b"NX",)),
    b"GET": Option(b"GET"),
    b"KEEPTTL": Option(b"KEEPTTL", 0, _EXPIRES),
    **{e: Option(e, 1, (b"KEEPTTL", *(x for x in _EXPIRES if x != e))) for e in _EXPIRES},
}
_GETEX_OPTIONS = {
    b"PERSIST": Option(b"PERSIST", 0, _EXPIRES),
    **{e: Option(e, 1, (b"PERSIST", *(x for x in _EXPIRES if x != e))) for e in _EXPIRES},
}


# Redis's notes on the key specs of SET and GETEX (COMMAND INFO).
_SET_NOTES = "RW and ACCESS due to the optional `GET` argument"
_GETEX_NOTES = "RW and UPDATE because it changes the TTL"


def max_bulk_len(ctx: Context) -> int:
    return int(ctx.config.get("proto-max-bulk-len"))


def string_value(ctx: Context, key: bytes, write: bool = False) -> bytes | bytearray | None:
    """The key's value (None: absent). ``write``: looked up to change it (APPEND, INCR...), which Redis's
    lookupKeyWrite does not count in keyspace_hits/misses."""
    entry = ctx.store.get(key, count=not write)
    return None if entry is None else entry.value


@command("get", 2, "readonly fast", keys=(1, 1, 1), group="string", summary="Returns the string value of a key.")
def get(ctx: Context, args: list[bytes]) -> Any:
    entry = ctx.store.get(args[1])
    return None if entry is None else entry.value


def _set_load(args: list[bytes]) -> str | bool:
    """SET replaces the value: its old record's header is enough (version, expiry: NX, XX, KEEPTTL), unless GET
    returns the old value."""
    return True if any(a.upper() == b"GET" for a in args[3:]) else "meta"


# load="meta" for the writes below that replace a value: a key held only below DRAM (the SSD, another node's in the
# pool) has its record header probed before the write, not its whole value read (megabytes for a KV chunk).
@command("set", -3, "write denyoom", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "update", "variable_flags"), _SET_NOTES),),
         values=(2, 0), group="string", load=_set_load,
         summary="Sets the string value of a key, ignoring its type. The key is created if it doesn't exist.",
         syntax="SET key value [NX | XX] [GET] [EX seconds | PX milliseconds | EXAT unix-time-seconds | "
                "PXAT unix-time-milliseconds | KEEPTTL]")
def set_(ctx: Context, args: list[bytes]) -> Any:
    store = ctx.store
    key = args[1]
    if len(args) == 3:
        store.put(key, args[2])
        notify(ctx, STRING, b"set", key)
        return OK
    opts = parse_options(args, 3, _SET_OPTIONS)
    now = store.clock.now_ms()
    expire_at = 0
    for kind in _EXPIRES:
        if kind in opts:
            expire_at = expire_at_ms(kind, opts[kind][0], now, "set")
    current = store.get(key, touch=False, count=True) if b"GET" in opts else store.probe(key)
    if (b"NX" in opts and current is not None) or (b"XX" in opts and current is None):
        return current.value if (b"GET" in opts and current is not None) else None
    if b"KEEPTTL" in opts and current is not None:
        expire_at = current.expire_at
    store.put(key, args[2], expire_at)
    set_events(ctx, key, expire_at and b"KEEPTTL" not in opts)
    if b"GET" in opts:
        return None if current is None else current.value  # type: ignore[union-attr]
    return OK


def _setex(ctx: Context, args: list[bytes], unit: bytes, name: str) -> Any:
    expire_at = expire_at_ms(unit, args[2], ctx.store.clock.now_ms(), name)
    ctx.store.put(args[1], args[3], expire_at)
    set_events(ctx, args[1], True)
    return OK


@command("setex", 4, "write denyoom", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("OW", "update")),),
         values=(3, 0), group="string", load="meta", since="2.0.0",
         summary="Sets the string value and expiration time of a key.", syntax="SETEX key seconds value")
def setex(ctx: Context, args: list[bytes]) -> Any:
    return _setex(ctx, args, b"EX", "setex")


@command("psetex", 4, "write denyoom", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("OW", "update")),),
         values=(3, 0), group="string", load="meta", since="2.6.0",
         summary="Sets both string value and expiration time in milliseconds of a key.",
         syntax="PSETEX key milliseconds value")
def psetex(ctx: Context, args: list[bytes]) -> Any:
    return _setex(ctx, args, b"PX", "psetex")


@command("setnx", 3, "write denyoom fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("OW", "insert")),),
         values=(2, 0), group="string", load="meta",
         summary="Set the string value of a key only when the key doesn't exist.")
def setnx(ctx: Context, args: list[bytes]) -> Any:
    if ctx.store.probe(args[1]) is not None:
        return 0
    ctx.store.put(args[1], args[2])
    notify(ctx, STRING, b"set", args[1])
    return 1


@command("getset", 3, "write denyoom fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "update")),),
         values=(2, 0), group="string",
         summary="Returns the previous string value of a key after setting it to a new value.")
def getset(ctx: Context, args: list[bytes]) -> Any:
    old = string_value(ctx, args[1])
    ctx.store.put(args[1], args[2])
    notify(ctx, STRING, b"set", args[1])
    return old


@command("getdel", 2, "write fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "delete")),),
         group="string", since="6.2.0",
         summary="Returns the string value of a key after deleting the key.")
def getdel(ctx: Context, args: list[bytes]) -> Any:
    old = string_value(ctx, args[1])
    if old is None:
        return None
    # As DEL: with the pool, the reply waits for the key's tombstone (-TRYAGAIN if the pool did not take it).
    return after_pool_delete(ctx, old, delete_tracked(ctx, [args[1]])[1])


@command("getex", -2, "write fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "update"), _GETEX_NOTES),),
         group="string", since="6.2.0",
         summary="Returns the string value of a key after setting its expiration time.",
         syntax="GETEX key [EX seconds | PX milliseconds | EXAT unix-time-seconds | "
                "PXAT unix-time-milliseconds | PERSIST]")
def getex(ctx: Context, args: list[bytes]) -> Any:
    store = ctx.store
    opts = parse_options(args, 2, _GETEX_OPTIONS)
    entry = store.get(args[1])
    if entry is None:  # as Redis: a missing key answers nil before the time is checked
        return None
    now = store.clock.now_ms()
    expire_at: int | None = None
    for kind in _EXPIRES:
        if kind in opts:
            expire_at = expire_at_ms(kind, opts[kind][0], now, "getex")
    value = entry.value
    if b"PERSIST" in opts:
        if entry.expire_at:
            store.set_expire(args[1], 0)
            notify(ctx, GENERIC, b"persist", args[1])
    elif expire_at is not None:
        store.set_expire(args[1], expire_at)
        notify(ctx, GENERIC, b"expire", args[1])
    return value


@command("mget", -2, "readonly fast", keys=(1, -1, 1), group="string",
         summary="Atomically returns the string values of one or more keys.", syntax="MGET key [key ...]")
def mget(ctx: Context, args: list[bytes]) -> Any:
    get_entry = ctx.store.get
    out = []
    for key in args[1:]:
        entry = get_entry(key)
        out.append(None if entry is None else entry.value)
    return out


@command("mset", -3, "write denyoom", keys=(1, -1, 2),
         key_specs=(KeySpec(1, -1, 2, ("OW", "update")),),
         values=(2, 2), group="string", load="meta",
         summary="Atomically creates or modifies the string values of one or more keys.",
         syntax="MSET key value [key value ...]")
def mset(ctx: Context, args: list[bytes]) -> Any:
    if len(args) % 2 == 0:
        raise wrong_arity("mset")
    for i in range(1, len(args), 2):
        ctx.store.put(args[i], args[i + 1])
        notify(ctx, STRING, b"set", args[i])
    return OK


@command("msetnx", -3, "write denyoom", keys=(1, -1, 2),
         key_specs=(KeySpec(1, -1, 2, ("OW", "insert")),),
         values=(2, 2), group="string", load="meta",
         summary="Atomically modifies the string values of one or more keys only when all keys don't exist.",
         syntax="MSETNX key value [key value ...]")
def msetnx(ctx: Context, args: list[bytes]) -> Any:
    if len(args) % 2 == 0:
        raise wrong_arity("msetnx")
    if any(ctx.store.probe(args[i]) is not None for i in range(1, len(args), 2)):
        return 0
    for i in range(1, len(args), 2):
        ctx.store.put(args[i], args[i + 1])
        notify(ctx, STRING, b"set", args[i])
    return 1


@command("append", 3, "write denyoom fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "insert")),),
         values=(2, 0), group="string", since="2.0.0",
         summary="Appends a string to the value of a key. Creates the key if it doesn't exist.")
def append(ctx: Context, args: list[bytes]) -> Any:
    old = string_value(ctx, args[1], write=True)
    if old is None:
        ctx.store.put(args[1], args[2])
        notify(ctx, STRING, b"append", args[1])
        return len(args[2])
    if len(old) + len(args[2]) > max_bulk_len(ctx):
        raise CommandError("string exceeds maximum allowed size (proto-max-bulk-len)")
    value = grown_value(ctx, args[1], old, len(old), args[2])
    ctx.store.replace_value(args[1], value)
    notify(ctx, STRING, b"append", args[1])
    return len(value)


@command("strlen", 2, "readonly fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RO",)),),
         group="string", since="2.2.0",
         summary="Returns the length of a string value.")
def strlen(ctx: Context, args: list[bytes]) -> Any:
    old = string_value(ctx, args[1])
    return 0 if old is None else len(old)


@command("getrange", 4, "readonly", keys=(1, 1, 1), group="string", since="2.4.0",
         summary="Returns a substring of the string stored at a key.", syntax="GETRANGE key start end")
def getrange(ctx: Context, args: list[bytes]) -> Any:
    start = parse_int(args[2])
    end = parse_int(args[3])
    value = string_value(ctx, args[1])
    if value is None:
        return b""
    n = len(value)
    if start < 0 and end < 0 and start > end:
        return b""
    if start < 0:
        start = max(n + start, 0)
    if end < 0:
        end = max(n + end, 0)
    end = min(end, n - 1)
    if start > end or n == 0:
        return b""
    return bytes(value[start : end + 1])


@command("substr", 4, "readonly", keys=(1, 1, 1), group="string", since="1.0.0",
         summary="Returns a substring from a string value.", syntax="SUBSTR key start end")
def substr(ctx: Context, args: list[bytes]) -> Any:
    """Redis keeps the old name of GETRANGE (deprecated since 2.0) with the same answers."""
    return getrange(ctx, args)


@command("setrange", 4, "write denyoom", keys=(1, 1, 1), values=(3, 0), group="string", since="2.2.0",
         summary="Overwrites a part of a string value with another by an offset. Creates the key if it doesn't "
                 "exist.", syntax="SETRANGE key offset value")
def setrange(ctx: Context, args: list[bytes]) -> Any:
    offset = parse_int(args[2])
    if offset < 0:
        raise CommandError("offset is out of range")
    patch = args[3]
    old = string_value(ctx, args[1], write=True)
    if old is None:
        if not patch:
            return 0
        old = b""
    elif not patch:
        return len(old)
    if offset + len(patch) > max_bulk_len(ctx):
        raise CommandError("string exceeds maximum allowed size (proto-max-bulk-len)")
    value = grown_value(ctx, args[1], old, offset, patch)
    ctx.store.replace_value(args[1], value)
    notify(ctx, STRING, b"setrange", args[1])
    return len(value)


def grown_value(ctx: Context, key: bytes, old: bytes | bytearray | memoryview, offset: int, patch: bytes) -> bytearray:
    """``old`` with ``patch`` written at ``offset`` (zeros in any gap, as in Redis), built in one allocation that
    becomes the stored value (the store keeps a bytearray as it is). A result no tier could hold is refused
    before it is allocated."""
    n = max(len(old), offset + len(patch))
    ctx.store.refuse_oversized(key, n)
    value = bytearray(n)
    value[:len(old)] = old
    value[offset : offset + len(patch)] = patch
    return value


def _incr(ctx: Context, key: bytes, delta: int) -> int:
    old = string_value(ctx, key, write=True)
    current = 0 if old is None else parse_int(bytes(old))
    result = current + delta
    if not INT64_MIN <= result <= INT64_MAX:
        raise CommandError(OVERFLOW)
    ctx.store.replace_value(key, str(result).encode())
    notify(ctx, STRING, b"incrby", key)
    return result


@command("incr", 2, "write denyoom fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "update")),),
         group="string",
         summary="Increments the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.")
def incr(ctx: Context, args: list[bytes]) -> Any:
    return _incr(ctx, args[1], 1)


@command("decr", 2, "write denyoom fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "update")),),
         group="string",
         summary="Decrements the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.")
def decr(ctx: Context, args: list[bytes]) -> Any:
    return _incr(ctx, args[1], -1)


@command("incrby", 3, "write denyoom fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "update")),),
         group="string",
         summary="Increments the integer value of a key by a number. Uses 0 as initial value if the key doesn't "
                 "exist.", syntax="INCRBY key increment")
def incrby(ctx: Context, args: list[bytes]) -> Any:
    return _incr(ctx, args[1], parse_int(args[2]))


@command("decrby", 3, "write denyoom fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "update")),),
         group="string",
         summary="Decrements a number from the integer value of a key. Uses 0 as initial value if the key "
                 "doesn't exist.", syntax="DECRBY key decrement")
def decrby(ctx: Context, args: list[bytes]) -> Any:
    delta = parse_int(args[2])
    if delta == INT64_MIN:
        raise CommandError("decrement would overflow")
    return _incr(ctx, args[1], -delta)


# Redis adds in the platform's long double and prints "%.17Lf" with trailing zeros removed: numpy's longdouble
# is that same C type, and its exact positional formatting gives the same digits (100001.5 + 0.1 is
# "100001.60000000000000142", 0.1 + 0.2 is "0.3", as in Redis).


# strtold's hexadecimal floats (C99): 0x, hex digits with an optional point, an optional binary exponent.
_HEX_FLOAT = re.compile(rb"([+-]?)0[xX]([0-9a-fA-F]*)(?:\.([0-9a-fA-F]*))?(?:[pP]([+-]?[0-9]+))?\Z")


def _hex_long_double(match: re.Match[bytes]) -> np.longdouble:
    sign, whole, frac, exp = match.groups()
    frac = frac or b""
    if not whole and not frac:  # "0x" alone: strtold reads the 0 and stops at the x
        raise CommandError(NOT_FLOAT)
    mantissa = int(whole + frac, 16)
    shift = int(exp or b"0") - 4 * len(frac)
    extra = mantissa.bit_length() - 64  # a long double's mantissa holds 64 bits: rounded to nearest, ties to even
    if extra > 0:
        rest, half = mantissa & ((1 << extra) - 1), 1 << (extra - 1)
        mantissa >>= extra
        shift += extra
        if rest > half or (rest == half and mantissa & 1):
            mantissa += 1
    if mantissa and not -20000 < shift < 20000:  # far past long double's range: ERANGE
        raise CommandError(NOT_FLOAT)
    with np.errstate(over="ignore", under="ignore"):
        number = np.ldexp(np.longdouble(mantissa), shift)
    if not np.isfinite(number) or (number == 0 and mantissa):  # ERANGE: overflow, or underflow to zero
        raise CommandError(NOT_FLOAT)
    return -number if sign == b"-" else number


def parse_long_double(raw: bytes) -> np.longdouble:
    if len(raw) >= 5 * 1024:  # Redis's MAX_LONG_DOUBLE_CHARS
        raise CommandError(NOT_FLOAT)
    hexa = _HEX_FLOAT.match(raw)
    if hexa is not None:
        return _hex_long_double(hexa)
    parse_float(raw)  # Redis's syntax (no spaces, no NaN)
    if raw.lower().lstrip(b"+-") in (b"inf", b"infinity"):
        return np.longdouble("-inf" if raw.startswith(b"-") else "inf")
    with np.errstate(over="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns on overflow while parsing a string
        number = np.longdouble(raw.decode())
    if not np.isfinite(number):  # strtold's ERANGE (overflow): not a valid float
        raise CommandError(NOT_FLOAT)
    if number == 0 and any(48 < c <= 57 for c in raw.lower().split(b"e")[0]):  # ERANGE, underflow to zero
        raise CommandError(NOT_FLOAT)
    return number


def format_long_double(x: np.longdouble) -> bytes:
    text = np.format_float_positional(x, precision=17, unique=False, fractional=True, trim="-")
    return b"0" if text == "-0" else text.encode()


@command("incrbyfloat", 3, "write denyoom fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "update")),),
         group="string", since="2.6.0",
         summary="Increment the floating point value of a key by a number. Uses 0 as initial value if the key "
                 "doesn't exist.", syntax="INCRBYFLOAT key increment")
def incrbyfloat(ctx: Context, args: list[bytes]) -> Any:
    delta = parse_long_double(args[2])
    old = string_value(ctx, args[1], write=True)
    current = np.longdouble(0) if old is None else parse_long_double(bytes(old))
    with np.errstate(over="ignore", invalid="ignore"):
        result = current + delta
    if not np.isfinite(result):
        raise CommandError("increment would produce NaN or Infinity")
    text = format_long_double(result)
    ctx.store.replace_value(args[1], text)
    notify(ctx, STRING, b"incrbyfloat", args[1])
    return text
