"""KV-cache commands (TAIR.KV.*): versioned writes, consistent multi-gets, prefetch, hot keys, tier lookup."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstrata.commands.args import parse_int
from kvstrata.commands.context import Context
from kvstrata.commands.expiry import ttl_expires_at, ttl_ms_arg
from kvstrata.commands.pool_acks import after_pool_write
from kvstrata.commands.registry import command
from kvstrata.commands.waits import Commit, PoolAck, PoolVersions, Suspend
from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.pool import PoolDeleted, PoolUnavailableError
from kvstrata.errors import CommandError, syntax_error, wrong_arity
from kvstrata.server.notify import set_events

STRONG_RECHECKS = 3


@command("tair.kv.setex", -4, "write denyoom", keys=(1, 1, 1), values=(3, 0), group="tairkv", since="0.1.0", load="meta",
         summary="Sets a KV-cache value with a TTL in milliseconds (0: none); replies with its new version.",
         syntax="TAIR.KV.SETEX key ttl_ms value [COLD_STORAGE] [VER expected_version]")
def kv_setex(ctx: Context, args: list[bytes]) -> Any:
    store = ctx.store
    ttl_ms = ttl_ms_arg(args[2], store.clock.now_ms(), "tair.kv.setex")
    cold = False
    expected: int | None = None
    i = 4
    while i < len(args):
        opt = args[i].upper()
        if opt == b"COLD_STORAGE":
            cold = True
            i += 1
        elif opt == b"VER" and i + 1 < len(args):
            expected = parse_int(args[i + 1])
            i += 2
        else:
            raise syntax_error()
    if cold and ctx.store.ssd is None:
        raise CommandError("COLD_STORAGE needs the SSD tier (start with --essd-path)")
    return _setex(ctx, args[1], args[3], ttl_expires_at(ttl_ms, store.clock.now_ms()), cold, expected, 0)


def _setex(ctx: Context, key: bytes, value: bytes, expire_at: int, cold: bool, expected: int | None,
           tries: int) -> Any:
    """Write, then reply once the pool holds the write (``pool-ack``; pool_acks.after_pool_write)."""
    store = ctx.store
    ctx.command.pool_ack = 0
    entry = store.put(key, value, expire_at, cold=cold, expected_version=expected)
    ssd_seq = ctx.command.ack_seq
    if not tries:  # TAIR.KV.SETEX, COMMIT, PULL and MPULL all store here: SET's events (a retry is the same write)
        set_events(ctx, key, expire_at)

    def again(n: int) -> Any:
        # The pool held a higher version: write again above it (a plain write; a CAS gets VERMISMATCH).
        return _setex(ctx, key, value, expire_at, cold, None, n)

    return after_pool_write(ctx, key, entry.version, entry.version, expected=expected, ssd_seq=ssd_seq,
                            rewrite=again, tries=tries)


def _mget_options(args: list[bytes], default: str) -> tuple[list[bytes], str, bool]:
    keys = list(args[1:])
    level = default
    with_versions = False
    while keys:
        if keys[-1].upper() == b"WITHVERSIONS":
            with_versions = True
            keys.pop()
        elif len(keys) >= 2 and keys[-2].upper() == b"CONSISTENCY_LEVEL":
            word = keys[-1].lower()
            if word not in (b"strong", b"eventual"):
                raise CommandError("CONSISTENCY_LEVEL must be STRONG or EVENTUAL")
            level = word.decode()
            del keys[-2:]
        else:
            break
    if not keys:
        raise wrong_arity("tair.kv.mget")
    return keys, level, with_versions


def _mget_keys(args: list[bytes]) -> list[bytes]:
    """TAIR.KV.MGET's keys: its option words (CONSISTENCY_LEVEL STRONG, WITHVERSIONS) are not keys."""
    try:
        return _mget_options(args, "eventual")[0]
    except CommandError:
        return []  # the handler answers with the error; nothing to load for it


@command("tair.kv.mget", -2, "readonly", keys=(1, -1, 1), getkeys=_mget_keys, group="tairkv", since="0.1.0",
         summary="Gets KV-cache values (nil for missing), optionally with their versions.",
         syntax="TAIR.KV.MGET key [key ...] [CONSISTENCY_LEVEL STRONG|EVENTUAL] [WITHVERSIONS]")
