"""OBJECT: what Redis reports of a key's value (its encoding, references, access frequency and idle time), as far
as kvstrata keeps such things.

ENCODING answers what Redis answers for a value stored by SET: ``int`` for the canonical decimal text of a 64-bit
integer (at most 20 bytes), ``embstr`` up to 44 bytes, ``raw`` above (Redis reports ``raw`` also for short values
built by APPEND or SETRANGE; kvstrata keeps only the bytes). REFCOUNT is 1: values are never shared (Redis shares
the integers 0-9999 when no maxmemory is set). FREQ is refused with Redis's text for an LRU policy (CONFIG GET
maxmemory-policy says allkeys-lru); IDLETIME too, since kvstrata's eviction policies rank keys by counts of
accesses, not by a clock, and keep no access time per key.
"""

from __future__ import annotations

from typing import Any

from kvstrata.commands.context import Context
from kvstrata.commands.observe import help_reply
from kvstrata.commands.registry import KeySpec, command, container
from kvstrata.errors import CommandError

EMBSTR_LIMIT = 44  # OBJ_ENCODING_EMBSTR_SIZE_LIMIT
INT_TEXT_LIMIT = 20  # the longest text Redis tries as an integer
NOT_LFU = ("An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching "
           "between policies at runtime LRU and LFU data will take some time to adjust.")


def encoding(value: bytes | bytearray) -> str:
    """Redis's encoding of a string value SET stored (tryObjectEncoding)."""
    n = len(value)
    if 0 < n <= INT_TEXT_LIMIT and value[0] in b"-0123456789":
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is not None and -(1 << 63) <= number < 1 << 63 and str(number).encode() == bytes(value):
            return "int"
    return "embstr" if n <= EMBSTR_LIMIT else "raw"


container("object", "", group="generic", since="2.2.3", summary="A container for object introspection commands.")


# ENCODING reads the value (an integer's text decides); the others need only the record's header (load="meta").
@command("encoding", 3, "readonly", parent="object", group="generic", since="2.2.3", keys=(2, 2, 1),
         key_specs=(KeySpec(2, 0, 1, ("RO",)),),
         summary="Returns the internal encoding of a Redis object.", syntax="ENCODING key")
def object_encoding(ctx: Context, args: list[bytes]) -> Any:
    entry = ctx.store.get(args[2], touch=False)
    ctx.store.count_read(args[2], entry is not None, notify=False)  # as Redis's OBJECT: counted, no keymiss
    return None if entry is None else encoding(entry.value)


@command("refcount", 3, "readonly", parent="object", group="generic", since="2.2.3", keys=(2, 2, 1),
         key_specs=(KeySpec(2, 0, 1, ("RO",)),),
         load="meta",
         summary="Returns the reference count of a value of a key.", syntax="REFCOUNT key")
def object_refcount(ctx: Context, args: list[bytes]) -> Any:
    return None if ctx.store.probe_counted(args[2], notify=False) is None else 1


@command("freq", 3, "readonly", parent="object", group="generic", since="4.0.0", keys=(2, 2, 1),
         key_specs=(KeySpec(2, 0, 1, ("RO",)),),
         load="meta",
         summary="Returns the logarithmic access frequency counter of a Redis object.", syntax="FREQ key")
def object_freq(ctx: Context, args: list[bytes]) -> Any:
    if ctx.store.probe_counted(args[2], notify=False) is None:
        return None
    raise CommandError(NOT_LFU)


@command("idletime", 3, "readonly", parent="object", group="generic", since="2.2.3", keys=(2, 2, 1),
         key_specs=(KeySpec(2, 0, 1, ("RO",)),),
         load="meta",
         summary="Returns the time since the last access to a Redis object.", syntax="IDLETIME key")
def object_idletime(ctx: Context, args: list[bytes]) -> Any:
    if ctx.store.probe_counted(args[2], notify=False) is None:
        return None
    raise CommandError("idle time not tracked: kvstrata's eviction policies rank keys by counts of accesses, not "
                       "by a clock, and keep no access time per key")


@command("help", 2, "loading stale", parent="object", group="generic", since="6.2.0",
         summary="Returns helpful text about the different subcommands.")
def object_help(ctx: Context, args: list[bytes]) -> Any:
    return help_reply("OBJECT", [
        "ENCODING <key>",
        "    Return the kind of internal representation used in order to store the value",
        "    associated with a <key>.",
        "FREQ <key>",
        "    Not tracked by kvstrata (its eviction policies count accesses their own way).",
        "IDLETIME <key>",
        "    Not tracked by kvstrata (its eviction policies keep no access time per key).",
        "REFCOUNT <key>",
        "    Return the number of references of the value associated with the specified",
        "    <key> (always 1: values are never shared).",
        "HELP",
        "    Print this help.",
    ])
