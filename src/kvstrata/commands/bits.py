"""Bitmap commands on string values: SETBIT, GETBIT, BITCOUNT, BITPOS, BITOP, BITFIELD and BITFIELD_RO, with
Redis 7.0's replies, argument checks in its order, and error texts.

Bit 0 is the most significant bit of the first byte, as in Redis. Counting, searching and combining run in numpy
over the stored value without copying it (values may be hundreds of megabytes); writes build the new value once
and store it through the store, as SETRANGE does: a value is never changed in place, because the SSD writer or the
pool may still be sending the old one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kvstrata.commands.args import parse_int
from kvstrata.commands.context import Context
from kvstrata.commands.pool_acks import after_pool_delete, delete_tracked
from kvstrata.commands.registry import KeySpec, command
from kvstrata.commands.strings import grown_value, max_bulk_len, string_value
from kvstrata.errors import NOT_INTEGER, CommandError, syntax_error
from kvstrata.server.notify import STRING, notify

Buffer = bytes | bytearray | memoryview

BIT_OFFSET = "bit offset is not an integer or out of range"
BIT_VALUE = "bit is not an integer or out of range"
BITFIELD_TYPE = "Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is."

# Below this many bytes Python's int.bit_count beats numpy's per-call overhead.
_SMALL = 4096
# numpy works through large values in slices of this many bytes: bounded temporaries, and BITPOS stops early.
_CHUNK = 1 << 20
_BYTE_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
_bitwise_count: Callable[..., np.ndarray] | None = getattr(np, "bitwise_count", None)  # numpy >= 2.0


def _word(raw: bytes) -> bytes:
    """An option word as Redis's strcasecmp sees it: a C string (up to the first NUL), any case."""
    return raw.split(b"\0", 1)[0].lower()


def _wrap64(x: int) -> int:
    """``x`` as a C int64 computes it: wrapped around past 64 bits."""
    return (x + 2**63) % 2**64 - 2**63


def _bytes_of(value: Buffer) -> np.ndarray:
    return np.frombuffer(value, dtype=np.uint8)


def _popcount(value: Buffer, start: int, end: int) -> int:
    """Set bits in bytes ``start`` .. ``end - 1`` of ``value``."""
    if end - start <= _SMALL:
        return int.from_bytes(value[start:end], "big").bit_count()
    data = _bytes_of(value)
    total = 0
    for lo in range(start, end, _CHUNK):
        part = data[lo : min(lo + _CHUNK, end)]
        if _bitwise_count is not None:
            whole = len(part) & ~7
            total += int(_bitwise_count(part[:whole].view(np.uint64)).sum(dtype=np.uint64))
            part = part[whole:]
        total += int(_BYTE_POPCOUNT[part].sum(dtype=np.uint64))
    return total


def _first_byte_not(value: Buffer, start: int, end: int, skip: int) -> int:
    """The index of the first byte in ``start`` .. ``end - 1`` that is not ``skip``, or -1."""
    if start >= end:
        return -1
    data = _bytes_of(value)
    word = np.uint64(0 if skip == 0 else 2**64 - 1)
    for lo in range(start, end, _CHUNK):
        part = data[lo : min(lo + _CHUNK, end)]
        whole = len(part) & ~7
        if whole == len(part) and not (part.view(np.uint64) != word).any():
            continue  # compared 8 bytes at a time: a long run of skipped bytes (a sparse bitmap) goes fast
        differs = part != skip
        if differs.any():
            return lo + int(differs.argmax())
    return -1


def _first_bit_in_byte(byte: int, bit: int, lo: int = 0, hi: int = 7) -> int:
    """The first bit position (0 = most significant) in ``lo`` .. ``hi`` of ``byte`` equal to ``bit``, or -1."""
    for pos in range(lo, hi + 1):
        if (byte >> (7 - pos)) & 1 == bit:
            return pos
    return -1


def _first_bit(value: Buffer, bit: int, first: int, last: int) -> int:
    """The first bit position in ``first`` .. ``last`` (inclusive bit offsets inside ``value``) equal to ``bit``,
    or -1."""
    head, tail = first >> 3, last >> 3
    if head == tail:
        pos = _first_bit_in_byte(value[head], bit, first & 7, last & 7)
        return -1 if pos < 0 else head * 8 + pos
    pos = _first_bit_in_byte(value[head], bit, first & 7, 7)
    if pos >= 0:
        return head * 8 + pos
    found = _first_byte_not(value, head + 1, tail, 0 if bit else 0xFF)
    if found >= 0:
        return found * 8 + _first_bit_in_byte(value[found], bit)
    pos = _first_bit_in_byte(value[tail], bit, 0, last & 7)
    return -1 if pos < 0 else tail * 8 + pos


