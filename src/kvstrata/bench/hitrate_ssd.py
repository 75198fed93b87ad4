"""Whole-store hit ratio with a small DRAM and a small SSD: the SSD tier's eviction policy (``ssd-policy``)
compared on the hit-rate traces, every policy in the same run (``kvstrata bench hitrate --ssd``).

Each trace (``bench/traces.py``) is replayed through a real :class:`~kvstrata.engine.store.Store` over a real
LMDB :class:`~kvstrata.engine.tiers.ssd.SsdTier` (its writer applying each write at once, ``fsync=no``, in a
temporary directory), with the server's defaults where they matter: write-back, ``promote-hits 2`` within 60 s,
the default DRAM policy, a :class:`~kvstrata.clock.ManualClock` in trace time. Budgets are fractions of the
trace's distinct chunks, in the bytes each tier charges for one chunk of ``value_size`` bytes, so the SSD
evicts. For every chunk read: a hit when DRAM or the SSD returns it, else a miss and the chunk is written (it was
recomputed); written chunks are then stored. Hit ratio = hits (DRAM + SSD) / reads. The SSD's budget is checked
after every request (``max_ssd_used``). Memory per ranked record is measured with ``tracemalloc`` on the ranking
alone (``ranking_bytes_per_key``).
"""

from __future__ import annotations

import gc
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

from kvstrata.bench.traces import Request, generate, preset, trace_stats
from kvstrata.clock import ManualClock
from kvstrata.engine.entry import ENTRY_OVERHEAD
from kvstrata.engine.policy import create_policy
from kvstrata.engine.policy.chain import ScanGuard
from kvstrata.engine.policy.registry import DEFAULT_POLICY
from kvstrata.engine.store import Store
from kvstrata.engine.tiers.ssd import HEADER_SIZE, RECORD_OVERHEAD, SsdTier, data_key
from kvstrata.engine.tiers.ssd_rank import DEFAULT_SSD_POLICY, SSD_POLICIES, SsdRanking

DRAM_FRACTION = 0.01
SSD_FRACTION = 0.04
VALUE_SIZE = 1024


def replay_store(
    trace: Sequence[Request],
    *,
    dram_slots: int,
    ssd_slots: int,
    ssd_policy: str,
    value_size: int = VALUE_SIZE,
    dram_policy: str = DEFAULT_POLICY,
    scan_guard: bool = False,
) -> dict[str, Any]:
    """Replay ``trace`` through a Store with ``dram_slots`` + ``ssd_slots`` chunks of room; hit counts.
    ``scan_guard``: the DRAM policy wrapped in ScanGuard, as ``eviction-scan-guard yes`` does."""
    keys = [k for req in trace[:1] for k in req.reads + req.writes] or [b"k"]
    key_len = len(keys[0])
    dram_budget = dram_slots * (key_len + value_size + ENTRY_OVERHEAD)
    ssd_budget = ssd_slots * (len(data_key(keys[0])) + HEADER_SIZE + value_size + RECORD_OVERHEAD)
    value = bytes(value_size)
    clock = ManualClock()
    with tempfile.TemporaryDirectory(prefix="kvstrata-hitrate-ssd-") as tmp:
        ssd = SsdTier(tmp, ssd_budget, fsync="no", threaded=False, policy=ssd_policy)
        try:
            policy: Any = create_policy(dram_policy)
            store = Store(dram_budget, policy=ScanGuard(policy) if scan_guard else policy, clock=clock, ssd=ssd)
            start = clock.monotonic()
            hits = reads = max_used = 0
            for req in trace:
                dt = start + req.time - clock.monotonic()
                if dt > 0:
                    clock.advance(dt)
                for key in req.reads:
                    reads += 1
                    if store.get(key) is not None:
                        hits += 1
                    else:
                        store.put(key, value)
                for key in req.writes:
                    if store.get(key, touch=False) is None:
                        store.put(key, value)
                max_used = max(max_used, ssd.used)
            return {
                "ssd_policy": ssd_policy, "scan_guard": scan_guard, "reads": reads, "hits": hits, "hit_ratio": hits / reads if reads else 0.0,
                "dram_hits": store.tier_stats["dram"].hits, "ssd_hits": store.tier_stats["ssd"].hits,
                "ssd_evictions": ssd.evictions, "ssd_budget": ssd_budget, "max_ssd_used": max_used,
            }
        finally:
            ssd.close()


