"""Transactions as Redis runs them: MULTI, EXEC, DISCARD, WATCH, UNWATCH.

After MULTI the connection queues each command (``Connection.execute`` answers +QUEUED) instead of running it; a
command refused while being queued (unknown, wrong arity, NOAUTH, ACL, -OOM, not allowed here) makes EXEC answer
-EXECABORT. EXEC runs the queue in one go on the event loop, so no other client's command runs in between: on a
tiered server the keys of every queued command (and the watched ones) are loaded before it starts
(``CommandRuns._tiered``), as for any multi-key command. A runtime error of one command is its reply in EXEC's
array and the others still run, as in Redis.

WATCH keeps each key's epoch, version and expiry as they were: the store bumps a watched key's epoch on every
write, delete, expiry change and flush of it (``Store.watch_epochs``, kept only while someone watches the key),
and its version and expiry change with an eviction or an expiry, so EXEC answers a null array when any of them
differs (a key rewritten, deleted, created and deleted again, given or stripped of a TTL, expired or evicted
meanwhile; FLUSHALL included).

Not inside a transaction: the TAIR.KV commands (their replies may wait for copies, the SSD writer or the pool
within the command), SHUTDOWN and HELLO; and no transaction at all while the pool acknowledges writes
(``pool-ack`` other than local), whose writes' replies wait for the pool one command at a time.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

from kvstrata import acl as acl_mod
from kvstrata.commands.context import ClientState, Context, held
from kvstrata.commands.registry import CommandSpec, KeySpec, command
from kvstrata.commands.waits import Suspend
from kvstrata.errors import CommandError
from kvstrata.protocol.encoder import NULL_ARRAY, OK, ErrorReply, Status
from kvstrata.server.monitor import shown

log = logging.getLogger("kvstrata.conn")

QUEUED = Status("QUEUED")
# Run at once even inside MULTI (Redis's list: they act on the transaction or the connection itself).
RUN_IN_MULTI = frozenset({"exec", "discard", "multi", "watch", "quit", "reset"})
# HELLO would switch the protocol in the middle of EXEC's reply (SHUTDOWN, which may answer nothing, and SAVE are
# flagged no_multi, as in Redis); MIGRATE waits for another server, which EXEC cannot.
_NOT_IN_MULTI = frozenset({"hello", "migrate"})


def refused_in_multi(spec: CommandSpec) -> str | None:
    """Why ``spec`` cannot be queued by MULTI (an error text), or None."""
    top = spec.parent or spec
    if "no_multi" in top.flags:  # Redis's own (SAVE, SHUTDOWN): its text
        return "ERR Command not allowed inside a transaction"
    if top.group == "tairkv" or top.name in _NOT_IN_MULTI:
        return f"ERR Command not allowed inside a transaction: '{spec.full_name}'"
    return None


def _pool_waits(ctx: Context) -> bool:
    pool = ctx.store.pool
    return pool is not None and pool.ack != "local"


def _snapshot(ctx: Context, key: bytes) -> tuple[int, int, int]:
    """What EXEC compares: the key's epoch (bumped by every write, delete, expiry change or flush of a watched
    key: a key created and deleted again meanwhile) and its version and expiry (an expiry or an eviction)."""
    meta = ctx.store.probe(key)
    epoch = ctx.store.watch_epoch(key)
    return (epoch, -1, -1) if meta is None else (epoch, meta.version, meta.expire_at)


def unwatch_all(ctx: Context) -> None:
    client = ctx.client
    if client.watched:
        ctx.store.unwatch(client.watched)
        client.held_bytes -= sum(map(held, client.watched))
        client.watched = {}


def end_transaction(ctx: Context) -> None:
    """Forget the queue and the watched keys (EXEC, DISCARD, RESET, a closed connection)."""
    client = ctx.client
    client.multi = None
    client.multi_dirty = False
    client.multi_bytes = 0
    unwatch_all(ctx)


@command("multi", 1, "noscript loading stale fast allow_busy", group="transactions", since="1.2.0", load=False,
         summary="Starts a transaction.")
def multi(ctx: Context, args: list[bytes]) -> Any:
    client = ctx.client
    if client.multi is not None:
        raise CommandError("MULTI calls can not be nested")
    if _pool_waits(ctx):
        raise CommandError("MULTI is not supported while the pool acknowledges writes (pool-ack "
                           f"{ctx.store.pool.ack}); send the commands on their own")
    client.multi = []  # multi_dirty and multi_bytes are back at False and 0 since the last transaction ended
    return OK


@command("discard", 1, "noscript loading stale fast allow_busy", group="transactions", since="2.0.0", load=False,
         summary="Discards a transaction.")
def discard(ctx: Context, args: list[bytes]) -> Any:
    if ctx.client.multi is None:
        raise CommandError("DISCARD without MULTI")
    end_transaction(ctx)
    return OK


@command("watch", -2, "noscript loading stale fast allow_busy", keys=(1, -1, 1),
         key_specs=(KeySpec(1, -1, 1, ("RO",)),),
         load="meta",
         group="transactions", since="2.2.0", summary="Monitors changes to keys to determine the execution of a "
                                                      "transaction.")
def watch(ctx: Context, args: list[bytes]) -> Any:
    client = ctx.client
    if client.multi is not None:
        raise CommandError("WATCH inside MULTI is not allowed")
    for key in args[1:]:
        if key not in client.watched:  # as Redis: watching a key again keeps the first snapshot
            ctx.store.watch(key)
            client.watched[key] = _snapshot(ctx, key)
            client.held_bytes += held(key)
    return OK


@command("unwatch", 1, "noscript loading stale fast allow_busy", group="transactions", since="2.2.0", load=False,
         summary="Forgets about all watched keys.")
def unwatch(ctx: Context, args: list[bytes]) -> Any:
    unwatch_all(ctx)
    return OK


def exec_waits(client: ClientState) -> tuple[list[bytes], bool, bool]:
    """What EXEC declares for the tiered path, from its queue: the keys it must find in DRAM before it runs (every
    queued command's, and the watched ones), whether one of the queued commands needs a settled SSD tier, and
    whether one writes (writer backpressure)."""
    keys: list[bytes] = list(client.watched)
    settle = write = False
    for spec, args in client.multi or ():
        keys += spec.load_keys(args)
        settle = settle or spec.settle
        write = write or spec.write
    return list(dict.fromkeys(keys)), settle, write


# Why EXEC refuses a queued command its user may no longer run, as Redis words it.
_NO_LONGER = {"command": "no permission to execute the command or subcommand",
              "key": "no permission to touch the specified keys",
              "channel": "no permission to access one of the channels used as arguments"}


def _refused_now(ctx: Context, spec: CommandSpec, args: list[Any]) -> ErrorReply | None:
    """As Redis's EXEC: each queued command is checked against its user's ACL rules again (ACL SETUSER, ACL LOAD
    may have changed them since it was queued); a refusal is logged in ACL LOG with context ``multi``."""
    user = ctx.client.user
    if user is None or user.unrestricted:
        return None
    refused = acl_mod.check(user, spec, args)
    if refused is None:
        return None
    reason, obj = refused
    acl_mod.acl_of(ctx).record(ctx.client, reason, obj, context="multi")
    return ErrorReply("NOPERM ACLs rules changed between the moment the transaction was accumulated and the EXEC "
                      f"call. This command is no longer allowed for the following reason: {_NO_LONGER[reason]}")


def _run_one(ctx: Context, spec: CommandSpec, args: list[Any], feed: Callable[[list[Any]], None] | None) -> Any:
    counts = ctx.server.command_counts[spec] if ctx.server is not None else None
    reply = _refused_now(ctx, spec, args)
    if reply is not None:
        if counts is not None:
            counts.rejected += 1
    else:
        if feed is not None and shown(spec):
            feed(args)
        reply = _reply_of(ctx, spec, args, counts)
        if ctx.client.tracking and "readonly" in spec.flags:  # CLIENT TRACKING: as for a command run alone
            ctx.server.tracking.remember(ctx.client, spec, args)
    if reply.__class__ is ErrorReply and ctx.server is not None:  # counted as every error reply is
        ctx.server.error_replied(reply)
    return reply


def _reply_of(ctx: Context, spec: CommandSpec, args: list[Any], counts: Any) -> Any:
    if counts is not None:
        counts.calls += 1
    try:
        reply = spec.handler(ctx, args)
    except CommandError as exc:
        if counts is not None:
            counts.failed += 1
        return ErrorReply(exc.message)
    except Exception as exc:  # a bug in one handler: its reply says so, the others still run
        log.error("command %s failed inside EXEC: %s", spec.full_name, traceback.format_exc())
        if counts is not None:
            counts.failed += 1
        return ErrorReply(f"ERR internal error: {type(exc).__name__}")
    if reply.__class__ is Suspend:  # not expected of the commands MULTI queues; never left waiting
        reply.release()
        return ErrorReply(f"ERR '{spec.full_name}' cannot wait inside a transaction")
    return reply


@command("exec", 1, "noscript loading stale skip_slowlog", group="transactions", since="1.2.0", load=False,
         summary="Executes all commands in a transaction.")
def exec_(ctx: Context, args: list[bytes]) -> Any:
    feed = None
    if ctx.server is not None and ctx.server.monitors:
        monitors, conn = ctx.server.monitors, ctx.server.clients.get(ctx.client.id)

        def feed(fed: list[Any]) -> None:
            monitors.feed(ctx.client, fed, conn)

    try:
        return _exec(ctx, feed)
    finally:
        if feed is not None:  # as Redis: EXEC's line follows those of the commands it ran
            feed(args)


def _exec(ctx: Context, feed: Callable[[list[Any]], None] | None) -> Any:
    client = ctx.client
    queued, dirty = client.multi, client.multi_dirty
    if queued is None:
        raise CommandError("EXEC without MULTI")
    changed = not dirty and any(_snapshot(ctx, key) != seen for key, seen in client.watched.items())
    end_transaction(ctx)  # unwatches: the comparison above comes first
    if dirty:
        raise CommandError("EXECABORT Transaction discarded because of previous errors.", raw=True)
    if changed:
        return NULL_ARRAY
    client.executing = True
    try:
        return [_run_one(ctx, spec, qargs, feed) for spec, qargs in queued]
    finally:
        client.executing = False
