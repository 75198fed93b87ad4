"""Hit-ratio benchmark: replay synthetic KV-cache traces against every registered eviction policy and Belady's MIN.

The cache holds a fixed number of equally sized chunk slots. For each request, in trace order:

* every read chunk is a hit if resident (the policy is touched), else a miss: victims are removed until there
  is room, then the chunk is admitted;
* every written chunk is then inserted the same way (a write, never counted as a read).

Each key's depth in its request's chunk chain is passed to policies that take ``hint(key, depth)`` (the
chain-aware variants); a policy with ``admits(key)`` may refuse a key when admitting it would evict (the
chunk is then served but not cached). A :class:`~kvstrata.clock.ManualClock` runs in trace time, scaled by
``time_scale``: replaying at two very different rates shows whether a policy depends on the clients' speed.
Only ``lru-k@1s`` (LRU-K with the former 1 s wall-clock correlated-reference period, kept as a reference) reads
the clock; every registered policy counts in accesses.

The optimum is Belady's MIN (demand paging: every accessed chunk is admitted; on a full cache the resident chunk
whose next access is farthest away leaves), computed offline with a lazily invalidated max-heap. Every write is
a chunk's first access in these traces, so minimising all misses also maximises read hits: MIN bounds every
online policy from above. Hit ratio = read hits / reads. Capacities are fractions of the trace's distinct
chunks. Run ``kvstrata bench hitrate`` (or :func:`main`); ``--json`` prints one JSON document. ``--online-ref``
runs the reference caches of ``bench/online_ref.py`` instead; ``--trace twitter52`` replays a public cache trace
(``bench/public_traces.py``).
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import os
import random
import statistics
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from kvstrata.bench.hitrate_ssd import DRAM_FRACTION, SSD_FRACTION, format_ssd, run_ssd
from kvstrata.bench.online_ref import format_references, run_references
from kvstrata.bench.public_traces import ENV_FILE, PUBLIC_TRACES, load_named
from kvstrata.bench.report import target_lines, target_table
from kvstrata.bench.traces import PRESETS, Request, trace_stats
from kvstrata.clock import ManualClock
from kvstrata.engine.policy import create_policy
from kvstrata.engine.policy.base import EvictionPolicy
from kvstrata.engine.policy.chain import ScanGuard, TailFirst
from kvstrata.engine.policy.lru_k import LRUKPolicy
from kvstrata.engine.policy.registry import DEFAULT_POLICY
from kvstrata.engine.tiers.ssd_rank import SSD_POLICIES

POLICIES: tuple[str, ...] = ("lru", "lru-k", "lru-k-compact", "arc", "s3-fifo", "w-tinylfu")
"""The registered candidates, in table order."""
WALL_LRU_K = "lru-k@1s"
"""LRU-K as the server ran it before: K=2 and a correlated-reference period of 1 s of (trace) time."""
FEATURES: tuple[str, ...] = ("+tail", "+guard")
"""Chain-aware features (engine/policy/chain.py), evaluated on every candidate at the target capacity."""
DEFAULT_FRACTIONS: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2)
TARGET_FRACTION = 0.05
TARGET_RATIO = 0.9
RATES: tuple[float, float] = (1.0, 0.001)
"""Time scales of the two replays: the trace as generated, and 1000 times faster."""
MAX_RATE_DRIFT = 0.01
MAX_US_PER_ACCESS = 1.0
MAX_BYTES_PER_KEY = 64


def _capacity(fraction: float, working_set: int) -> int:
    return max(1, int(round(fraction * working_set)))


def make_policy(name: str, clock: ManualClock | None = None) -> EvictionPolicy:
    """A policy by table name: a registered name, ``lru-k@1s``, or either with ``+tail`` / ``+guard``."""
    base, _, feature = name.partition("+")
    if base == WALL_LRU_K:
        policy: EvictionPolicy = LRUKPolicy(k=2, crp=1.0, clock=clock or ManualClock())
    else:
        policy = create_policy(base)
    if feature == "tail":
        return TailFirst(policy)  # type: ignore[return-value]
    if feature == "guard":
        return ScanGuard(policy)  # type: ignore[return-value]
    if feature:
        raise ValueError(f"unknown policy feature {feature!r}")
    return policy


class _NullPolicy:
    """A FIFO made of C-level calls only: timing the replay with it measures the driver, not a policy."""

    name = "null"

    def __init__(self) -> None:
        order: deque[bytes] = deque()
        self.admit = order.append
        self.victim = order.popleft
        self.touch = self.remove = id  # a C function taking one argument, doing nothing that matters


def simulate_policy(
    trace: Sequence[Request],
    capacity: int,
    policy: str | EvictionPolicy,
    *,
    time_scale: float = 1.0,
) -> int:
    """Read hits of ``policy`` (a table name, see :func:`make_policy`, or an instance) with ``capacity`` slots."""
    return replay(trace, capacity, policy, time_scale=time_scale)[0]


def replay(
    trace: Sequence[Request],
    capacity: int,
    policy: str | EvictionPolicy,
    *,
    time_scale: float = 1.0,
) -> tuple[int, int]:
    """(read hits, usable read hits) of ``policy`` with ``capacity`` slots.

    A hit is *usable* when every earlier read of its request hit too: an engine looks a prefix up and stops at
    the first missing chunk, so a chunk behind a missing one is recomputed anyway. The cache evolves the same
    either way (the chunks behind a miss are recomputed and stored, i.e. touched or inserted as here).
    """
    if capacity < 1:
        raise ValueError("capacity must be at least one chunk")
    clock = ManualClock()
    pol = make_policy(policy, clock) if isinstance(policy, str) else policy
    admit, touch, remove, victim = pol.admit, pol.touch, pol.remove, pol.victim
    hint = getattr(pol, "hint", None)
    admits = getattr(pol, "admits", None)
    resident: set[bytes] = set()
    hits = usable = 0

    def insert(key: bytes) -> None:
        if len(resident) >= capacity:
            if admits is not None and not admits(key):
                return
            while len(resident) >= capacity:
                v = victim()
                if v is None:  # pragma: no cover - the policy tracks every resident key
                    raise RuntimeError(f"{pol.name}: no victim with {len(resident)} resident chunks")
                remove(v)
                resident.discard(v)
        admit(key)
        resident.add(key)

    for req in trace:
        dt = req.time * time_scale - clock.monotonic()
        if dt > 0:
            clock.advance(dt)
        if hint is not None:
            for depth, key in enumerate(req.reads + req.writes):
                hint(key, depth)
        whole = True
        for key in req.reads:
            if key in resident:
                hits += 1
                usable += whole
                touch(key)
            else:
                whole = False
                insert(key)
        for key in req.writes:
            if key in resident:
                touch(key)
            else:
                insert(key)
    return hits, usable


def simulate_optimal(trace: Sequence[Request], capacity: int) -> int:
    """Read hits of Belady's MIN on ``trace`` with ``capacity`` chunk slots (offline, demand paging)."""
    return replay_optimal(trace, capacity)[0]