def _bit_offset(ctx: Context, raw: bytes, bits: int = 0) -> int:
    """A bit offset as Redis's getBitOffsetFromArgument reads it: ``#n`` (BITFIELD, ``bits`` > 0) is n times the
    field's width; an offset whose byte lies at or past proto-max-bulk-len is refused."""
    by_field = bits > 0 and raw[:1] == b"#"
    offset = parse_int(raw[1:] if by_field else raw, BIT_OFFSET)
    if by_field:
        # Redis multiplies in a C long long: an offset past 64 bits wraps around as it does there.
        offset = _wrap64(offset * bits)
    if offset < 0 or (offset >> 3) >= max_bulk_len(ctx):
        raise CommandError(BIT_OFFSET)
    return offset


# --------------------------------------------------------------------------------------------------------------
# SETBIT / GETBIT
# --------------------------------------------------------------------------------------------------------------


# SETBIT also reads the bit it replaces (RW access update), as Redis's key spec says.
@command("setbit", 4, "write denyoom", keys=(1, 1, 1), group="bitmap", since="2.2.0",
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "update")),),
         summary="Sets or clears the bit at offset of the string value. Creates the key if it doesn't exist.",
         syntax="SETBIT key offset value")
def setbit(ctx: Context, args: list[bytes]) -> Any:
    offset = _bit_offset(ctx, args[2])
    on = parse_int(args[3], BIT_VALUE)
    if on not in (0, 1):
        raise CommandError(BIT_VALUE)
    key = args[1]
    old = string_value(ctx, key, write=True)
    byte, shift = offset >> 3, 7 - (offset & 7)
    current = old[byte] if old is not None and byte < len(old) else 0
    was = (current >> shift) & 1
    if old is not None and byte < len(old) and was == on:
        return was  # as Redis: an unchanged value is not written (no new version, WATCH not fired)
    patch = bytes(((current & ~(1 << shift)) | (on << shift),))
    ctx.store.replace_value(key, grown_value(ctx, key, b"" if old is None else old, byte, patch))
    notify(ctx, STRING, b"setbit", key)
    return was


@command("getbit", 3, "readonly fast", keys=(1, 1, 1), group="bitmap", since="2.2.0",
         summary="Returns a bit value by offset.", syntax="GETBIT key offset")
def getbit(ctx: Context, args: list[bytes]) -> Any:
    offset = _bit_offset(ctx, args[2])
    value = string_value(ctx, args[1])
    byte = offset >> 3
    if value is None or byte >= len(value):
        return 0
    return (value[byte] >> (7 - (offset & 7))) & 1




# --------------------------------------------------------------------------------------------------------------
# BITCOUNT / BITPOS
# --------------------------------------------------------------------------------------------------------------


def _unit_is_bit(raw: bytes) -> bool:
    word = _word(raw)
    if word == b"bit":
        return True
    if word == b"byte":
        return False
    raise syntax_error()


def _clamp(start: int, end: int, total: int) -> tuple[int, int]:
    """Redis's range rule: negative indexes count from the end, then both are held inside 0 .. total - 1."""
    if start < 0:
        start += total
    if end < 0:
        end += total
    start = max(start, 0)
    end = max(end, 0)
    return start, min(end, total - 1)


@command("bitcount", -2, "readonly", keys=(1, 1, 1), group="bitmap", since="2.6.0",
         summary="Counts the number of set bits (population counting) in a string.",
         syntax="BITCOUNT key [start end [BYTE | BIT]]")
def bitcount(ctx: Context, args: list[bytes]) -> Any:
    value = string_value(ctx, args[1])
    if value is None:  # as Redis: a missing key answers 0 before the range is looked at
        return 0
    n = len(value)
    if len(args) == 2:
        return _popcount(value, 0, n)
    if len(args) not in (4, 5):
        raise syntax_error()
    start = parse_int(args[2])
    end = parse_int(args[3])
    if start < 0 and end < 0 and start > end:
        return 0
    is_bit = len(args) == 5 and _unit_is_bit(args[4])
    if not is_bit:
        start, end = _clamp(start, end, n)
        return 0 if start > end else _popcount(value, start, end + 1)
    start, end = _clamp(start, end, n * 8)
    if start > end:
        return 0
    head, tail = start >> 3, end >> 3
    count = _popcount(value, head, tail + 1)
    # The edge bytes' bits outside the range were counted too: take them off.
    count -= (value[head] >> (8 - (start & 7))).bit_count()
    count -= (value[tail] & ((1 << (7 - (end & 7))) - 1)).bit_count()
    return count


