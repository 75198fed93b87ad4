"""KV-cache commands (TAIR.KV.*): versioned writes, consistent multi-gets, prefetch, hot keys, tier lookup."""

from __future__ import annotations

from typing import Any

from kvstrata.commands.args import parse_int
from kvstrata.commands.context import Context
from kvstrata.commands.registry import command
from kvstrata.errors import CommandError, syntax_error, wrong_arity

_WAIT = "kvstrata.pool_wait"
STRONG_RECHECKS = 3


class WaitForCommit(Exception):
    """Raised by a handler that must see the SSD writer reach ``seq`` before it can answer (STRONG reads)."""

    def __init__(self, seq: int) -> None:
        super().__init__(seq)
        self.seq = seq


class PoolWait:
    """Raised (inside WaitForCommit) by a handler that needs the pool before it can answer.

    ``pool_seq``: a pool write to wait for (TAIR.KV.SETEX acknowledges after the pool has the value, so a STRONG
    read through another node sees it); ``check``: {key: local version} to compare with the pool's (STRONG
    reads). The server fills ``result`` and ``done``; the handler runs again and finds them.
    """

    __slots__ = ("args", "check", "done", "overlay", "pool_seq", "reply", "result", "ssd_seq", "ticket", "tries")

    def __init__(self, args: Any, *, pool_seq: int = 0, ssd_seq: int = 0, reply: Any = None,
                 check: dict[bytes, int] | None = None, tries: int = 0) -> None:
        self.args = args
        self.pool_seq = pool_seq
        self.ssd_seq = ssd_seq
        self.reply = reply
        self.check = check
        self.result: dict[bytes, Any] = {}
        self.ticket: list[Any] | None = None
        self.done = False
        self.tries = tries
        # The loader's records of the first run, kept for the second (see Store.keep_overlay).
        self.overlay: Any = None

    def release(self, store: Any) -> None:
        """Drop the watch tickets of a wait that will not be used."""
        if self.ticket is not None and store.pool is not None:
            store.pool.unwatch(self.ticket)
            self.ticket = None
        if self.overlay is not None:
            store.restore_overlay(self.overlay, install=False)
            self.overlay = None

    def __bool__(self) -> bool:
        return True


@command("tair.kv.setex", -4, "write denyoom", keys=(1, 1, 1), group="tairkv", since="0.1.0",
         summary="Sets a KV-cache value with a TTL in milliseconds (0: none); replies with its new version.",
         syntax="TAIR.KV.SETEX key ttl_ms value [COLD_STORAGE] [VER expected_version]")
def kv_setex(ctx: Context, args: list[bytes]) -> Any:
    store = ctx.store
    w = ctx.extra.pop(_WAIT, None)
    if w is not None and w.args is not args:
        w.release(store)
    elif w is not None:
        # Second run, after the pool (and, under write-through, the SSD) acknowledged the write.
        if w.ssd_seq and store.ssd is not None:
            failed = store.ssd.failed.get(w.ssd_seq)
            if failed is not None:
                raise CommandError(f"SSD write failed: {failed}")
        return w.reply
    ttl_ms = parse_int(args[2])
    if ttl_ms < 0:
        raise CommandError("invalid expire time in 'tair.kv.setex' command")
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
    expire_at = store.clock.now_ms() + ttl_ms if ttl_ms else 0
    store.pool_ack = 0
    entry = store.put(args[1], args[3], expire_at, cold=cold, expected_version=expected)
    pool = store.pool
    if store.pool_ack and pool is not None and pool.active and ctx.server is not None:
        # Acknowledge once the pool holds the value, so a STRONG read through another node sees it. A pool
        # that fails meanwhile releases the wait (the write stays local; the pool is marked degraded).
        w = PoolWait(args, pool_seq=store.pool_ack, ssd_seq=store.ack_seq, reply=entry.version)
        ctx.extra[_WAIT] = w
        raise WaitForCommit(w)  # type: ignore[arg-type]
    return entry.version


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