def replay_optimal(trace: Sequence[Request], capacity: int) -> tuple[int, int]:
    """(read hits, usable read hits, see :func:`replay`) of Belady's MIN. MIN maximises hits, not usable hits:
    its usable figure is a reference, not a bound."""
    if capacity < 1:
        raise ValueError("capacity must be at least one chunk")
    ids: dict[bytes, int] = {}
    seq: list[int] = []
    is_read: list[bool] = []
    starts: set[int] = set()  # index of each request's first access
    for req in trace:
        starts.add(len(seq))
        for key in req.reads:
            seq.append(ids.setdefault(key, len(ids)))
            is_read.append(True)
        for key in req.writes:
            seq.append(ids.setdefault(key, len(ids)))
            is_read.append(False)
    n = len(seq)
    never = n  # "no next use": farther than any real index
    next_use = [never] * n
    last = [never] * len(ids)
    for i in range(n - 1, -1, -1):
        x = seq[i]
        next_use[i] = last[x]
        last[x] = i

    current = [-1] * len(ids)  # next use of a resident chunk, -1 when not resident
    heap: list[tuple[int, int]] = []  # (-next use, chunk id); stale entries are skipped
    push, pop = heapq.heappush, heapq.heappop
    size = hits = usable = 0
    whole = True
    for i in range(n):
        x = seq[i]
        nu = next_use[i]
        if i in starts:
            whole = True
        if current[x] >= 0:
            if is_read[i]:
                hits += 1
                usable += whole
        else:
            whole = whole and not is_read[i]
            if size >= capacity:
                while True:
                    neg, y = pop(heap)
                    if current[y] == -neg:
                        current[y] = -1
                        break
            else:
                size += 1
        current[x] = nu
        push(heap, (-nu, x))
    return hits, usable


