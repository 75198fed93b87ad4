"""Two-phase write commands: a writer's own staging segment, reservations in it, and verified commits.

``TAIR.KV.STAGE`` hands a Unix-socket client a *writable* descriptor of its own staging segment;
``TAIR.KV.RESERVE`` reserves room there; the client writes a value into its reservation and
``TAIR.KV.COMMIT`` stores it under a key once the server's copy of it matches the client's xxh3-64 (the
checksum ``TAIR.KV.MGETREF`` reports; with ``SUMAT offset``, of a value that carries its own xxh3-64 at that
offset, computed with the field zeroed: the SDK codec's header, so the client hashes the tensor only once; with
``SKIP n``, the value is the reservation's bytes after its first n, so a writer can align the payload). The engine part is ``kvstrata.engine.staging``; the design and the
security model are in docs/dataplane.md.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kvstrata.commands.args import Option, parse_int, parse_options
from kvstrata.commands.context import Context
from kvstrata.commands.dataplane import _arena
from kvstrata.commands.expiry import ttl_expires_at, ttl_ms_arg
from kvstrata.commands.registry import command
from kvstrata.commands.tairkv import _setex
from kvstrata.commands.waits import Offload, Suspend
from kvstrata.engine.staging import CommitJob, StageError, Staging
from kvstrata.errors import CommandError, OutOfMemoryError
from kvstrata.protocol.encoder import NO_REPLY

# Options of the commands that publish a value written outside the socket (COMMIT, PULL): the version it must
# replace and where the value's own checksum field is.
PUBLISH_OPTIONS = {b"VER": Option(b"VER", 1), b"SUMAT": Option(b"SUMAT", 1)}
_COMMIT_OPTIONS = {**PUBLISH_OPTIONS, b"SKIP": Option(b"SKIP", 1)}


def room_for(store: Any, need: int, exclude: bytes | None = None) -> None:
    """Room in DRAM for ``need`` bytes charged before their value exists (a reservation, a pull's slot): demote or
    evict as a write would (never ``exclude``, the key being written), and -OOM rather than exceed the budget."""
    dram = store.dram
    if dram.used + need > dram.budget:
        store.make_room(need, exclude=exclude)
        if dram.used + need > dram.budget:
            raise OutOfMemoryError()


def _staging(ctx: Context) -> Staging:
    staging = _arena(ctx).staging
    if staging is None:
        raise CommandError("two-phase writes are not available")
    return staging


def _checksum(raw: bytes) -> int:
    text = bytes(raw)
    if not 0 < len(text) <= 16:
        raise CommandError("invalid checksum: 16 hex digits of the value's xxh3-64 expected")
    try:
        return int(text, 16)
    except ValueError:
        raise CommandError("invalid checksum: 16 hex digits of the value's xxh3-64 expected") from None


@command("tair.kv.stage", 1, "", group="tairkv", since="0.2.0",
         summary="Sends a Unix-socket client a writable descriptor of its own staging segment (SCM_RIGHTS).",
         syntax="TAIR.KV.STAGE")
def kv_stage(ctx: Context, args: list[bytes]) -> Any:
    from kvstrata.server.dataplane import reply_with_fd

    staging = _staging(ctx)
    client = ctx.client.id
    existed = client in staging.segments
    try:
        seg = staging.segment(client)
    except StageError as exc:
        raise CommandError(str(exc), raw=True) from None
    try:
        reply_with_fd(ctx, str(seg.size), seg.region.fd)
    except CommandError:
        if not existed:
            staging.close_segment(client)
        raise
    return NO_REPLY


@command("tair.kv.reserve", -2, "denyoom", group="tairkv", since="0.2.0",
         summary="Reserves room for values in this client's staging segment; answers [id, offset] per length.",
         syntax="TAIR.KV.RESERVE length [length ...]")
def kv_reserve(ctx: Context, args: list[bytes]) -> Any:
    staging = _staging(ctx)
    lengths = [parse_int(bytes(a)) for a in args[1:]]
    store = ctx.store
    try:
        staging.check(ctx.client.id, lengths)
    except StageError as exc:
        raise CommandError(str(exc), raw=True) from None
    need = staging.demand(lengths)
    room_for(store, need)  # reserved bytes are charged to the DRAM budget from now on
    try:
        made = staging.reserve(ctx.client.id, lengths, store.clock.now_ms())
    except StageError as exc:
        raise CommandError(str(exc), raw=True) from None
    return [[r.id, r.off] for r in made]


@command("tair.kv.unreserve", -2, "fast", group="tairkv", since="0.2.0",
         summary="Gives back reservations of this client; answers how many it held.",
         syntax="TAIR.KV.UNRESERVE id [id ...]")
def kv_unreserve(ctx: Context, args: list[bytes]) -> Any:
    staging = _staging(ctx)
    return staging.unreserve(ctx.client.id, [parse_int(bytes(a)) for a in args[1:]])


@command("tair.kv.commit", -5, "write denyoom", keys=(1, 1, 1), group="tairkv", since="0.2.0",
         summary="Stores a reservation's bytes under a key once they match the checksum; replies with the version.",
         syntax="TAIR.KV.COMMIT key ttl_ms reservation checksum [SUMAT offset] [SKIP bytes] [VER expected_version]")
def kv_commit(ctx: Context, args: list[bytes]) -> Any:
    staging = _staging(ctx)
    arena = _arena(ctx)
    ttl_ms = ttl_ms_arg(args[2], ctx.store.clock.now_ms(), "tair.kv.commit")
    rid = parse_int(bytes(args[3]))
    checksum = _checksum(args[4])
    opts = parse_options([bytes(a) for a in args[5:]], 0, _COMMIT_OPTIONS)
    expected = parse_int(opts[b"VER"][0]) if b"VER" in opts else None
    sum_at = parse_int(opts[b"SUMAT"][0]) if b"SUMAT" in opts else None
    skip = parse_int(opts[b"SKIP"][0]) if b"SKIP" in opts else 0
    # The reservation ends here whatever the outcome (a writer whose bytes were wrong reserves again); its room
    # and charge stay until the copy is done (``finish``).
    try:
        seg, res = staging.take(ctx.client.id, rid, hold=True)
    except StageError as exc:
        raise CommandError(str(exc), raw=True) from None
    try:
        n = staging.value_length(res, skip)
        staging.check_sum_at(n, sum_at)
    except StageError as exc:
        staging.finish(seg, res)
        raise CommandError(str(exc), raw=True) from None
    # The server's own copy is what gets verified and stored: the writer may still change its segment.
    # Slots of values overwritten by earlier commits are reused first, while their pages are resident: a fresh
    # shared-memory page costs far more than the copy into it (10x a memcpy on the 2-core VM).
    arena.collect_unreferenced()
    view: Any = arena.held_slot(n) if n >= arena.min_size else None
    if view is None:
        view = bytearray(n)
    src = seg.region.view[res.off + skip:res.off + skip + n]

    def store(found: Any) -> Any:
        # The copy is over (the thread, if any, has returned): the reservation's room and charge go back before the
        # value is charged its slot, so the budget never counts the value twice.
        job.cleanup()
        try:
            if isinstance(found, BaseException):
                raise found
            try:
                digest = staging.verify(found, checksum)
            except StageError as exc:
                raise CommandError(str(exc), raw=True) from None
            slot = arena.slot(view)
            if slot is not None and sum_at is None:
                slot.checksum = digest  # TAIR.KV.MGETREF answers it without hashing again
            expire_at = ttl_expires_at(ttl_ms, ctx.store.clock.now_ms())
            # The value becomes visible (and gets its version) only now: a write of the same key by another
            # client while the copy ran comes first, as if this COMMIT had arrived after it.
            return _setex(ctx, args[1], view, expire_at, False, expected, 0)
        finally:
            arena.release(view)  # the stored entry holds the slot now; a refused one goes back to the arena

    job = CommitJob(src, view, sum_at, lambda: staging.finish(seg, res))
    if n < staging.offload_min:
        return store(job.run())
    # Large: copied and hashed in a worker thread while the loop serves the other clients; this client's
    # pipeline waits behind it, so its replies stay in order.
    staging.offloaded += 1
    return Suspend(Offload(job.run), store, reload=True,
                   cancel=lambda: job.abandon(asyncio.get_running_loop(), lambda: arena.release(view)))
