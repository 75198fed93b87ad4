"""Keyspace commands: DEL, EXISTS, EXPIRE and TTL families, TYPE, KEYS, SCAN, RENAME, DBSIZE, FLUSH*."""

from __future__ import annotations

from typing import Any

from kvstrata import acl as acl_mod
from kvstrata.commands.args import parse_db_index, parse_int
from kvstrata.commands.context import Context
from kvstrata.commands.expiry import expire_at_ms
from kvstrata.commands.pool_acks import after_pool_delete, delete_tracked
from kvstrata.commands.registry import KeySpec, command
from kvstrata.engine.keyspace import SCAN_BUCKETS
from kvstrata.errors import CommandError, syntax_error
from kvstrata.protocol.encoder import OK, Status
from kvstrata.server.notify import GENERIC, notify


@command("del", -2, "write", keys=(1, -1, 1),
         key_specs=(KeySpec(1, -1, 1, ("RM", "delete")),),
         group="generic", summary="Deletes one or more keys.",
         syntax="DEL key [key ...]")
def del_(ctx: Context, args: list[bytes]) -> Any:
    deleted, seqs = delete_tracked(ctx, args[1:])
    return after_pool_delete(ctx, deleted, seqs)  # each key's tombstone: the reply waits for every one's outcome


@command("unlink", -2, "write fast", keys=(1, -1, 1),
         key_specs=(KeySpec(1, -1, 1, ("RM", "delete")),),
         group="generic", since="4.0.0",
         summary="Asynchronously deletes one or more keys.", syntax="UNLINK key [key ...]")
def unlink(ctx: Context, args: list[bytes]) -> Any:
    return del_(ctx, args)


# load="meta" (here and for TYPE and the TTL family): a tiered server probes the record headers of the keys below
# DRAM (version, expiry, value length) instead of loading their values; ``store.probe`` answers from them.
@command("exists", -2, "readonly fast", keys=(1, -1, 1),
         key_specs=(KeySpec(1, -1, 1, ("RO",)),),
         load="meta", group="generic",
         summary="Determines whether one or more keys exist.", syntax="EXISTS key [key ...]")
def exists(ctx: Context, args: list[bytes]) -> Any:
    store = ctx.store
    probe = store.probe_counted
    found = [(key, meta) for key in args[1:] if (meta := probe(key)) is not None]
    if store.predictor is not None and found:
        # A lookup batch (SGLang batch_exists, vLLM's scheduler) announces the reads
        # that follow: the predictor queues the chunks it found below DRAM (docs/prefetch.md).
        store.predictor.lookup([k for k, m in found if m.value_len >= store.profile_min_bytes], ctx.command.stream)
    return len(found)


@command("touch", -2, "readonly fast", keys=(1, -1, 1),
         key_specs=(KeySpec(1, -1, 1, ("RO",)),),
         group="generic", since="3.2.1",
         summary="Returns the number of existing keys out of those specified after updating the time they were "
                 "last accessed.", syntax="TOUCH key [key ...]")
def touch(ctx: Context, args: list[bytes]) -> Any:
    get = ctx.store.get
    return sum(1 for key in args[1:] if get(key) is not None)


def _expire(ctx: Context, args: list[bytes], kind: bytes, name: str) -> Any:
    store = ctx.store
    now = store.clock.now_ms()
    flags = {a.upper() for a in args[3:]}
    for a in args[3:]:  # as Redis, the options are checked before the time
        if a.upper() not in (b"NX", b"XX", b"GT", b"LT"):
            shown = a.split(b"\x00", 1)[0].decode("latin-1")  # Redis formats it as a C string: up to a NUL
            raise CommandError(f"Unsupported option {shown}")
    if b"NX" in flags and flags & {b"XX", b"GT", b"LT"}:
        raise CommandError("NX and XX, GT or LT options at the same time are not compatible")
    if b"GT" in flags and b"LT" in flags:
        raise CommandError("GT and LT options at the same time are not compatible")
    when = expire_at_ms(kind, args[2], now, name, allow_nonpositive=True)
    entry = store.get(args[1], touch=False)
    if entry is None:
        return 0
    current = entry.expire_at
    if b"NX" in flags and current:
        return 0
    if b"XX" in flags and not current:
        return 0
    if b"GT" in flags and (not current or when <= current):
        return 0
    if b"LT" in flags and current and when >= current:
        return 0
    if when <= now:
        # A delete: with the pool, the reply waits for its tombstone as DEL's does.
        return after_pool_delete(ctx, 1, delete_tracked(ctx, [args[1]])[1])
    store.set_expire(args[1], when)
    notify(ctx, GENERIC, b"expire", args[1])
    return 1


