"""Hit-ratio benchmark: replay synthetic KV-cache traces against LRU, LRU-K and Belady's optimal.

The cache holds a fixed number of equally sized chunks (a slot capacity). For each request, in trace order:

* every read chunk is a hit if resident (the policy is touched), else a miss: victims are removed until there
  is room, then the chunk is admitted;
* every written chunk is then inserted the same way (a write, never counted as a read).

A :class:`~kvstrata.clock.ManualClock` is advanced to each request's timestamp, so LRU-K's history and its
correlated-reference period (CRP) run in trace time. The optimal policy is Belady's MIN (demand paging: every
accessed chunk is admitted; on a full cache the resident chunk whose next access is farthest away leaves),
computed offline from precomputed next-use indices with a lazily invalidated max-heap. Since every write is a
chunk's first access in these traces, minimising all misses also maximises read hits, so MIN bounds both
online policies from above.

Hit ratio = read hits / reads. Capacities are fractions of the trace's working set (its distinct chunks, read
or written). Run ``kvstrata bench hitrate`` (or :func:`main`); ``--json`` prints one JSON document.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvstrata.bench.report import target_lines, target_table
from kvstrata.bench.traces import PRESETS, Request, generate, preset, trace_stats
from kvstrata.clock import ManualClock
from kvstrata.engine.policy import create_policy

DEFAULT_FRACTIONS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5)
LRU_K = 2
LRU_K_CRP_S = 1.0
"""LRU-K's correlated-reference period, seconds of trace time.

References closer together than this count as one. In KV-cache traffic the correlated references are the ones
inside one request or one burst (parallel samples, retries, a request's prefill re-reading what it just
wrote), all within about a second; the next uncorrelated reference to a conversation's chunks is the user's next
turn, which comes at least one answer decode (seconds) plus a think time (tens of seconds) later. One second
sits between the two, and it is below the gap between requests that share only a system prompt at the rates of
these traces, so popular prompts still accumulate history."""
TARGET_FRACTION = 0.2
TARGET_RATIO = 0.9


def _capacity(fraction: float, working_set: int) -> int:
    return max(1, int(round(fraction * working_set)))


def simulate_policy(
    trace: Sequence[Request],
    capacity: int,
    policy: str,
    *,
    k: int = LRU_K,
    crp: float = LRU_K_CRP_S,
) -> int:
    """Read hits of ``policy`` (``lru`` or ``lru-k``) on ``trace`` with ``capacity`` chunk slots."""
    if capacity < 1:
        raise ValueError("capacity must be at least one chunk")
    clock = ManualClock()
    pol = create_policy("lru-k", clock=clock, k=k, crp=crp) if policy == "lru-k" else create_policy(policy)
    admit, touch, remove, victim = pol.admit, pol.touch, pol.remove, pol.victim
    resident: set[bytes] = set()
    hits = 0

    def insert(key: bytes) -> None:
        while len(resident) >= capacity:
            v = victim()
            if v is None:  # pragma: no cover - the policy tracks every resident key
                raise RuntimeError(f"{policy}: no victim with {len(resident)} resident chunks")
            remove(v)
            resident.discard(v)
        admit(key)
        resident.add(key)

    for req in trace:
        dt = req.time - clock.monotonic()
        if dt > 0:
            clock.advance(dt)
        for key in req.reads:
            if key in resident:
                hits += 1
                touch(key)
            else:
                insert(key)
        for key in req.writes:
            if key in resident:
                touch(key)
            else:
                insert(key)
    return hits


def simulate_optimal(trace: Sequence[Request], capacity: int) -> int:
    """Read hits of Belady's MIN on ``trace`` with ``capacity`` chunk slots (offline, demand paging)."""
    if capacity < 1:
        raise ValueError("capacity must be at least one chunk")
    ids: dict[bytes, int] = {}
    seq: list[int] = []
    is_read: list[bool] = []
    for req in trace:
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
    size = hits = 0
    for i in range(n):
        x = seq[i]
        nu = next_use[i]
        if current[x] >= 0:
            if is_read[i]:
                hits += 1
        else:
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
    return hits


def _read_count(trace: Sequence[Request]) -> int:
    return sum(len(r.reads) for r in trace)