@command("bitpos", -3, "readonly", keys=(1, 1, 1), group="bitmap", since="2.8.7",
         summary="Finds the first set (1) or clear (0) bit in a string.",
         syntax="BITPOS key bit [start [end [BYTE | BIT]]]")
def bitpos(ctx: Context, args: list[bytes]) -> Any:
    bit = parse_int(args[2])
    if bit not in (0, 1):
        raise CommandError("The bit argument must be 1 or 0.")
    value = string_value(ctx, args[1])
    if value is None:  # an endless run of zeros
        return -1 if bit else 0
    n = len(value)
    is_bit = end_given = False
    if len(args) == 3:
        start, end = 0, n - 1
    elif len(args) <= 6:
        start = parse_int(args[3])
        if len(args) == 6:  # Redis reads the unit before the end
            is_bit = _unit_is_bit(args[5])
        if len(args) >= 5:
            end = parse_int(args[4])
            end_given = True
        else:
            end = n - 1
        start, end = _clamp(start, end, n * 8 if is_bit else n)
    else:
        raise syntax_error()
    if start > end:
        return -1  # an empty range holds neither a 0 nor a 1
    first, last = (start, end) if is_bit else (start * 8, end * 8 + 7)
    pos = _first_bit(value, bit, first, last)
    if pos >= 0 or bit or end_given:
        return pos
    # Looking for a 0 with no end given: the string counts as padded with zeros on the right.
    return last + 1


# --------------------------------------------------------------------------------------------------------------
# BITOP
# --------------------------------------------------------------------------------------------------------------

_BITOPS: dict[bytes, Callable[..., Any] | None] = {
    b"and": np.bitwise_and, b"or": np.bitwise_or, b"xor": np.bitwise_xor, b"not": None}


def _combine(opname: bytes, sources: list[Buffer], out: bytearray) -> None:
    """Write into ``out`` (zeros, as long as the longest source) the bitwise ``opname`` of ``sources``, each
    counting as padded with zeros. numpy's views of ``out`` end with this call, before ``out`` is stored."""
    result = np.frombuffer(out, dtype=np.uint8)
    first = _bytes_of(sources[0])
    if opname == b"not":
        np.invert(first, out=result)
    elif opname == b"and":
        common = min(len(s) for s in sources)  # past the shortest source every byte is 0 (``out`` already is)
        if common:
            head = result[:common]
            head[:] = first[:common]
            for other in sources[1:]:
                np.bitwise_and(head, _bytes_of(other)[:common], out=head)
    else:
        combine = _BITOPS[opname]
        assert combine is not None
        result[: len(first)] = first
        for other in sources[1:]:
            if len(other):
                part = result[: len(other)]
                combine(part, _bytes_of(other), out=part)


# BITOP's destination is overwritten, its sources only read: two key specs, as Redis's.
@command("bitop", -4, "write denyoom", keys=(2, -1, 1), group="bitmap", since="2.6.0",
         key_specs=(KeySpec(2, 0, 1, ("OW", "update")), KeySpec(3, -1, 1, ("RO", "access"))),
         summary="Performs bitwise operations on multiple strings, and stores the result.",
         syntax="BITOP <AND | OR | XOR | NOT> destkey key [key ...]")
def bitop(ctx: Context, args: list[bytes]) -> Any:
    opname = _word(args[1])
    if opname not in _BITOPS:
        raise syntax_error()
    if opname == b"not" and len(args) != 4:
        raise CommandError("BITOP NOT must be called with a single source key.")
    dest = args[2]
    sources: list[Buffer] = []
    for key in args[3:]:
        value = string_value(ctx, key)
        sources.append(b"" if value is None else value)  # a missing key counts as an empty string
    size = max(len(s) for s in sources)
    if size == 0:
        # Every source empty or missing: the destination is deleted, as DEL does (its pool tombstone awaited).
        return after_pool_delete(ctx, 0, delete_tracked(ctx, [dest])[1])
    ctx.store.refuse_oversized(dest, size)
    out = bytearray(size)
    _combine(opname, sources, out)
    ctx.store.put(dest, out)  # no expiry: as Redis's setKey, the destination's TTL is cleared
    notify(ctx, STRING, b"set", dest)
    return size