@command("expire", -3, "write fast", keys=(1, 1, 1), group="generic",
         summary="Sets the expiration time of a key in seconds.", syntax="EXPIRE key seconds [NX | XX | GT | LT]")
def expire(ctx: Context, args: list[bytes]) -> Any:
    return _expire(ctx, args, b"EX", "expire")


@command("pexpire", -3, "write fast", keys=(1, 1, 1), group="generic", since="2.6.0",
         summary="Sets the expiration time of a key in milliseconds.",
         syntax="PEXPIRE key milliseconds [NX | XX | GT | LT]")
def pexpire(ctx: Context, args: list[bytes]) -> Any:
    return _expire(ctx, args, b"PX", "pexpire")


@command("expireat", -3, "write fast", keys=(1, 1, 1), group="generic", since="1.2.0",
         summary="Sets the expiration time of a key to a Unix timestamp.",
         syntax="EXPIREAT key unix-time-seconds [NX | XX | GT | LT]")
def expireat(ctx: Context, args: list[bytes]) -> Any:
    return _expire(ctx, args, b"EXAT", "expireat")


@command("pexpireat", -3, "write fast", keys=(1, 1, 1), group="generic", since="2.6.0",
         summary="Sets the expiration time of a key to a Unix milliseconds timestamp.",
         syntax="PEXPIREAT key unix-time-milliseconds [NX | XX | GT | LT]")
def pexpireat(ctx: Context, args: list[bytes]) -> Any:
    return _expire(ctx, args, b"PXAT", "pexpireat")


def _ttl(ctx: Context, key: bytes, unit: int, absolute: bool) -> int:
    entry = ctx.store.probe_counted(key)
    if entry is None:
        return -2
    if not entry.expire_at:
        return -1
    if absolute:
        return (entry.expire_at + 500) // 1000 if unit == 1000 else entry.expire_at
    remaining = max(entry.expire_at - ctx.store.clock.now_ms(), 0)
    return (remaining + 500) // 1000 if unit == 1000 else remaining


@command("ttl", 2, "readonly fast", keys=(1, 1, 1), load="meta", group="generic",
         summary="Returns the expiration time in seconds of a key.")
def ttl(ctx: Context, args: list[bytes]) -> Any:
    return _ttl(ctx, args[1], 1000, False)


@command("pttl", 2, "readonly fast", keys=(1, 1, 1), load="meta", group="generic", since="2.6.0",
         summary="Returns the expiration time in milliseconds of a key.")
def pttl(ctx: Context, args: list[bytes]) -> Any:
    return _ttl(ctx, args[1], 1, False)


@command("expiretime", 2, "readonly fast", keys=(1, 1, 1), load="meta", group="generic", since="7.0.0",
         summary="Returns the expiration time of a key as a Unix timestamp.")
def expiretime(ctx: Context, args: list[bytes]) -> Any:
    return _ttl(ctx, args[1], 1000, True)


@command("pexpiretime", 2, "readonly fast", keys=(1, 1, 1), load="meta", group="generic", since="7.0.0",
         summary="Returns the expiration time of a key as a Unix milliseconds timestamp.")
def pexpiretime(ctx: Context, args: list[bytes]) -> Any:
    return _ttl(ctx, args[1], 1, True)


