"""SETs of large values, one at a time on one connection: server CPU per GB and throughput, kvstrata against a
real redis-server (and optionally against another kvstrata tree), in the same run.

Each server gets its own FastClient; per value size, rounds alternate the server order (forward, then reversed),
each round warms up with 20 SETs and then times ``--count`` SETs over 64 keys (overwrites, as an engine refilling
its cache). Server CPU is utime+stime of the server's process tree from /proc over the timed SETs. Prints the
median over the rounds of each server, and kvstrata's ratios to Redis.

    PYTHONPATH=src python benchmarks/set_large_ab.py [--sizes 65536,262144,1048576,4194304] [--rounds 5]
        [--base-src OTHER_TREE/src] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import Any

from kvstrata.bench.procs import ServerProcess, describe_machine, start_server
from kvstrata.client.fast import FastClient

WARMUP = 20


def _round(srv: ServerProcess, value: bytes, count: int) -> tuple[float, float]:
    """(GB/s, server CPU seconds per GB) of ``count`` SETs of ``value``."""
    c = FastClient(srv.host, srv.port)
    try:
        for i in range(WARMUP):
            c.set(b"w%d" % (i % 8), value)
        before = srv.usage()
        t0 = time.perf_counter()
        for i in range(count):
            c.set(b"k%d" % (i % 64), value)
        elapsed = time.perf_counter() - t0
        cpu_s = (srv.usage() - before).cpu_us / 1e6
    finally:
        c.close()
    gb = len(value) * count / 1e9
    return gb / elapsed, cpu_s / gb


def run(sizes: list[int], rounds: int, base_src: str | None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "kvstrata", "serve", "--http-port", "0", "--dram-size", "1gb"]
    results = []
    with contextlib.ExitStack() as stack:  # every server started is stopped, also when a later one fails
        servers = {
            "redis": stack.enter_context(start_server("redis-setab", ["redis-server", "--save", "", "--appendonly",
                                                                       "no", "--dir", "/tmp"])),
            "kvstrata": stack.enter_context(start_server("kvstrata-setab", argv))}
        if base_src:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(base_src))
            servers["base"] = stack.enter_context(start_server("kvstrata-base-setab", argv, env=env,
                                                               cwd=os.path.dirname(base_src)))
        names = list(servers)
        for size in sizes:
            value = os.urandom(size)
            count = max(50, int(2e9 // 5 // size))  # about 0.4 GB a round
            seen: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
            for r in range(rounds):
                for name in (names if r % 2 == 0 else names[::-1]):
                    seen[name].append(_round(servers[name], value, count))
            row: dict[str, Any] = {"bytes": size, "count": count}
            for name in names:
                row[name] = {"gb_s": round(statistics.median(x[0] for x in seen[name]), 2),
                             "cpu_s_per_gb": round(statistics.median(x[1] for x in seen[name]), 3)}
            results.append(row)
    return {"benchmark": "set-large-ab", "machine": describe_machine(), "rounds": rounds, "results": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="65536,262144,1048576,4194304")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--base-src", help="another kvstrata tree's src/ to run as a third server (before/after)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run([int(s) for s in args.sizes.split(",")], args.rounds, args.base_src)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    names = [n for n in ("kvstrata", "base", "redis") if n in result["results"][0]]
    print("| value | " + " | ".join(f"{n} GB/s | {n} CPU s/GB" for n in names) + " | GB/s vs Redis | CPU vs Redis |")
    print("|---" * (2 * len(names) + 3) + "|")
    for row in result["results"]:
        kv, rd = row["kvstrata"], row["redis"]
        cells = " | ".join(f"{row[n]['gb_s']} | {row[n]['cpu_s_per_gb']}" for n in names)
        print(f"| {row['bytes'] // 1024} KiB | {cells} | {kv['gb_s'] / rd['gb_s']:.2f}x | "
              f"{kv['cpu_s_per_gb'] / rd['cpu_s_per_gb']:.2f}x |")


if __name__ == "__main__":
    main()
