"""Pull stores: ``TAIR.KV.PULL`` stores a value that the server copies straight out of its client's memory.

``TAIR.KV.PULL key ttl_ms head count addr len [addr len ...] [SUMAT offset] [VER expected_version]`` stores ``head``
(sent inline: the SDK codec's small header) followed by the bytes of the ``count`` ranges of the *connecting
process's* memory (or ``RANGES packed``: the ranges as one bulk string of little-endian u64 address and length
pairs, 16 bytes a range, which is what the SDK sends: nothing to parse per range), read with ``process_vm_readv``
into a fresh arena slot (kvstrata.engine.pull), off the event loop from ``stage-offload-min`` on, as
``TAIR.KV.COMMIT`` copies. ``SUMAT offset``: the value carries its own xxh3-64 there (8 bytes inside ``head``),
computed by the server over its own copy with the field zeroed, as the codec's header wants it; ``VER``: compare-
and-set, as SETEX's. The value is published through the same write path as SETEX and COMMIT (version, acks,
replication, tiers). Only on a Unix-socket connection, only while ``pull-store`` is yes. ``TAIR.KV.PULLPROBE addr
len`` (or ``RANGES packed``, one range) reads up to 64 KiB the same way and answers its xxh3-64 (hex), storing
nothing: how a client learns that the server may read its memory.

``TAIR.KV.MPULL sum_at key ttl_ms head packed [...]`` stores a batch of values the same way with one worker run
(the thread hand-offs are paid once per batch, not per value), publishes them in order and answers one element per
value: its version, or its error (the others are still stored). Design and security model: docs/dataplane.md."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from kvstrata.commands.args import parse_int, parse_options
from kvstrata.commands.context import Context
from kvstrata.commands.dataplane import _arena
from kvstrata.commands.expiry import ttl_expires_at, ttl_ms_arg
from kvstrata.commands.registry import command
from kvstrata.commands.staging import PUBLISH_OPTIONS, room_for
from kvstrata.commands.tairkv import _setex
from kvstrata.commands.waits import Offload, Suspend
from kvstrata.engine.pull import (
    MultiPullJob,
    Peer,
    PullError,
    PullJob,
    parse_packed,
    parse_ranges,
    peer_of,
    pull_hash,
    ranges_array,
)
from kvstrata.errors import CommandError
from kvstrata.protocol.encoder import ErrorReply

MAX_RANGES = 1 << 16  # per value: a strided KV chunk is a few hundred runs
PROBE_MAX = 64 * 1024


def _unix_socket(ctx: Context) -> Any:
    """This connection's Unix socket (CommandError when pulls are disabled or the client is not on it)."""
    from kvstrata.server.dataplane import unix_transport

    if not ctx.config.get("pull-store"):
        raise CommandError("pull stores are disabled (pull-store no)")
    server = ctx.server
    conn = server.clients.get(ctx.client.id) if server is not None else None
    sock = unix_transport(conn) if conn is not None else None
    if sock is None:
        raise CommandError("TAIR.KV.PULL reads the client's memory: only on the Unix socket (unixsocket)")
    return sock


def _peer(ctx: Context, sock: Any) -> Peer:
    """The process that connected this Unix-socket connection, held for the caller (who ``close``s it); looked up
    once per connection, which keeps a reference until it closes (CommandError when it is gone)."""
    client = ctx.client
    if client.pull_peer is None:
        age_s = max(0, ctx.store.clock.now_ms() - client.created_ms) / 1000
        try:
            client.pull_peer = peer_of(sock, age_s)
        except PullError as exc:
            raise CommandError(str(exc), raw=True) from None
    return client.pull_peer.hold()


def _publish(ctx: Context, arena: Any, key: bytes, view: Any, found: tuple[int, int], ttl_ms: int,
             sum_at: int | None, expected: int | None) -> Any:
    """Store a pulled value through SETEX's path (version, CAS, acks, tiers); its reply or a Suspend."""
    slot = arena.slot(view)
    if slot is not None and sum_at is None:
        slot.checksum = found[0]  # TAIR.KV.MGETREF answers it without hashing again
    return _setex(ctx, key, view, ttl_expires_at(ttl_ms, ctx.store.clock.now_ms()), False, expected, 0)


def _ranges(args: list[bytes]) -> tuple[np.ndarray, int, int]:
    """A PULL's ranges (``count addr len ...``, or ``RANGES packed``), the bytes they name, and where its options
    start."""
    if bytes(args[4]).upper() == b"RANGES":
        if len(args) < 6:
            raise CommandError("TAIR.KV.PULL RANGES needs the packed ranges")
        rows = parse_packed(bytes(args[5]), MAX_RANGES)
        return rows, int(rows[:, 1].sum()), 6  # each below 2**48, at most 2**16 of them: no overflow
    count = parse_int(bytes(args[4]))
    if count < 0 or 5 + 2 * count > len(args):
        raise CommandError(f"TAIR.KV.PULL names {count} ranges but sends fewer addresses and lengths")
    listed = parse_ranges(args[5:5 + 2 * count], MAX_RANGES)
    return ranges_array(listed), sum(length for _, length in listed), 5 + 2 * count


