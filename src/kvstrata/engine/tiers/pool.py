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

Faults: any error (refused, timed out, ``CLUSTERDOWN``...) marks the pool *degraded*. While degraded, reads
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
from urllib.parse import urlsplit

import xxhash

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.markers import Corrupt, Tombstone
from kvstrata.engine.tiers.watch import Ticket, Watchers
from kvstrata.engine.tiers.writer import BatchWriter
from kvstrata.redact import redact_url

log = logging.getLogger("kvstrata.pool")

MAGIC = b"KP"
FORMAT = 1
# magic, format, flags, version, expire_at, checksum
_HEADER = struct.Struct(">2sBBQqQ")
_CHECKED = struct.Struct(">2sBBQq")
HEADER_SIZE = _HEADER.size
VERSION_OFFSET = 4
RECORD_OVERHEAD = 96  # bytes charged per record beyond key and value: Redis's own per-key overhead, roughly

# Replace the record unless the pool holds a higher version (byte-wise compare of the big-endian versions).
_SET_IF_NEWER = """
local cur = redis.call('GETRANGE', KEYS[1], 4, 11)
if #cur == 8 then
  for i = 1, 8 do
    local a, b = string.byte(cur, i), string.byte(ARGV[2], i)
    if a > b then return 0 end
    if a < b then break end
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return 1
"""
# Delete the record only if it is still the version this node wrote.
_DEL_IF_VERSION = """
if redis.call('GETRANGE', KEYS[1], 4, 11) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_PUT, _DEL, _DEL_IF = range(3)
_ERRORS_LOGGED_EVERY = 10.0


def encode_record(key: bytes, value: Any, version: int, expire_at: int) -> bytes:
    checked = _CHECKED.pack(MAGIC, FORMAT, 0, version, expire_at)
    h = xxhash.xxh3_64(checked)
    h.update(key)
    h.update(value)
    return b"".join((_HEADER.pack(MAGIC, FORMAT, 0, version, expire_at, h.intdigest()), value))


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
    return Entry(bytes(value), version, expire_at)


def parse_url(url: str) -> tuple[bool, list[tuple[str, int]], str | None]:
    """``redis://host:port`` or ``redis-cluster://host:port[,host:port...]`` -> (cluster, nodes, password)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "redis-cluster"):
        raise ValueError(f"pool URL must start with redis:// or redis-cluster://, got {redact_url(url)!r}")
    netloc = parts.netloc
    password = None
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        password = auth.split(":", 1)[-1] or None
    nodes = []
    for item in netloc.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"pool URL node must be host:port, got {item!r}")
        nodes.append((host.strip("[]"), int(port)))
    if parts.scheme == "redis" and len(nodes) != 1:
        raise ValueError("redis:// names one server; use redis-cluster:// for several")
    return parts.scheme == "redis-cluster", nodes, password