def kv_mget(ctx: Context, args: list[bytes]) -> Any:
    keys, level, with_versions = _mget_options(args, ctx.config.get("consistency"))
    if level == "strong":
        return _strong(ctx, keys, with_versions)
    return _read(ctx, keys, with_versions)


def _read(ctx: Context, keys: list[bytes], with_versions: bool) -> list[Any]:
    get = ctx.store.get
    out: list[Any] = []
    for key in keys:
        entry = get(key)
        if with_versions:
            out.append(None if entry is None else [entry.value, entry.version])
        else:
            out.append(None if entry is None else entry.value)
    return out


def _strong(ctx: Context, keys: list[bytes], with_versions: bool,
            answer: Callable[[list[Entry | None]], Any] | None = None) -> Any:
    """A STRONG read answers only with acknowledged data, never older than the pool's (docs/pool.md)."""
    store = ctx.store
    ssd = store.ssd
    answer = answer or (lambda entries: _reply(entries, with_versions))
    if ssd is not None and store.write_through and ssd.committed_seq < ssd.enqueued_seq \
            and any(k in ssd.pending for k in keys):
        # In-flight write-through writes of these keys: wait for them, then read the keys again (they left the
        # pending writes, so they are loaded anew).
        return Suspend(Commit(ssd.enqueued_seq), lambda _: _strong(ctx, keys, with_versions, answer), reload=True)
    if store.pool is not None and ctx.server is not None:
        return _pool_check(ctx, keys, answer, 0)
    return answer([store.get(k) for k in keys])


def _reply(entries: list[Entry | None], with_versions: bool) -> list[Any]:
    if with_versions:
        return [None if e is None else [e.value, e.version] for e in entries]
    return [None if e is None else e.value for e in entries]


def _pool_check(ctx: Context, keys: list[bytes], answer: Callable[[list[Entry | None]], Any], tries: int) -> Any:
    """STRONG reads with a pool: compare each key's local version with the pool's and answer with the newer.

    The check runs in a worker thread (it raises -TRYAGAIN when the pool cannot be asked). The answer for a key
    is the pool's record or tombstone when that is newer than the local copy (adopted, or the local copy dropped),
    else the local copy. If this node wrote or deleted one of the keys meanwhile, the check is redone (at most
    STRONG_RECHECKS times, then -TRYAGAIN): a local write the pool has not confirmed is not an answer yet.
    """
    store = ctx.store
    pool = store.pool
    assert pool is not None
    down = next((r for k in keys if (r := pool.down_reason(k)) is not None), None)
    if down is not None:
        # Only keys whose master (or the whole pool) is degraded: the others' masters keep answering.
        raise PoolUnavailableError(f"the pool is unavailable ({down}); STRONG reads need it")
    if pool.pending and any(k in pool.pending for k in keys):
        # This node's write or delete of a key is on its way to the pool, unconfirmed (a CAS may yet be refused):
        # it is not an answer yet. Wait for the pool writer, then check again.
        if tries >= STRONG_RECHECKS:
            raise PoolUnavailableError("the keys kept changing on this node during the pool check; try again")
        return Suspend(PoolAck(pool.enqueued_seq), lambda _: _pool_check(ctx, keys, answer, tries + 1),
                       reload=True)
    local = store.local_versions(keys)
    # The records loaded before this step, kept (watched) so the reads after the check stay off the event loop.
    kept = store.keep_overlay(keys)

    def release() -> None:
        if kept is not None:
            store.restore_overlay(kept, install=False)

    def then(result: tuple[dict[bytes, Any], bool]) -> Any:
        newer, raced = result
        if kept is not None:
            store.restore_overlay(kept)  # reinstalled unless the SSD changed these keys meanwhile
        # A write of one of the keys here between this step and the start of the check (the watch ticket only
        # covers the check itself) is a race too: the local copy is not the one that was compared.
        raced = raced or any(k in pool.pending for k in keys)
        if not raced:
            store.refresh_from_pool(newer)
            out: list[Entry | None] = []
            for key in keys:
                rec = newer.get(key)
                if isinstance(rec, PoolDeleted):
                    out.append(None)
                elif isinstance(rec, Entry) and not rec.expired(store.clock.now_ms()):
                    out.append(rec)  # even if DRAM had no room to adopt it
                else:
                    out.append(store.get(key))
            lost = [k for k, e in zip(keys, out, strict=True) if e is None and local[k]
                    and not isinstance(newer.get(k), PoolDeleted)]
            if not lost:
                return answer(out)
            # A copy compared above left this node meanwhile (demoted out of DRAM, its loaded record dropped):
            # load the keys again and redo the check rather than answer "absent".
            raced = True
        if tries >= STRONG_RECHECKS:
            raise PoolUnavailableError("the keys kept changing on this node during the pool check; try again")
        return Suspend(PoolAck(0), lambda _: _pool_check(ctx, keys, answer, tries + 1), reload=True)

    return Suspend(PoolVersions(local), then, cancel=release)


