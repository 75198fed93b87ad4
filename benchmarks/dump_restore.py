"""DUMP and RESTORE of large values on kvstrata against a real redis-server, in the same run.

One redis-server and one kvstrata server (embedded defaults), each value size in turn: SET a random value, then
DUMP it and RESTORE the payload over another key (REPLACE), timed from a redis-py client; rounds alternate the
server order, the first two are a warm-up. Prints per size and operation the median milliseconds of each and their
ratio (kvstrata time / Redis time: below 1 is faster). Random bytes are what KV-cache values look like to LZF:
Redis tries to compress them on DUMP and keeps the plain string.

    PYTHONPATH=src python benchmarks/dump_restore.py [--sizes 65536,4194304,33554432] [--rounds 12] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import redis

from kvstrata.bench.procs import describe_machine, start_server

WARMUP = 2


def _round(c: redis.Redis, value: bytes) -> tuple[float, float]:
    c.set("src", value)
    t0 = time.perf_counter()
    payload = c.dump("src")
    t1 = time.perf_counter()
    c.restore("dst", 0, payload, replace=True)
    t2 = time.perf_counter()
    if c.get("dst") != value:
        raise RuntimeError("RESTORE did not give back the value")
    return t1 - t0, t2 - t1


def run(sizes: list[int], rounds: int) -> dict[str, Any]:
    redis_argv = ["redis-server", "--save", "", "--appendonly", "no", "--dir", "/tmp"]
    kv_argv = [sys.executable, "-m", "kvstrata", "serve", "--http-port", "0"]
    results: list[dict[str, Any]] = []
    with start_server("redis-dump", redis_argv) as rd, start_server("kvstrata-dump", kv_argv) as kv:
        clients = {"redis": redis.Redis(host=rd.host, port=rd.port, socket_timeout=60),
                   "kvstrata": redis.Redis(host=kv.host, port=kv.port, socket_timeout=60)}
        for size in sizes:
            value = os.urandom(size)
            times: dict[str, dict[str, list[float]]] = {n: {"dump": [], "restore": []} for n in clients}
            for i in range(rounds + WARMUP):
                for name in (("redis", "kvstrata") if i % 2 else ("kvstrata", "redis")):
                    dump_s, restore_s = _round(clients[name], value)
                    if i >= WARMUP:
                        times[name]["dump"].append(dump_s)
                        times[name]["restore"].append(restore_s)
            row: dict[str, Any] = {"bytes": size}
            for op in ("dump", "restore"):
                kv_ms = statistics.median(times["kvstrata"][op]) * 1e3
                rd_ms = statistics.median(times["redis"][op]) * 1e3
                row[op] = {"kvstrata_ms": round(kv_ms, 2), "redis_ms": round(rd_ms, 2),
                           "ratio": round(kv_ms / rd_ms, 2)}
            results.append(row)
        for c in clients.values():
            c.close()
    return {"benchmark": "dump-restore", "machine": describe_machine(), "rounds": rounds, "results": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="65536,4194304,33554432")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run([int(s) for s in args.sizes.split(",")], args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print("| value | DUMP kvstrata / Redis ms | ratio | RESTORE kvstrata / Redis ms | ratio |")
    print("|---|---|---|---|---|")
    for row in result["results"]:
        d, r = row["dump"], row["restore"]
        print(f"| {row['bytes']:,} B | {d['kvstrata_ms']} / {d['redis_ms']} | {d['ratio']} | "
              f"{r['kvstrata_ms']} / {r['redis_ms']} | {r['ratio']} |")


if __name__ == "__main__":
    main()