@command("tair.kv.mget", -2, "readonly", keys=(1, -1, 1), group="tairkv", since="0.1.0",
         summary="Gets KV-cache values (nil for missing), optionally with their versions.",
         syntax="TAIR.KV.MGET key [key ...] [CONSISTENCY_LEVEL STRONG|EVENTUAL] [WITHVERSIONS]")
def kv_mget(ctx: Context, args: list[bytes]) -> Any:
    keys, level, with_versions = _mget_options(args, ctx.config.get("consistency"))
    store = ctx.store
    ssd = store.ssd
    if level == "strong" and ssd is not None and store.write_through and ssd.committed_seq < ssd.enqueued_seq:
        # Answer only with acknowledged data: wait for in-flight write-through writes of these keys.
        if any(k in ssd.pending for k in keys):
            raise WaitForCommit(ssd.enqueued_seq)
    if level == "strong" and store.pool is not None and ctx.server is not None:
        _strong_pool_check(ctx, args, keys)
    out: list[Any] = []
    for key in keys:
        entry = store.get(key)
        if with_versions:
            out.append(None if entry is None else [entry.value, entry.version])
        else:
            out.append(None if entry is None else entry.value)
    return out


def _strong_pool_check(ctx: Context, args: list[bytes], keys: list[bytes]) -> None:
    """STRONG reads with a pool: compare each key's local version with the pool's; adopt newer pool records.

    First run: note the local versions and suspend (the check runs in a worker thread). Second run: adopt what
    is newer (highest version wins). If this node wrote or deleted one of the keys meanwhile, the check is redone
    (at most STRONG_RECHECKS times, then the local copies answer). A degraded pool answers from local tiers.
    """
    store = ctx.store
    pool = store.pool
    assert pool is not None
    w = ctx.extra.pop(_WAIT, None)
    if w is not None and w.args is args and w.done:
        stale = w.ticket is not None and w.ticket[0]
        if w.ticket is not None:
            pool.unwatch(w.ticket)
            w.ticket = None
        if w.overlay is not None:
            # The records loaded before the first run, still valid unless the SSD changed them meanwhile: the
            # reads below stay off the event loop.
            store.restore_overlay(w.overlay)
            w.overlay = None
        if not stale:
            store.refresh_from_pool(w.result)
            return
        if w.tries >= STRONG_RECHECKS or not pool.active:
            return
        tries = w.tries + 1
    else:
        if w is not None:
            w.release(store)
        tries = 0
    if not pool.active:
        return
    w = PoolWait(args, check=store.local_versions(keys), tries=tries)
    w.overlay = store.keep_overlay(keys)
    ctx.extra[_WAIT] = w
    raise WaitForCommit(w)  # type: ignore[arg-type]


@command("tair.kv.prefetch", -2, "readonly fast", keys=(1, -1, 1), group="tairkv", since="0.1.0",
         summary="Queues keys for promotion from lower tiers to DRAM; replies with how many were queued.",
         syntax="TAIR.KV.PREFETCH key [key ...] [PRIORITY n]")
def kv_prefetch(ctx: Context, args: list[bytes]) -> Any:
    keys = list(args[1:])
    priority = 0
    if len(keys) >= 2 and keys[-2].upper() == b"PRIORITY":
        priority = parse_int(keys[-1])
        del keys[-2:]
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
        ms = parse_int(args[3])
        if ms <= 0:
            raise CommandError("invalid expire time in 'tair.kv.markhot' command")
        until = ctx.store.clock.now_ms() + ms
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


@command("tair.kv.version", 2, "readonly fast", keys=(1, 1, 1), group="tairkv", since="0.1.0",
         summary="Returns the version of a key, or nil.")
def kv_version(ctx: Context, args: list[bytes]) -> Any:
    entry = ctx.store.get(args[1], touch=False)
    return None if entry is None else entry.version


@command("tair.kv.tier", 2, "readonly fast", keys=(1, 1, 1), group="tairkv", since="0.1.0",
         summary="Returns the tier that holds a key (dram, pool or ssd), or nil.")
def kv_tier(ctx: Context, args: list[bytes]) -> Any:
    return ctx.store.tier_of(args[1])

