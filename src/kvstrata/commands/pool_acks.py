"""Replies that wait for the pool: a write is acknowledged only at the level ``pool-ack`` asks for.

Every command's writes are: a handler acknowledges its own (``after_pool_write``, ``after_pool_delete``: the
KV-cache commands, DEL and friends), and the server acknowledges the rest once the handler returned
(``after_command_writes``: SET, MSET, INCR, ...). An outcome nobody will take is abandoned, never left behind.

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
from kvstrata.engine.tiers.pool import FAILED, MISMATCH, OK, OLDER, TOMB_RETRIES, PoolUnavailableError
from kvstrata.errors import CommandError, VersionMismatchError
from kvstrata.server.notify import GENERIC, notify

WRITE_RETRIES = 3


def _away(store: Any, key: bytes, version: int) -> PoolUnavailableError:
    """A write skipped because the pool is away for ``key``: not served here either; the error its client hears."""
    store.pool_refused(key, version)
    return PoolUnavailableError(f"the pool is unavailable ({store.pool.down_reason(key)}); the write is kept on "
                                "this node only")


def _check_ssd(store: Any, ssd_seq: int) -> None:
    """-ERR when the SSD write the reply also waited for (write-through, ``ssd_seq``) failed."""
    failed = store.ssd.failed.get(ssd_seq) if ssd_seq and store.ssd is not None else None
    if failed is not None:
        raise CommandError(f"SSD write failed: {failed}")


def after_pool_write(ctx: Context, key: bytes, version: int, reply: Any, *, expected: int | None = None,
                     ssd_seq: int = 0, rewrite: Callable[[int], Any] | None = None, tries: int = 0) -> Any:
    """``reply`` once the pool holds the write of ``key`` at ``version`` queued by the current command (or at
    once under pool-ack local). A write the client hears failed is not kept (served) here either.

    ``rewrite(pool_version)`` writes again after an OLDER refusal and returns the new reply (or a Suspend).
    """
    store = ctx.store
    pool = store.pool
    seq = ctx.command.pool_ack
    ctx.command.took(key)  # acknowledged here, not by after_command_writes
    if pool is None or ctx.server is None:
        return reply
    if not seq:
        if pool.ack != "local" or expected is not None:
            if not pool.usable(key):
                raise _away(store, key, version)
        return reply
    if pool.ack == "local" and expected is None:
        return reply

    def then(_: Any) -> Any:
        outcome, detail = pool.take_outcome(seq)  # taken first: an SSD failure must not leave it behind
        _check_ssd(store, ssd_seq)
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
        pool.abandon([seq])

    return Suspend(PoolAck(seq, ssd_seq), then, cancel=release)


def after_command_writes(ctx: Context, reply: Any, writes: list[tuple[bytes, int, int]], ssd_seq: int = 0) -> Any:
    """``reply`` once the pool holds every write the command made without acknowledging it itself (``writes``:
    SET, MSET, INCR, APPEND, COPY, RENAME's new key, ...), as ``after_pool_write`` does for TAIR.KV.SETEX: at once
    under pool-ack local, else -TRYAGAIN when the pool is away for one of the keys or did not take one of the
    writes (that value is not served here either). A write refused because the pool holds a higher version (another
    node's, ahead by its clock) is not written again here: the client's retry gets a version above it."""
    store = ctx.store
    pool = store.pool
    if pool is None or ctx.server is None or not writes or pool.ack == "local":
        return reply
    seqs = [seq for _, _, seq in writes if seq]
    for key, version, seq in writes:
        if not seq and not pool.usable(key):
            pool.abandon(seqs)
            raise _away(store, key, version)
    if not seqs:
        return reply

    def then(_: Any) -> Any:
        outcomes = [pool.take_outcome(seq) for seq in seqs]
        _check_ssd(store, ssd_seq)
        refused = [(outcome, detail) for outcome, detail in outcomes if outcome != OK]
        if not refused:
            return reply
        for outcome, detail in refused:
            if outcome == OLDER:
                store.observe_version(int(detail))
        outcome, detail = refused[0]
        what = "holds a newer version" if outcome == OLDER else f"did not take the write ({detail})"
        raise PoolUnavailableError(f"the pool {what} of {len(refused)} of the {len(seqs)} key(s) written; "
                                   "retry the command")

    return Suspend(PoolAck(max(seqs), ssd_seq), then, cancel=lambda: pool.abandon(seqs))


def abandon_writes(store: Any, writes: list[tuple[bytes, int, int]]) -> None:
    """Nobody will take the outcomes of ``writes`` (a CommandState's ``pool_writes``): the command failed, or its
    handler waits for something else."""
    if store.pool is not None:
        store.pool.abandon([seq for _, _, seq in writes if seq])


def delete_tracked(ctx: Context, keys: list[bytes]) -> tuple[int, list[int]]:
    """Delete ``keys`` (DEL, GETDEL, EXPIRE with a past time), each pool tombstone tracked: (how many of them
    existed, the tombstones' seqs for ``after_pool_delete``)."""
    delete = ctx.store.delete
    deleted = 0
    seqs: list[int] = []
    for key in keys:
        ctx.command.pool_ack = 0
        if delete(key, track=True):
            deleted += 1
            notify(ctx, GENERIC, b"del", key)
        if ctx.command.pool_ack:
            seqs.append(ctx.command.pool_ack)
    return deleted, seqs


def after_pool_delete(ctx: Context, reply: Any, seqs: list[int], _tries: int = 0) -> Any:
    """``reply`` to a delete once the pool holds its tombstones (unless pool-ack is local): each tombstone's own
    outcome decides (``seqs`` from ``delete_tracked``; a tombstone sent again above a version that reached the
    pool first reports to the first one's seq). A tombstone the pool did not take stays queued here and is
    replayed; the client hears -TRYAGAIN, never a silent local-only delete - also when a write of the key was
    queued on this node while the tombstone was in flight (``pending`` then holds that write, and says nothing
    about the delete)."""
    pool = ctx.store.pool
    if pool is None or ctx.server is None or pool.ack == "local" or not seqs:
        return reply
    wait = max(seqs) if not _tries else pool.enqueued_seq

    def then(_: Any) -> Any:
        if pool.active and _tries <= TOMB_RETRIES and any(s not in pool.outcomes for s in seqs):
            # A tombstone sent again above a version that reached the pool first: wait for that one too.
            return after_pool_delete(ctx, reply, seqs, _tries + 1)
        failed = [detail for outcome, detail in map(pool.take_outcome, seqs) if outcome != OK]
        if failed:
            raise PoolUnavailableError(f"the pool did not take the delete of {len(failed)} key(s) ({failed[0]}); "
                                       "queued here and replayed when the pool answers")
        return reply

    def release() -> None:
        pool.abandon(seqs)

    return Suspend(PoolAck(wait), then, cancel=release)