def _prefetch_keys(args: list[bytes]) -> list[bytes]:
    """TAIR.KV.PREFETCH's keys: a trailing ``PRIORITY n`` is an option, not two keys."""
    if len(args) >= 3 and args[-2].upper() == b"PRIORITY":
        return list(args[1:-2])
    return list(args[1:])


# load=False: the keys are queued for the prefetcher, which reads each once; the reply does not wait for them.
@command("tair.kv.prefetch", -2, "readonly fast", keys=(1, -1, 1), getkeys=_prefetch_keys, load=False,
         group="tairkv", since="0.1.0",
         summary="Queues keys for promotion from lower tiers to DRAM; replies with how many were queued.",
         syntax="TAIR.KV.PREFETCH key [key ...] [PRIORITY n]")
def kv_prefetch(ctx: Context, args: list[bytes]) -> Any:
    keys = _prefetch_keys(args)
    priority = parse_int(args[-1]) if len(keys) < len(args) - 1 else 0
    if not keys:
        raise wrong_arity("tair.kv.prefetch")
    if ctx.server is not None:
        return ctx.server.prefetcher.submit(keys, priority)
    return sum(1 for k in keys if ctx.store.promote(k))


@command("tair.kv.markhot", -2, "write", group="tairkv", since="0.1.0",
         summary="Pins keys matching a pattern in DRAM (optionally for PX milliseconds); replies with how many "
                 "were pinned now.", syntax="TAIR.KV.MARKHOT pattern [PX milliseconds]")
def kv_markhot(ctx: Context, args: list[bytes]) -> Any:
    until = 0
    if len(args) == 4 and args[2].upper() == b"PX":
        now = ctx.store.clock.now_ms()
        ms = ttl_ms_arg(args[3], now, "tair.kv.markhot")
        if ms == 0:
            raise CommandError("invalid expire time in 'tair.kv.markhot' command")
        until = ttl_expires_at(ms, now)
    elif len(args) != 2:
        raise syntax_error()
    # bytes(): the pattern is kept, and a long one arrives in a receive buffer that must not be.
    pinned, below = ctx.store.mark_hot(bytes(args[1]), until)
    if below:
        if ctx.server is not None:
            ctx.server.prefetcher.submit(below, 100)
        else:
            for key in below:
                ctx.store.promote(key)
    return pinned


@command("tair.kv.unmarkhot", 2, "write", group="tairkv", since="0.1.0",
         summary="Removes a hot pattern; replies with how many keys were unpinned.")
def kv_unmarkhot(ctx: Context, args: list[bytes]) -> Any:
    return ctx.store.unmark_hot(bytes(args[1]))


@command("tair.kv.version", -2, "readonly fast", keys=(1, 1, 1), group="tairkv", since="0.1.0",
         summary="Returns the version of a key, or nil; with CONSISTENCY_LEVEL STRONG, never older than the "
                 "pool's.", syntax="TAIR.KV.VERSION key [CONSISTENCY_LEVEL STRONG|EVENTUAL]")
def kv_version(ctx: Context, args: list[bytes]) -> Any:
    level = "eventual"
    if len(args) == 4 and args[2].upper() == b"CONSISTENCY_LEVEL":
        word = args[3].lower()
        if word not in (b"strong", b"eventual"):
            raise CommandError("CONSISTENCY_LEVEL must be STRONG or EVENTUAL")
        level = word.decode()
    elif len(args) != 2:
        raise syntax_error()
    if level == "strong":
        return _strong(ctx, [args[1]], False, lambda entries: None if entries[0] is None else entries[0].version)
    entry = ctx.store.get(args[1], touch=False)
    return None if entry is None else entry.version


@command("tair.kv.tier", 2, "readonly fast", keys=(1, 1, 1), group="tairkv", since="0.1.0",
         summary="Returns the tier that holds a key (dram, pool or ssd), or nil.")
def kv_tier(ctx: Context, args: list[bytes]) -> Any:
    return ctx.store.tier_of(args[1])

