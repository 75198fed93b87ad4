"""The pool tier: a Redis or Valkey (Cluster) shared by several kvstrata nodes, reached with redis-py.

The pool is a *shared copy* tier. This node's authoritative copy of a key stays in its local tiers (DRAM, then
SSD); the pool holds copies that any node can read:

- every write is *published* to the pool (so a chunk stored through node A is found by node B), and, with the
  tier order ``dram,pool,ssd``, an entry demoted out of DRAM is written there if the pool does not already hold
  its version;
- a node that misses locally reads the pool and promotes what it finds into its DRAM.

Records are ``header + value``; the header (28 bytes, big-endian) is magic ``KP``, format, flags, version,
expiry (wall ms, 0 = none) and an xxh3-64 checksum over the header's first 20 bytes, the key and the value. No
pickle: a record from another node is parsed and verified, never executed. The version sits at byte offset 4 so
the Lua scripts (``pool_scripts``) can compare versions with ``GETRANGE key 4 11``: a write only replaces a record whose
version is not higher (highest version wins in the pool itself, whatever the order writes arrive in).

Pool I/O never runs on the event loop. Writes (publish, demotion, delete, budget evictions) go through a queue
to one writer thread that sends everything waiting as one pipeline. Until the writer reports back (on the owner's
thread, through ``set_delivery``), the newest state of each key sits in ``pending``. Reads are done by the
caller's worker thread (``read_many``, ``check_versions``); they only touch the redis-py client, which is
thread-safe.

Versions are decided in the pool (``pool_scripts``): a write replaces a record only with a higher version, a
delete writes a versioned *tombstone* (kept ``tombstone_ttl_ms``, longer than any record), and a compare-and-set
(``VER``) compares the expected version with the pool's inside the same script. The outcome of a write a client
waits for (``put(..., track=True)``) is kept in ``outcomes`` until the command takes it: ``OK``, ``OLDER`` (the
pool holds a higher version), ``MISMATCH`` (CAS refused) or ``FAILED`` (the pool refused it, e.g. ``-OOM``, or could
not be reached); a command that will not take it (failed, cancelled) abandons it (``abandon``). Every change is
published on the invalidation channel; a subscriber thread hands ``(key, version)`` to ``on_invalidate`` so this
node drops older local copies (docs/pool.md).

Faults: a connection error or timeout (``CLUSTERDOWN``...) marks the pool *degraded*; a command the pool refuses
(``-OOM``, a script error) fails that write only. While degraded, reads
answer "not in the pool" at once and writes are skipped (counted in ``skipped_writes``); a probe (``probe``,
run by the server off the loop) retries with exponential backoff and, when every node answers again, the pool
is used again. Timeouts are the redis-py socket timeouts (``pool-timeout``, ``pool-connect-timeout``).

Budget: ``index`` remembers what this node put in the pool (key -> version, charged bytes, pool expiry), oldest
first. Over ``budget`` this node removes its oldest records (only if the pool still holds the version it wrote:
a newer record from another node is left alone). Records also expire with the pool TTL (``pool-ttl``, or the
entry's own TTL when sooner); the index forgets them at the same time.

The code is split by job: ``pool_record`` (the record format), ``pool_client`` (the redis-py client and
per-master pipelines), ``pool_health`` (degradation, backoff, probes), ``pool_reads`` (worker-thread reads),
``pool_index`` (pending writes, the index and budget, queuing), ``pool_writer`` (the writer thread),
``pool_subscriber`` (invalidations), ``pool_scripts`` (the Lua scripts), ``pool_url`` (URLs) and
``pool_sentinel`` (the client and startup check of a Sentinel service's master). This module is the facade: ``PoolTier`` holds the state the mixins share, its counters and ``INFO`` rows, and re-exports
the names other modules import from here.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.base import TierRoles
from kvstrata.engine.tiers.markers import Corrupt, Tombstone
from kvstrata.engine.tiers.pool_client import PoolClient
from kvstrata.engine.tiers.pool_health import PoolHealth, PoolUnavailableError
from kvstrata.engine.tiers.pool_index import PoolIndex
from kvstrata.engine.tiers.pool_pubsub import PoolPubSub
from kvstrata.engine.tiers.pool_reads import PoolReads
from kvstrata.engine.tiers.pool_record import (
    FLAG_TOMBSTONE,
    FORMAT,
    HEADER_SIZE,
    MAGIC,
    RECORD_OVERHEAD,
    VERSION_OFFSET,
    ZERO_VERSION,
    PoolDeleted,
    decode_head,
    decode_header,
    decode_record,
    encode_record,
)
from kvstrata.engine.tiers.pool_subscriber import PoolSubscriber
from kvstrata.engine.tiers.pool_url import parse_pool_url
from kvstrata.engine.tiers.pool_writer import FAILED, MISMATCH, OK, OLDER, TOMB_RETRIES, PoolWriter
from kvstrata.engine.tiers.watch import Ticket, Watchers

__all__ = [
    "FAILED", "FLAG_TOMBSTONE", "FORMAT", "HEADER_SIZE", "MAGIC", "MISMATCH", "OK", "OLDER", "RECORD_OVERHEAD",
    "TOMB_RETRIES", "VERSION_OFFSET", "ZERO_VERSION", "Corrupt", "PoolDeleted", "PoolTier", "PoolUnavailableError",
    "decode_head", "decode_header", "decode_record", "encode_record", "parse_url",
]


def parse_url(url: str) -> tuple[bool, list[tuple[str, int]], str | None]:
    """(cluster, nodes, password) of a pool URL (see ``pool_url``)."""
    parsed = parse_pool_url(url)
    return parsed.cluster, parsed.nodes, parsed.password


class PoolTier(PoolClient, PoolHealth, PoolReads, PoolIndex, PoolSubscriber, PoolPubSub, PoolWriter, TierRoles):
    """A shared Redis/Valkey (Cluster) pool with this node's own byte budget, TTL and degradation handling."""

    name = "pool"
    shared = True  # holds copies, written with every client write; versions are decided here (tiers/base.py)

    def __init__(
        self,
        url: str,
        budget: int,
        *,
        ttl_ms: int = 3_600_000,
        timeout_ms: int = 1000,
        connect_timeout_ms: int = 500,
        backoff_max_ms: int = 5000,
        prefix: bytes = b"kvs:",
        tombstone_ttl_ms: int = 0,
        ack: str = "pool",
        ack_replicas: int = 1,
        threaded: bool = True,
        pubsub: bool = True,
        wall_ms: Callable[[], int] | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        parsed = parse_pool_url(url)
        self._url = parsed
        self.url = parsed.safe  # the password never leaves this object
        self.cluster, self.nodes = parsed.cluster, parsed.nodes
        # A tombstone outlives every record (they live at most ttl_ms), so no copy can come back after a delete.
        self.tombstone_ttl_ms = max(tombstone_ttl_ms, 2 * ttl_ms)
        self.ack = ack
        self.ack_replicas = ack_replicas
        self.channel = b"__kvstrata_invalidate__:" + prefix
        self._init_pubsub(prefix, pubsub)  # PUBLISH forwarded to the other nodes (pool_pubsub)
        # seq -> (outcome, pool version or error text), for the writes a client waits for (track=True).
        self.outcomes: dict[int, tuple[str, Any]] = {}
        # Tracked writes whose command will not take the outcome (PoolIndex.abandon): dropped when it comes.
        self.abandoned: set[int] = set()
        # Set by the engine: drop local copies older than a version the pool now holds (another node's write or
        # delete), and a local write the pool refused.
        self.on_invalidate: Callable[[bytes, int, bool], None] = lambda key, version, deleted: None
        self.on_refused: Callable[[bytes, int], None] = lambda key, version: None
        self.maxmemory_policy = ""
        self.invalidations = 0
        self.invalidation_gaps = 0
        self.subscribed = False  # the invalidation subscription is up (pool_subscriber)
        self.subscriptions = 0  # subscriptions the pool took; each asks for a resync (server/pool_resync.py)
        # Resyncs of the local copies against the pool after a subscription (kvstrata.server.pool_resync).
        self.resyncs = 0
        self.resync_running = 0
        self.resync_checked = 0
        self.resync_dropped = 0
        self.resync_failures = 0
        self.resync_last_ms = 0  # how long the last finished resync took
        self.resynced = 0  # the subscription the last finished resync followed (none pending when = subscriptions)
        self.dropped_copies = 0
        self.replay: dict[bytes, int] = {}  # key -> tombstone version: deletes the pool has not taken yet
        self.replayed = 0
        self.refused_writes = 0
        self.cas_refused = 0
        self.tombstones = 0
        self.replica_waits_short = 0
        self._subscriber: threading.Thread | None = None
        self._stop = threading.Event()
        self.budget = budget
        self.ttl_ms = ttl_ms
        self.timeout_ms = timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self.backoff_max_ms = backoff_max_ms
        self.prefix = prefix
        self._wall_ms = wall_ms or (lambda: int(time.time() * 1000))
        # Backoff and degraded-time bookkeeping; injectable (the engine's clock) so tests never wait.
        self._monotonic = monotonic or time.monotonic
        self.pending: dict[bytes, Entry | Tombstone] = {}
        # key -> (version, charged bytes, pool expiry in wall ms): what this node put in the pool, oldest first.
        self.index: OrderedDict[bytes, tuple[int, int, int]] = OrderedDict()
        self.used = 0
        self.own = 0  # records in ``index`` written by this node (the others were only read here)
        self.committed_seq = 0
        self.degraded: str | None = None
        self.degraded_since = 0.0
        self._backoff_ms = 0
        self.next_probe = 0.0
        self.probing = False
        # Per-master health (cluster pools): node name -> [reason, backoff ms, next probe, since]. A fault against
        # one master degrades only the keys whose slots it serves; ``degraded`` is for the whole pool.
        self.masters_down: dict[str, list[Any]] = {}
        self.master_recoveries = 0
        # counters
        self.errors = 0
        self.timeouts = 0
        self.retries = 0
        self.recoveries = 0
        self.skipped_writes = 0
        self.skipped_reads = 0
        self.writes = 0
        self.write_bytes = 0
        self.reads = 0
        self.read_bytes = 0
        self.probes = 0  # record headers read (probe_many: EXISTS, TTL, writes replacing a value), no value sent
        self.conflicts = 0
        self.evictions = 0
        self.expired = 0
        self.corrupt_reads = 0
        self._last_error_log = 0.0
        self._lock = threading.Lock()
        self._client: Any = None
        self._watchers = Watchers()
        self._deliver: Callable[[Callable[[], None]], None] = lambda fn: fn()
        self._closed = False
        self._start_writer(threaded, "kvstrata-pool-writer", 64 * 1024 * 1024)

    def set_delivery(self, deliver: Callable[[Callable[[], None]], None]) -> None:
        self._deliver = deliver

    # ---- watch tickets (owner's thread) ----
    def watch(self, keys: Iterable[bytes]) -> Ticket:
        """A ticket that turns stale when any of ``keys`` is written or deleted here before ``unwatch``."""
        return self._watchers.watch(keys)

    def unwatch(self, ticket: Ticket) -> None:
        self._watchers.unwatch(ticket)

    def close(self) -> None:
        if self._closed:
            return
        self._stop.set()
        self._stop_forwarder()
        self._stop_writer(10)
        self._closed = True
        self._drop_client()

    def __len__(self) -> int:
        """Records this node wrote to the pool (and has not seen expire)."""
        return self.own

    def info_row(self, stats: dict[str, int]) -> dict[str, Any]:
        return {**stats, "evictions": self.evictions, "corrupt_reads": self.corrupt_reads,
                "pool_degraded": int(self.degraded is not None), "pool_masters_degraded": len(self.masters_down),
                **self.info()}

    def info(self) -> dict[str, Any]:
        return {
            "pending": len(self.pending), "queued_bytes": self.queued_bytes, "degraded": int(self.degraded is not None),
            "degraded_reason": self.degraded or "", "errors": self.errors, "timeouts": self.timeouts,
            "retries": self.retries, "recoveries": self.recoveries, "skipped_writes": self.skipped_writes,
            "skipped_reads": self.skipped_reads, "writes": self.writes, "write_bytes": self.write_bytes,
            "reads": self.reads, "read_bytes": self.read_bytes, "probes": self.probes, "conflicts": self.conflicts,
            "expired": self.expired, "ttl_ms": self.ttl_ms, "refused_writes": self.refused_writes,
            "cas_refused": self.cas_refused, "tombstones": self.tombstones, "invalidations": self.invalidations, "dropped_copies": self.dropped_copies,
            "deletes_to_replay": len(self.replay), "deletes_replayed": self.replayed,
            "acks_held": len(self.outcomes),
            "invalidation_gaps": self.invalidation_gaps, "invalidation_subscribed": int(self.subscribed),
            "resyncs": self.resyncs, "resync_running": self.resync_running, "resync_checked": self.resync_checked,
            "resync_dropped": self.resync_dropped, "resync_failures": self.resync_failures,
            "resync_last_ms": self.resync_last_ms, "resync_pending": int(self.subscriptions > self.resynced),
            "replica_waits_short": self.replica_waits_short,
            "pubsub_forwarded": self.pubsub_forwarded, "pubsub_received": self.pubsub_received,
            "pubsub_dropped": self.pubsub_dropped,
            "ack": self.ack, "maxmemory_policy": self.maxmemory_policy,
            "masters_degraded": len(self.masters_down), "master_recoveries": self.master_recoveries,
            "masters_degraded_names": ",".join(sorted(self.masters_down)),
        }