@command("persist", 2, "write fast", keys=(1, 1, 1), group="generic", since="2.2.0",
         summary="Removes the expiration time of a key.")
def persist(ctx: Context, args: list[bytes]) -> Any:
    entry = ctx.store.get(args[1], touch=False)
    if entry is None or not entry.expire_at:
        return 0
    ctx.store.set_expire(args[1], 0)
    notify(ctx, GENERIC, b"persist", args[1])
    return 1


@command("type", 2, "readonly fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RO",)),),
         load="meta", group="generic",
         summary="Determines the type of value stored at a key.")
def type_(ctx: Context, args: list[bytes]) -> Any:
    return Status("none" if ctx.store.probe_counted(args[1]) is None else "string")


@command("keys", 2, "readonly", group="generic", summary="Returns all key names that match a pattern.",
         syntax="KEYS pattern")
def keys(ctx: Context, args: list[bytes]) -> Any:
    return acl_mod.visible(ctx, ctx.store.keys(args[1]))  # an ACL user sees only the keys it may access


def _scan_cursor(raw: bytes) -> int:
    """Redis's strtoul: an optional sign and digits, nothing else ("" is 0); a minus wraps modulo 2**64, as C's
    unsigned conversion; more than 64 bits is an invalid cursor (ERANGE)."""
    sign = raw[:1] if raw[:1] in (b"+", b"-") else b""
    digits = raw[len(sign):]
    if (sign and not digits) or (digits and not digits.isdigit()) or (digits and int(digits) > 2**64 - 1):
        raise CommandError("invalid cursor")
    value = int(digits) if digits else 0
    return (-value) % 2**64 if sign == b"-" else value


@command("scan", -2, "readonly", group="generic", since="2.8.0",
         summary="Iterates over the key names in the database.",
         syntax="SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]")
def scan(ctx: Context, args: list[bytes]) -> Any:
    cursor = _scan_cursor(args[1])
    match: bytes | None = None
    count = 10
    type_filter: bytes | None = None
    i = 2
    while i < len(args):
        opt = args[i].upper()
        if i + 1 >= len(args):
            raise syntax_error()
        if opt == b"MATCH":
            match = args[i + 1]
        elif opt == b"COUNT":
            count = parse_int(args[i + 1])
            if count < 1:
                raise syntax_error()
        elif opt == b"TYPE":
            type_filter = args[i + 1].lower()
        else:
            raise syntax_error()
        i += 2
    if match == b"*":
        match = None
    if cursor >= SCAN_BUCKETS:
        return [b"0", []]
    nxt, found = ctx.store.scan(cursor, count, match)
    if type_filter is not None and type_filter != b"string":
        found = []
    return [str(nxt).encode(), acl_mod.visible(ctx, found)]


@command("randomkey", 1, "readonly", group="generic", summary="Returns a random key name from the database.")
def randomkey(ctx: Context, args: list[bytes]) -> Any:
    key = ctx.store.random_key()
    return key if key is None or acl_mod.visible(ctx, [key]) else None  # never another tenant's key name


def _rename(ctx: Context, args: list[bytes], nx: bool) -> Any:
    store = ctx.store
    src, dst = args[1], args[2]
    entry = store.get(src, touch=False)
    if entry is None:
        raise CommandError("no such key")
    if src == dst:
        return 0 if nx else OK
    if nx and store.get(dst, touch=False) is not None:
        return 0
    value, expire_at = entry.value, entry.expire_at
    store.delete(src)
    store.put(dst, value, expire_at, recreate=True)  # Redis deletes dst and adds it: a new key, for class n
    notify(ctx, GENERIC, b"rename_from", src)
    notify(ctx, GENERIC, b"rename_to", dst)
    return 1 if nx else OK


@command("rename", 3, "write", keys=(1, 2, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "delete")),
         KeySpec(2, 0, 1, ("OW", "update"))), group="generic", summary="Renames a key and overwrites the "
         "destination.", syntax="RENAME key newkey")
def rename(ctx: Context, args: list[bytes]) -> Any:
    return _rename(ctx, args, False)


