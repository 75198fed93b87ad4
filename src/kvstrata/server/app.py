"""Server lifecycle: build the engine from the config, listen, run background tasks, shut down cleanly."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import heapq
import itertools
import logging
import os
import signal
import threading
import time
from typing import Any

from kvstrata.acl import Acl
from kvstrata.clock import Clock, SystemClock
from kvstrata.commands import REGISTRY, CommandSpec
from kvstrata.commands.waits import Await, Commit, Offload, PoolAck, PoolVersions, Wait
from kvstrata.config import Config
from kvstrata.cpulist import usable_cpus
from kvstrata.engine import predict
from kvstrata.engine.policy import create_policy
from kvstrata.engine.policy.chain import ScanGuard
from kvstrata.engine.predict import Predictor
from kvstrata.engine.store import LoadTicket, Store
from kvstrata.engine.tiers import registry as tier_registry
from kvstrata.engine.tiers.pool import PoolTier
from kvstrata.observability.service import Observability
from kvstrata.server import dataplane
from kvstrata.server.client_eviction import ClientEviction
from kvstrata.server.cmdstats import CommandStats, SlowLog
from kvstrata.server.connection import Connection
from kvstrata.server.limits import empty_budget
from kvstrata.server.monitor import Monitors
from kvstrata.server.notify import KEY_MISS, NEW, Notifier
from kvstrata.server.pause import ClientPause
from kvstrata.server.pool_resync import PoolResync
from kvstrata.server.prefetch import Prefetcher
from kvstrata.server.pubsub import PubSub
from kvstrata.server.saves import Saves
from kvstrata.server.stats import ServerStats, count_error
from kvstrata.server.tls import server_context, tls_wanted
from kvstrata.server.tracking import Tracking

log = logging.getLogger("kvstrata.server")



def build_store(config: Config, clock: Clock | None = None) -> Store:
    clock = clock or SystemClock()
    policy = create_policy(config.get("eviction-policy"), clock=clock, k=int(config.get("lru-k")),
                           crp=float(config.get("lru-k-crp")))
    if config.get("eviction-scan-guard"):
        policy = ScanGuard(policy)  # type: ignore[assignment]
    # The lower tiers in tier-order, each built by its registered factory (engine/tiers/registry.py).
    lower = tier_registry.build(config, clock)
    ssd = next((t for t in lower if t.name == "ssd"), None)
    problem = empty_budget(int(config.get("dram-size")), ssd is not None)
    if problem is not None:
        for tier in lower:
            tier.close()
        raise ValueError(problem)
    node_id = tier_registry.pool_node_id(config) if any(t.shared for t in lower) else 0
    predictor = None
    if ssd is not None and config.get("prefetch-predict"):
        predictor = Predictor(clock, max_keys=int(config.get("profile-max-keys")),
                              window=int(config.get("prefetch-window")),
                              session_max=int(config.get("prefetch-session-max")),
                              min_confidence=float(config.get("prefetch-min-confidence")),
                              link_window=float(config.get("prefetch-link-window")),
                              half_life=float(config.get("prefetch-half-life")))
        if not predictor.NATIVE:
            logging.getLogger("kvstrata.prefetch").warning(
                "the prefetch predictor runs in Python (%s): 4-5x the CPU per read of the compiled one",
                predict.NATIVE_WHY)
    return Store(
        int(config.get("dram-size")),
        predictor=predictor,
        chain_evict=bool(config.get("chain-evict")),
        head_keep=float(config.get("head-keep")),
        prefetch_protect=float(config.get("prefetch-protect")),
        profile_min_bytes=int(config.get("prefetch-min-value")),
        policy=policy,
        clock=clock,
        lower=lower,
        durability=config.get("durability"),
        noeviction=config.get("maxmemory-policy") == "noeviction",
        promote_hits=int(config.get("promote-hits")),
        promote_window=float(config.get("promote-window")),
        hot_max_fraction=float(config.get("hot-max-fraction")),
        node_id=node_id,
    )


class Server:
    def __init__(self, config: Config, store: Store | None = None, config_file: str | None = None) -> None:
        self.config = config
        self.config_file = config_file
        self.store = store or build_store(config)
        # Tiered: a tier below DRAM (SSD, pool, any registered one), so commands may load keys and wait for writers.
        self.tiered = bool(self.store.lower)
        # The shared-memory arena (docs/dataplane.md): before any connection exists, as they receive into it.
        self.arena = dataplane.setup_arena(self)
        self._unix: asyncio.base_events.Server | None = None
        if self.store.ssd is not None:
            self.store.ssd.stuck_limit = int(config.get("ssd-write-queue"))
            self.store.ssd.set_writer_pause(int(config.get("ssd-writer-pause")))
            self.store.ssd.key_filter.lookups = bool(config.get("ssd-key-filter"))
        self.store.inline_max = int(config.get("ssd-inline-max"))
        # TLS contexts are built before anything listens, so a bad certificate stops the start with its reason.
        self._tls = server_context(config) if tls_wanted(config) else None
        self.tls_port = int(config.get("tls-port"))
        self._tls_server: asyncio.base_events.Server | None = None
        # Users, passwords and key patterns; the default user's password is requirepass (raises on a bad aclfile).
        self.acl = Acl(config.get("requirepass"), str(config.get("aclfile")),
                       pubsub_default=config.get("acl-pubsub-default") == "allchannels")
        self.stats = ServerStats()
        self.error_codes: dict[str, int] = {}  # error replies by code (INFO errorstats)
        self.clients: dict[int, Connection] = {}
        # Per command spec; created up front so the hot path is one dict lookup.
        self.command_counts: dict[CommandSpec, CommandStats] = {}
        for spec in REGISTRY.values():
            self.command_counts[spec] = CommandStats()
            for sub in spec.subcommands.values():
                self.command_counts[sub] = CommandStats()
        self.slowlog = SlowLog()
        self.slow_usec = int(config.get("slowlog-log-slower-than"))
        self._latency_settings()
        # Read per write command on the tiered path: kept here, refreshed by apply_config.
        self.ssd_write_queue = int(config.get("ssd-write-queue"))
        self.tasks: set[asyncio.Task[Any]] = set()
        self.saves = Saves(self)  # SAVE, BGSAVE, save points, LASTSAVE (server/saves.py)
        self.resync = PoolResync(self)  # missed pool invalidations found and applied (server/pool_resync.py)
        self.monitors = Monitors(config)  # connections in MONITOR mode (server/monitor.py)
        self.pause = ClientPause()  # CLIENT PAUSE / UNPAUSE (server/pause.py)
        self.pubsub = PubSub()  # channels, patterns and their subscribers (server/pubsub.py)
        self.notifier = Notifier(self.pubsub)  # keyspace notifications (server/notify.py)
        self._notifications()
        self.client_eviction = ClientEviction(self)  # maxmemory-clients (server/client_eviction.py)
        self.tracking = Tracking(self)  # client-side caching: CLIENT TRACKING (server/tracking.py)
        self.tracking.max_keys = int(config.get("tracking-table-max-keys"))
        self.store.on_event = self._store_event
        self.blocked_clients = 0  # connections held by CLIENT PAUSE or blocked in WAIT (INFO clients)
        self.started = time.monotonic()
        self.run_id = os.urandom(20).hex()
        self.replid = os.urandom(20).hex()  # INFO replication's master_replid: another random id, as Redis's
        self.uvloop = False
        self.now_ms = self.store.clock.now_ms()
        self._ids = itertools.count(1)
        self._commit_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._pool_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiter_seq = itertools.count()
        self._shutdown = asyncio.Event()
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvstrata-io")
        # The prefetcher's loads, apart: a client's load never waits in _io's queue behind a prefetch batch.
        self._prefetch_io = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvstrata-prefetch")
        # CPU work of commands (Offload: large two-phase commits), apart from the loads _io runs.
        self._cpu = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvstrata-cpu")
        # A thread that copies pieces of a large pull alongside the worker running it (kvstrata.engine.copyalong):
        # only where the server may use a second CPU (server-cpulist is applied before this).
        self.copy_helper: concurrent.futures.ThreadPoolExecutor | None = (
            concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvstrata-copy")
            if usable_cpus() > 1 else None)
        self._server: asyncio.base_events.Server | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0  # the loop's thread: the store's events from others are handed to the loop
        self.port = int(config.get("port"))
        # Dispatch by the name as sent (upper case from most clients) and in lower case.
        self.dispatch: dict[bytes, CommandSpec] = {}
        for name, spec in REGISTRY.items():
            self.dispatch[name] = spec
            self.dispatch[name.upper()] = spec
        self.prefetcher = Prefetcher(self.store, functools.partial(self.load, background=True))
        self.prefetcher.along = int(config.get("prefetch-along"))
        # Metrics, dashboard, LATENCY monitor; checks the HTTP endpoint's configuration (raises if unsafe).
        self.observability = Observability(self)

    def tls_context(self) -> Any:
        """The server's TLS context (tls-cert-file, tls-key-file, tls-auth-clients); None without TLS."""
        return self._tls

    def next_client_id(self) -> int:
        return next(self._ids)

    # ---- SSD writer coordination ----
    def _on_ssd_commit(self, committed_seq: int, evicted: list[bytes]) -> None:
        self.store._ssd_committed(committed_seq, evicted)
        waiters = self._commit_waiters
        while waiters and waiters[0][0] <= committed_seq:
            _, _, fut = heapq.heappop(waiters)
            if not fut.done():
                fut.set_result(None)

    async def wait_commit(self, seq: int) -> None:
        """Wait for the SSD writer to commit ``seq``."""
        ssd = self.store.ssd
        if ssd is None or ssd.committed_seq >= seq:
            return
        assert self.loop is not None
        fut: asyncio.Future[None] = self.loop.create_future()
        heapq.heappush(self._commit_waiters, (seq, next(self._waiter_seq), fut))
        await fut

    async def wait(self, w: Wait) -> Any:
        """Perform a handler's typed wait (kvstrata.commands.waits) and return its result."""
        if w.__class__ is Commit:
            await self.wait_commit(w.seq)  # type: ignore[union-attr]
            return None
        pool = self.store.pool
        assert self.loop is not None
        if w.__class__ is Offload:
            return await self.loop.run_in_executor(self._cpu, w.run)  # type: ignore[union-attr]
        if w.__class__ is Await:
            return await w.start()  # type: ignore[union-attr]
        if isinstance(w, PoolAck):
            if w.ssd_seq:
                await self.wait_commit(w.ssd_seq)
            if pool is not None and pool.committed_seq < w.seq and pool.active:
                fut: asyncio.Future[None] = self.loop.create_future()
                heapq.heappush(self._pool_waiters, (w.seq, next(self._waiter_seq), fut))
                await fut
            return None
        assert isinstance(w, PoolVersions)
        if pool is None:
            return {}, False
        ticket = pool.watch(w.local)
        try:
            newer = await self.loop.run_in_executor(self._io, pool.check_versions, w.local)
        finally:
            pool.unwatch(ticket)
        return newer, ticket.stale

    def _on_pool_commit(self) -> None:
        pool = self.store.pool
        if pool is None:
            return
        waiters = self._pool_waiters
        while waiters and (waiters[0][0] <= pool.committed_seq or not pool.active):
            _, _, fut = heapq.heappop(waiters)
            if not fut.done():
                fut.set_result(None)

    async def load(self, keys: list[bytes], *, meta: bool = False, background: bool = False) -> bool:
        """Read lower-tier records of ``keys`` (LMDB, the pool) in a thread and install them for the next command;
        with ``meta``, only their headers (a probe: EXISTS, TYPE, the TTL family declare ``load="meta"``). A load
        of SSD records whose pages are in memory is read right here instead (``Store.read_inline``).

        True when every key's state is now known without LMDB. False when the load was raced by a write (its
        records are not installed) or a key left the SSD's pending writes meanwhile: the caller loads again.

        ``background``: the prefetcher's load, on its own loader thread, so a client's (foreground) load never
        queues behind a prefetch batch. Foreground loads are timed (``INFO prefetch`` ``wait_load``,
        ``wait_queued``).
        """
        store = self.store
        missing = store.missing(keys)
        if not missing:
            return True
        ticket: LoadTicket = store.begin_load(missing)
        assert self.loop is not None
        read = store.probe_lower if meta else store.read_lower
        started: list[int] = []

        def timed(t: LoadTicket) -> dict[bytes, Any]:
            started.append(time.perf_counter_ns())  # when a loader thread took it: the queueing it suffered
            return read(t)

        t0 = time.perf_counter_ns()
        found = store.read_inline(ticket, probe=meta)
        if found is not None:
            if not background:
                self.prefetcher.waits.add("load", (time.perf_counter_ns() - t0) // 1000)
            return self._finish_load(ticket, found, keys, meta)
        try:
            found = await self.loop.run_in_executor(self._prefetch_io if background else self._io,
                                                    read if background else timed, ticket)
        except BaseException:
            store.cancel_load(ticket)
            raise
        if not background:
            waits = self.prefetcher.waits
            waits.add("load", (time.perf_counter_ns() - t0) // 1000)
            waits.add("queued", (started[0] - t0) // 1000 if started else 0)
        return self._finish_load(ticket, found, keys, meta)

    def _finish_load(self, ticket: LoadTicket, found: dict[bytes, Any], keys: list[bytes], meta: bool) -> bool:
        store = self.store
        if meta:
            return store.finish_probe(ticket, found) and all(store.probed(k) for k in keys)
        return store.finish_load(ticket, found) and all(store.loaded(k) for k in keys)

    # ---- configuration at run time ----
    def apply_config(self) -> None:
        store = self.store
        store.dram.budget = int(self.config.get("dram-size"))
        store.noeviction = self.config.get("maxmemory-policy") == "noeviction"
        store.admission.hits = int(self.config.get("promote-hits"))
        store.admission.window_ms = int(float(self.config.get("promote-window")) * 1000)
        store.hot_max_fraction = float(self.config.get("hot-max-fraction"))
        store.prefetch_protect = float(self.config.get("prefetch-protect"))
        store.profile_min_bytes = int(self.config.get("prefetch-min-value"))
        store.chain_evict = bool(self.config.get("chain-evict")) and store.predictor is not None
        store.head_keep = float(self.config.get("head-keep"))
        store.inline_max = int(self.config.get("ssd-inline-max"))
        self.prefetcher.along = int(self.config.get("prefetch-along"))
        self.saves.configured()
        if store.predictor is not None:
            store.predictor.min_confidence = float(self.config.get("prefetch-min-confidence"))
            store.predictor.set_half_life(float(self.config.get("prefetch-half-life")))
            store.predictor.link_window = float(self.config.get("prefetch-link-window"))
        if store.ssd is not None:
            store.ssd.stuck_limit = int(self.config.get("ssd-write-queue"))
            store.ssd.set_writer_pause(int(self.config.get("ssd-writer-pause")))
            store.ssd.key_filter.lookups = bool(self.config.get("ssd-key-filter"))
        self.acl.on_requirepass(self.config.get("requirepass"))
        self.acl.log_max = int(self.config.get("acllog-max-len"))
        self.acl.pubsub_default = self.config.get("acl-pubsub-default") == "allchannels"
        self._latency_settings()
        self.slow_usec = int(self.config.get("slowlog-log-slower-than"))
        self.ssd_write_queue = int(self.config.get("ssd-write-queue"))
        self.slowlog.max_len = int(self.config.get("slowlog-max-len"))
        self._notifications()
        self.tracking.max_keys = int(self.config.get("tracking-table-max-keys"))
        self.client_eviction.configure(str(self.config.get("maxmemory-clients")), int(self.config.get("dram-size")))
        if store.pool is not None:
            store.pool.forwarding = bool(self.config.get("pool-pubsub"))
        dataplane.apply_config(self)
        for conn in self.clients.values():
            conn.parser.refresh()
        if store.dram.used > store.dram.budget:
            try:
                store.make_room(0)
            except Exception as exc:  # a smaller budget that cannot be met now is met as keys go
                log.warning("could not shrink DRAM to the new budget yet: %s", exc)

    def error_replied(self, message: str) -> None:
        """An error reply went out (INFO stats total_error_replies and errorstats)."""
        self.stats.errors += 1
        count_error(self.error_codes, message)

    def _latency_settings(self) -> None:
        """latency-tracking and latency-tracking-info-percentiles as the command path and INFO read them."""
        self.latency_tracking = bool(self.config.get("latency-tracking"))
        self.latency_percentiles = [float(p) for p in str(self.config.get("latency-tracking-info-percentiles")).split()]

    def clients_memory(self) -> int:
        """What all clients hold now (the sum of CLIENT LIST's tot-mem): INFO mem_clients_normal, /metrics."""
        return sum(conn.memory()[5] for conn in list(self.clients.values()))

    def reset_stats(self) -> None:
        self.stats.reset()
        self.error_codes.clear()
        for counts in self.command_counts.values():
            counts.reset()

    def snapshot(self) -> dict[str, Any]:
        """Every counter, tier and command statistic as one JSON-ready dict (the schema of /stats.json)."""
        return self.observability.snapshot_json()

    @property
    def commands_processed(self) -> int:
        # Containers count no calls of their own for their subcommands: every (sub)command row is summed.
        return self.stats.unknown + sum(c.calls for c in self.command_counts.values())

    # ---- background work ----
    async def _cron(self) -> None:
        last_second = time.monotonic()
        while True:
            hz = max(1, min(500, int(self.config.get("hz"))))
            await asyncio.sleep(1 / hz)
            self.now_ms = self.store.clock.now_ms()
            try:
                if not self.pause.active():  # as Redis: keys do not expire actively during a pause
                    self.store.active_expire(int(self.config.get("active-expire-keys")))
                dataplane.tick(self)
                self.stats.peak_memory = max(self.stats.peak_memory, self.store.dram.used)
                now = time.monotonic()
                if self.resync.due(now):  # every tick: a missed invalidation is looked for as soon as possible
                    self.resync.start()
                if now - last_second >= 1.0:
                    last_second = now
                    self._every_second()
            except Exception:
                log.exception("background cycle failed")

    def _every_second(self) -> None:
        store = self.store
        pool = store.pool
        if pool is not None:
            pool.expire_index()
            if pool.probe_due():
                self._probe_pool(pool)
        if not self.pause.active():
            store.sweep_lower()
        if self.saves.due(time.monotonic()):
            log.info("%s: background saving started", "BGSAVE SCHEDULE" if self.saves.scheduled else
                     f"{self.saves.changes} changes since the last save (save points: {self.config.get('save')})")
            self.saves.start()
        if store.ssd is not None:
            if store.ssd.stuck:
                store.ssd.retry_stuck()
            if store.ssd.fsync == "everysec":
                assert self.loop is not None
                self.loop.run_in_executor(self._io, store.ssd.env.sync, True)
        timeout = int(self.config.get("timeout"))
        if timeout > 0:
            limit = self.now_ms - timeout * 1000
            for conn in list(self.clients.values()):
                if conn.client.last_ms < limit and not conn.busy:
                    conn.kill()

    def _probe_pool(self, pool: PoolTier) -> None:
        """Retry a degraded pool off the loop; its backoff decides when the next probe is due."""
        assert self.loop is not None
        pool.probing = True
        fut = self.loop.run_in_executor(self._io, pool.probe)

        def done(f: asyncio.Future[bool]) -> None:
            pool.probing = False
            if not f.cancelled() and f.exception() is not None:
                log.error("pool probe failed: %s", f.exception())

        fut.add_done_callback(done)

    def _notifications(self) -> None:
        """notify-keyspace-events, at start and on CONFIG SET; the store reports read misses only while class m
        (keymiss) is on, and the keys writes create only while class n (new) is on."""
        self.notifier.configure(self.config.get("notify-keyspace-events"))
        flags = self.notifier.flags
        # keymiss: a counted read found nothing (Store.count_read); new: a write created its key (Store.put,
        # before the command's own event, as Redis's dbAdd).
        store, event = self.store, self._command_event
        store.on_miss = functools.partial(event, KEY_MISS, b"keymiss") if flags & KEY_MISS else None
        store.on_new = functools.partial(event, NEW, b"new") if flags & NEW else None

    def _command_event(self, cls: int, event: bytes, key: bytes) -> None:
        """An event the store saw while running a command, on the loop: sent behind that client's pending replies
        (as ``notify`` sends a handler's)."""
        self.notifier.emit(cls, event, key, self.clients.get(self.store.command.stream))

    def _store_event(self, event: bytes, key: bytes) -> None:
        """A key expired or the last tier evicted it (the store's ``on_event``): keyspace notifications and
        client-side caching's invalidations, on the loop (an event from a loader or writer thread is handed there;
        none is when nobody wants it)."""
        if not (self.notifier.wants(event) or self.tracking.clients):
            return
        if self.loop is not None and threading.get_ident() != self._loop_thread:
            self.loop.call_soon_threadsafe(self._store_event, event, bytes(key))
            return
        self.notifier.from_store(event, key)
        if self.tracking.clients:
            self.tracking.modified(bytes(key))

    def request_shutdown(self) -> None:
        self._shutdown.set()

    # ---- lifecycle ----
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        loop = self.loop
        ssd = self.store.ssd
        pool = self.store.pool

        def deliver_pool(fn: Any) -> None:
            def run() -> None:
                fn()
                self._on_pool_commit()

            loop.call_soon_threadsafe(run)

        # Every tier's writer thread hands its completions to the loop; the pool's also wake its waiters.
        for tier in self.store.lower:
            tier.set_delivery(deliver_pool if tier is pool else (lambda fn: loop.call_soon_threadsafe(fn)))
        if ssd is not None:
            ssd.on_commit = self._on_ssd_commit
        if pool is not None:
            # Messages other nodes PUBLISHed, for this node's subscribers (engine/tiers/pool_pubsub.py).
            pool.on_publish = lambda channel, message: self.pubsub.publish(channel, message)
            pool.start_invalidation()
        hosts = [h for h in str(self.config.get("bind")).split() if h]
        backlog = int(self.config.get("tcp-backlog"))
        # The HTTP endpoint first: once the RESP port answers, /metrics does too.
        await self.observability.start()
        # The TLS port and the Unix socket before the plain port: once the plain port answers (what readiness
        # probes and the tests wait on), every listener does.
        if self.tls_port > 0:
            self._tls_server = await self.loop.create_server(
                lambda: Connection(self), host=hosts or None, port=self.tls_port, reuse_address=True, backlog=backlog,
                ssl=self._tls)
            log.info("TLS on port %d (client certificates: %s)", self.tls_port, self.config.get("tls-auth-clients"))
        self._unix = await dataplane.listen_unix(self, lambda: Connection(self))
        # As in Redis, --port 0 with a TLS port serves TLS only (without one, port 0 picks a free port).
        if self.port != 0 or self.tls_port <= 0:
            self._server = await self.loop.create_server(
                lambda: Connection(self), host=hosts or None, port=self.port, reuse_address=True, backlog=backlog
            )
            if self.port == 0:
                self.port = self._server.sockets[0].getsockname()[1]
        for coro in (self._cron(), self.prefetcher.run()):
            task = asyncio.ensure_future(coro)
            self.tasks.add(task)
        log.info("kvstrata ready to accept connections on %s port %d (DRAM budget %d bytes%s)",
                 ",".join(hosts), self.port, self.store.dram.budget,
                 f", SSD tier at {ssd.path}" if ssd is not None else "")

    async def serve_forever(self) -> None:
        await self.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._shutdown.set)
            except (NotImplementedError, RuntimeError):
                pass
        with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
            # As Redis: a hang-up (the terminal that started it closed) must not kill it with no checkpoint.
            loop.add_signal_handler(signal.SIGHUP, lambda: log.warning("SIGHUP received and ignored, as Redis "
                                                                       "does: SIGTERM or SHUTDOWN stops the server"))
        await self._shutdown.wait()
        await self.close()

    async def close(self) -> None:
        log.info("shutting down")
        if self._server is not None:
            self._server.close()
        if self._tls_server is not None:
            self._tls_server.close()
        if self._unix is not None:
            self._unix.close()
            dataplane.close_unix(self)
        await self.observability.close()
        for conn in list(self.clients.values()):
            conn.kill()
        for task in list(self.tasks):
            task.cancel()
        store = self.store
        if store.pool is not None:
            store.pool.close()
            self._on_pool_commit()
        if store.ssd is not None:
            # Write-back data that lives only in DRAM goes down to SSD, so a clean restart finds every key.
            store.ssd.retry_stuck()  # failed writes get one more try (a disk with room again)
            store.checkpoint()
            await self.wait_commit(store.ssd.barrier())
            if store.ssd.stuck:
                log.error("%d acknowledged writes could not be written to the SSD tier (%s) and are lost",
                          len(store.ssd.stuck), store.ssd.degraded)
        for tier in store.lower:
            if tier is not store.pool:
                tier.close()
        self._io.shutdown(wait=False)
        self._prefetch_io.shutdown(wait=False)
        self._cpu.shutdown(wait=False)
        if self.copy_helper is not None:
            self.copy_helper.shutdown(wait=False)
        log.info("bye")