def _pull_staging(ctx: Context) -> tuple[Any, Any]:
    """The arena and its staging (CommandError without one: pulls are charged as reservations)."""
    arena = _arena(ctx)
    if arena.staging is None:
        raise CommandError("pull stores need the arena's staging (stage-size)")
    return arena, arena.staging


def _value_size(ctx: Context, head: bytes, payload: int, sum_at: int | None) -> int:
    """The stored value's size (``head`` then ``payload`` bytes), refused when ``SUMAT`` lies outside the head or
    the value exceeds ``proto-max-bulk-len``."""
    if sum_at is not None and not 0 <= sum_at <= len(head) - 8:
        raise CommandError(f"SUMAT {sum_at} is outside the head ({len(head)} bytes)")
    n = len(head) + payload
    if n > int(ctx.config.get("proto-max-bulk-len")):
        raise CommandError("string exceeds maximum allowed size (proto-max-bulk-len)")
    return n


def _reserve(ctx: Context, arena: Any, staging: Any, sock: Any, sizes: list[int],
             exclude: bytes | None = None) -> tuple[Peer, list[Any], Callable[[], None]]:
    """Slots for values of ``sizes`` bytes, charged from now on like a reservation (unmovable for make_room: room
    first, -OOM as a SET), and the peer to read them from: (peer, slots, what gives the peer and the charge
    back once the copies are over)."""
    charge = sum(arena.charge(n) for n in sizes if n)
    room_for(ctx.store, charge, exclude=exclude)
    peer = _peer(ctx, sock)
    staging.hold_bytes(charge)
    # Freed slots of overwritten values first, while their pages are resident (as COMMIT does).
    arena.collect_unreferenced()
    views = [(arena.held_slot(n) if n >= arena.min_size else None) or bytearray(n) for n in sizes]

    def given_back() -> None:
        peer.close()
        staging.unhold_bytes(charge)

    return peer, views, given_back


@command("tair.kv.pull", -5, "write denyoom", keys=(1, 1, 1), group="tairkv", since="0.2.0",
         summary="Stores head + ranges of the connecting process's memory, copied by the server; replies with the "
                 "version.",
         syntax="TAIR.KV.PULL key ttl_ms head <count addr len [addr len ...] | RANGES packed> [SUMAT offset] "
                "[VER expected_version]")
def kv_pull(ctx: Context, args: list[bytes]) -> Any:
    arena, staging = _pull_staging(ctx)
    ttl_ms = ttl_ms_arg(args[2], ctx.store.clock.now_ms(), "tair.kv.pull")
    head = bytes(args[3])
    try:
        ranges, payload, rest = _ranges(args)
    except PullError as exc:
        raise CommandError(str(exc), raw=True) from None
    opts = parse_options([bytes(a) for a in args[rest:]], 0, PUBLISH_OPTIONS)
    expected = parse_int(opts[b"VER"][0]) if b"VER" in opts else None
    sum_at = parse_int(opts[b"SUMAT"][0]) if b"SUMAT" in opts else None
    n = _value_size(ctx, head, payload, sum_at)
    sock = _unix_socket(ctx)  # before anything moves for a command that is refused anyway
    peer, (view,), given_back = _reserve(ctx, arena, staging, sock, [n], exclude=bytes(args[1]))

    def stored(found: Any) -> Any:
        job.cleanup()  # the copy is over: the charge goes back before the value is charged its slot
        try:
            if isinstance(found, PullError):
                staging.pull_failures += 1
                raise CommandError(str(found), raw=True)
            if isinstance(found, BaseException):
                staging.pull_failures += 1
                raise found
            reply = _publish(ctx, arena, args[1], view, found, ttl_ms, sum_at, expected)
            staging.pulls += 1
            staging.pull_bytes += n
            return reply
        finally:
            arena.release(view)  # the stored entry holds the slot now; a refused one goes back to the arena

    # Large: copied in a worker thread (and, where the server has a second CPU, its helper thread) while the loop
    # serves the other clients; this client's pipeline waits behind it, so its replies stay in order.
    large = n >= staging.offload_min
    job = PullJob(peer, head, ranges, view, sum_at, given_back,
                  getattr(ctx.server, "copy_helper", None) if large else None)
    if not large:
        return stored(job.run())
    return Suspend(Offload(job.run), stored, reload=True,
                   cancel=lambda: job.abandon(asyncio.get_running_loop(), lambda: arena.release(view)))


def _settle(reply: Any, then: Callable[[Any], Any]) -> Any:
    """``then(outcome)`` once ``reply`` (a value, or a Suspend chain such as a pool acknowledgement's) has its
    outcome: the reply, or the error reply it raised (an element of a multi-value reply)."""
    if not isinstance(reply, Suspend):
        return then(reply)
    inner = reply

    def resumed(result: Any) -> Any:
        try:
            nxt = inner.then(result)
        except CommandError as exc:
            return then(ErrorReply(exc.message))
        return _settle(nxt, then)

    return Suspend(inner.wait, resumed, reload=inner.reload, cancel=inner.release)


