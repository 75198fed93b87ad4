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
the Lua scripts below can compare versions with ``GETRANGE key 4 11``: a write only replaces a record whose
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
not be reached). Every change is published on the invalidation channel; a subscriber thread hands
``(key, version)`` to ``on_invalidate`` so this node drops older local copies (docs/pool.md).

Faults: a connection error or timeout (``CLUSTERDOWN``...) marks the pool *degraded*; a command the pool refuses
(``-OOM``, a script error) fails that write only. While degraded, reads
answer "not in the pool" at once and writes are skipped (counted in ``skipped_writes``); a probe (``probe``,
run by the server off the loop) retries with exponential backoff and, when every node answers again, the pool
is used again. Timeouts are the redis-py socket timeouts (``pool-timeout``, ``pool-connect-timeout``).

Budget: ``index`` remembers what this node put in the pool (key -> version, charged bytes, pool expiry), oldest
first. Over ``budget`` this node removes its oldest records (only if the pool still holds the version it wrote:
a newer record from another node is left alone). Records also expire with the pool TTL (``pool-ttl``, or the
entry's own TTL when sooner); the index forgets them at the same time.
"""

from __future__ import annotations

import itertools
import logging
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import xxhash

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers import pool_scripts
from kvstrata.engine.tiers.base import TierRoles
from kvstrata.engine.tiers.markers import Corrupt, Tombstone
from kvstrata.engine.tiers.pool_url import parse_pool_url
from kvstrata.engine.tiers.watch import Ticket, Watchers
from kvstrata.engine.tiers.writer import BatchWriter
from kvstrata.errors import CommandError

log = logging.getLogger("kvstrata.pool")

MAGIC = b"KP"
FORMAT = 1
# magic, format, flags, version, expire_at, checksum
_HEADER = struct.Struct(">2sBBQqQ")
_CHECKED = struct.Struct(">2sBBQq")
HEADER_SIZE = _HEADER.size
VERSION_OFFSET = 4
RECORD_OVERHEAD = 96  # bytes charged per record beyond key and value: Redis's own per-key overhead, roughly

FLAG_TOMBSTONE = 1
ZERO_VERSION = bytes(8)

_PUT, _DEL_IF, _CAS, _TOMB = range(4)
TOMB_RETRIES = 3
OK, OLDER, MISMATCH, FAILED = "ok", "older", "mismatch", "failed"


class PoolUnavailableError(CommandError):
    """The pool could not be asked (degraded, timed out, refused): the command fails instead of guessing."""

    prefix = "TRYAGAIN"


class PoolDeleted:
    """A STRONG check's answer for a key the pool holds a tombstone of, newer than the local copy."""

    __slots__ = ("version",)

    def __init__(self, version: int) -> None:
        self.version = version


class _Targeted:
    """A pipeline whose every command names its master. Without ``target_nodes`` redis-py's cluster pipeline asks
    its default node for the keys of an EVAL (COMMAND GETKEYS): a hung default node would hang every master's
    writes."""

    def __init__(self, pipe: Any, node: Any) -> None:
        self.pipe = pipe
        self.kw = {"target_nodes": node} if node is not None else {}

    def execute_command(self, *args: Any) -> Any:
        return self.pipe.execute_command(*args, **self.kw)

    def get(self, name: bytes) -> Any:
        return self.execute_command("GET", name)

    def getrange(self, name: bytes, start: int, end: int) -> Any:
        return self.execute_command("GETRANGE", name, start, end)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        return self.pipe.execute(raise_on_error=raise_on_error)


def _is_fault(exc: BaseException) -> bool:
    """Connection-level trouble (degrades the pool), as opposed to a command the pool refused (-OOM...)."""
    import redis

    if isinstance(exc, redis.ResponseError):
        text = str(exc)
        return text.startswith(("CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING"))
    return True


_ERRORS_LOGGED_EVERY = 10.0


def encode_record(key: bytes, value: Any, version: int, expire_at: int, flags: int = 0) -> bytes:
    checked = _CHECKED.pack(MAGIC, FORMAT, flags, version, expire_at)
    h = xxhash.xxh3_64(checked)
    h.update(key)
    h.update(value)
    return b"".join((_HEADER.pack(MAGIC, FORMAT, flags, version, expire_at, h.intdigest()), value))


def decode_head(raw: bytes) -> tuple[int, int, int] | None:
    """(version, expire_at, flags) from a record's first bytes, or None when it is not a pool record."""
    if len(raw) < HEADER_SIZE:
        return None
    magic, fmt, flags, version, expire_at, _ = _HEADER.unpack_from(raw)
    if magic != MAGIC or fmt != FORMAT:
        return None
    return version, expire_at, flags


def decode_header(raw: bytes) -> tuple[int, int] | None:
    """(version, expire_at) from a record's first bytes, or None when it is not a pool record."""
    if len(raw) < HEADER_SIZE:
        return None
    magic, fmt, _flags, version, expire_at, _ = _HEADER.unpack_from(raw)
    if magic != MAGIC or fmt != FORMAT:
        return None
    return version, expire_at


def decode_record(key: bytes, raw: bytes) -> Entry | Corrupt:
    if len(raw) < HEADER_SIZE:
        return Corrupt(key, "short record")
    magic, fmt, flags, version, expire_at, checksum = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        return Corrupt(key, "bad magic")
    if fmt != FORMAT:
        return Corrupt(key, f"unknown record format {fmt}")
    value = memoryview(raw)[HEADER_SIZE:]
    h = xxhash.xxh3_64(_CHECKED.pack(magic, fmt, flags, version, expire_at))
    h.update(key)
    h.update(value)
    if h.intdigest() != checksum:
        return Corrupt(key, "checksum mismatch")
    if flags & FLAG_TOMBSTONE:
        return PoolDeleted(version)  # type: ignore[return-value]
    return Entry(bytes(value), version, expire_at)


def parse_url(url: str) -> tuple[bool, list[tuple[str, int]], str | None]:
    """(cluster, nodes, password) of a pool URL (see ``pool_url``)."""
    parsed = parse_pool_url(url)
    return parsed.cluster, parsed.nodes, parsed.password


class PoolTier(BatchWriter, TierRoles):
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
        # seq -> (outcome, pool version or error text), for the writes a client waits for (track=True).
        self.outcomes: dict[int, tuple[str, Any]] = {}
        # Set by the engine: drop local copies older than a version the pool now holds (another node's write or
        # delete), and a local write the pool refused.
        self.on_invalidate: Callable[[bytes, int, bool], None] = lambda key, version, deleted: None
        self.on_refused: Callable[[bytes, int], None] = lambda key, version: None
        self.maxmemory_policy = ""
        self.invalidations = 0
        self.invalidation_gaps = 0
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

    # ---- the redis-py client (created lazily, off the loop) ----
    def _connect(self) -> Any:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        common: dict[str, Any] = {
            "socket_timeout": self.timeout_ms / 1000,
            "socket_connect_timeout": self.connect_timeout_ms / 1000,
            "retry": Retry(NoBackoff(), 0),
            **self._url.kwargs,
        }
        if self.cluster:
            from redis.cluster import ClusterNode, RedisCluster

            # No retries (``retry`` above): a hung master costs at most one pool-timeout per request.
            return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in self.nodes],
                                require_full_coverage=False, **common)
        import redis

        if self.nodes:
            host, port = self.nodes[0]
            return redis.Redis(host=host, port=port, **common)
        return redis.Redis(**common)  # unix socket: the path is in the URL's options

    def client(self) -> Any:
        c = self._client
        if c is None:
            with self._lock:
                c = self._client
                if c is None:
                    c = self._client = self._connect()
        return c

    def _drop_client(self) -> None:
        with self._lock:
            c, self._client = self._client, None
        if c is not None:
            try:
                c.close()
            except Exception:  # closing a broken client must not raise
                pass

    def set_delivery(self, deliver: Callable[[Callable[[], None]], None]) -> None:
        self._deliver = deliver

    def pool_key(self, key: bytes) -> bytes:
        return self.prefix + key

    # ---- health ----
    @property
    def active(self) -> bool:
        return self.degraded is None and not self._closed

    def _master(self, key: bytes) -> tuple[str, Any]:
        """The name and redis-py node of the master serving ``key`` ("" and None for a single server)."""
        c = self._client
        if not self.cluster or c is None:
            return "", None
        try:
            node = c.get_node_from_key(self.pool_key(key))
        except Exception:  # no slot map yet (the client is being rebuilt): no master to blame
            return "", None
        return (node.name, node) if node is not None else ("", None)

    def down_reason(self, key: bytes) -> str | None:
        """Why ``key`` cannot use the pool now (the pool or its master is degraded), None when it can."""
        if self._closed:
            return "the pool is closed"
        if self.degraded is not None:
            return self.degraded
        if not self.masters_down:
            return None
        got = self.masters_down.get(self._master(key)[0])
        return f"master {self._master(key)[0]}: {got[0]}" if got is not None else None

    def usable(self, key: bytes) -> bool:
        return self.down_reason(key) is None

    def _master_failed(self, name: str, what: str, exc: BaseException) -> None:
        """A fault against one master: only its slots are degraded, with their own backoff and probe."""
        import redis

        with self._lock:
            self.errors += 1
            if isinstance(exc, redis.TimeoutError | TimeoutError):
                self.timeouts += 1
            got = self.masters_down.get(name)
            first = got is None
            backoff = 100 if first else min(self.backoff_max_ms, got[1] * 2)
            now = self._monotonic()
            self.masters_down[name] = [f"{what}: {type(exc).__name__}: {exc}", backoff, now + backoff / 1000,
                                       now if first else got[3]]
        if first:
            log.warning("pool master %s degraded (%s); its keys are served from local tiers", name,
                        self.masters_down[name][0])

    def _failed(self, what: str, exc: BaseException) -> None:
        """Record an error (any thread): the pool is degraded until a probe succeeds."""
        import redis

        with self._lock:
            self.errors += 1
            if isinstance(exc, redis.TimeoutError | TimeoutError):
                self.timeouts += 1
            first = self.degraded is None
            self.degraded = f"{what}: {type(exc).__name__}: {exc}"
            if first:
                self.degraded_since = self._monotonic()
                self._backoff_ms = 0
            self._backoff_ms = min(self.backoff_max_ms, max(100, self._backoff_ms * 2))
            self.next_probe = self._monotonic() + self._backoff_ms / 1000
            now = self._monotonic()
            noisy = now - self._last_error_log < _ERRORS_LOGGED_EVERY
            if first or not noisy:
                self._last_error_log = now
        if first:
            log.warning("pool %s degraded (%s); serving from local tiers, retrying with backoff", self.url,
                        self.degraded)
        elif not noisy:
            log.warning("pool still degraded: %s (%d errors so far)", self.degraded, self.errors)

    def check_connect(self) -> None:
        """At startup (off the loop): every node answers, the endpoint is what the URL says (a cluster for
        redis-cluster://, a single server otherwise), and the pool's memory policy is read (a warning when it
        is ``noeviction`` or maxmemory is unset). Raises ValueError with a clear message."""
        import redis

        try:
            c = self.client()
            if self.cluster:
                from redis.cluster import RedisCluster

                c.ping(target_nodes=RedisCluster.ALL_NODES)
                nodes = c.get_primaries()
                configs = [c.config_get("maxmemory*", target_nodes=n) for n in nodes]
            else:
                c.ping()
                if int(c.info("cluster").get("cluster_enabled", 0)):
                    raise ValueError(f"pool {self.url} is a Redis Cluster node: use redis-cluster://")
                configs = [c.config_get("maxmemory*")]
        except ValueError:
            raise
        except redis.AuthenticationError as exc:
            raise ValueError(f"pool {self.url}: authentication failed ({exc})") from None
        except redis.ResponseError as exc:
            if "cluster" in str(exc).lower() or "unknown command" in str(exc).lower():
                raise ValueError(f"pool {self.url}: not a Redis Cluster ({exc}); use redis:// for one server") \
                    from None
            if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
                raise ValueError(f"pool {self.url}: authentication failed ({exc})") from None
            configs = []  # CONFIG renamed or forbidden: the policy stays unknown
        except Exception as exc:
            self._drop_client()
            raise ValueError(f"pool {self.url} unreachable: {type(exc).__name__}: {exc}") from None
        policies = {str(cfg.get("maxmemory-policy", "")) for cfg in configs}
        unset = any(str(cfg.get("maxmemory", "0")) == "0" for cfg in configs)
        self.maxmemory_policy = ",".join(sorted(policies))
        if configs and (unset or "noeviction" in policies):
            log.warning("pool %s: maxmemory %s, maxmemory-policy %s; the pool can fill up (writes are then "
                        "refused with -OOM): set maxmemory and an allkeys-* policy", self.url,
                        "unset" if unset else "set", self.maxmemory_policy)

    def probe_due(self) -> bool:
        if self.probing:
            return False
        now = self._monotonic()
        if self.degraded is not None:
            return now >= self.next_probe
        return any(now >= m[2] for m in list(self.masters_down.values()))

    def probe(self) -> bool:
        """Try the pool again (worker thread): a fresh client, every node answers PING, the cluster is ok."""
        if self.degraded is None:
            return self._probe_masters()
        self.retries += 1
        self._drop_client()
        try:
            c = self.client()
            if self.cluster:
                from redis.cluster import RedisCluster

                c.ping(target_nodes=RedisCluster.ALL_NODES)
                info = c.cluster_info(target_nodes=RedisCluster.ALL_NODES)
                states = info.values() if isinstance(info, dict) and "cluster_state" not in info else [info]
                if any(isinstance(s, dict) and s.get("cluster_state") != "ok" for s in states):
                    raise ConnectionError("cluster_state is not ok")
            else:
                c.ping()
        except Exception as exc:
            self._failed("probe", exc)
            return False
        with self._lock:
            was = self.degraded
            self.degraded = None
            self._backoff_ms = 0
            self.recoveries += 1
            self.masters_down.clear()
        log.warning("pool %s is back after %.1fs (%s); using it again", self.url,
                    self._monotonic() - self.degraded_since, was)
        return True

    def _probe_masters(self) -> bool:
        """Probe the degraded masters that are due (worker thread): refresh the slot map first (after a failover
        the slots have a new master), then PING each; a master that answers, or no longer serves slots, is back."""
        c = self._client
        if c is None:
            self.masters_down.clear()
            return True
        self.retries += 1
        try:
            c.nodes_manager.initialize()
        except Exception as exc:
            log.warning("pool slot map refresh failed: %s: %s", type(exc).__name__, exc)
        primaries = {n.name: n for n in c.get_primaries()}
        now = self._monotonic()
        back = True
        for name, state in list(self.masters_down.items()):
            if now < state[2]:
                back = False
                continue
            node = primaries.get(name)
            try:
                if node is not None:
                    c.ping(target_nodes=node)
            except Exception as exc:
                self._master_failed(name, "probe", exc)
                back = False
                continue
            with self._lock:
                self.masters_down.pop(name, None)
                self.master_recoveries += 1
            log.warning("pool master %s is back after %.1fs; using it again", name, now - state[3])
        return back

    def _grouped(self, keys: list[bytes]) -> tuple[dict[str, tuple[Any, list[int]]], list[int]]:
        """Indexes of ``keys`` per healthy master (with its redis-py node), and those whose master is degraded."""
        groups: dict[str, tuple[Any, list[int]]] = {}
        skipped: list[int] = []
        for i, key in enumerate(keys):
            name, node = self._master(key) if self.cluster else ("", None)
            if name and name in self.masters_down:
                skipped.append(i)
            else:
                groups.setdefault(name, (node, []))[1].append(i)
        return groups, skipped

    def _fault(self, name: str, what: str, exc: BaseException) -> None:
        # Any fault of one master's pipeline (connection, timeout, CLUSTERDOWN, MOVED after a failover) is that
        # master's: its probe refreshes the slot map, so keys whose slots moved find their new master.
        if name:
            self._master_failed(name, what, exc)
        else:
            self._failed(what, exc)

    def _run(self, keys: list[bytes], what: str, add: Callable[[Any, int], None]) -> tuple[list[Any], list[int]]:
        """One pipeline per healthy master over ``keys`` (``add(pipe, i)`` queues key i's command). Returns the
        results (an exception for each key whose master is degraded or failed now) and the failed indexes;
        a fault of one master degrades that master only (the whole pool for one server or a cluster-wide fault)."""
        c = self.client()
        groups, skipped = self._grouped(keys)
        out: list[Any] = [None] * len(keys)
        failed = list(skipped)
        for i in skipped:
            out[i] = PoolUnavailableError(f"pool master degraded ({self.down_reason(keys[i])})")
        for name, (node, idx) in groups.items():
            try:
                pipe = _Targeted(c.pipeline(transaction=False), node)
                for i in idx:
                    add(pipe, i)
                res = pipe.execute(raise_on_error=False)
                fault = next((r for r in res if isinstance(r, BaseException) and _is_fault(r)), None)
                if fault is not None:
                    raise fault
            except Exception as exc:
                self._fault(name, what, exc)
                if self.degraded is not None:
                    raise
                for i in idx:
                    out[i] = exc
                failed.extend(idx)
                continue
            for i, r in zip(idx, res, strict=True):
                out[i] = r
        return out, failed

    # ---- reads (worker threads) ----
    def read_many(self, keys: list[bytes]) -> dict[bytes, Entry | Corrupt | None]:
        """The pool's records for ``keys``; {} (nothing known) when degraded or on error."""
        if not keys or not self.active:
            if keys:
                self.skipped_reads += len(keys)
            return {}
        try:
            raws, failed = self._run(keys, "read", lambda pipe, i: pipe.get(self.pool_key(keys[i])))
        except Exception as exc:
            if self.degraded is None:
                self._failed("read", exc)
            return {}
        self.skipped_reads += len(failed)
        out: dict[bytes, Entry | Corrupt | None] = {}
        for key, raw in zip(keys, raws, strict=True):
            if isinstance(raw, BaseException):
                continue  # its master is degraded: nothing known about this key
            self.reads += 1
            if raw is None:
                out[key] = None
                continue
            self.read_bytes += len(raw)
            rec = decode_record(key, raw)
            if isinstance(rec, Corrupt):
                self.corrupt_reads += 1
            elif isinstance(rec, PoolDeleted):
                out[key] = None  # deleted: a miss (the tombstone only keeps older copies from coming back)
                continue
            out[key] = rec
        return out

    def check_versions(self, local: dict[bytes, int]) -> dict[bytes, Entry | PoolDeleted | None]:
        """For STRONG reads: the pool's state of each key whose pool version is higher than ``local[key]``: its
        record (Entry) or, for a delete, PoolDeleted; None when the pool holds nothing newer.

        First only the headers (``GETRANGE``), then the full records that are newer. Raises
        PoolUnavailableError when the pool cannot be asked: a STRONG read never guesses.
        """
        if not local:
            return {}
        if not self.active:
            raise PoolUnavailableError(f"the pool is unavailable ({self.degraded}); STRONG reads need it")
        keys = list(local)
        down = next((r for k in keys if (r := self.down_reason(k)) is not None), None)
        if down is not None:
            raise PoolUnavailableError(f"the pool is unavailable ({down}); STRONG reads need it")
        try:
            heads, failed = self._run(keys, "version check",
                                      lambda pipe, i: pipe.getrange(self.pool_key(keys[i]), 0, HEADER_SIZE - 1))
            bad = next((r for r in heads if isinstance(r, BaseException)), None)
            if bad is not None:
                raise bad
            out: dict[bytes, Entry | PoolDeleted | None] = dict.fromkeys(keys)
            newer = []
            for key, head in zip(keys, heads, strict=True):
                hdr = decode_head(head or b"")
                if hdr is None or hdr[0] <= local[key]:
                    continue
                if hdr[2] & FLAG_TOMBSTONE:
                    out[key] = PoolDeleted(hdr[0])
                else:
                    newer.append(key)
            if newer:
                raws, failed = self._run(newer, "version check", lambda pipe, i: pipe.get(self.pool_key(newer[i])))
                bad = next((r for r in raws if isinstance(r, BaseException)), None)
                if bad is not None:
                    raise bad
                for key, raw in zip(newer, raws, strict=True):
                    rec = decode_record(key, raw) if raw is not None else None
                    if isinstance(rec, Entry | PoolDeleted) and rec.version > local[key]:
                        out[key] = rec
                    elif isinstance(rec, Corrupt):
                        self.corrupt_reads += 1
            return out
        except Exception as exc:
            if self.degraded is None and not self.masters_down:
                self._failed("version check", exc)
            raise PoolUnavailableError(f"the pool could not be asked: {type(exc).__name__}: {exc}") from None

    # ---- watch tickets (owner's thread) ----
    def watch(self, keys: Iterable[bytes]) -> Ticket:
        """A ticket that turns stale when any of ``keys`` is written or deleted here before ``unwatch``."""
        return self._watchers.watch(keys)

    def unwatch(self, ticket: Ticket) -> None:
        self._watchers.unwatch(ticket)

    # ---- writes (owner's thread) ----
    def lookup_pending(self, key: bytes) -> tuple[bool, Entry | None]:
        found = self.pending.get(key)
        if found is None:
            return False, None
        return True, (None if found.__class__ is Tombstone else found)  # type: ignore[return-value]

    def likely(self, key: bytes) -> bool:
        """Read here first (above the SSD): a key this node put in the pool, its newest local version."""
        return key in self.index

    def holds(self, key: bytes, version: int) -> bool:
        """True when this node knows the pool holds ``version`` of ``key`` (written or being written by it)."""
        got = self.index.get(key)
        return got is not None and got[0] == version and got[2] > self._wall_ms()

    def wrote(self, key: bytes, version: int) -> bool:
        """True when ``version`` of ``key`` in the pool is this node's own write."""
        got = self.index.get(key)
        return got is not None and got[0] == version and got[1] > 0

    def _forget(self, key: bytes) -> None:
        got = self.index.pop(key, None)
        if got is not None and got[1]:
            self.used -= got[1]
            self.own -= 1

    def put(self, key: bytes, entry: Entry, *, track: bool = False, expected: int | None = None,
            fallback: int = 0) -> int:
        """Queue a write of ``entry`` to the pool; returns its sequence number, or 0 when it was skipped.

        ``expected``: a compare-and-set, decided in the pool against its version of the key (``fallback``, the
        local version, when the pool holds no record). ``track``: keep the outcome for ``take_outcome``.
        """
        if not self.usable(key):
            self.skipped_writes += 1
            self._forget(key)
            return 0
        now = self._wall_ms()
        px = self.ttl_ms
        if entry.expire_at:
            px = min(px, entry.expire_at - now)
            if px <= 0:
                return 0
        snap = Entry(entry.value, entry.version, entry.expire_at)
        self.replay.pop(key, None)  # a newer write supersedes a delete still to be replayed
        self.pending[key] = snap
        self._watchers.touched(key)
        self._forget(key)
        charged = len(self.prefix) + len(key) + len(entry.value) + HEADER_SIZE + RECORD_OVERHEAD
        self.index[key] = (entry.version, charged, now + px)
        self.used += charged
        self.own += 1
        if expected is None:
            op: tuple[Any, ...] = (_PUT, key, snap, (px, track))
        else:
            op = (_CAS, key, snap, (px, True, expected, fallback))
        seq = self._enqueue(op, len(entry.value))
        if self.used > self.budget:
            self._evict_over_budget(exclude=key)
        return seq

    def take_outcome(self, seq: int) -> tuple[str, Any]:
        """The outcome of tracked write ``seq`` (owner's thread); FAILED when none came (the pool went away)."""
        return self.outcomes.pop(seq, None) or (FAILED, self.degraded or "the pool did not answer")

    def note(self, key: bytes, version: int) -> None:
        """Remember that the pool holds ``version`` of ``key`` (read from it, written by another node), so a
        demotion does not write it again. Charged 0 bytes: it is not this node's record."""
        got = self.index.get(key)
        if got is None or got[0] < version:
            self._forget(key)
            self.index[key] = (version, 0, self._wall_ms() + self.ttl_ms)

    def delete(self, key: bytes, version: int = 0, *, track: bool = False) -> int:
        """Queue a tombstone of ``key`` at ``version`` (the delete's own version: it hides every older record and
        refuses every older write for ``tombstone_ttl_ms``). Raises PoolUnavailableError when degraded: a delete
        is never dropped."""
        down = self.down_reason(key)
        if down is not None:
            raise PoolUnavailableError(f"the pool is unavailable ({down}); deletes need it")
        self._forget(key)
        self.replay.pop(key, None)
        tomb = Tombstone()
        self.pending[key] = tomb
        self._watchers.touched(key)
        return self._enqueue((_TOMB, key, tomb, (version, track, 0)))

    def _evict_over_budget(self, exclude: bytes | None = None) -> None:
        for key in list(self.index):
            if self.used <= self.budget:
                break
            if key == exclude:
                continue
            version, charged, _exp = self.index[key]
            self._forget(key)
            if not charged:
                continue  # another node's record: only forgotten
            self.evictions += 1
            if key not in self.pending:
                self._enqueue((_DEL_IF, key, None, version))

    def expire_index(self) -> int:
        """Forget records whose pool TTL has passed (the pool has dropped them itself); replay deletes."""
        self.replay_deletes()
        now = self._wall_ms()
        done = 0
        # The first 4096 only (listed, since _forget changes the dict): never a copy of the whole index.
        for key, (_v, _c, exp) in list(itertools.islice(self.index.items(), 4096)):
            if exp <= now and key not in self.pending:
                self._forget(key)
                self.expired += 1
                done += 1
        return done

    def replay_deletes(self) -> int:
        """Send again the tombstones the pool did not take (owner's thread, while the pool is active)."""
        if not self.replay or not self.active:
            return 0
        todo, self.replay = self.replay, {}
        for key, version in todo.items():
            if not self.usable(key):
                self.replay[key] = version  # its master is still degraded: replayed once it answers
                continue
            tomb = self.pending.get(key)
            if tomb.__class__ is Tombstone:
                self.replayed += 1
                self._enqueue((_TOMB, key, tomb, (version, False, 0)))
        return len(todo)

    def flush(self, version: int) -> int:
        """FLUSHALL: a tombstone at ``version`` for every key this node knows in the pool (written or read here);
        the other nodes drop their copies when the invalidations arrive. Keys this node never saw stay."""
        last = 0
        for key in list(self.index):
            last = self.delete(key, version) or last
        return last

    # ---- the writer ----
    def _process(self, batch: list[tuple[Any, ...]]) -> None:
        error: str | None = None
        results: list[Any] = []
        if not self.active:
            error = f"skipped (pool degraded: {self.degraded})"
        else:
            def add(pipe: Any, i: int) -> None:
                _seq, _n, kind, key, snap, arg = batch[i]
                pkey = self.pool_key(key)
                if kind == _PUT:
                    rec = encode_record(key, snap.value, snap.version, snap.expire_at)
                    ver = struct.pack(">Q", snap.version)
                    pipe.execute_command("EVAL", pool_scripts.SET_IF_NEWER, 1, pkey, rec, ver, arg[0],
                                         self.channel, ver + b"\x00")
                elif kind == _CAS:
                    rec = encode_record(key, snap.value, snap.version, snap.expire_at)
                    ver = struct.pack(">Q", snap.version)
                    pipe.execute_command("EVAL", pool_scripts.CAS, 1, pkey, rec, ver, arg[0], self.channel,
                                         struct.pack(">Q", arg[2]), struct.pack(">Q", arg[3]), ver + b"\x00")
                elif kind == _TOMB:
                    rec = encode_record(key, b"", arg[0], 0, FLAG_TOMBSTONE)
                    ver = struct.pack(">Q", arg[0])
                    pipe.execute_command("EVAL", pool_scripts.SET_IF_NEWER, 1, pkey, rec, ver,
                                         self.tombstone_ttl_ms, self.channel, ver + b"\x01")
                else:
                    pipe.execute_command("EVAL", pool_scripts.DEL_IF_VERSION, 1, pkey, struct.pack(">Q", arg))

            try:
                c = self.client()
                # A key whose master is degraded (or failed now) gets its exception as result: a failed write.
                results, _failed = self._run([op[3] for op in batch], "write", add)
                if self.ack == "replicas":
                    results = self._wait_replicas(c, batch, results)
            except Exception as exc:
                if self.degraded is None:
                    self._failed("write", exc)
                error = f"{type(exc).__name__}: {exc}"
        self._deliver(lambda: self._committed(batch, error, results))

    def _wait_replicas(self, c: Any, batch: list[tuple[Any, ...]], results: list[Any]) -> list[Any]:
        """``WAIT ack_replicas`` on each master a tracked write of this batch went to; a write whose master could
        not confirm enough replicas within one pool-timeout fails (it may be lost in a failover)."""
        masters: dict[Any, list[int]] = {}
        for i, (_seq, _n, kind, key, _snap, arg) in enumerate(batch):
            if kind in (_PUT, _CAS, _TOMB) and arg[1] and results[i] == 1:
                node = c.get_node_from_key(self.pool_key(key)) if self.cluster else None
                masters.setdefault(node, []).append(i)
        out = list(results)
        for node, idx in masters.items():
            kw = {"target_nodes": node} if node is not None else {}
            # Half a pool-timeout: WAIT answers (with the count so far) before the socket gives up.
            got = c.execute_command("WAIT", self.ack_replicas, max(1, self.timeout_ms // 2), **kw)
            if int(got) < self.ack_replicas:
                self.replica_waits_short += 1
                for i in idx:
                    out[i] = RuntimeError(f"only {got} of {self.ack_replicas} pool replicas confirmed the write")
        return out

    def _committed(self, batch: list[tuple[Any, ...]], error: str | None, results: list[Any]) -> None:
        for i, (seq, nbytes, kind, key, snap, arg) in enumerate(batch):
            self.queued_bytes -= nbytes
            mine = kind != _DEL_IF and self.pending.get(key, 0) is snap
            if mine:
                del self.pending[key]
            self.committed_seq = max(self.committed_seq, seq)
            if kind == _DEL_IF:
                continue
            tracked = bool(arg[1])
            res = results[i] if results else None
            version = arg[0] if kind == _TOMB else snap.version
            if kind == _TOMB and (error is not None or isinstance(res, BaseException)):
                # A delete is never dropped: its tombstone stays pending here (so this node does not read the
                # old record back) and is sent again once the pool answers (``replay_deletes``).
                if key not in self.pending:
                    self.pending[key] = snap
                if self.pending.get(key) is snap:
                    self.replay[key] = arg[0]
            if error is not None or isinstance(res, BaseException):
                text = error if error is not None else f"{type(res).__name__}: {res}"
                self.skipped_writes += 1
                if error is None and not (isinstance(res, PoolUnavailableError) or _is_fault(res)):
                    self.refused_writes += 1
                got = self.index.get(key)
                if got is not None and got[0] == version:
                    self._forget(key)
                if tracked:
                    self.outcomes[seq] = (FAILED, text)
                    if kind != _TOMB and (self.ack != "local" or kind == _CAS):
                        # The client hears that the write failed: this node does not serve it either.
                        self.on_refused(key, version)
                continue
            self.writes += 1
            self.write_bytes += nbytes
            if kind == _TOMB:
                self.tombstones += 1
            if res == 1:
                if tracked:
                    self.outcomes[seq] = (OK, version)
                continue
            # Refused: the pool holds a higher version (or, for a CAS, another one than expected).
            if isinstance(res, list):
                pool_version = struct.unpack(">Q", res[0])[0] if len(res[0]) == 8 else 0
                outcome = MISMATCH
                self.cas_refused += 1
            else:
                pool_version = struct.unpack(">Q", res)[0] if isinstance(res, bytes) and len(res) == 8 else 0
                outcome = OLDER
                self.conflicts += 1
            got = self.index.get(key)
            if got is not None and got[0] == version:
                self._forget(key)
            if kind == _TOMB:
                if outcome == OLDER and key not in self.pending and arg[2] < TOMB_RETRIES:
                    # The pool holds a higher version that arrived first (another node's clock was ahead): this
                    # delete came later, so it must win. Sent again above the pool's version (the DEL waits).
                    self.pending[key] = snap
                    self._enqueue((_TOMB, key, snap, (pool_version + 1, tracked, arg[2] + 1)))
                continue
            self.on_refused(key, version)
            if tracked:
                self.outcomes[seq] = (outcome, pool_version)

    # ---- invalidation (a subscriber thread) ----
    def start_invalidation(self) -> None:
        """Subscribe to the invalidation channel in a thread; messages reach ``on_invalidate`` on the owner's
        thread. While the subscription is down, invalidations are missed (counted in invalidation_gaps)."""
        if self._subscriber is None:
            self._subscriber = threading.Thread(target=self._subscribe_loop, name="kvstrata-pool-inval",
                                                daemon=True)
            self._subscriber.start()

    def _subscribe_loop(self) -> None:
        import redis

        n = 0
        kwargs = {k: v for k, v in self._url.kwargs.items() if k != "db"}
        while not self._stop.is_set():
            host, port = self.nodes[n % len(self.nodes)] if self.nodes else (None, None)
            n += 1
            conn = None
            try:
                conn = redis.Redis(host=host, port=port, socket_timeout=self.timeout_ms / 1000,
                                   socket_connect_timeout=self.connect_timeout_ms / 1000, **kwargs) \
                    if host else redis.Redis(socket_timeout=self.timeout_ms / 1000, **kwargs)
                ps = conn.pubsub(ignore_subscribe_messages=True)
                ps.subscribe(self.channel)
                plen = len(self.prefix)
                while not self._stop.is_set():
                    msg = ps.get_message(timeout=min(0.2, self.timeout_ms / 2000))
                    if msg is None or msg.get("type") != "message":
                        continue
                    data = msg["data"]
                    if len(data) < 9 + plen:
                        continue
                    version = struct.unpack_from(">Q", data)[0]
                    deleted = data[8] == 1
                    key = bytes(data[9 + plen:])
                    self._deliver(lambda key=key, version=version, deleted=deleted:
                                  self._invalidated(key, version, deleted))
            except Exception as exc:
                if self._stop.is_set():
                    break
                self.invalidation_gaps += 1
                log.warning("pool invalidation subscription lost (%s: %s); reconnecting", type(exc).__name__, exc)
                self._stop.wait(min(1.0, self.backoff_max_ms / 1000))
            finally:
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # closing a broken connection must not raise
                        pass

    def _invalidated(self, key: bytes, version: int, deleted: bool) -> None:
        self.invalidations += 1
        self.on_invalidate(key, version, deleted)

    def close(self) -> None:
        if self._closed:
            return
        self._stop.set()
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
            "reads": self.reads, "read_bytes": self.read_bytes, "conflicts": self.conflicts,
            "expired": self.expired, "ttl_ms": self.ttl_ms, "refused_writes": self.refused_writes,
            "cas_refused": self.cas_refused, "tombstones": self.tombstones, "invalidations": self.invalidations, "dropped_copies": self.dropped_copies,
            "deletes_to_replay": len(self.replay), "deletes_replayed": self.replayed,
            "invalidation_gaps": self.invalidation_gaps, "replica_waits_short": self.replica_waits_short,
            "ack": self.ack, "maxmemory_policy": self.maxmemory_policy,
            "masters_degraded": len(self.masters_down), "master_recoveries": self.master_recoveries,
            "masters_degraded_names": ",".join(sorted(self.masters_down)),
        }