def ranking_bytes_per_key(name: str, keys: int = 20_000) -> float:
    """Bytes the SSD ranking holds per ranked record at steady state (its returning-key ghosts included).

    ``keys`` records, then 3 x ``keys`` evictions each followed by a new record, a third of them after a read of
    a resident record: what a full SSD does. 0 for ``fifo`` (no ranking in memory).
    """
    if name == "fifo":
        return 0.0
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        rank = SsdRanking(name)
        seq = 1
        for i in range(keys):
            rank.admit(seq, b"\0\0k%031d" % i)
            seq += 1
        for i in range(3 * keys):
            if i % 3 == 0:
                rank.accessed(seq - 1 - i % keys)
                rank.drain()
            victim = rank.victim()
            assert victim is not None
            rank.remove(victim, b"\0\0k%031d" % victim)
            rank.admit(seq, b"\0\0k%031d" % (keys + i))
            seq += 1
            rank.commit()
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return used / keys


def run_ssd(
    traces: Sequence[str],
    *,
    policies: Sequence[str] = SSD_POLICIES,
    dram_fraction: float = DRAM_FRACTION,
    ssd_fraction: float = SSD_FRACTION,
    seed_offset: int = 0,
    costs: bool = True,
    scan_guard: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replay every trace with every SSD policy (same run, same budgets) and return the JSON document. With
    ``scan_guard``, each policy also runs with ScanGuard on DRAM (a column ``<policy>+guard``)."""
    runs = [(pol, pol, False) for pol in policies]
    if scan_guard:
        runs += [(f"{pol}+guard", pol, True) for pol in policies]
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    for name in traces:
        trace = generate(preset(name, seed_offset=seed_offset))
        distinct = trace_stats(trace)["distinct_chunks"]
        dram_slots = max(1, round(dram_fraction * distinct))
        ssd_slots = max(1, round(ssd_fraction * distinct))
        row: dict[str, Any] = {"trace": name, "distinct_chunks": distinct, "dram_slots": dram_slots,
                               "ssd_slots": ssd_slots, "policies": {}}
        for label, pol, guard in runs:
            t0 = time.perf_counter()
            row["policies"][label] = replay_store(trace, dram_slots=dram_slots, ssd_slots=ssd_slots, ssd_policy=pol,
                                                  scan_guard=guard)
            say(f"{name} ssd-policy {label}: hit ratio {row['policies'][label]['hit_ratio']:.4f} "
                f"({time.perf_counter() - t0:.1f}s)")
        results.append(row)
    memory = {pol: ranking_bytes_per_key(pol) for pol in policies} if costs else {}
    return {"benchmark": "hitrate-ssd", "default": DEFAULT_SSD_POLICY, "dram_fraction": dram_fraction,
            "ssd_fraction": ssd_fraction, "value_size": VALUE_SIZE, "dram_policy": DEFAULT_POLICY,
            "results": results, "bytes_per_key": memory, "runtime_s": time.perf_counter() - started}


def format_ssd(result: dict[str, Any]) -> str:
    """Markdown: whole-store hit ratio per trace and SSD policy, the gain over fifo, and memory per record."""
    names = list(result["results"][0]["policies"]) if result["results"] else []
    out = [
        f"DRAM {result['dram_fraction']:.0%} + SSD {result['ssd_fraction']:.0%} of each trace's distinct chunks "
        f"({result['value_size']} B values, DRAM policy {result['dram_policy']}); whole-store hit ratio "
        "(DRAM + SSD hits / reads), in brackets the change against fifo.",
        "",
        "| trace | DRAM slots | SSD slots | " + " | ".join(names) + " |",
        "|---|---:|---:|" + "---:|" * len(names),
    ]
    for row in result["results"]:
        base = row["policies"].get("fifo", {}).get("hit_ratio")
        cells = []
        for name in names:
            ratio = row["policies"][name]["hit_ratio"]
            delta = "" if base is None or name == "fifo" else f" ({ratio - base:+.4f})"
            cells.append(f"{ratio:.4f}{delta}")
        out.append(f"| {row['trace']} | {row['dram_slots']} | {row['ssd_slots']} | " + " | ".join(cells) + " |")
    if result["results"]:
        means = [sum(r["policies"][n]["hit_ratio"] for r in result["results"]) / len(result["results"])
                 for n in names]
        out.append("| mean | | | " + " | ".join(f"{m:.4f}" for m in means) + " |")
    if result["bytes_per_key"]:
        out.append("| bytes per SSD record | | | "
                   + " | ".join(f"{result['bytes_per_key'][n.partition('+')[0]]:.0f}" for n in names) + " |")
    over = [f"{r['trace']}/{n}" for r in result["results"] for n, p in r["policies"].items()
            if p["max_ssd_used"] > p["ssd_budget"]]
    out += ["", "SSD budget exceeded: " + (", ".join(over) if over else "never") + "."]
    return "\n".join(out)
