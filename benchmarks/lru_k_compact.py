"""``lru-k-compact`` against ``lru-k`` and ``lru``: same decisions, memory per key, cost of a touch (one run).

    python benchmarks/lru_k_compact.py                 # every bench trace at 1-20%: ~2-4 min on a loaded 2-core box
    python benchmarks/lru_k_compact.py --fractions 0.05

1. Decisions: each ``kvstrata bench hitrate`` trace (full presets) at each capacity replayed through ``lru-k`` and
   ``lru-k-compact`` in lock step (``kvstrata.bench.policy_diff``): every victim must be the same key.
2. Memory: bytes the policy holds per tracked key, counted by ``kvstrata bench hitrate``'s ``memory_per_key``
   (tracemalloc after 3x churn, ghosts filled to one per tracked key, the engine's key objects subtracted), for
   the three policies at 20k keys, and ``lru-k-compact`` at other sizes (its tables double, so the figure moves).
3. Cost: ``us_per_touch`` of ``kvstrata bench hitrate`` (a touch of a proven resident key, the DRAM hit; the
   three policies in rotating order, 5 repeats, medians, a C no-op loop subtracted), with the ratio to LRU.

Prints markdown; nothing is written.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from kvstrata.bench.hitrate import DEFAULT_FRACTIONS, memory_per_key, touch_cost
from kvstrata.bench.policy_diff import lockstep
from kvstrata.bench.traces import PRESETS, generate, preset, trace_stats
from kvstrata.engine.policy import create_policy

PEERS = ("lru", "lru-k", "lru-k-compact")
SIZES = (2_000, 5_000, 10_000, 30_000)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fractions", default=",".join(str(f) for f in DEFAULT_FRACTIONS))
    parser.add_argument("--no-decisions", action="store_true", help="skip the lock-step replays")
    args = parser.parse_args(argv)
    fractions = [float(f) for f in args.fractions.split(",")]
    started = time.perf_counter()
    if not args.no_decisions:
        print("| trace | capacity | evictions compared | victims |")
        print("|---|---:|---:|---|")
        for name in PRESETS:
            trace = generate(preset(name))
            distinct = trace_stats(trace)["distinct_chunks"]
            for fraction in fractions:
                cap = max(1, round(fraction * distinct))
                n = lockstep(trace, cap, create_policy("lru-k-compact"), create_policy("lru-k"))
                print(f"| {name} | {fraction:.0%} ({cap}) | {n} | identical |", flush=True)
    print()
    print("| bytes per tracked key | " + " | ".join(PEERS) + " |")
    print("|---|" + "---:|" * len(PEERS))
    print("| 20,000 keys | " + " | ".join(f"{memory_per_key(p, 20_000):.1f}" for p in PEERS) + " |", flush=True)
    print("\n| lru-k-compact, keys | " + " | ".join(f"{n:,}" for n in SIZES) + " |")
    print("|---|" + "---:|" * len(SIZES))
    print("| bytes per tracked key | " + " | ".join(f"{memory_per_key('lru-k-compact', n):.1f}" for n in SIZES)
          + " |", flush=True)
    touch = touch_cost(PEERS)
    load = os.getloadavg()[0]
    print("\n| us per touch (DRAM hit) | " + " | ".join(PEERS) + " |")
    print("|---|" + "---:|" * len(PEERS))
    print("| same run | " + " | ".join(f"{touch[p]:.3f} ({touch[p] / touch['lru']:.1f}x)" for p in PEERS) + " |")
    print(f"\n1-min load average {load:.1f}; {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