def _read_count(trace: Sequence[Request]) -> int:
    return sum(len(r.reads) for r in trace)


def _access_count(trace: Sequence[Request]) -> int:
    return sum(len(r.reads) + len(r.writes) for r in trace)


def cpu_cost(
    trace: Sequence[Request], capacity: int, names: Sequence[str], repeats: int = 3
) -> dict[str, float]:
    """Microseconds of policy work per access: the replay's median time minus the null policy's, per access.

    Every policy (and the null FIFO that measures the driver) is replayed ``repeats`` times in rotating order,
    in the same run, so machine load hits all of them alike.
    """
    accesses = _access_count(trace)
    runs: dict[str, list[float]] = {name: [] for name in ("null", *names)}
    order = list(runs)
    for r in range(repeats):
        for name in order[r % len(order):] + order[: r % len(order)]:
            pol = _NullPolicy() if name == "null" else make_policy(name)
            gc.collect()
            t0 = time.perf_counter()
            simulate_policy(trace, capacity, pol)  # type: ignore[arg-type]
            runs[name].append(time.perf_counter() - t0)
    base = statistics.median(runs["null"])
    return {name: max(0.0, (statistics.median(runs[name]) - base) / accesses * 1e6) for name in names}


def memory_per_key(name: str, keys: int = 20_000) -> float:
    """Bytes the policy holds per tracked key at steady state (ghosts and sketches included).

    ``keys`` resident keys, then 3 x ``keys`` misses on new keys interleaved with hits, so ghost queues and
    histories fill to their bounds. Keys are created while tracing, as a server receives them, and the driver
    drops a key once it is evicted: a key object the policy alone keeps alive (a ghost that stores the key) is
    the policy's memory and counted; the resident keys, which the engine's store holds anyway, are subtracted.
    """
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        pol = make_policy(name)
        live: set[bytes] = set()
        resident = [b"resident:%08d" % i for i in range(keys)]
        for key in resident:
            pol.admit(key)
            live.add(key)
        for i in range(3 * keys):
            key = b"fresh:%08d" % i
            hot = resident[i % keys]
            if hot in live:
                pol.touch(hot)
            victim = pol.victim()
            pol.remove(victim)  # type: ignore[arg-type]
            live.discard(victim)  # type: ignore[arg-type]
            pol.admit(key)
            live.add(key)
        engine_keys = sum(sys.getsizeof(k) for k in live)  # the engine's own key objects: not the policy's
        del live, resident, key, hot, victim
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - before - engine_keys
    finally:
        tracemalloc.stop()
    del pol
    return used / keys


def touch_cost(names: Sequence[str], keys: int = 20_000, rounds: int = 5, repeats: int = 5) -> dict[str, float]:
    """Microseconds of one ``touch`` on a resident key (a DRAM hit, the server's hot path), per policy.

    Each policy tracks ``keys`` keys that were all referenced twice (proven, as hot keys are); ``rounds`` passes
    touch them in a shuffled order. Policies are timed ``repeats`` times in rotating order in the same run and a
    loop calling a C no-op is subtracted, so the figure is the policy's call, and the ratio to LRU is load-proof.
    """
    rng = random.Random(7)
    order = [b"hot:%08d" % i for i in range(keys)]
    rng.shuffle(order)
    seq = order * rounds
    runs: dict[str, list[float]] = {name: [] for name in ("null", *names)}
    names_all = list(runs)
    for r in range(repeats):
        for name in names_all[r % len(names_all):] + names_all[: r % len(names_all)]:
            if name == "null":
                touch: Callable[[bytes], object] = id
            else:
                pol = make_policy(name)
                for key in order:
                    pol.admit(key)
                for key in order:
                    pol.touch(key)
                touch = pol.touch
            gc.collect()
            t0 = time.perf_counter()
            for key in seq:
                touch(key)
            runs[name].append(time.perf_counter() - t0)
    base = statistics.median(runs["null"])
    return {name: max(0.0, (statistics.median(runs[name]) - base) / len(seq) * 1e6) for name in names}