# --------------------------------------------------------------------------------------------------------------
# BITFIELD / BITFIELD_RO
# --------------------------------------------------------------------------------------------------------------

_GET, _SET, _INCRBY = 0, 1, 2
_WRAP, _SAT, _FAIL = 0, 1, 2
_OVERFLOWS = {b"wrap": _WRAP, b"sat": _SAT, b"fail": _FAIL}
_OPCODES = {b"get": (_GET, 2), b"set": (_SET, 3), b"incrby": (_INCRBY, 3)}


def _field_type(raw: bytes) -> tuple[bool, int]:
    """(signed, width) of ``i1`` .. ``i64`` or ``u1`` .. ``u63`` (Redis reads the width as a C string)."""
    kind = raw[:1]
    if kind not in (b"i", b"u"):
        raise CommandError(BITFIELD_TYPE)
    signed = kind == b"i"
    width = parse_int(raw[1:].split(b"\0", 1)[0], BITFIELD_TYPE)
    if width < 1 or width > (64 if signed else 63):
        raise CommandError(BITFIELD_TYPE)
    return signed, width


class _Field:
    """The bits of a value as BITFIELD sees them: zeros past its end, and the bytes its operations wrote kept
    aside (``patch``) so that the stored value is copied once, at the end, and only if something changed."""

    def __init__(self, base: Buffer) -> None:
        self.base = base
        self.patch: dict[int, int] = {}

    def _byte(self, i: int) -> int:
        got = self.patch.get(i)
        return self._old(i) if got is None else got

    def changed(self) -> bool:
        """Whether a written byte differs from the value's (as Redis: rewriting the same bits changes nothing)."""
        return any(self._old(i) != b for i, b in self.patch.items())

    def _old(self, i: int) -> int:
        return self.base[i] if i < len(self.base) else 0

    def get(self, offset: int, width: int) -> int:
        """The unsigned integer in bits ``offset`` .. ``offset + width - 1``."""
        lo, hi = offset >> 3, (offset + width - 1) >> 3
        if self.patch:
            span = bytes(self._byte(i) for i in range(lo, hi + 1))
        else:
            span = bytes(self.base[lo : hi + 1]).ljust(hi + 1 - lo, b"\0")
        word = int.from_bytes(span, "big")
        return (word >> ((hi + 1) * 8 - offset - width)) & ((1 << width) - 1)

    def set(self, offset: int, width: int, value: int) -> None:
        lo, hi = offset >> 3, (offset + width - 1) >> 3
        word = int.from_bytes(bytes(self._byte(i) for i in range(lo, hi + 1)), "big")
        shift = (hi + 1) * 8 - offset - width
        mask = ((1 << width) - 1) << shift
        word = (word & ~mask) | ((value << shift) & mask)
        for i, b in enumerate(word.to_bytes(hi + 1 - lo, "big"), lo):
            self.patch[i] = b


def _overflow(value: int, incr: int, signed: bool, width: int) -> int:
    """1 when ``value + incr`` is past the top of a ``width``-bit integer, -1 past the bottom, else 0; ``value``
    is what the field holds or a SET's argument (``incr`` 0), an int64 for signed fields, a uint64 otherwise.

    As Redis's check{Signed,Unsigned}BitfieldOverflow, quirk included: for signed fields it compares with
    ``max - value`` and ``min - value`` computed in 64 bits, which wrap around for a SET value far below the
    field's range, so that such a value counts as past the top (OVERFLOW SAT then stores the maximum)."""
    if not signed:
        high = (1 << width) - 1
        if value > high or (incr > 0 and incr > high - value):
            return 1
        return -1 if incr < 0 and incr < -value else 0
    high = (1 << (width - 1)) - 1
    low = -high - 1
    up, down = _wrap64(high - value), _wrap64(low - value)
    short = width != 64
    if value > high or (short and incr > up) or (value >= 0 and incr > 0 and incr > up):
        return 1
    if value < low or (short and incr < down) or (value < 0 and incr < 0 and incr < down):
        return -1
    return 0