def run(
    traces: Sequence[str],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    *,
    seed_offset: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Simulate every (trace, fraction, policy) and return the benchmark's JSON document."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    trace_info: dict[str, Any] = {}
    results: list[dict[str, Any]] = []
    for name in traces:
        params = preset(name, seed_offset=seed_offset)
        t0 = time.perf_counter()
        trace = generate(params)
        stats = trace_stats(trace)
        say(
            f"{name}: {stats['requests']} requests, {stats['chunk_reads']} chunk reads, "
            f"{stats['chunk_writes']} writes, {stats['distinct_chunks']} distinct chunks "
            f"({time.perf_counter() - t0:.2f}s)"
        )
        trace_info[name] = {"params": params.to_dict(), "stats": stats}
        reads = _read_count(trace)
        for fraction in fractions:
            cap = _capacity(fraction, stats["distinct_chunks"])
            t0 = time.perf_counter()
            lru = simulate_policy(trace, cap, "lru")
            lru_k = simulate_policy(trace, cap, "lru-k")
            opt = simulate_optimal(trace, cap)
            row = {
                "trace": name,
                "fraction": fraction,
                "capacity": cap,
                "reads": reads,
                "lru": lru / reads if reads else 0.0,
                "lru_k": lru_k / reads if reads else 0.0,
                "optimal": opt / reads if reads else 0.0,
                "lru_k_over_optimal": lru_k / opt if opt else 1.0,
                "hits": {"lru": lru, "lru_k": lru_k, "optimal": opt},
            }
            results.append(row)
            say(
                f"  {name} {fraction:.0%} ({cap} slots): lru {row['lru']:.4f} lru-k {row['lru_k']:.4f} "
                f"optimal {row['optimal']:.4f} ({time.perf_counter() - t0:.2f}s)"
            )
    at_target = [r for r in results if abs(r["fraction"] - TARGET_FRACTION) < 1e-9]
    targets = {
        "lru_k_at_20pct_ge_90pct_of_optimal": bool(at_target)
        and all(r["lru_k_over_optimal"] >= TARGET_RATIO for r in at_target),
        "lru_k_never_below_lru": all(r["hits"]["lru_k"] >= r["hits"]["lru"] for r in results),
    }
    return {
        "benchmark": "hitrate",
        "policies": {
            "lru": {},
            "lru_k": {"k": LRU_K, "crp_s": LRU_K_CRP_S},
            "optimal": {"algorithm": "belady-min"},
        },
        "traces": trace_info,
        "results": results,
        "targets": targets,
        "runtime_s": round(time.perf_counter() - started, 3),
    }


def format_table(result: dict[str, Any]) -> str:
    """The human-readable table of a :func:`run` result."""
    lines = [f"{'trace':<12} {'cap':>5} {'slots':>6} {'LRU':>7} {'LRU-K':>7} {'OPT':>7} {'K/OPT':>6}"]
    for r in result["results"]:
        lines.append(
            f"{r['trace']:<12} {r['fraction']:>5.0%} {r['capacity']:>6} {r['lru']:>7.4f} {r['lru_k']:>7.4f} "
            f"{r['optimal']:>7.4f} {r['lru_k_over_optimal']:>6.3f}"
        )
    lines.append("")
    lines += target_lines(result["targets"])
    return "\n".join(lines)


def write_markdown(result: dict[str, Any]) -> str:
    """A BENCHMARKS.md section for a :func:`run` result."""
    lru_k = result.get("policies", {}).get("lru_k", {"k": LRU_K, "crp_s": LRU_K_CRP_S})
    out = [
        "## Hit ratio",
        "",
        "```",
        "kvstrata bench hitrate --trace all",
        "```",
        "",
        "Synthetic KV-cache traces (see `docs/traces.md`) replayed against a cache of equally sized chunk slots; "
        "capacity is a fraction of the trace's distinct chunks. Hit ratio = read hits / chunk reads. "
        f"LRU-K uses K={lru_k['k']}, CRP={lru_k['crp_s']} s of trace time; OPT is Belady's MIN (offline).",
        "",
        "| trace | capacity | slots | LRU | LRU-K | OPT | LRU-K / OPT |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["results"]:
        out.append(
            f"| {r['trace']} | {r['fraction']:.0%} | {r['capacity']} | {r['lru']:.4f} | {r['lru_k']:.4f} | "
            f"{r['optimal']:.4f} | {r['lru_k_over_optimal']:.3f} |"
        )
    labels = {
        "lru_k_at_20pct_ge_90pct_of_optimal": "LRU-K reaches >= 90% of the optimal hit ratio at 20% capacity",
        "lru_k_never_below_lru": "LRU-K is never below LRU",
    }
    out += ["", *target_table(result["targets"], labels)]
    out.append("")
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
        description="Hit ratio of LRU, LRU-K and Belady's optimal on synthetic KV-cache traces.",
    )
    parser.add_argument(
        "--trace", choices=[*PRESETS, "all"], default="default", help="trace preset (default: default)"
    )
    parser.add_argument(
        "--fractions",
        type=_fractions,
        default=list(DEFAULT_FRACTIONS),
        help="capacities as fractions of the working set, comma-separated (default: 0.05,0.1,0.2,0.3,0.5)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="offset added to each preset's own seed (default: 0, the presets as is)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    args = parser.parse_args(argv)
    names = list(PRESETS) if args.trace == "all" else [args.trace]

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    result = run(names, args.fractions, seed_offset=args.seed, progress=progress)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result))
    progress(f"done in {result['runtime_s']:.1f}s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
