"""Data-plane commands: read values by reference into the shared-memory arena, under leases.

``TAIR.KV.ARENA`` hands a Unix-socket client a read-only descriptor of the arena; ``TAIR.KV.MGETREF`` answers
where each value lies in it (offset, length, version, checksum) and holds those slots under one lease until
``TAIR.KV.RELEASE`` or expiry. ``NOSUM`` leaves the checksum out: it is computed on first demand, a pass over the
whole value, which a client that verifies its own way (the SDK's codec) or not at all does not need. Design and
rules: docs/dataplane.md.
"""

from __future__ import annotations

import os
from typing import Any

import xxhash

from kvstrata.commands.args import parse_int
from kvstrata.commands.context import Context
from kvstrata.commands.registry import command
from kvstrata.engine.arena import ArenaPool, LeaseError
from kvstrata.engine.entry import Entry
from kvstrata.errors import CommandError, OutOfMemoryError
from kvstrata.protocol.encoder import NO_REPLY

_EMPTY_SUM = b"%016x" % xxhash.xxh3_64_intdigest(b"")


def _arena(ctx: Context) -> ArenaPool:
    arena = ctx.store.dram.arena
    if arena is None:
        raise CommandError("the shared-memory arena is disabled (arena no)")
    return arena


def _place(ctx: Context, arena: ArenaPool, key: bytes, entry: Entry) -> Any:
    """The arena view holding ``entry``'s value: copied in first when it is elsewhere (a small value, a value
    promoted from SSD or the pool, one received when the arena was full). None when it cannot be placed."""
    store = ctx.store
    dram = store.dram
    current = dram.entries.get(key)
    in_dram = current is not None and current.version == entry.version
    if in_dram:  # the read may have promoted the loaded entry into DRAM as a new Entry
        entry = current
    value = entry.value
    if arena.slot(value) is not None:
        return value
    view = arena.copy_in(value)
    if view is None:
        return None
    # Placed in DRAM the value is charged its slot's class; outside DRAM (loaded from a lower tier for this
    # command only) the slot is charged until the lease ends, like a leased value that was dropped.
    growth = dram.charge(key, view) - (dram.size(key, value) if in_dram else len(key) + dram.overhead)
    try:
        if dram.used + growth > dram.budget:
            store.make_room(growth, exclude=key)
    except OutOfMemoryError:
        pass
    if dram.used + growth > dram.budget:  # demotion could not free enough (leased bytes cannot move)
        arena.discard(view)
        return None
    if in_dram:
        dram.rehome(key, entry, view)
    else:
        arena.charge_transient(view)
        dram.used += arena.slot(view).cls
    return view


def _mgetref_options(args: list[bytes], ttl: int) -> tuple[list[bytes], int, bool]:
    """(keys, lease ms, whether to answer checksums) from ``key... [LEASE ms] [NOSUM]``: the options trail the keys
    (``NOSUM`` last), and at least one key is left either way."""
    keys = args[1:]
    with_sum = True
    if len(keys) >= 2 and bytes(keys[-1]).upper() == b"NOSUM":
        with_sum = False
        keys = keys[:-1]
    if len(keys) >= 3 and bytes(keys[-2]).upper() == b"LEASE":
        ttl = parse_int(bytes(keys[-1]))
        if ttl <= 0:
            raise CommandError("invalid LEASE time: it must be a positive number of milliseconds")
        keys = keys[:-2]
    return keys, ttl, with_sum


def _mgetref_keys(args: list[bytes]) -> list[bytes]:
    """TAIR.KV.MGETREF's keys: ``LEASE ms`` and ``NOSUM`` are not keys (for ACL key patterns and the tier
    loader alike)."""
    try:
        return _mgetref_options(args, 1)[0]
    except CommandError:
        return []  # the handler answers with the error; nothing to load for it


@command("tair.kv.mgetref", -2, "readonly", keys=(1, -1, 1), getkeys=_mgetref_keys, group="tairkv", since="0.2.0",
         summary="Leases the arena slots of values and answers where they lie: offset, length, version, checksum.",
         syntax="TAIR.KV.MGETREF key [key ...] [LEASE milliseconds] [NOSUM]")
def kv_mgetref(ctx: Context, args: list[bytes]) -> Any:
    arena = _arena(ctx)
    keys, ttl, with_sum = _mgetref_options(args, int(ctx.config.get("lease-default-ms")))
    store = ctx.store
    # The lease is taken first and each slot joins it as soon as it is placed: placing a later value may
    # demote an earlier key, whose slot must then stay (and stay charged) for this reader.
    try:
        lease = arena.lease(ctx.client.id, (), ttl, store.clock.now_ms())
    except LeaseError as exc:
        raise CommandError(str(exc), raw=True) from None
    refs: list[Any] = []
    for key in keys:
        entry = store.get(key)
        if entry is None:
            refs.append(None)
            continue
        if len(entry.value) == 0:
            refs.append([0, 0, entry.version, _EMPTY_SUM if with_sum else None])
            continue
        view = _place(ctx, arena, key, entry)
        if view is None:
            refs.append(entry.value)  # no room in the arena: the value itself, as TAIR.KV.MGET would
            continue
        arena.extend(lease, view)
        slot = arena.slot(view)
        checksum = None
        if with_sum:
            if slot.checksum is None:
                arena.hashed_bytes += slot.length
            checksum = b"%016x" % slot.digest()
        refs.append([slot.off, slot.length, entry.version, checksum])
    if not arena.lease_table[lease].slots:
        arena.release_lease(lease)
        lease = 0
    return [lease, refs]


@command("tair.kv.release", -2, "fast", group="tairkv", since="0.2.0",
         summary="Ends leases taken by TAIR.KV.MGETREF; answers how many were held by this client.",
         syntax="TAIR.KV.RELEASE lease [lease ...]")
def kv_release(ctx: Context, args: list[bytes]) -> Any:
    arena = _arena(ctx)
    n = 0
    for a in args[1:]:
        n += arena.release_lease(parse_int(bytes(a)), ctx.client.id)
    return n


@command("tair.kv.arena", 1, "", group="tairkv", since="0.2.0",
         summary="Sends a Unix-socket client a read-only descriptor of the shared-memory arena (SCM_RIGHTS).",
         syntax="TAIR.KV.ARENA")
def kv_arena(ctx: Context, args: list[bytes]) -> Any:
    from kvstrata.server.dataplane import reply_with_fd

    arena = _arena(ctx)
    fd = arena.region.reader_fd()
    try:
        reply_with_fd(ctx, str(arena.region.size), fd)
    finally:
        os.close(fd)
    return NO_REPLY