def run(
    traces: Sequence[str],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    *,
    policies: Sequence[str] = POLICIES,
    default: str = DEFAULT_POLICY,
    seed_offset: int = 0,
    costs: bool = True,
    trace_file: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Simulate every (trace, fraction, policy) and return the benchmark's JSON document.

    ``traces`` are preset names or public trace names (``bench/public_traces.py``, read from ``trace_file``)."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    policies = list(dict.fromkeys([*policies, default]))
    trace_info: dict[str, Any] = {}
    results: list[dict[str, Any]] = []
    features: list[dict[str, Any]] = []
    rates: list[dict[str, Any]] = []
    cost_rows: dict[str, dict[str, float]] = {}
    for name in traces:
        t0 = time.perf_counter()
        trace, params = load_named(name, seed_offset=seed_offset, trace_file=trace_file)
        stats = trace_stats(trace)
        say(
            f"{name}: {stats['requests']} requests, {stats['chunk_reads']} chunk reads, "
            f"{stats['chunk_writes']} writes, {stats['distinct_chunks']} distinct chunks "
            f"({time.perf_counter() - t0:.2f}s)"
        )
        trace_info[name] = {"params": params, "stats": stats}
        reads = _read_count(trace)
        for fraction in fractions:
            cap = _capacity(fraction, stats["distinct_chunks"])
            t0 = time.perf_counter()
            opt = simulate_optimal(trace, cap)
            hits = {p: simulate_policy(trace, cap, p) for p in policies}
            row = {
                "trace": name,
                "fraction": fraction,
                "capacity": cap,
                "reads": reads,
                "optimal": opt / reads if reads else 0.0,
                "hit_ratio": {p: h / reads if reads else 0.0 for p, h in hits.items()},
                "over_optimal": {p: h / opt if opt else 1.0 for p, h in hits.items()},
                "hits": {**hits, "optimal": opt},
            }
            results.append(row)
            say(
                f"  {name} {fraction:.0%} ({cap} slots) OPT {row['optimal']:.4f}: "
                + " ".join(f"{p} {row['over_optimal'][p]:.3f}" for p in policies)
                + f" ({time.perf_counter() - t0:.1f}s)"
            )
        cap = _capacity(TARGET_FRACTION, stats["distinct_chunks"])
        opt, opt_usable = replay_optimal(trace, cap)
        for p in policies:
            for feature in ("", *FEATURES):
                h, u = replay(trace, cap, p + feature)
                features.append({"trace": name, "policy": p, "feature": feature, "capacity": cap,
                                 "hit_ratio": h / reads if reads else 0.0, "over_optimal": h / opt if opt else 1.0,
                                 "usable_ratio": u / reads if reads else 0.0,
                                 "usable_over_optimal": u / opt_usable if opt_usable else 1.0})
        for p in (*policies, WALL_LRU_K):
            slow, fast = (simulate_policy(trace, cap, p, time_scale=s) for s in RATES)
            rates.append({"trace": name, "policy": p, "capacity": cap,
                          "slow": slow / reads if reads else 0.0, "fast": fast / reads if reads else 0.0,
                          "drift": abs(fast - slow) / slow if slow else 0.0})
        say(f"  {name}: chain features and replay rates at {TARGET_FRACTION:.0%} done")
        if costs:
            cost_rows[name] = cpu_cost(trace, cap, policies)
            say(f"  {name}: us/access " + " ".join(f"{p} {c:.2f}" for p, c in cost_rows[name].items()))
    memory = {p: memory_per_key(p) for p in policies} if costs else {}
    touch = touch_cost(policies) if costs else {}
    load = os.getloadavg()[0] if costs and hasattr(os, "getloadavg") else None
    if memory:
        say("bytes/key " + " ".join(f"{p} {m:.0f}" for p, m in memory.items()))
        say("us/touch (DRAM hit) " + " ".join(f"{p} {c:.3f}" for p, c in touch.items()) + f" (load {load})")
    at_target = [r for r in results if abs(r["fraction"] - TARGET_FRACTION) < 1e-9]
    targets = {
        "default_at_5pct_ge_90pct_of_optimal": bool(at_target)
        and all(r["over_optimal"][default] >= TARGET_RATIO for r in at_target),
        "default_never_below_lru": all(r["hits"][default] >= r["hits"]["lru"] for r in results)
        if "lru" in policies else False,
        "default_same_hit_ratio_slow_and_fast": all(r["drift"] <= MAX_RATE_DRIFT for r in rates
                                                    if r["policy"] == default),
    }
    if costs:
        # The server's hot path is a DRAM hit, i.e. one touch; a miss waits on a lower tier far longer than the
        # policy's admit/evict work (whose per-access cost over a whole replay is in us_per_access).
        targets["default_le_1us_per_access"] = touch[default] <= MAX_US_PER_ACCESS
        targets["default_le_64_bytes_per_key"] = memory[default] <= MAX_BYTES_PER_KEY
    return {
        "benchmark": "hitrate",
        "default": default,
        "policies": {
            "lru-k": {"k": 2, "crp": 0, "time": "accesses"},
            "lru-k-compact": {"k": 2, "crp": 0, "time": "accesses", "storage": "flat arrays"},
            WALL_LRU_K: {"k": 2, "crp_s": 1.0, "time": "trace seconds"},
            "optimal": {"algorithm": "belady-min"},
        },
        "traces": trace_info,
        "results": results,
        "features": features,
        "rates": rates,
        "us_per_access": cost_rows,
        "us_per_touch": touch,
        "load_average": load,
        "bytes_per_key": memory,
        "targets": targets,
        "runtime_s": round(time.perf_counter() - started, 3),
    }


def _policies_of(result: dict[str, Any]) -> list[str]:
    return list(result["results"][0]["hit_ratio"]) if result["results"] else []


def format_table(result: dict[str, Any]) -> str:
    """The human-readable tables of a :func:`run` result (ratios to Belady's MIN)."""
    names = _policies_of(result)
    lines = [f"{'trace':<12} {'cap':>4} {'slots':>6} {'OPT':>7} " + " ".join(f"{p:>10}" for p in names)]
    for r in result["results"]:
        lines.append(
            f"{r['trace']:<12} {r['fraction']:>4.0%} {r['capacity']:>6} {r['optimal']:>7.4f} "
            + " ".join(f"{r['over_optimal'][p]:>10.3f}" for p in names)
        )
    if result["features"]:
        lines += ["", f"chain features at {TARGET_FRACTION:.0%} (ratio to OPT; usable: hits before a request's first miss)"]
        for f in result["features"]:
            lines.append(f"{f['trace']:<12} {f['policy'] + f['feature']:<18} hits {f['over_optimal']:.3f} "
                         f"usable {f['usable_over_optimal']:.3f}")
    if result["rates"]:
        lines += ["", f"replay rate at {TARGET_FRACTION:.0%}: hit ratio slow / fast (time x{RATES[1]:g})"]
        for r in result["rates"]:
            lines.append(f"{r['trace']:<12} {r['policy']:<10} {r['slow']:.4f} {r['fast']:.4f} drift {r['drift']:.2%}")
    if result["us_per_access"]:
        lines += ["", "policy cost, us per access (driver subtracted)"]
        for trace, row in result["us_per_access"].items():
            lines.append(f"{trace:<12} " + " ".join(f"{p} {c:.2f}" for p, c in row.items()))
        lines.append("bytes per key: " + " ".join(f"{p} {m:.0f}" for p, m in result["bytes_per_key"].items()))
        touch = result.get("us_per_touch") or {}
        lines.append("us per touch (DRAM hit): " + " ".join(f"{p} {c:.3f}" for p, c in touch.items())
                     + f" (load average {result.get('load_average')})")
    lines += ["", f"default: {result['default']}", *target_lines(result["targets"])]
    return "\n".join(lines)


_LABELS = {
    "default_at_5pct_ge_90pct_of_optimal": "default >= 0.9x Belady at 5% capacity on every trace",
    "default_never_below_lru": "default never below LRU (every trace and capacity)",
    "default_same_hit_ratio_slow_and_fast": "default: same hit ratio (+-1%) replayed slowly and 1000x faster",
    "default_le_1us_per_access": "default costs <= 1 us per access (a touch on a DRAM hit)",
    "default_le_64_bytes_per_key": "default uses <= 64 B per tracked key",
}


def write_markdown(result: dict[str, Any]) -> str:
    """A BENCHMARKS.md section for a :func:`run` result."""
    names = _policies_of(result)
    out = [
        "## Eviction policies: hit ratio against Belady's MIN",
        "",
        "```",
        "kvstrata bench hitrate --trace all",
        "```",
        "",
        "Synthetic KV-cache traces (`docs/traces.md`) replayed against a cache of equally sized chunk slots; "
        "capacity is a fraction of the trace's distinct chunks. Cells are read hits / Belady's MIN read hits "
        "(OPT is MIN's hit ratio).",
        "",
        "| trace | capacity | slots | OPT | " + " | ".join(names) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(names),
    ]
    for r in result["results"]:
        out.append(
            f"| {r['trace']} | {r['fraction']:.0%} | {r['capacity']} | {r['optimal']:.4f} | "
            + " | ".join(f"{r['over_optimal'][p]:.3f}" for p in names)
            + " |"
        )
    if result["features"]:
        out += ["", f"Chain-aware features at {TARGET_FRACTION:.0%}. *hits*: read hits / MIN's; *usable*: hits "
                "whose request hit every earlier chunk (an engine stops at the first missing chunk) / MIN's "
                "usable hits (MIN maximises hits, not usable hits, so this is a reference, not a bound). "
                "`+guard` may refuse admission, so MIN does not bound it either.", "",
                "| trace | policy | hits | +tail | +guard | usable | +tail | +guard |",
                "|---|---|---:|---:|---:|---:|---:|---:|"]
        feats = {(f["trace"], f["policy"], f["feature"]): f for f in result["features"]}
        for trace in result["traces"]:
            for p in names:
                row = [feats.get((trace, p, feat)) for feat in ("", *FEATURES)]
                if None in row:
                    continue
                out.append(f"| {trace} | {p} | " + " | ".join(f"{f['over_optimal']:.3f}" for f in row) + " | "
                           + " | ".join(f"{f['usable_over_optimal']:.3f}" for f in row) + " |")
    if result["rates"]:
        out += ["", f"Replay rate at {TARGET_FRACTION:.0%}: hit ratio with trace time as generated / "
                f"{1 / RATES[1]:g}x faster (drift):", "",
                "| trace | policy | as generated | faster | drift |", "|---|---|---:|---:|---:|"]
        out += [f"| {r['trace']} | {r['policy']} | {r['slow']:.4f} | {r['fast']:.4f} | {r['drift']:.2%} |"
                for r in result["rates"]]
    if result["us_per_access"]:
        out += ["", f"Policy cost at {TARGET_FRACTION:.0%}, microseconds per access (median of 3 replays minus "
                "a null FIFO's, same run), and bytes per tracked key (tracemalloc, ghosts and sketches "
                "included):", "",
                "| trace | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for trace, row in result["us_per_access"].items():
            out.append(f"| {trace} | " + " | ".join(f"{row.get(p, float('nan')):.2f}" for p in names) + " |")
        touch = result.get("us_per_touch") or {}
        if touch:
            out.append("| us/touch (DRAM hit) | " + " | ".join(f"{touch.get(p, float('nan')):.3f}" for p in names)
                       + " |")
            if touch.get("lru"):
                out.append("| touch / LRU's | " + " | ".join(f"{touch.get(p, float('nan')) / touch['lru']:.1f}x"
                                                           for p in names) + " |")
        out.append("| bytes/key | " + " | ".join(f"{result['bytes_per_key'].get(p, float('nan')):.0f}"
                                                 for p in names) + " |")
        load = result.get("load_average")
        out += ["", "us/touch: one `touch` of a resident, proven key (the server's hot path on a DRAM hit), median "
                "of 5 rotating runs minus a C no-op loop; bytes/key: tracemalloc after churning 3x the tracked "
                "keys, ghosts, sketches and any key object only the policy keeps alive included"
                + (f"; 1-min load average {load:.1f} when measured." if load is not None else ".")]
    out += ["", f"Default: `{result['default']}`.", "", *target_table(result["targets"], _LABELS), ""]
    return "\n".join(out)


def _fractions(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError("fractions must be in (0, 1]")
    return values


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="kvstrata bench hitrate",
        description="Hit ratio of the eviction policies and Belady's optimal on synthetic KV-cache traces.",
    )
    parser.add_argument("--trace", choices=[*PRESETS, *PUBLIC_TRACES, "all"], default="all",
                        help="trace preset, or a public trace read from --trace-file (default: all presets)")
    parser.add_argument("--trace-file", help="file of a public trace (see bench/public_traces.py)")
    parser.add_argument("--online-ref", action="store_true",
                        help="instead: MIN, the online (informed) and static references and the policies "
                        "(bench/online_ref.py)")
    parser.add_argument(
        "--fractions",
        type=_fractions,
        default=list(DEFAULT_FRACTIONS),
        help="capacities as fractions of the working set, comma-separated (default: 0.01,0.02,0.05,0.1,0.2)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="offset added to each preset's own seed (default: 0, the presets as is)",
    )
    parser.add_argument("--no-cost", action="store_true", help="skip the CPU and memory measurements")
    parser.add_argument(
        "--ssd",
        action="store_true",
        help="instead: whole-store hit ratio through a real Store with a small DRAM and SSD, per SSD eviction "
        "policy (bench/hitrate_ssd.py)",
    )
    parser.add_argument(
        "--ssd-policies",
        default=",".join(SSD_POLICIES),
        help=f"with --ssd: the SSD policies compared, comma-separated (default: {','.join(SSD_POLICIES)})",
    )
    parser.add_argument("--ssd-scan-guard", action="store_true",
                        help="with --ssd: also replay each SSD policy with ScanGuard on DRAM (eviction-scan-guard)")
    parser.add_argument("--ssd-dram", type=float, default=DRAM_FRACTION,
                        help=f"with --ssd: DRAM as a fraction of the distinct chunks (default: {DRAM_FRACTION})")
    parser.add_argument("--ssd-size", type=float, default=SSD_FRACTION,
                        help=f"with --ssd: SSD as a fraction of the distinct chunks (default: {SSD_FRACTION})")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    args = parser.parse_args(argv)
    names = list(PRESETS) if args.trace == "all" else [args.trace]
    if args.trace in PUBLIC_TRACES and not (args.trace_file or os.environ.get(ENV_FILE)):
        parser.error(f"--trace {args.trace} needs --trace-file (or ${ENV_FILE}); see bench/public_traces.py")

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.online_ref:
        ref = run_references(names, args.fractions, policies=POLICIES, seed_offset=args.seed,
                             trace_file=args.trace_file, progress=progress)
        print(json.dumps(ref, indent=2) if args.json else format_references(ref))
        return 0
    if args.ssd:
        ssd_policies = [p.strip() for p in args.ssd_policies.split(",") if p.strip()]
        unknown = [p for p in ssd_policies if p not in SSD_POLICIES]
        if unknown or not 0 < args.ssd_dram < 1 or not 0 < args.ssd_size < 1:
            parser.error(f"--ssd-policies from {', '.join(SSD_POLICIES)}; --ssd-dram and --ssd-size in (0, 1)")
        ssd_result = run_ssd(names, policies=ssd_policies, dram_fraction=args.ssd_dram,
                             ssd_fraction=args.ssd_size, seed_offset=args.seed, costs=not args.no_cost,
                             scan_guard=args.ssd_scan_guard, progress=progress)
        print(json.dumps(ssd_result, indent=2) if args.json else format_ssd(ssd_result))
        progress(f"done in {ssd_result['runtime_s']:.1f}s")
        return 0
    result = run(names, args.fractions, seed_offset=args.seed, costs=not args.no_cost, trace_file=args.trace_file,
                 progress=progress)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result))
    progress(f"done in {result['runtime_s']:.1f}s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
