"""Per-call cost of every registered eviction policy on the server's hot path, each against LRU in the same run.

    python benchmarks/policy_speed.py            # about 10-20 s
    python benchmarks/policy_speed.py --quick    # fewer repeats

Three loops over 100k distinct keys, each timed separately (best of several repeats, fresh policy each time):

* mixed: 200k policy calls driven by a Zipf(0.9) key stream against a cache of 50k resident keys: a resident key
  is touched (1 call), a missing one costs victim() + remove() + admit() (3 calls). The driver's own
  bookkeeping (a set of resident keys) is inside the timing for every policy alike.
* touch: 200k touches of resident keys in random order.
* evict: 66,667 victim() + remove() + admit() cycles (200k calls) admitting keys never seen before.

Every policy counts time in its own accesses (no clock), as the server runs it. Prints a table; nothing is
written. ``kvstrata bench hitrate`` measures the cost per access of a whole trace replay as well.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from itertools import accumulate

from kvstrata.engine.policy import create_policy, policy_names
from kvstrata.engine.policy.base import EvictionPolicy

KEYS = 100_000
RESIDENT = 50_000
CALLS = 200_000


def _keys(n: int, prefix: bytes = b"chunk:") -> list[bytes]:
    return [prefix + b"%08d" % i for i in range(n)]


def _zipf_stream(keys: list[bytes], n: int, s: float, rng: random.Random) -> list[bytes]:
    weights = [1.0 / (rank + 1) ** s for rank in range(len(keys))]
    order = keys[:]
    rng.shuffle(order)  # popularity unrelated to key order or to the warm-up set
    return rng.choices(order, cum_weights=list(accumulate(weights)), k=n)


def bench_mixed(policy: EvictionPolicy, keys: list[bytes], stream: list[bytes]) -> tuple[float, int]:
    resident = set(keys[:RESIDENT])
    for key in keys[:RESIDENT]:
        policy.admit(key)
    admit, touch, remove, victim = policy.admit, policy.touch, policy.remove, policy.victim
    calls = 0
    t0 = time.perf_counter()
    for key in stream:
        if key in resident:
            touch(key)
            calls += 1
        else:
            v = victim()
            remove(v)
            resident.discard(v)
            admit(key)
            resident.add(key)
            calls += 3
        if calls >= CALLS:
            break
    return time.perf_counter() - t0, calls


def bench_touch(policy: EvictionPolicy, keys: list[bytes], order: list[bytes]) -> tuple[float, int]:
    for key in keys[:RESIDENT]:
        policy.admit(key)
    touch = policy.touch
    t0 = time.perf_counter()
    for key in order:
        touch(key)
    return time.perf_counter() - t0, len(order)


def bench_evict(policy: EvictionPolicy, keys: list[bytes], fresh: list[bytes]) -> tuple[float, int]:
    for key in keys[:RESIDENT]:
        policy.admit(key)
    admit, remove, victim = policy.admit, policy.remove, policy.victim
    t0 = time.perf_counter()
    for key in fresh:
        remove(victim())
        admit(key)
    return time.perf_counter() - t0, 3 * len(fresh)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat instead of five")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else 5
    rng = random.Random(42)
    keys = _keys(KEYS)
    stream = _zipf_stream(keys, 2 * CALLS, 0.9, rng)
    order = [rng.choice(keys[:RESIDENT]) for _ in range(CALLS)]
    fresh = _keys(CALLS // 3, prefix=b"fresh:")

    policies: list[tuple[str, Callable[[], EvictionPolicy]]] = [
        (name, lambda name=name: create_policy(name))  # type: ignore[misc]
        for name in ["lru", *(n for n in policy_names() if n != "lru")]
    ]
    loops = [
        ("mixed", lambda p: bench_mixed(p, keys, stream)),
        ("touch", lambda p: bench_touch(p, keys, order)),
        ("evict", lambda p: bench_evict(p, keys, fresh)),
    ]
    print(f"{KEYS} keys, {RESIDENT} resident, {CALLS} calls per loop, best of {repeats}; microseconds per call")
    print(f"{'policy':<22}" + "".join(f"{name:>10}" for name, _ in loops))
    base: dict[str, float] = {}
    for label, make in policies:
        cells = []
        for name, loop in loops:
            best = float("inf")
            for _ in range(repeats):
                elapsed, calls = loop(make())
                best = min(best, elapsed / calls * 1e6)
            base.setdefault(name, best)
            cells.append(f"{best:>7.3f}" + (f" ({best / base[name]:.1f}x)" if label != "lru" else ""))
        print(f"{label:<22}" + "".join(f"{c:>10}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