def _fit(value: int, incr: int, signed: bool, width: int, rule: int) -> int | None:
    """``value + incr`` stored in a ``width``-bit field under the OVERFLOW rule: wrapped around, held at the
    limit it passed, or None (FAIL) when it does not fit."""
    past = _overflow(value, incr, signed, width)
    if not past:
        return value + incr
    if rule == _FAIL:
        return None
    if rule == _SAT:
        if past < 0:
            return -(1 << (width - 1)) if signed else 0
        return (1 << (width - 1)) - 1 if signed else (1 << width) - 1
    wrapped = (value + incr) & ((1 << width) - 1)
    return wrapped - (1 << width) if signed and wrapped >> (width - 1) else wrapped


def _bitfield(ctx: Context, args: list[bytes], readonly_command: bool) -> Any:
    ops: list[tuple[int, bool, int, int, int, int]] = []  # opcode, signed, width, offset, argument, overflow
    overflow = _WRAP
    reads_only = True
    highest = 0  # the highest bit a SET or INCRBY writes
    n = len(args)
    j = 2
    while j < n:
        remaining = n - j - 1
        word = _word(args[j])
        if word == b"overflow" and remaining >= 1:
            kind = _OVERFLOWS.get(_word(args[j + 1]))
            if kind is None:
                raise CommandError("Invalid OVERFLOW type specified")
            overflow = kind
            j += 2
            continue
        opcode, needs = _OPCODES.get(word, (-1, 0))
        if opcode < 0 or remaining < needs:
            raise syntax_error()
        signed, width = _field_type(args[j + 1])
        offset = _bit_offset(ctx, args[j + 2], width)
        argument = 0
        if opcode != _GET:
            reads_only = False
            highest = max(highest, offset + width - 1)
            argument = parse_int(args[j + 3], NOT_INTEGER)
        ops.append((opcode, signed, width, offset, argument, overflow))
        j += 1 + needs

    if not reads_only and readonly_command:
        raise CommandError("BITFIELD_RO only supports the GET subcommand")
    key = args[1]
    old = string_value(ctx, key, write=not reads_only)  # as Redis: a BITFIELD of GETs alone is a read
    field = _Field(b"" if old is None else old)
    # As Redis: a write creates the key, or pads it with zeros up to the highest bit written, even when every
    # write then fails (OVERFLOW FAIL).
    size = (highest >> 3) + 1
    grows = not reads_only and (old is None or len(old) < size)
    replies: list[int | None] = []
    writes = 0  # SETs and INCRBYs that did not fail: Redis sends a setbit event when there is one
    for opcode, signed, width, offset, argument, kind in ops:
        current = field.get(offset, width)
        if signed and current >> (width - 1):
            current -= 1 << width
        if opcode == _GET:
            replies.append(current)
            continue
        if opcode == _INCRBY:
            new = _fit(current, argument, signed, width, kind)
            reply = new
        else:
            # Redis checks an unsigned SET value as a uint64: a negative one is past the top.
            new = _fit(argument if signed else argument % 2**64, 0, signed, width, kind)
            reply = current
        if new is None:
            replies.append(None)
            continue
        replies.append(reply)
        field.set(offset, width, new)
        writes += 1
    if grows or field.changed():
        base = field.base
        value = grown_value(ctx, key, base, size if grows else len(base), b"")
        for i, b in field.patch.items():
            value[i] = b
        ctx.store.replace_value(key, value)
    if writes:
        notify(ctx, STRING, b"setbit", key)
    return replies


@command("bitfield", -2, "write denyoom", keys=(1, 1, 1), group="bitmap", since="3.2.0",
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "update", "variable_flags"),
                            "This command allows both access and modification of the key"),),
         summary="Performs arbitrary bitfield integer operations on strings.",
         syntax="BITFIELD key [GET encoding offset | [OVERFLOW <WRAP | SAT | FAIL>] <SET encoding offset value | "
                "INCRBY encoding offset increment> [GET encoding offset | [OVERFLOW <WRAP | SAT | FAIL>] "
                "<SET encoding offset value | INCRBY encoding offset increment> ...]]")
def bitfield(ctx: Context, args: list[bytes]) -> Any:
    return _bitfield(ctx, args, False)


@command("bitfield_ro", -2, "readonly fast", keys=(1, 1, 1), group="bitmap", since="6.0.0",
         summary="Performs arbitrary read-only bitfield integer operations on strings.",
         syntax="BITFIELD_RO key [GET encoding offset [GET encoding offset ...]]")
def bitfield_ro(ctx: Context, args: list[bytes]) -> Any:
    return _bitfield(ctx, args, True)


