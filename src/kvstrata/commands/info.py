"""The INFO report: sections built from the engine's and server's counters."""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

from kvstrata import __version__
from kvstrata.commands.context import Context
from kvstrata.observability import memory
from kvstrata.observability.latency import latencystats_line
from kvstrata.observability.snapshot import hits_misses
from kvstrata.sizes import format_size

Section = Callable[[Context], list[tuple[str, Any]]]


def _server(ctx: Context) -> list[tuple[str, Any]]:
    srv = ctx.server
    uptime = int(time.monotonic() - srv.started) if srv is not None else 0
    from kvstrata.commands.connection import REDIS_COMPAT_VERSION

    return [
        ("redis_version", REDIS_COMPAT_VERSION),
        ("kvstrata_version", __version__),
        ("redis_mode", "standalone"),
        ("os", f"{platform.system()} {platform.release()} {platform.machine()}"),
        ("arch_bits", 64 if sys.maxsize > 2**32 else 32),
        ("multiplexing_api", "uvloop" if srv is not None and srv.uvloop else "asyncio"),
        ("python_version", platform.python_version()),
        ("process_id", os.getpid()),
        ("run_id", srv.run_id if srv is not None else ""),
        ("tcp_port", ctx.config.get("port")),
        ("uptime_in_seconds", uptime),
        ("uptime_in_days", uptime // 86400),
        ("hz", ctx.config.get("hz")),
        ("executable", sys.argv[0]),
        ("config_file", (srv.config_file or "") if srv is not None else ""),
    ]


def _client_memory(ctx: Context) -> list[tuple[int, int, int, int, int, int]]:
    """Each connected client's (qbuf, qbuf-free, argv-mem, oll, omem, tot-mem)."""
    if ctx.server is None:
        return []
    return [conn.memory() for conn in list(ctx.server.clients.values())]


def _clients(ctx: Context) -> list[tuple[str, Any]]:
    n = len(ctx.server.clients) if ctx.server is not None else 1
    mem = _client_memory(ctx)
    return [
        ("connected_clients", n),
        ("cluster_connections", 0),
        ("maxclients", ctx.config.get("maxclients")),
        ("client_recent_max_input_buffer", max((m[0] + m[2] for m in mem), default=0)),
        ("client_recent_max_output_buffer", max((m[4] for m in mem), default=0)),
        ("blocked_clients", ctx.server.blocked_clients if ctx.server is not None else 0),
        ("tracking_clients", ctx.server.tracking.clients if ctx.server is not None else 0),
        ("clients_in_timeout_table", 0),
    ]


def _memory(ctx: Context) -> list[tuple[str, Any]]:
    store = ctx.store
    dram = store.dram
    m = memory.figures(store, ctx.server)
    system = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rows: list[tuple[str, Any]] = [
        ("used_memory", m.used),
        ("used_memory_human", format_size(m.used)),
        ("used_memory_rss", m.rss),
        ("used_memory_rss_human", format_size(m.rss)),
        ("used_memory_peak", m.peak),
        ("used_memory_peak_human", format_size(m.peak)),
        ("used_memory_peak_perc", f"{100.0 * m.used / m.peak:.2f}%" if m.peak else "0.00%"),
        ("used_memory_peak_rss", memory.rss_peak()),
        ("used_memory_overhead", m.overhead),
        ("used_memory_dataset", m.dataset),
        ("used_memory_dataset_perc", f"{100.0 * m.dataset / m.used:.2f}%" if m.used else "0.00%"),
        ("total_system_memory", system),
        ("total_system_memory_human", format_size(system)),
        ("maxmemory", dram.budget),
        ("maxmemory_human", format_size(dram.budget)),
        ("maxmemory_policy", ctx.config.get("maxmemory-policy")),
        ("eviction_policy", ctx.config.get("eviction-policy")),
        ("water_level_pct", _pct(dram.used, dram.budget)),
        ("mem_fragmentation_ratio", f"{m.fragmentation:.2f}"),
        ("mem_fragmentation_bytes", m.rss - m.used),
        # What clients hold besides the data: pending requests, replies not yet sent, per-connection objects.
        ("mem_clients_normal", m.clients),
        ("mem_clients_slaves", 0),
        ("mem_allocator", "libc"),
    ]
    bufpool = store.dram.bufpool
    if bufpool is not None:
        rows.extend(bufpool.info().items())
    for tier in store.tier_info():
        rows.append((f"{tier['name']}_used", tier["used"]))
        rows.append((f"{tier['name']}_budget", tier["budget"]))
        rows.append((f"{tier['name']}_water_level_pct", _pct(tier["used"], tier["budget"])))
    return rows


def _pct(used: int, budget: int) -> str:
    return f"{100.0 * used / budget:.2f}" if budget else "0.00"


def _stats(ctx: Context) -> list[tuple[str, Any]]:
    store = ctx.store
    srv = ctx.server
    rows: list[tuple[str, Any]] = []
    if srv is not None:
        s = srv.stats
        ops, kib_in, kib_out = srv.observability.history.instantaneous()
        rows += [
            ("total_connections_received", s.connections),
            ("total_commands_processed", srv.commands_processed),
            ("instantaneous_ops_per_sec", int(ops)),
            ("total_net_input_bytes", s.net_in),
            ("total_net_output_bytes", s.net_out),
            ("instantaneous_input_kbps", f"{kib_in:.2f}"),
            ("instantaneous_output_kbps", f"{kib_out:.2f}"),
            ("rejected_connections", s.rejected),
            ("client_query_buffer_limit_disconnections", s.query_limit_closed),
            ("client_output_buffer_limit_disconnections", s.output_limit_closed),
            ("total_error_replies", s.errors),
            ("protocol_errors", s.protocol_errors),
        ]
    e = store.stats
    hits, misses = hits_misses(store)
    rows += [
        ("expired_keys", e.expired_keys),
        ("evicted_keys", e.evicted_keys),
        ("evicted_clients", srv.stats.evicted_clients if srv is not None else 0),
        ("keyspace_hits", hits),
        ("keyspace_misses", misses),
        *zip(("pubsub_channels", "pubsub_patterns", "pubsubshard_channels"),
             srv.pubsub.sizes() if srv is not None else (0, 0, 0), strict=True),
        *zip(("tracking_total_keys", "tracking_total_items", "tracking_total_prefixes"),
             srv.tracking.sizes() if srv is not None else (0, 0, 0), strict=True),
        ("prefetch_queued", e.prefetch_queued),
        ("prefetch_done", e.prefetch_done),
        ("prefetch_dropped", srv.prefetcher.dropped if srv is not None else 0),
        ("prefetch_queue_depth", len(srv.prefetcher) if srv is not None else 0),
        ("pin_rejected", e.pin_rejected),
        ("ssd_sync_reads", store.sync_reads),
        ("current_version", store.version),
    ]
    return rows


def _keyspace(ctx: Context) -> list[tuple[str, Any]]:
    n = ctx.store.dbsize()
    if n == 0:
        return []
    expires = sum(1 for e in ctx.store.dram.entries.values() if e.expire_at)
    return [("db0", f"keys={n},expires={expires},avg_ttl=0")]


def _tier(name: str) -> Section:
    def section(ctx: Context) -> list[tuple[str, Any]]:
        for tier in ctx.store.tier_info():
            if tier["name"] == name:
                rows = [(k, v) for k, v in tier.items() if k != "name"]
                rows.append(("water_level_pct", _pct(tier["used"], tier["budget"])))
                return rows
        return []

    return section


def _prefetch(ctx: Context) -> list[tuple[str, Any]]:
    """Prefetch outcomes (issued, used, late, wasted, accuracy, coverage) and the predictor's state."""
    rows: list[tuple[str, Any]] = list(ctx.store.prefetch_info().items())
    if ctx.server is not None:
        rows.append(("prefetch_queue_depth", len(ctx.server.prefetcher)))
        rows += ctx.server.prefetcher.waits.info()  # what reads below DRAM waited for (server/read_waits.py)
    return rows


def _commandstats(ctx: Context) -> list[tuple[str, Any]]:
    if ctx.server is None:
        return []
    rows = []
    for spec, st in sorted(ctx.server.command_counts.items(), key=lambda kv: kv[0].full_name):
        if st.calls or st.failed or st.rejected:
            per_call = st.usec / st.calls if st.calls else 0.0
            rows.append((f"cmdstat_{spec.full_name}", f"calls={st.calls},usec={st.usec},usec_per_call={per_call:.2f},"
                                                     f"rejected_calls={st.rejected},failed_calls={st.failed}"))
    return rows


def _latencystats(ctx: Context) -> list[tuple[str, Any]]:
    """Redis 7's format: ``latency_percentiles_usec_<cmd>:p50=...,p99=...,p99.9=...`` (µs, interpolated within
    the power-of-two histogram buckets; see kvstrata.observability.latency)."""
    if ctx.server is None:
        return []
    rows = []
    for spec, st in sorted(ctx.server.command_counts.items(), key=lambda kv: kv[0].full_name):
        if any(st.hist):
            rows.append((f"latency_percentiles_usec_{spec.full_name}",
                         latencystats_line(st.hist, ctx.server.latency_percentiles)))
    return rows


def _cpu(ctx: Context) -> list[tuple[str, Any]]:
    """The process's CPU times in seconds, as Redis reports them (main thread: the event loop's thread)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = [
        ("used_cpu_sys", f"{me.ru_stime:.6f}"),
        ("used_cpu_user", f"{me.ru_utime:.6f}"),
        ("used_cpu_sys_children", f"{children.ru_stime:.6f}"),
        ("used_cpu_user_children", f"{children.ru_utime:.6f}"),
    ]
    thread = getattr(resource, "RUSAGE_THREAD", None)
    if thread is not None:
        main = resource.getrusage(thread)
        rows += [("used_cpu_sys_main_thread", f"{main.ru_stime:.6f}"),
                 ("used_cpu_user_main_thread", f"{main.ru_utime:.6f}")]
    return rows


def _persistence(ctx: Context) -> list[tuple[str, Any]]:
    """Redis's fields, for the checkpoints of write-back DRAM to the SSD tier (kvstrata.server.saves)."""
    saves = ctx.server.saves if ctx.server is not None else None
    started = saves.started if saves is not None else None
    return [
        ("loading", 0),
        ("async_loading", 0),
        ("rdb_changes_since_last_save", saves.changes if saves is not None else ctx.store.changes),
        ("rdb_bgsave_in_progress", int(started is not None)),
        ("rdb_last_save_time", saves.last_save if saves is not None else 0),
        ("rdb_last_bgsave_status", "ok" if saves is None or saves.last_ok else "err"),
        ("rdb_last_bgsave_time_sec", saves.last_duration if saves is not None else -1),
        ("rdb_current_bgsave_time_sec", int(time.monotonic() - started) if started is not None else -1),
        ("rdb_saves", saves.count if saves is not None else 0),
        ("aof_enabled", 0),
        ("aof_rewrite_in_progress", 0),
        ("aof_rewrite_scheduled", 0),
    ]


def _replication(ctx: Context) -> list[tuple[str, Any]]:
    # A kvstrata node has no replicas (nodes share data through the pool, which they are clients of).
    return [
        ("role", "master"),
        ("connected_slaves", 0),
        ("master_failover_state", "no-failover"),
        ("master_replid", ctx.server.replid if ctx.server is not None else "0" * 40),
        ("master_replid2", "0" * 40),
        ("master_repl_offset", 0),
        ("second_repl_offset", -1),
        ("repl_backlog_active", 0),
    ]


def _errorstats(ctx: Context) -> list[tuple[str, Any]]:
    codes = ctx.server.error_codes if ctx.server is not None else {}
    return [(f"errorstat_{code}", f"count={n}") for code, n in sorted(codes.items())]


def _cluster(ctx: Context) -> list[tuple[str, Any]]:
    # kvstrata nodes are standalone (the shared pool may be a Redis Cluster, which kvstrata is a client of).
    return [("cluster_enabled", 0)]


SECTIONS: dict[str, Section] = {
    "server": _server,
    "clients": _clients,
    "memory": _memory,
    "persistence": _persistence,
    "stats": _stats,
    "replication": _replication,
    "cpu": _cpu,
    "errorstats": _errorstats,
    "cluster": _cluster,
    "keyspace": _keyspace,
    "tier_dram": _tier("dram"),
    "tier_ssd": _tier("ssd"),
    "prefetch": _prefetch,
    "commandstats": _commandstats,
    "latencystats": _latencystats,
    "tier_pool": _tier("pool"),
}
DEFAULT = ["server", "clients", "memory", "persistence", "stats", "replication", "cpu", "errorstats", "cluster",
           "tier_dram", "tier_ssd", "prefetch", "keyspace"]
_TITLES = {"cpu": "CPU"}


def render(ctx: Context, names: list[str]) -> str:
    wanted: list[str] = []
    tiers = {t.name for t in ctx.store.lower}  # every lower tier has its section (tier_<name>)
    for name in names or ["default"]:
        name = name.lower()
        if name == "default":
            wanted += DEFAULT
        elif name in ("all", "everything"):
            wanted += list(SECTIONS) + [f"tier_{t.name}" for t in ctx.store.lower]
        elif name in SECTIONS or (name.startswith("tier_") and name[5:] in tiers):
            wanted.append(name)
    parts: list[str] = []
    seen: set[str] = set()
    for name in wanted:
        if name in seen:
            continue
        seen.add(name)
        if name in ("tier_ssd", "prefetch") and ctx.store.ssd is None:
            continue
        rows = SECTIONS[name](ctx) if name in SECTIONS else _tier(name[5:])(ctx)
        title = _TITLES.get(name) or (name.capitalize() if not name.startswith("tier_") else "Tier_" + name[5:])
        parts.append(f"# {title}\r\n" + "".join(f"{k}:{v}\r\n" for k, v in rows))
    return "\r\n".join(parts)