@command("tair.kv.mpull", -2, "write denyoom", keys=(2, -1, 4), group="tairkv", since="0.2.0",
         summary="Stores several values out of the connecting process's memory in one command (TAIR.KV.PULL's "
                 "packed form, one worker run for all); replies with a version or an error per value.",
         syntax="TAIR.KV.MPULL sum_at key ttl_ms head packed [key ttl_ms head packed ...]")
def kv_mpull(ctx: Context, args: list[bytes]) -> Any:
    """What a store of many chunks sends instead of one PULL each: the values are copied one after another by one
    worker run (with the copy helper), then published in order, each as its PULL would be (``sum_at`` -1: none).
    Malformed input refuses the whole command before anything moves; a value that cannot be read, or whose write
    is refused, is an error element of the reply and the others are stored."""
    arena, staging = _pull_staging(ctx)
    if (len(args) - 2) % 4:
        raise CommandError("TAIR.KV.MPULL takes sum_at, then key ttl_ms head packed for each value")
    sum_raw = parse_int(bytes(args[1]))
    sum_at = None if sum_raw == -1 else sum_raw
    values: list[tuple[bytes, int, bytes, np.ndarray, int]] = []  # key, ttl_ms, head, ranges, bytes
    for i in range(2, len(args), 4):
        ttl_ms = ttl_ms_arg(args[i + 1], ctx.store.clock.now_ms(), "tair.kv.mpull")
        head = bytes(args[i + 2])
        try:
            rows = parse_packed(bytes(args[i + 3]), MAX_RANGES)
        except PullError as exc:
            raise CommandError(str(exc), raw=True) from None
        values.append((bytes(args[i]), ttl_ms, head, rows, _value_size(ctx, head, int(rows[:, 1].sum()), sum_at)))
    sock = _unix_socket(ctx)
    if not values:
        return []  # how a client learns that the server takes MPULL
    peer, views, given_back = _reserve(ctx, arena, staging, sock, [n for *_, n in values])

    def release_all() -> None:
        for view in views:
            arena.release(view)

    def stored(found: Any) -> Any:
        job.cleanup()  # the copies are over: the charge goes back before the values are charged their slots
        if isinstance(found, BaseException):
            staging.pull_failures += len(values)
            release_all()
            if isinstance(found, PullError):
                raise CommandError(str(found), raw=True)
            raise found
        # Every value is published now, in order (each entry holds its slot from its write on); what follows a
        # write (its pool acknowledgement) is waited for after all of them, value by value.
        def publish(i: int, got: tuple[int, int] | PullError) -> Any:
            if isinstance(got, PullError):
                staging.pull_failures += 1
                raise CommandError(str(got), raw=True)
            key, ttl_ms, _, _, n = values[i]
            reply = _publish(ctx, arena, key, views[i], got, ttl_ms, sum_at, None)
            staging.pulls += 1
            staging.pull_bytes += n
            return reply

        replies: list[Any] = []
        for i, got in enumerate(found):
            try:
                replies.append(publish(i, got))
            except CommandError as exc:
                replies.append(ErrorReply(exc.message))
            finally:
                arena.release(views[i])  # the stored entry holds the slot now; a refused one goes back
        out: list[Any] = []

        def collect(outcome: Any) -> Any:
            out.append(outcome)
            return drain()

        def drain() -> Any:
            while len(out) < len(replies):  # a loop, not recursion: a store may be hundreds of values
                reply = replies[len(out)]
                if isinstance(reply, Suspend):
                    return _settle(reply, collect)
                out.append(reply)
            return out

        return drain()

    job = MultiPullJob(peer, [(head, rows, views[i]) for i, (_, _, head, rows, _) in enumerate(values)], sum_at,
                       given_back, getattr(ctx.server, "copy_helper", None))
    return Suspend(Offload(job.run), stored, reload=True,
                   cancel=lambda: job.abandon(asyncio.get_running_loop(), release_all))


@command("tair.kv.pullprobe", 3, "fast", group="tairkv", since="0.2.0",
         summary="Reads up to 64 KiB of the connecting process's memory as TAIR.KV.PULL would; answers its xxh3-64.",
         syntax="TAIR.KV.PULLPROBE <addr len | RANGES packed>")
def kv_pullprobe(ctx: Context, args: list[bytes]) -> Any:
    try:
        packed = bytes(args[1]).upper() == b"RANGES"
        ranges = parse_packed(bytes(args[2]), 1) if packed else ranges_array(parse_ranges(args[1:3], 1))
    except PullError as exc:
        raise CommandError(str(exc), raw=True) from None
    n = int(ranges[:, 1].sum())
    if n > PROBE_MAX:
        raise CommandError(f"TAIR.KV.PULLPROBE reads at most {PROBE_MAX} bytes")
    peer = _peer(ctx, _unix_socket(ctx))
    buf = bytearray(n)
    try:
        digest = pull_hash(peer.pid, b"", ranges, buf)
        if not peer.alive():
            raise PullError("ERR the client process is gone")
    except PullError as exc:
        raise CommandError(str(exc), raw=True) from None
    finally:
        peer.close()
    return b"%016x" % digest