@command("renamenx", 3, "write fast", keys=(1, 2, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "delete")),
         KeySpec(2, 0, 1, ("OW", "insert"))), group="generic",
         summary="Renames a key only when the target key name doesn't exist.", syntax="RENAMENX key newkey")
def renamenx(ctx: Context, args: list[bytes]) -> Any:
    return _rename(ctx, args, True)


@command("copy", -3, "write denyoom", keys=(1, 2, 1),
         key_specs=(KeySpec(1, 0, 1, ("RO", "access")),
         KeySpec(2, 0, 1, ("OW", "update"))), group="generic", since="6.2.0",
         summary="Copies the value of a key to a new key.",
         syntax="COPY source destination [DB destination-db] [REPLACE]")
def copy(ctx: Context, args: list[bytes]) -> Any:
    """Redis's checks in its order: options, then same key, then a missing source (0), then an existing
    destination without REPLACE (0). The copy keeps the source's expiry."""
    replace = False
    i = 3
    while i < len(args):
        opt = args[i].upper()
        if opt == b"REPLACE":
            replace = True
        elif opt == b"DB" and i + 1 < len(args):
            parse_db_index(args[i + 1])
            i += 1
        else:
            raise syntax_error()
        i += 1
    store = ctx.store
    src, dst = args[1], args[2]
    if src == dst:
        raise CommandError("source and destination objects are the same")
    entry = store.get(src, touch=False, count=True)
    if entry is None:
        return 0
    if store.get(dst, touch=False) is not None and not replace:
        return 0
    # Its own bytes: the source may change later. A new key for class n even when it replaced dst, as Redis's.
    store.put(bytes(dst), bytes(entry.value), entry.expire_at, recreate=True)
    notify(ctx, GENERIC, b"copy_to", dst)
    return 1


@command("move", 3, "write fast", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("RW", "access", "update")),),
         group="generic", load=False,
         summary="Moves a key to another database.", syntax="MOVE key db")
def move(ctx: Context, args: list[bytes]) -> Any:
    """Database 0 is the only one (as Redis with ``databases 1``): moving a key to it is moving it onto itself."""
    parse_db_index(args[2])
    raise CommandError("source and destination objects are the same")


@command("swapdb", 3, "write fast", group="server", since="4.0.0", load=False,
         summary="Swaps two Redis databases.", syntax="SWAPDB index1 index2")
def swapdb(ctx: Context, args: list[bytes]) -> Any:
    """Only database 0 exists: swapping it with itself changes nothing."""
    indexes = []
    for raw, which in ((args[1], "first"), (args[2], "second")):
        index = parse_int(raw, f"invalid {which} DB index")
        if not -2**31 <= index < 2**31:  # Redis reads an int
            raise CommandError(f"invalid {which} DB index")
        indexes.append(index)
    if indexes != [0, 0]:
        raise CommandError("DB index is out of range")
    return OK


# settle: LMDB's record count is exact only once the SSD writer has committed everything queued.
@command("dbsize", 1, "readonly fast", settle=True, group="server",
         summary="Returns the number of keys in the database.")
def dbsize(ctx: Context, args: list[bytes]) -> Any:
    return ctx.store.dbsize()


def _flush(ctx: Context, args: list[bytes]) -> Any:
    if len(args) > 2 or (len(args) == 2 and args[1].upper() not in (b"ASYNC", b"SYNC")):
        raise syntax_error()
    ctx.store.flush()
    return OK


@command("flushdb", -1, "write", group="server", summary="Remove all keys from the current database.",
         syntax="FLUSHDB [ASYNC | SYNC]")
def flushdb(ctx: Context, args: list[bytes]) -> Any:
    return _flush(ctx, args)


@command("flushall", -1, "write", group="server", summary="Removes all keys from all databases.",
         syntax="FLUSHALL [ASYNC | SYNC]")
def flushall(ctx: Context, args: list[bytes]) -> Any:
    return _flush(ctx, args)

