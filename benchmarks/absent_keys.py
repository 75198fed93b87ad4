#!/usr/bin/env python3
"""What a miss of a key the SSD tier never held costs a client, with and without the SSD key filter.

    PYTHONPATH=src python benchmarks/absent_keys.py [--keys 2000] [--rounds 8] [--value-bytes 16384] [--json]

An engine that meets a prompt it has not seen asks for its chunks (all misses) and then stores them. On a tiered
server each such GET, and each SET of a new key (which loads its key first), had to ask LMDB in a loader thread
whether a record exists: without reading, a key with no record cannot be told from one whose place is unknown.
The key filter (engine/tiers/keyfilter.py) answers those on the event loop. One tiered server (a small DRAM,
``--keys`` values already demoted to the SSD tier); rounds alternate ``ssd-key-filter`` yes and no (which mode
goes first alternates too), each round a fresh set of ``--keys`` new keys, GET (a miss) then SET, one client.
Per mode: medians over rounds of the GET-miss and SET latency percentiles, and the ratio filter / no filter.
Figures in BENCHMARKS.md ("SSD key filter").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

from kvstrata.bench.procs import describe_machine, start_server
from kvstrata.bench.rawclient import RawClient
from kvstrata.server.read_waits import percentile

MODES = ("yes", "no")


def _pct(xs: list[int], q: float) -> float:
    return percentile(sorted(xs), q) / 1000


def _round(c: RawClient, tag: str, n: int, value: bytes) -> tuple[list[int], list[int]]:
    """``n`` new keys: GET (a miss), then SET; the two latency lists (ns)."""
    gets: list[int] = []
    sets: list[int] = []
    clock = time.perf_counter_ns
    for i in range(n):
        key = f"{tag}:{i}".encode()
        t0 = clock()
        got = c.get(key)
        t1 = clock()
        c.set(key, value)
        t2 = clock()
        if got is not None:
            raise RuntimeError(f"{key!r} was expected to be a miss")
        gets.append(t1 - t0)
        sets.append(t2 - t1)
    return gets, sets


def run(keys: int, rounds: int, value_bytes: int) -> dict[str, Any]:
    value = b"\x5a" * value_bytes
    per: dict[str, dict[str, list[float]]] = {m: {"get_p50": [], "get_p99": [], "set_p50": [], "set_p99": []}
                                               for m in MODES}
    with tempfile.TemporaryDirectory(prefix="kvstrata-bench-absent-") as ssd_dir:
        argv = [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning", "--dram-size", "2mb",
                "--essd-path", ssd_dir, "--fsync", "no"]
        with start_server("kvstrata-absent-keys", argv) as srv, RawClient(srv.host, srv.port) as c:
            for i in range(keys):  # records on the SSD tier: the filter has keys to tell the new ones from
                c.set(f"old:{i}".encode(), value)
            _round(c, "warm", keys // 4, value)
            for r in range(rounds):
                order = MODES if r % 2 == 0 else MODES[::-1]
                for mode in order:
                    c.call("CONFIG", "SET", "ssd-key-filter", mode)
                    gets, sets = _round(c, f"r{r}{mode}", keys, value)
                    per[mode]["get_p50"].append(_pct(gets, 0.5))
                    per[mode]["get_p99"].append(_pct(gets, 0.99))
                    per[mode]["set_p50"].append(_pct(sets, 0.5))
                    per[mode]["set_p99"].append(_pct(sets, 0.99))
            info = c.call("INFO", "tier_ssd").decode()
    absent = next((int(line.split(":")[1]) for line in info.splitlines() if line.startswith("key_filter_absent:")), 0)
    med = {m: {k: round(statistics.median(v), 1) for k, v in d.items()} for m, d in per.items()}
    return {
        "benchmark": "absent-keys",
        "machine": describe_machine(),
        "keys": keys, "rounds": rounds, "value_bytes": value_bytes,
        "median_us": med,
        "filter_over_lookup": {k: round(med["yes"][k] / med["no"][k], 2) for k in med["yes"]},
        "ranges_us": {m: {k: [round(min(v), 1), round(max(v), 1)] for k, v in d.items()} for m, d in per.items()},
        "key_filter_absent": absent,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--value-bytes", type=int, default=16384)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run(args.keys, args.rounds, args.value_bytes)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for mode in MODES:
        m = result["median_us"][mode]
        print(f"ssd-key-filter {mode:<3}: GET miss p50 {m['get_p50']} us p99 {m['get_p99']} us; "
              f"SET new p50 {m['set_p50']} us p99 {m['set_p99']} us")
    print(f"filter / lookup: {result['filter_over_lookup']}; keys ruled out: {result['key_filter_absent']}")


if __name__ == "__main__":
    main()
