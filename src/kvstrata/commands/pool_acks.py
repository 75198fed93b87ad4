"""Replies that wait for the pool: a write is acknowledged only at the level ``pool-ack`` asks for.

``after_pool_write`` turns the pool write a command just queued (``ctx.command.pool_ack``) into a ``Suspend`` whose
continuation reads the write's outcome (``PoolTier.take_outcome``): the command's reply, a ``-VERMISMATCH`` for a
compare-and-set the pool refused, or ``-TRYAGAIN`` when the pool did not take the write. A write the pool refused
because it holds a higher version (another node's, ordered after ours by its version) is written again with a
version above the pool's, so an acknowledged write is never silently lost to an older clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstrata.commands.context import Context
from kvstrata.commands.waits import PoolAck, Suspend
from kvstrata.engine.tiers.markers import Tombstone
from kvstrata.engine.tiers.pool import FAILED, MISMATCH, OK, OLDER, PoolUnavailableError
from kvstrata.errors import CommandError, VersionMismatchError

WRITE_RETRIES = 3


def after_pool_write(ctx: Context, key: bytes, version: int, reply: Any, *, expected: int | None = None,
                     ssd_seq: int = 0, rewrite: Callable[[int], Any] | None = None, tries: int = 0) -> Any:
    """``reply`` once the pool holds the write of ``key`` at ``version`` queued by the current command (or at
    once under pool-ack local). A write the client hears failed is not kept (served) here either.

    ``rewrite(pool_version)`` writes again after an OLDER refusal and returns the new reply (or a Suspend).
    """
    store = ctx.store
    pool = store.pool
    seq = ctx.command.pool_ack
    if pool is None or ctx.server is None:
        return reply
    if not seq:
        if pool.ack != "local" or expected is not None:
            if not pool.usable(key):
                store.pool_refused(key, version)
                raise PoolUnavailableError(f"the pool is unavailable ({pool.down_reason(key)}); the write is kept on "
                                           "this node only")
        return reply
    if pool.ack == "local" and expected is None:
        return reply

    def then(_: Any) -> Any:
        failed = store.ssd.failed.get(ssd_seq) if ssd_seq and store.ssd is not None else None
        if failed is not None:
            raise CommandError(f"SSD write failed: {failed}")
        outcome, detail = pool.take_outcome(seq)
        if outcome == OK:
            return reply
        if outcome == MISMATCH:
            raise VersionMismatchError(f"version mismatch: expected {expected}, current {detail} (in the pool)")
        if outcome == OLDER and rewrite is not None and tries < WRITE_RETRIES:
            store.observe_version(int(detail))
            return rewrite(tries + 1)
        assert outcome in (FAILED, OLDER)
        raise PoolUnavailableError(f"the pool did not take the write ({detail}); it is kept on this node only")

    def release() -> None:
        pool.outcomes.pop(seq, None)

    return Suspend(PoolAck(seq, ssd_seq), then, cancel=release)


def after_pool_delete(ctx: Context, keys: list[bytes], reply: Any, _tries: int = 0) -> Any:
    """``reply`` to DEL once the pool holds its tombstones (unless pool-ack is local). A tombstone the pool did
    not take stays queued here and is replayed; the client hears -TRYAGAIN, never a silent local-only delete."""
    store = ctx.store
    pool = store.pool
    seq = ctx.command.pool_ack if not _tries else (pool.enqueued_seq if pool is not None else 0)
    if pool is None or ctx.server is None or not seq or pool.ack == "local":
        return reply

    def then(_: Any) -> Any:
        if any(pool.pending.get(k).__class__ is Tombstone for k in keys) and pool.active:
            # A tombstone sent again above a version that reached the pool first: wait for that one too.
            return after_pool_delete(ctx, keys, reply, _tries + 1) if _tries < 3 else _check()
        return _check()

    def _check() -> Any:
        waiting = sum(1 for k in keys if k in pool.replay)
        if waiting:
            raise PoolUnavailableError(f"the pool did not take the delete of {waiting} key(s) ({pool.degraded}); "
                                       "queued here and replayed when the pool answers")
        return reply

    return Suspend(PoolAck(seq), then)
