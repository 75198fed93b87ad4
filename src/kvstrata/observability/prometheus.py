"""Prometheus metrics: a custom ``prometheus_client`` collector that turns one snapshot into metric families.

Nothing is registered with ``prometheus_client``'s global registry and no client-library metric object is
touched on the hot path: at scrape time ``collect()`` asks for a snapshot (``snapshot.build``) and yields
families from it. Names follow the Prometheus conventions: the ``kvstrata_`` prefix, base units (bytes,
seconds) in the name, ``_total`` on counters (the client library adds it).

Per-command latency comes from the power-of-two microsecond histograms: cumulative bucket ``i`` has
``le = 2**i`` µs, written in seconds, for ``i`` in ``0..LE_BUCKETS-1``; slower commands fall in ``+Inf``. The
bucket set is fixed so that ``rate()`` and ``histogram_quantile()`` work across scrapes.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from typing import Any

from kvstrata.observability.latency import cumulative_usec

LE_BUCKETS = 25  # 1 µs .. 2**24 µs (16.8 s)
POOL_GAUGES = frozenset({"pending", "queued_bytes", "degraded", "ttl_ms", "deletes_to_replay",
                         "masters_degraded", "acks_held", "invalidation_subscribed", "resync_running",
                         "resync_last_ms", "resync_pending"})
POOL_DEGRADED = "kvstrata_pool_degraded"  # alerted on in deploy/prometheus/alerts.yml; only with a pool tier

TIER_COUNTERS = (
    ("hits", "Lookups answered by this tier."),
    ("misses", "Lookups this tier could not answer."),
    ("promotions", "Entries moved up out of this tier into a faster one."),
    ("demotions", "Entries moved down out of this tier into a slower one."),
    ("evictions", "Entries dropped by this tier (the last tier) to stay within its budget."),
    ("corrupt_reads", "Records that failed their checksum on read (answered as misses and dropped)."),
)
# Counters only some tiers keep (INFO tier_<name> has them): a family each, with a sample per tier reporting it.
TIER_OPTIONAL_COUNTERS = (
    ("reads", "Records looked up in the tier below DRAM (SSD: LMDB lookups; pool: keys read), found or not: "
              "loads, prefetches and synchronous reads."),
    ("probes", "Record headers looked up below DRAM, no value read (EXISTS, TYPE, the TTL family; "
               "SSD)."),
    ("reads_inline", "Of reads and probes, those done on the event loop: SSD records whose pages were in memory "
                     "(--ssd-inline-max)."),
    ("inline_declined", "Loads that could have been read on the event loop but went to a loader thread: a record's "
                        "place unknown or its pages on the disk, or more bytes than --ssd-inline-max (SSD)."),
    ("inline_unknown", "Of the loads sent to a loader thread instead of the event loop, those for a key whose "
                       "record's place was unknown (never found since a restart, forgotten, or no record at all that the key "
                       "filter could not rule out; SSD)."),
    ("inline_direct", "Of the reads on the event loop, those copied straight out of the memory map at the place "
                      "the SSD writer found the record, without an LMDB lookup (SSD)."),
    ("inline_moved", "Records read on the event loop that had moved since their place was remembered (the residency "
                     "check looked at other pages; SSD)."),
    ("key_filter_absent", "Reads and probes of keys the SSD tier's key filter ruled out: answered with no lookup "
                          "and no loader thread (a key the tier never held; SSD)."),
    ("writer_pauses", "Pauses of the SSD writer thread so that the event loop could take the interpreter (GIL) "
                      "(--ssd-writer-pause)."),
    ("unreadable_pages", "Damaged LMDB pages met by reads and listings (skipped; run `kvstrata check`)."),
    ("expired", "Records the tier dropped because their TTL passed (SSD: the reclaim sweep; pool: its index)."),
    ("writes", "Records written to the tier below DRAM (SSD: committed puts: demotions of entries it lacks, "
               "write-through writes, TTL changes; pool: values written)."),
    ("write_bytes", "Bytes of the values written to the tier below DRAM (SSD: committed puts; pool: values written)."),
)


def _le(usec: int) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(usec / 1e6)


LE_LABELS: list[str] = []


class KvstrataCollector:
    """``collect()`` yields every kvstrata metric family from ``snapshot_fn()``, called once per scrape."""

    def __init__(self, snapshot_fn: Callable[[], dict[str, Any]]) -> None:
        self.snapshot_fn = snapshot_fn

    def describe(self) -> list[Any]:
        return []  # unchecked collector: families are only known at scrape time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        if not LE_LABELS:
            LE_LABELS.extend(_le(2**i) for i in range(LE_BUCKETS))
        snap = self.snapshot_fn()
        srv = snap["server"]

        info = GaugeMetricFamily("kvstrata_build_info", "Always 1; the labels describe the running server.",
                                 labels=["version", "eviction_policy", "durability"])
        info.add_metric([srv["version"], str(srv["eviction_policy"]), str(srv["durability"])], 1)
        yield info
        yield GaugeMetricFamily("kvstrata_uptime_seconds", "Seconds since the server started.",
                                value=srv["uptime_seconds"])
        yield GaugeMetricFamily("kvstrata_keys", "Keys in the keyspace, all tiers (estimated on huge keyspaces).",
                                value=snap["keys"])
        yield GaugeMetricFamily("kvstrata_version_counter",
                                "The per-node version counter: the version the last write got.",
                                value=snap["version_counter"])

        saves = snap["persistence"]
        yield GaugeMetricFamily("kvstrata_changes_since_last_save", "Writes since the last completed save of "
                                "write-back DRAM to the SSD tier (0 under write-through).",
                                value=saves["changes_since_last_save"])
        yield GaugeMetricFamily("kvstrata_last_save_timestamp_seconds", "When the last save completed (the start "
                                "before any), Unix time.", value=saves["last_save_time"])
        yield GaugeMetricFamily("kvstrata_last_save_ok", "1 if the last save wrote everything, 0 if it failed.",
                                value=int(saves["last_save_ok"]))
        yield CounterMetricFamily("kvstrata_saves", "Saves completed (SAVE, BGSAVE, save points).",
                                  value=saves["saves"])

        # ---- tiers ----
        tiers = snap["tiers"]
        for name, help_text, field in (
            ("kvstrata_tier_used_bytes", "Bytes held by the tier (key, value and per-entry overhead).",
             "used_bytes"),
            ("kvstrata_tier_budget_bytes", "The tier's budget in bytes.", "budget_bytes"),
            ("kvstrata_tier_keys", "Entries held by the tier.", "keys"),
        ):
            g = GaugeMetricFamily(name, help_text, labels=["tier"])
            for t in tiers:
                g.add_metric([t["name"]], t[field])
            yield g
        for field, help_text in TIER_COUNTERS:
            c = CounterMetricFamily(f"kvstrata_tier_{field}", help_text, labels=["tier"])
            for t in tiers:
                c.add_metric([t["name"]], t[field])
            yield c
        for field, help_text in TIER_OPTIONAL_COUNTERS:
            c = CounterMetricFamily(f"kvstrata_tier_{field}", help_text, labels=["tier"])
            for t in tiers:
                if field in t:
                    c.add_metric([t["name"]], t[field])
            yield c
        pinned = GaugeMetricFamily("kvstrata_tier_pinned_bytes", "Bytes of pinned (hot) entries.", labels=["tier"])
        for t in tiers:
            if "pinned_bytes" in t:
                pinned.add_metric([t["name"]], t["pinned_bytes"])
        yield pinned
        for t in tiers:
            if t["name"] == "ssd":
                yield GaugeMetricFamily("kvstrata_ssd_write_queue_bytes",
                                        "Bytes of values waiting for the SSD writer.", value=t["queued_bytes"])
                yield GaugeMetricFamily("kvstrata_ssd_pending_writes",
                                        "Keys with a write or delete not yet committed to the SSD tier.",
                                        value=t["pending"])
                yield CounterMetricFamily("kvstrata_ssd_write_errors", "SSD write transactions that failed.",
                                          value=t["write_errors"])
                if "key_filter_bytes" in t:
                    yield GaugeMetricFamily("kvstrata_ssd_key_filter_bytes",
                                            "Memory of the SSD tier's key filter (outside the tier budgets).",
                                            value=t["key_filter_bytes"])

        # ---- keyspace ----
        ks = snap["keyspace"]
        for name, help_text, value in (
            ("kvstrata_keyspace_hits", "Reads that found their key in some tier (as Redis counts them).",
             ks["hits"]),
            ("kvstrata_keyspace_misses", "Reads that found their key in no tier (as Redis counts them).",
             ks["misses"]),
            ("kvstrata_expired_keys", "Keys removed because their TTL passed (any tier).", ks["expired_keys"]),
            ("kvstrata_evicted_keys", "Keys dropped by the last tier to stay within its budget.",
             ks["evicted_keys"]),
            ("kvstrata_pin_rejected", "Pins refused because pinned bytes would pass hot-max-fraction.",
             ks["pin_rejected"]),
            ("kvstrata_ssd_sync_reads", "SSD reads done on the event loop (KEYS, SCAN, RANDOMKEY).",
             ks["ssd_sync_reads"]),
        ):
            yield CounterMetricFamily(name, help_text, value=value)

        # ---- clients and network ----
        cl = snap["clients"]
        yield GaugeMetricFamily("kvstrata_connected_clients", "Client connections open now.", value=cl["connected"])
        yield CounterMetricFamily("kvstrata_connections_received", "Client connections accepted.",
                                  value=cl["connections_received"])
        yield CounterMetricFamily("kvstrata_connections_rejected",
                                  "Client connections refused (maxclients, protected mode).", value=cl["rejected"])
        yield CounterMetricFamily("kvstrata_client_output_limit_disconnections",
                                  "Clients closed for passing client-output-buffer-limit.",
                                  value=cl.get("output_limit_closed", 0))
        yield CounterMetricFamily("kvstrata_evicted_clients", "Clients closed by maxmemory-clients.",
                                  value=cl.get("evicted", 0))
        tracked, subs = snap["tracking"], snap["pubsub"]
        for name, help_text, value in (
            ("kvstrata_blocked_clients", "Clients held by CLIENT PAUSE or blocked in WAIT now.", cl["blocked"]),
            ("kvstrata_clients_memory_bytes", "What all clients hold now: request bytes, arguments, unsent replies "
             "(INFO mem_clients_normal).", cl["memory"]),
            ("kvstrata_clients_memory_limit_bytes", "maxmemory-clients in bytes (0: no limit).", cl["memory_limit"]),
            ("kvstrata_tracking_clients", "Clients with CLIENT TRACKING on now.", cl["tracking"]),
            ("kvstrata_tracking_keys", "Keys CLIENT TRACKING remembers (default mode) now.", tracked["keys"]),
            ("kvstrata_tracking_prefixes", "CLIENT TRACKING BCAST prefixes now.", tracked["prefixes"]),
            ("kvstrata_pubsub_channels", "Pub/Sub channels with a subscriber now.", subs["channels"]),
            ("kvstrata_pubsub_patterns", "Pub/Sub patterns with a subscriber now.", subs["patterns"]),
            ("kvstrata_pubsub_shard_channels", "Pub/Sub shard channels with a subscriber now.",
             subs["shard_channels"]),
        ):
            yield GaugeMetricFamily(name, help_text, value=value)
        yield CounterMetricFamily("kvstrata_net_input_bytes", "Bytes received from clients.",
                                  value=snap["net"]["input_bytes"])
        yield CounterMetricFamily("kvstrata_net_output_bytes", "Bytes sent to clients.",
                                  value=snap["net"]["output_bytes"])

        # ---- commands ----
        yield CounterMetricFamily("kvstrata_commands_processed", "Commands processed, unknown ones included.",
                                  value=snap["commands_processed"])
        err = snap["errors"]
        yield CounterMetricFamily("kvstrata_error_replies", "Error replies sent.", value=err["error_replies"])
        by_code = CounterMetricFamily("kvstrata_error_replies_by_code", "Error replies sent, by their code (the "
                                      "first word: ERR, NOPERM, OOM, ...), as INFO errorstats.", labels=["code"])
        for code, n in sorted(err.get("by_code", {}).items()):
            by_code.add_metric([code], n)
        yield by_code
        yield CounterMetricFamily("kvstrata_protocol_errors", "Connections closed for a protocol error.",
                                  value=err["protocol_errors"])
        yield CounterMetricFamily("kvstrata_unknown_commands", "Commands not in the command table.",
                                  value=err["unknown_commands"])
        calls = CounterMetricFamily("kvstrata_commands", "Calls per command (containers such as CONFIG once).",
                                    labels=["cmd"])
        subcalls = CounterMetricFamily("kvstrata_subcommands", "Calls per subcommand (config|get, ...): a "
                                       "breakdown of the container's kvstrata_commands_total.", labels=["cmd"])
        failed = CounterMetricFamily("kvstrata_command_errors", "Calls per command that replied with an error.",
                                     labels=["cmd"])
        rejected = CounterMetricFamily("kvstrata_command_rejected", "Calls per (sub)command refused before they "
                                       "ran: wrong arity, NOAUTH, ACL (INFO commandstats rejected_calls).",
                                       labels=["cmd"])
        duration = HistogramMetricFamily("kvstrata_command_duration_seconds",
                                         "Time spent in the command handler, per command.", labels=["cmd"])
        for row in snap["commands"]:
            if row.get("rejected"):
                rejected.add_metric([row["name"]], row["rejected"])
            if row.get("subcommand"):
                subcalls.add_metric([row["name"]], row["calls"])
        for row in _per_command(snap["commands"]):
            calls.add_metric([row["name"]], row["calls"])
            failed.add_metric([row["name"]], row["failed"])
            hist = row.get("_hist")
            if hist is None or not row["timed"]:
                continue
            buckets: list[tuple[str, float]] = [
                (LE_LABELS[i], seen) for i, (_le, seen) in enumerate(cumulative_usec(hist, LE_BUCKETS - 1))]
            buckets.append(("+Inf", row["timed"]))
            duration.add_metric([row["name"]], buckets, row["usec"] / 1e6)
        yield calls
        yield subcalls
        yield failed
        yield rejected
        yield duration

        # ---- prefetch ----
        pf = snap["prefetch"]
        yield GaugeMetricFamily("kvstrata_prefetch_queue_depth", "Keys waiting in the prefetch queue.",
                                value=pf["queue_depth"])
        yield GaugeMetricFamily("kvstrata_prefetch_queue_capacity", "Most keys the prefetch queue holds.",
                                value=pf["capacity"])
        yield CounterMetricFamily("kvstrata_prefetch_queued", "Keys accepted into the prefetch queue.",
                                  value=pf["queued"])
        yield CounterMetricFamily("kvstrata_prefetch_promoted", "Prefetched keys moved up to DRAM.",
                                  value=pf["promoted"])
        yield CounterMetricFamily("kvstrata_prefetch_dropped", "Prefetch requests dropped: the queue was full.",
                                  value=pf["dropped"])
        for name, doc in (
            ("predicted", "Keys the predictor queued for prefetch."),
            ("issued", "Prefetches that brought a key up to DRAM."),
            ("used", "Prefetched keys read before they left DRAM (late ones included)."),
            ("late", "Prefetched keys read while their load was still in flight."),
            ("wasted", "Prefetched keys that left DRAM (demoted, overwritten, deleted) unread."),
            ("absent", "Prefetches of keys found in no tier (harmless)."),
            ("rejected", "Prefetches refused: room only by displacing pinned, recent or hotter keys."),
        ):
            yield CounterMetricFamily(f"kvstrata_prefetch_{name}", doc, value=pf[name])
        yield GaugeMetricFamily("kvstrata_prefetch_accuracy", "Prefetched keys used / issued.",
                                value=pf["accuracy"])
        yield GaugeMetricFamily("kvstrata_prefetch_coverage",
                                "Reads served in time by a prefetch / reads that needed a lower tier.",
                                value=pf["coverage"])
        if "profiled_keys" in pf:
            yield GaugeMetricFamily("kvstrata_profiled_keys", "Keys with an access profile.",
                                    value=pf["profiled_keys"])
            yield GaugeMetricFamily("kvstrata_prefetch_session_score",
                                    "Learned P(a returning session reads past its previous turn).",
                                    value=pf["session_score"])

        # ---- the shared pool tier (only on nodes that run one) ----
        pool = snap.get("pool")
        if pool is not None:
            yield GaugeMetricFamily(POOL_DEGRADED, "1 while the shared pool tier is degraded (unreachable or "
                                    "failing); lookups then fall through to the local tiers.",
                                    value=1 if pool["degraded"] else 0)
            yield CounterMetricFamily("kvstrata_pool_errors", "Errors talking to the shared pool tier.",
                                      value=pool["errors"])
            # The rest of INFO tier_pool (docs/pool.md, Observability): gauges for levels, counters for totals.
            for field, value in sorted(pool.get("counters", {}).items()):
                if field in POOL_GAUGES:
                    yield GaugeMetricFamily(f"kvstrata_pool_{field}", f"Pool tier: {field} (INFO tier_pool).",
                                            value=value)
                else:
                    yield CounterMetricFamily(f"kvstrata_pool_{field}", f"Pool tier: {field} (INFO tier_pool).",
                                              value=value)

        # ---- slow log ----
        sl = snap["slowlog"]
        yield GaugeMetricFamily("kvstrata_slowlog_length", "Entries in the slow log now.", value=sl["length"])
        yield CounterMetricFamily("kvstrata_slow_commands", "Commands logged as slow (slowlog-log-slower-than).",
                                  value=sl["total"])


def _per_command(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The command rows with each container's subcommand rows folded into it (calls, failures, time and
    histogram): the dispatcher counts ``config|get`` only on the subcommand, kvstrata_commands_total counts the
    container once per call."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.get("rejected") and not (row["calls"] or row["failed"]):
            continue  # only refused: not a call
        name = row["name"].partition("|")[0]
        agg = out.get(name)
        if agg is None:
            out[name] = {**row, "name": name, "_hist": list(row["_hist"]) if row.get("_hist") else None}
            continue
        for field in ("calls", "failed", "usec", "timed"):
            agg[field] += row[field]
        hist = row.get("_hist")
        if hist:
            agg["_hist"] = hist if agg["_hist"] is None else [a + b for a, b in zip(agg["_hist"], hist, strict=True)]
    return list(out.values())


def render(snapshot_fn: Callable[[], dict[str, Any]], accept: str = "", accept_encoding: str = "",
           process_metrics: bool = True) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a ``/metrics`` response (content negotiated as ``prometheus_client`` does)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    registry = CollectorRegistry(auto_describe=False)
    registry.register(KvstrataCollector(snapshot_fn))  # type: ignore[arg-type]
    if process_metrics:
        from prometheus_client import ProcessCollector

        ProcessCollector(registry=registry)
    encoder, content_type = choose_encoder(accept)
    body = encoder(registry)
    headers = {"Content-Type": content_type}
    if "gzip" in accept_encoding.lower() and len(body) > 1024:
        body = gzip.compress(body, compresslevel=1)
        headers["Content-Encoding"] = "gzip"
    return body, headers
