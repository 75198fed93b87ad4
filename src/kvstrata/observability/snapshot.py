"""One snapshot of every number the server exposes: the schema of ``/stats.json``, read by ``/metrics``.

A snapshot is built on the event loop (the counters are plain Python objects owned by the loop), so it must
stay cheap: everything here is O(number of commands + number of tiers), except the key-prefix estimate, which
samples at most ``PREFIX_SAMPLE`` DRAM keys, and the key count, which is exact up to ``EXACT_KEYS_LIMIT`` DRAM
entries and estimated from the same sample above that.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from typing import Any

from kvstrata import __version__
from kvstrata.observability.latency import cumulative_usec, quantile_usec
from kvstrata.redact import public_args

SCHEMA_VERSION = 1
# Keys sampled from DRAM for the top-prefixes table (and the key-count estimate on huge keyspaces).
PREFIX_SAMPLE = 2000
TOP_PREFIXES = 10
# Up to this many DRAM entries the key count is exact (a pass over the DRAM dict); above it, estimated.
EXACT_KEYS_LIMIT = 100_000
NO_PREFIX = "(no prefix)"
SCAN_BUCKETS = 4096


def key_prefix(key: bytes) -> str:
    """The key up to and including its first ``:`` or ``{`` after the first byte; ``(no prefix)`` if none.

    ``user:42`` -> ``user:``; ``{doc7}:chunk:3`` -> ``{doc7}:`` (a leading hash tag stays whole);
    ``kv{s1}x`` -> ``kv{``.
    """
    head = key[:128]
    cut = -1
    for sep in (b":", b"{"):
        i = head.find(sep, 1)
        if i >= 0 and (cut < 0 or i < cut):
            cut = i
    if cut < 0:
        return NO_PREFIX
    return head[: cut + 1].decode("utf-8", errors="backslashreplace")


def sample_dram(dram: Any, limit: int = PREFIX_SAMPLE, rng: random.Random | None = None) -> list[bytes]:
    """Up to ``limit`` DRAM keys: whole scan buckets from a random start (keys are spread by CRC-32, so
    consecutive buckets are an unbiased sample). All keys when the tier holds no more than ``limit``."""
    entries = dram.entries
    if len(entries) <= limit:
        return list(entries)
    buckets = dram.buckets
    start = (rng or random).randrange(SCAN_BUCKETS)
    out: list[bytes] = []
    for i in range(SCAN_BUCKETS):
        keys = buckets.get((start + i) % SCAN_BUCKETS)
        if keys:
            out.extend(keys)
            if len(out) >= limit:
                break
    return out


def top_prefixes(dram: Any, sample: Sequence[bytes], top: int = TOP_PREFIXES) -> dict[str, Any]:
    """Bytes and keys per key prefix in DRAM, scaled up from ``sample`` to the whole tier."""
    entries = dram.entries
    groups: dict[str, list[int]] = {}
    for key in sample:
        entry = entries.get(key)
        if entry is None:
            continue
        g = groups.get(prefix := key_prefix(key))
        if g is None:
            g = groups[prefix] = [0, 0]
        g[0] += 1
        g[1] += dram.size(key, entry.value)
    total = len(entries)
    exact = len(sample) >= total
    scale = 1.0 if exact or not sample else total / len(sample)
    ranked = sorted(groups.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top]
    return {
        "sampled_keys": len(sample),
        "total_keys": total,
        "exact": exact,
        "top": [{"prefix": p, "keys": round(k * scale), "bytes": round(b * scale)} for p, (k, b) in ranked],
    }


def count_keys(store: Any, sample: Sequence[bytes]) -> tuple[int, bool]:
    """(number of keys over all tiers, estimated?). DRAM copies of SSD records count once."""
    dram = store.dram
    ssd = store.ssd
    if ssd is None:
        return len(dram.entries), False
    entries = dram.entries
    if len(entries) <= EXACT_KEYS_LIMIT:
        both = sum(1 for e in entries.values() if e.on_ssd)
        return len(entries) + len(ssd) - both, False
    seen = [entries[k].on_ssd for k in sample if k in entries]
    both = round(len(entries) * (sum(seen) / len(seen))) if seen else 0
    return len(entries) + len(ssd) - both, True


def command_rows(command_counts: dict[Any, Any]) -> list[dict[str, Any]]:
    """Every command that ran, busiest first: calls, failures, total µs, quantiles and the histogram."""
    rows = []
    for spec, st in command_counts.items():
        if not (st.calls or st.failed or st.rejected):
            continue
        hist = list(st.hist)
        timed = sum(hist)
        rows.append({
            "name": spec.full_name,
            "calls": st.calls,
            "failed": st.failed,
            "rejected": st.rejected,
            "usec": st.usec,
            "usec_per_call": round(st.usec / timed, 3) if timed else 0.0,
            "timed": timed,
            "p50_usec": round(quantile_usec(hist, 0.50), 3),
            "p99_usec": round(quantile_usec(hist, 0.99), 3),
            "p999_usec": round(quantile_usec(hist, 0.999), 3),
            "histogram_usec": [[le, n] for le, n in cumulative_usec(hist)],
            "fast": "fast" in spec.flags,
            "subcommand": spec.parent is not None,
            "_hist": hist,
        })
    rows.sort(key=lambda r: (-r["calls"], r["name"]))
    return rows


def hits_misses(store: Any) -> tuple[int, int]:
    """Keyspace hits and misses as INFO reports them: reads Redis would count, found in any tier or in none."""
    return store.stats.keyspace_hits, store.stats.keyspace_misses


def tier_rows(store: Any) -> list[dict[str, Any]]:
    rows = []
    for info in store.tier_info():
        used, budget = int(info["used"]), int(info["budget"])
        row = {
            "name": info["name"],
            "used_bytes": used,
            "budget_bytes": budget,
            "water_level": round(used / budget, 6) if budget else 0.0,
            "keys": int(info["keys"]),
        }
        for field in ("hits", "misses", "promotions", "demotions", "evictions", "corrupt_reads"):
            row[field] = int(info.get(field, 0))
        for field in ("pinned_bytes", "pending", "queued_bytes", "write_errors", "expired", "reads",
                      "probes", "reads_inline", "inline_declined", "inline_unknown", "inline_moved",
                      "inline_direct", "writer_pauses", "unreadable_pages", "writes", "write_bytes",
                      "key_filter", "key_filter_keys", "key_filter_bytes", "key_filter_absent", "key_filter_scans"):
            if field in info:
                row[field] = int(info[field])
        rows.append(row)
    return rows


def expired_keys(store: Any) -> int:
    """Keys expired any way: lazily or by the DRAM sweep (engine counter) and by the SSD reclaim pass."""
    n = store.stats.expired_keys
    if store.ssd is not None:
        n += store.ssd.expired
    return n


def _persistence(server: Any) -> dict[str, Any]:
    """Saves of write-back DRAM to the SSD tier (kvstrata.server.saves), as INFO persistence has them."""
    saves = server.saves
    return {
        "changes_since_last_save": saves.changes,
        "last_save_time": saves.last_save,
        "last_save_ok": saves.last_ok,
        "saves": saves.count,
        "save_in_progress": saves.running,
    }


def build(server: Any, *, history: dict[str, Any] | None = None, rng: random.Random | None = None,
          include_hist: bool = False) -> dict[str, Any]:
    """The snapshot of a running ``kvstrata.server.app.Server`` (duck-typed: only its attributes are read).

    ``include_hist`` keeps each command's raw histogram under ``_hist`` (the Prometheus collector uses it);
    the JSON form drops it.
    """
    store = server.store
    config = server.config
    sample = sample_dram(store.dram, rng=rng)
    keys, keys_estimated = count_keys(store, sample)
    hits, misses = hits_misses(store)
    stats = server.stats
    commands = command_rows(server.command_counts)
    if not include_hist:
        for row in commands:
            del row["_hist"]
    slowlog = server.slowlog
    prefetcher = server.prefetcher
    http_port = getattr(getattr(server, "observability", None), "http_port", 0)
    snap: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "time": round(time.time(), 3),
        "server": {
            "version": __version__,
            "run_id": server.run_id,
            "pid": os.getpid(),
            "uptime_seconds": round(time.monotonic() - server.started, 3),
            "port": server.port,
            "http_port": http_port,
            "tiered": store.ssd is not None,
            "eviction_policy": config.get("eviction-policy"),
            "maxmemory_policy": config.get("maxmemory-policy"),
            "durability": config.get("durability"),
        },
        "persistence": _persistence(server),
        "keys": keys,
        "keys_estimated": keys_estimated,
        "version_counter": store.version,
        "tiers": tier_rows(store),
        "keyspace": {
            "hits": hits,
            "misses": misses,
            "hit_ratio": round(hits / (hits + misses), 6) if hits + misses else None,
            "expired_keys": expired_keys(store),
            "evicted_keys": store.stats.evicted_keys,
            "pin_rejected": store.stats.pin_rejected,
            "ssd_sync_reads": store.sync_reads,
        },
        "clients": {
            "connected": len(server.clients),
            "connections_received": stats.connections,
            "rejected": stats.rejected,
            "output_limit_closed": getattr(stats, "output_limit_closed", 0),
            "evicted": stats.evicted_clients,
            "memory": server.clients_memory(),
            "memory_limit": server.client_eviction.limit,
            "blocked": server.blocked_clients,
            "tracking": server.tracking.clients,
        },
        # Channels, patterns and shard channels with subscribers; keys and BCAST prefixes CLIENT TRACKING holds.
        "pubsub": dict(zip(("channels", "patterns", "shard_channels"), server.pubsub.sizes(), strict=True)),
        "tracking": dict(zip(("keys", "items", "prefixes"), server.tracking.sizes(), strict=True)),
        "net": {"input_bytes": stats.net_in, "output_bytes": stats.net_out},
        "commands_processed": server.commands_processed,
        "errors": {
            "error_replies": stats.errors,
            "protocol_errors": stats.protocol_errors,
            "unknown_commands": stats.unknown,
            "by_code": dict(server.error_codes),
        },
        "commands": commands,
        "prefetch": {
            "queue_depth": len(prefetcher),
            "capacity": prefetcher.capacity,
            "queued": store.stats.prefetch_queued,
            "promoted": store.stats.prefetch_done,
            "dropped": prefetcher.dropped,
            **{k.removeprefix("prefetch_"): v for k, v in store.prefetch_info().items()},
        },
        "slowlog": {
            "length": len(slowlog.entries),
            "total": slowlog.next_id,
            "threshold_usec": server.slow_usec,
            "max_len": slowlog.max_len,
            "latest": [
                {"id": e.id, "time": e.when, "usec": e.usec,
                 # The command's name and argument count only: keys and values stay off the HTTP side.
                 "args": public_args(e.args),
                 "client": e.client_addr}
                for e in list(slowlog.entries)[:5]
            ],
        },
        "prefixes": top_prefixes(store.dram, sample),
    }
    pool = getattr(store, "pool", None)
    if pool is not None:  # the shared cluster pool tier, when the node runs with one
        snap["pool"] = {"degraded": getattr(pool, "degraded", None) is not None,
                        "errors": int(getattr(pool, "errors", 0) or 0),
                        # every numeric pool counter (PoolTier.info), for /metrics
                        "counters": {k: v for k, v in pool.info().items()
                                     if isinstance(v, int) and not isinstance(v, bool) and k not in ("errors", "degraded")}}
    if history is not None:
        snap["history"] = history
    return snap
