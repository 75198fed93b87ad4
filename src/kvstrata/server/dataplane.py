"""The server side of the local data plane: the arena's setup, its background duties, the Unix socket, and
handing the arena's descriptor to a client (SCM_RIGHTS).

The engine part (slots, holds, leases) is ``kvstrata.engine.arena``; the commands are in
``kvstrata.commands.dataplane``; the design is in docs/dataplane.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from kvstrata.engine.arena import ArenaPool
from kvstrata.engine.bufpool import tune_malloc
from kvstrata.engine.staging import Staging

if TYPE_CHECKING:
    from kvstrata.server.app import Server

log = logging.getLogger("kvstrata.dataplane")


def setup_arena(server: Server) -> ArenaPool | None:
    """Create the arena when configured, make it the DRAM tier's value store and the connections' receive pool."""
    config = server.config
    if not config.get("arena"):
        return None
    store = server.store
    dram = store.dram
    size = int(config.get("arena-size"))
    if not size:
        # The budget, room for size-class slack and slots waiting for a lease or a reply, and the demoted values
        # still queued to the SSD writer (their slots are reused only once it has written them).
        size = dram.budget + dram.budget // 4
        if store.lower:
            size += int(config.get("ssd-write-queue"))
    try:
        arena = ArenaPool(size, min_size=int(config.get("large-value-threshold")),
                          hugepages=bool(config.get("arena-hugepages")),
                          max_lease_ms=int(config.get("lease-max-ms")),
                          max_leases=int(config.get("lease-max-per-client")),
                          room=lambda: dram.budget)
    except OSError as exc:  # no memfd (an old kernel, a sandbox): the server works without the data plane
        log.warning("shared-memory arena not available (%s); large values stay in the heap", exc)
        return None
    dram.attach_arena(arena)
    setup_staging(server, arena)
    # Values handed to these writer threads are not reused before they committed (see the arena's gates).
    arena.gates = [t for t in store.lower if hasattr(t, "enqueued_seq")]
    # connection.server_pool() hands this to every connection's parser: large values land in arena slots.
    server.bufpool = arena  # type: ignore[attr-defined]
    tune_malloc()
    return arena


def setup_staging(server: Server, arena: ArenaPool) -> None:
    """Two-phase writes (kvstrata.engine.staging): reserved bytes are charged to the DRAM budget."""
    config = server.config
    dram = server.store.dram

    def charge(n: int) -> None:
        dram.used += n

    arena.staging = Staging(int(config.get("stage-size")),
                            max_reservations=int(config.get("stage-max-reservations")),
                            reserve_ms=int(config.get("stage-reserve-ms")),
                            idle_ms=int(config.get("stage-idle-ms")),
                            hugepages=bool(config.get("arena-hugepages")),
                            charge_of=arena.charge, charge=charge, uncharge=dram._uncharge)
    arena.staging.offload_min = int(config.get("stage-offload-min"))


def apply_config(server: Server) -> None:
    arena = server.store.dram.arena
    if arena is not None:
        arena.max_lease_ms = int(server.config.get("lease-max-ms"))
        arena.max_leases = int(server.config.get("lease-max-per-client"))
        if arena.staging is not None:
            arena.staging.max_reservations = int(server.config.get("stage-max-reservations"))
            arena.staging.reserve_ms = int(server.config.get("stage-reserve-ms"))
            arena.staging.idle_ms = int(server.config.get("stage-idle-ms"))
            arena.staging.offload_min = int(server.config.get("stage-offload-min"))


def tick(server: Server) -> None:
    """Each background cycle: expire leases and reservations, drop those of clients that are gone (and their
    staging segments), free what became free."""
    arena = server.store.dram.arena
    if arena is None:
        return
    clients = server.clients
    if arena.lease_table:
        arena.expire(server.now_ms)
        arena.drop_clients(lambda c: c in clients)
    staging = arena.staging
    if staging is not None and staging.segments:
        staging.expire(server.now_ms)
        staging.drop_clients(lambda c: c in clients)
    arena.collect()


async def listen_unix(server: Server, factory: Any) -> asyncio.base_events.Server | None:
    """Listen on ``unixsocket`` (a stale socket file left by a dead server is replaced), chmod ``unixsocketperm``."""
    path = str(server.config.get("unixsocket"))
    if not path:
        return None
    with contextlib.suppress(FileNotFoundError):
        if _is_socket(path):
            os.unlink(path)
    assert server.loop is not None
    srv = await server.loop.create_unix_server(factory, path, backlog=int(server.config.get("tcp-backlog")))
    os.chmod(path, int(str(server.config.get("unixsocketperm")), 8))
    log.info("listening on Unix socket %s", path)
    return srv


def _is_socket(path: str) -> bool:
    import stat

    return stat.S_ISSOCK(os.lstat(path).st_mode)


def close_unix(server: Server) -> None:
    path = str(server.config.get("unixsocket"))
    if path:
        with contextlib.suppress(OSError):
            if _is_socket(path):
                os.unlink(path)


def unix_transport(conn: Any) -> socket.socket | None:
    """The connection's socket when it is a Unix-domain one, else None."""
    t = conn.transport
    sock = t.get_extra_info("socket") if t is not None else None
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    return sock


def send_with_fd(conn: Any, data: bytes, fd: int) -> None:
    """Write ``data`` to the client with ``fd`` attached, in order with its other replies.

    Only when nothing else is waiting to go out (the caller checks), so the bytes cannot overtake earlier
    replies. The transport's socket is used through a duplicate descriptor (asyncio does not expose
    ``sendmsg``); both share the one open socket, so the bytes join the same stream.
    """
    sock = unix_transport(conn)
    assert sock is not None
    dup = socket.socket(fileno=os.dup(sock.fileno()))
    try:
        sent = socket.send_fds(dup, [data], [fd])
        if sent != len(data):  # the rest goes the ordinary way, still in order (nothing was queued)
            conn.transport.write(data[sent:])
    finally:
        dup.close()


def reply_with_fd(ctx: Any, status: str, fd: int) -> None:
    """Answer the current command with ``+status`` carrying ``fd`` (SCM_RIGHTS): only to a Unix-socket client,
    and only when no earlier reply is still waiting to go out (CommandError otherwise)."""
    from kvstrata.errors import CommandError
    from kvstrata.protocol.encoder import Status, encode_bytes

    server = ctx.server
    conn = server.clients.get(ctx.client.id) if server is not None else None
    if conn is None or unix_transport(conn) is None:
        raise CommandError("descriptors are shared only with clients on the Unix socket (unixsocket)")
    if conn.out or conn.transport.get_write_buffer_size() or conn._stream:
        raise CommandError("send this command on its own, after every earlier reply was read")
    send_with_fd(conn, encode_bytes(Status(status), ctx.client.proto), fd)
