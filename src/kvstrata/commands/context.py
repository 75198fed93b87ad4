"""What a handler sees: the connection's client state and the shared server state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvstrata.config import Config
from kvstrata.engine.command_state import CommandState
from kvstrata.engine.store import Store

# What one watched key, subscription or BCAST prefix holds beyond its name's bytes (its entries in the client's and
# the server's tables, the snapshot tuple): measured at ~270 bytes of RSS each with 100-byte names.
HELD_ENTRY = 270


def held(name: bytes) -> int:
    """The memory a client's watched key, subscription or BCAST prefix ``name`` holds (ClientState.held_bytes)."""
    return len(name) + HELD_ENTRY


@dataclass
class ClientState:
    id: int
    addr: str = ""
    laddr: str = ""
    name: bytes = b""
    lib_name: bytes = b""
    lib_ver: bytes = b""
    proto: int = 2
    authenticated: bool = True
    # The ACL user (kvstrata.acl.User) the connection runs as; None (no server) means unrestricted.
    user: Any = None
    created_ms: int = 0
    last_ms: int = 0
    last_cmd: Any = "NULL"
    closing: bool = False
    fd: int = -1
    # (running) -> (qbuf, qbuf-free, argv-mem, oll, omem, tot-mem), set by the connection (CLIENT LIST, INFO)
    memory: Any = None
    # CLIENT REPLY: REPLY_OFF / REPLY_SKIP / REPLY_SKIP_NEXT bits, as Redis's client flags (0: every reply sent)
    reply: int = 0
    # The process that connected this Unix socket, found by its first pull (kvstrata.engine.pull.Peer): looking it
    # up cost each PULL 40-175 us. The connection holds one reference, given back when it closes.
    pull_peer: Any = None
    # MULTI: the queued (spec, args), None outside a transaction; whether a command was refused while queued (EXEC
    # then aborts); WATCH's keys with what EXEC compares them to (commands/transactions._snapshot)
    multi: list[Any] | None = None
    multi_dirty: bool = False
    multi_bytes: int = 0  # the queued arguments' bytes, bounded by client-query-buffer-limit
    watched: dict[bytes, Any] = field(default_factory=dict)
    # What its watched keys, subscriptions and BCAST prefixes hold (``held``): in tot-mem, as Redis counts them, so
    # maxmemory-clients sees a client that watches or subscribes to millions of names.
    held_bytes: int = 0
    executing: bool = False  # EXEC is running the queue (BGSAVE then only schedules, as Redis's server.in_exec)
    monitor: bool = False  # MONITOR mode (server/monitor.py)
    unix: bool = False  # connected through the Unix socket (CLIENT LIST flag U)
    blocked: bool = False  # waiting in WAIT or held by CLIENT PAUSE (CLIENT LIST flag b)
    no_evict: bool = False  # CLIENT NO-EVICT: maxmemory-clients never closes it (server/client_eviction.py)
    # WAIT in progress: CLIENT UNBLOCK sets its result (True: answer -UNBLOCKED, False: as the timeout would).
    unblock: Any = None
    # Pub/Sub subscriptions (server/pubsub.py), per namespace: channels, patterns, shard channels, in the order
    # made; ``subscribed`` is true while there is any (RESP2 then allows only the pub/sub commands). A plain
    # attribute the subscriptions keep up to date: the connection reads it before every command.
    pubsub: tuple[dict[bytes, None], dict[bytes, None], dict[bytes, None]] = field(
        default_factory=lambda: ({}, {}, {}))
    subscribed: bool = False
    # CLIENT TRACKING (server/tracking.py): its mode bits (0: off), the client id its invalidations go to (0: its
    # own connection) and its BCAST prefixes, in the order given.
    tracking: int = 0
    tracking_redirect: int = 0
    tracking_prefixes: list[bytes] = field(default_factory=list)


REPLY_OFF, REPLY_SKIP, REPLY_SKIP_NEXT = 1, 2, 4


@dataclass
class Context:
    """One per connection. ``server`` is the running server (clients, stats, shutdown) or None in tests.

    ``command`` is the running command's state (engine/command_state.py: its client stream, the SSD and pool
    completions its reply waits for): the connection sets it to what ``Store.begin_command`` returned before each
    run; by default it is the store's current one (a DRAM-only server, tests calling handlers directly).
    """

    store: Store
    config: Config
    client: ClientState
    server: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    command: CommandState = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.command is None:
            self.command = self.store.command