class PoolTier(BatchWriter):
    """A shared Redis/Valkey (Cluster) pool with this node's own byte budget, TTL and degradation handling."""

    name = "pool"

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
        threaded: bool = True,
        wall_ms: Callable[[], int] | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.url = redact_url(url)  # for logs and INFO: never the password
        self.cluster, self.nodes, self._password = parse_url(url)
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
            "password": self._password,
        }
        if self.cluster:
            from redis.cluster import ClusterNode, RedisCluster

            return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in self.nodes],
                                require_full_coverage=False, **common)
        import redis

        host, port = self.nodes[0]
        return redis.Redis(host=host, port=port, **common)

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

    def probe_due(self) -> bool:
        return self.degraded is not None and not self.probing and self._monotonic() >= self.next_probe

    def probe(self) -> bool:
        """Try the pool again (worker thread): a fresh client, every node answers PING, the cluster is ok."""
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
        log.warning("pool %s is back after %.1fs (%s); using it again", self.url,
                    self._monotonic() - self.degraded_since, was)
        return True

    # ---- reads (worker threads) ----
    def read_many(self, keys: list[bytes]) -> dict[bytes, Entry | Corrupt | None]:
        """The pool's records for ``keys``; {} (nothing known) when degraded or on error."""
        if not keys or not self.active:
            if keys:
                self.skipped_reads += len(keys)
            return {}
        try:
            pipe = self.client().pipeline(transaction=False)
            for key in keys:
                pipe.get(self.pool_key(key))
            raws = pipe.execute(raise_on_error=True)
        except Exception as exc:
            self._failed("read", exc)
            return {}
        out: dict[bytes, Entry | Corrupt | None] = {}
        for key, raw in zip(keys, raws, strict=True):
            self.reads += 1
            if raw is None:
                out[key] = None
                continue
            self.read_bytes += len(raw)
            rec = decode_record(key, raw)
            if isinstance(rec, Corrupt):
                self.corrupt_reads += 1
            out[key] = rec
        return out

    def check_versions(self, local: dict[bytes, int]) -> dict[bytes, Entry | None]:
        """For STRONG reads: the pool's record of each key whose pool version is higher than ``local[key]``.

        First only the headers (``GETRANGE``), then the full records that are newer. Keys whose pool copy is
        missing, corrupt or not newer map to None. Raises nothing: on error the pool is degraded and {} returned.
        """
        if not local or not self.active:
            return {}
        keys = list(local)
        try:
            c = self.client()
            pipe = c.pipeline(transaction=False)
            for key in keys:
                pipe.getrange(self.pool_key(key), 0, HEADER_SIZE - 1)
            heads = pipe.execute(raise_on_error=True)
            newer = []
            for key, head in zip(keys, heads, strict=True):
                hdr = decode_header(head or b"")
                if hdr is not None and hdr[0] > local[key]:
                    newer.append(key)
            out: dict[bytes, Entry | None] = dict.fromkeys(keys)
            if newer:
                got = self.read_many(newer)
                for key in newer:
                    rec = got.get(key)
                    out[key] = rec if isinstance(rec, Entry) and rec.version > local[key] else None
            return out
        except Exception as exc:
            self._failed("version check", exc)
            return {}

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

    def put(self, key: bytes, entry: Entry) -> int:
        """Queue a write of ``entry`` to the pool; returns its sequence number, or 0 when it was skipped."""
        if not self.active:
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
        self.pending[key] = snap
        self._watchers.touched(key)
        self._forget(key)
        charged = len(self.prefix) + len(key) + len(entry.value) + HEADER_SIZE + RECORD_OVERHEAD
        self.index[key] = (entry.version, charged, now + px)
        self.used += charged
        self.own += 1
        seq = self._enqueue((_PUT, key, snap, px), len(entry.value))
        if self.used > self.budget:
            self._evict_over_budget(exclude=key)
        return seq

    def note(self, key: bytes, version: int) -> None:
        """Remember that the pool holds ``version`` of ``key`` (read from it, written by another node), so a
        demotion does not write it again. Charged 0 bytes: it is not this node's record."""
        got = self.index.get(key)
        if got is None or got[0] < version:
            self._forget(key)
            self.index[key] = (version, 0, self._wall_ms() + self.ttl_ms)

    def delete(self, key: bytes) -> int:
        self._forget(key)
        if not self.active:
            self.skipped_writes += 1
            return 0
        tomb = Tombstone()
        self.pending[key] = tomb
        self._watchers.touched(key)
        return self._enqueue((_DEL, key, tomb, 0))

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
        """Forget records whose pool TTL has passed (the pool has dropped them itself)."""
        now = self._wall_ms()
        done = 0
        # The first 4096 only (listed, since _forget changes the dict): never a copy of the whole index.
        for key, (_v, _c, exp) in list(itertools.islice(self.index.items(), 4096)):
            if exp <= now and key not in self.pending:
                self._forget(key)
                self.expired += 1
                done += 1
        return done

    def flush(self) -> int:
        """Delete every record this node put in the pool (FLUSHALL); other nodes' records stay."""
        last = 0
        for key, (_v, charged, _e) in list(self.index.items()):
            if charged:
                last = self.delete(key) or last
            else:
                self._forget(key)
        return last

    # ---- the writer ----
    def _process(self, batch: list[tuple[Any, ...]]) -> None:
        error: str | None = None
        results: list[Any] = []
        if not self.active:
            error = f"skipped (pool degraded: {self.degraded})"
        else:
            try:
                pipe = self.client().pipeline(transaction=False)
                for _seq, _n, kind, key, snap, arg in batch:
                    pkey = self.pool_key(key)
                    if kind == _PUT:
                        rec = encode_record(key, snap.value, snap.version, snap.expire_at)
                        pipe.execute_command("EVAL", _SET_IF_NEWER, 1, pkey, rec,
                                             struct.pack(">Q", snap.version), arg)
                    elif kind == _DEL:
                        pipe.delete(pkey)
                    else:
                        pipe.execute_command("EVAL", _DEL_IF_VERSION, 1, pkey, struct.pack(">Q", arg))
                results = pipe.execute(raise_on_error=True)
            except Exception as exc:
                self._failed("write", exc)
                error = f"{type(exc).__name__}: {exc}"
        self._deliver(lambda: self._committed(batch, error, results))

    def _committed(self, batch: list[tuple[Any, ...]], error: str | None, results: list[Any]) -> None:
        for i, (seq, nbytes, kind, key, snap, _arg) in enumerate(batch):
            self.queued_bytes -= nbytes
            mine = kind != _DEL_IF and self.pending.get(key, 0) is snap
            if mine:
                del self.pending[key]
            if kind == _PUT:
                if error is not None:
                    self.skipped_writes += 1
                    got = self.index.get(key)
                    if got is not None and got[0] == snap.version:
                        self._forget(key)
                else:
                    self.writes += 1
                    self.write_bytes += nbytes
                    if results and results[i] == 0:
                        # The pool holds a higher version written by another node: that one wins.
                        self.conflicts += 1
                        got = self.index.get(key)
                        if got is not None and got[0] == snap.version:
                            self._forget(key)
            self.committed_seq = max(self.committed_seq, seq)

    def close(self) -> None:
        if self._closed:
            return
        self._stop_writer(10)
        self._closed = True
        self._drop_client()

    def __len__(self) -> int:
        """Records this node wrote to the pool (and has not seen expire)."""
        return self.own

    def info(self) -> dict[str, Any]:
        return {
            "pending": len(self.pending), "queued_bytes": self.queued_bytes, "degraded": int(self.degraded is not None),
            "degraded_reason": self.degraded or "", "errors": self.errors, "timeouts": self.timeouts,
            "retries": self.retries, "recoveries": self.recoveries, "skipped_writes": self.skipped_writes,
            "skipped_reads": self.skipped_reads, "writes": self.writes, "write_bytes": self.write_bytes,
            "reads": self.reads, "read_bytes": self.read_bytes, "conflicts": self.conflicts,
            "expired": self.expired, "ttl_ms": self.ttl_ms,
        }
