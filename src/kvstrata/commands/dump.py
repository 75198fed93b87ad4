"""DUMP and RESTORE: a key's value in Redis's serialised form (kvstrata.protocol.dump_payload), so string keys
move between kvstrata and Redis or Valkey either way."""

from __future__ import annotations

from typing import Any

from kvstrata.commands.args import INT64_MAX, parse_int
from kvstrata.commands.context import Context
from kvstrata.commands.pool_acks import after_pool_delete, delete_tracked
from kvstrata.commands.registry import KeySpec, command
from kvstrata.errors import BusyKeyError, CommandError, syntax_error
from kvstrata.protocol import dump_payload
from kvstrata.protocol.encoder import OK
from kvstrata.server.notify import GENERIC, notify


@command("dump", 2, "readonly", keys=(1, 1, 1), group="generic", since="2.6.0",
         summary="Returns a serialized representation of the value stored at a key.", syntax="DUMP key")
def dump(ctx: Context, args: list[bytes]) -> Any:
    entry = ctx.store.get(args[1])
    return None if entry is None else dump_payload.dump(entry.value)


# load="meta": whether the key exists decides (BUSYKEY); its old value is never read.
# values=(3, 0): a large payload stays the buffer it was received into (it is only read, never hashed or kept).
@command("restore", -4, "write denyoom", keys=(1, 1, 1),
         key_specs=(KeySpec(1, 0, 1, ("OW", "update")),),
         values=(3, 0), group="generic", since="2.6.0", load="meta",
         summary="Creates a key from the serialized representation of a value.",
         syntax="RESTORE key ttl serialized-value [REPLACE] [ABSTTL] [IDLETIME seconds] [FREQ frequency]")
def restore(ctx: Context, args: list[bytes]) -> Any:
    """Redis's checks in its order: options, an existing key without REPLACE, the TTL, the payload's footer, its
    contents. IDLETIME and FREQ are checked and not kept: kvstrata's eviction policies keep their own counts."""
    replace = absttl = False
    idle = freq = False
    i = 4
    while i < len(args):
        opt = args[i].upper()
        more = i + 1 < len(args)
        if opt == b"REPLACE":
            replace = True
        elif opt == b"ABSTTL":
            absttl = True
        elif opt == b"IDLETIME" and more and not freq:
            if parse_int(args[i + 1]) < 0:
                raise CommandError("Invalid IDLETIME value, must be >= 0")
            idle = True
            i += 1
        elif opt == b"FREQ" and more and not idle:
            if not 0 <= parse_int(args[i + 1]) <= 255:
                raise CommandError("Invalid FREQ value, must be >= 0 and <= 255")
            freq = True
            i += 1
        else:
            raise syntax_error()
        i += 1
    store = ctx.store
    key = args[1]
    if not replace and store.probe(key) is not None:
        raise BusyKeyError()
    ttl = parse_int(args[2])
    if ttl < 0:
        raise CommandError("Invalid TTL value, must be >= 0")
    payload = args[3]
    dump_payload.verify(payload)
    value = dump_payload.load(payload, int(ctx.config.get("proto-max-bulk-len")))
    now = store.clock.now_ms()
    # A relative TTL past the 64-bit range would wrap in Redis (the key comes out expired); here it is the latest
    # time a tier can store.
    expire_at = ttl if absttl or not ttl else min(ttl, INT64_MAX - now) + now
    if expire_at and expire_at <= now:
        if replace:  # the old key goes, the restored one is born expired: as Redis, an OK and a delete
            return after_pool_delete(ctx, OK, delete_tracked(ctx, [key])[1])
        return OK
    store.put(bytes(key), value, expire_at, recreate=True)  # REPLACE deletes and adds: a new key, for class n
    notify(ctx, GENERIC, b"restore", key)
    return OK
