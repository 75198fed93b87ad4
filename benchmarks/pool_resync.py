#!/usr/bin/env python3
"""How fast a node resyncs its local copies with the pool after a restart, against reading the same headers
straight from the pool.

    PYTHONPATH=src python benchmarks/pool_resync.py [--keys 50000] [--rounds 4] [--json]

A node that was stopped, or whose invalidation subscription was down, compares every local copy's version with
the pool's record header (server/pool_resync.py) before its copies are known fresh. One tiered node on a local
3-master Redis Cluster holds ``--keys`` 1 KB values on its SSD tier (saved); each round restarts it and reads
INFO tier_pool ``resync_last_ms`` once its first resync is done, and, as the peer, one redis-py cluster client
reads the same keys' 28-byte headers (``GETRANGE``, pipelines of 512) - the pool's own rate for that work, with
nothing else to do. Which goes first alternates by round; a first round of each is a warm-up, not counted.
Medians over rounds of keys per second, and the ratio resync / peer. Figures in BENCHMARKS.md ("Pool resync").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

import redis

from kvstrata.bench.cluster import LocalCluster
from kvstrata.bench.procs import describe_machine, start_server
from kvstrata.engine.tiers.pool import HEADER_SIZE
from kvstrata.server.pool_resync import BATCH

PREFIX = b"kvs:"


def _keys(n: int) -> list[bytes]:
    return [f"resync:{i}".encode() for i in range(n)]


def _peer(cluster: LocalCluster, keys: list[bytes]) -> float:
    """Keys a second reading their pool headers with one redis-py cluster client, BATCH per pipeline."""
    rc = redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0], socket_timeout=30)
    try:
        t0 = time.perf_counter()
        for i in range(0, len(keys), BATCH):
            pipe = rc.pipeline(transaction=False)
            for key in keys[i:i + BATCH]:
                pipe.getrange(PREFIX + key, 0, HEADER_SIZE - 1)
            heads = pipe.execute()
            if any(len(h) != HEADER_SIZE for h in heads):
                raise RuntimeError("a pool record is missing")
        return len(keys) / (time.perf_counter() - t0)
    finally:
        rc.close()


def _resync(argv: list[str], n: int) -> float:
    """Restart the node; keys a second of its first resync (INFO resync_last_ms)."""
    with start_server("kvstrata-pool-resync", argv) as srv:
        c = redis.Redis(host=srv.host, port=srv.port, socket_timeout=30)
        deadline = time.monotonic() + 600
        while True:
            info = c.info("tier_pool")
            if info["resyncs"] >= 1 and not info["resync_running"]:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the resync did not finish")
            time.sleep(0.05)  # a poll with a deadline; the figure is the server's own resync_last_ms
        if info["resync_checked"] < n or info["resync_failures"]:
            raise RuntimeError(f"resync checked {info['resync_checked']} of {n} (failures {info['resync_failures']})")
        c.close()
    return n / max(info["resync_last_ms"], 1) * 1000


def run(n: int, rounds: int) -> dict[str, Any]:
    cluster = LocalCluster(masters=3).start()
    rates: dict[str, list[float]] = {"resync": [], "peer": []}
    try:
        with tempfile.TemporaryDirectory(prefix="kvstrata-bench-resync-") as ssd_dir:
            argv = [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning", "--dram-size", "4mb",
                    "--essd-path", ssd_dir, "--fsync", "no", "--pool", cluster.url, "--http-port", "0"]
            keys = _keys(n)
            with start_server("kvstrata-pool-resync", argv) as srv:
                c = redis.Redis(host=srv.host, port=srv.port, socket_timeout=60)
                value = b"\x5a" * 1024
                for i in range(0, n, 1000):
                    pipe = c.pipeline(transaction=False)
                    for key in keys[i:i + 1000]:
                        pipe.execute_command("TAIR.KV.SETEX", key, 0, value)
                    pipe.execute()
                c.save()
                c.close()
            for r in range(rounds + 1):
                order = ("resync", "peer") if r % 2 == 0 else ("peer", "resync")
                for what in order:
                    rate = _resync(argv, n) if what == "resync" else _peer(cluster, keys)
                    if r > 0:
                        rates[what].append(rate)
    finally:
        cluster.stop()
    med = {k: round(statistics.median(v)) for k, v in rates.items()}
    return {
        "benchmark": "pool-resync",
        "machine": describe_machine(),
        "keys": n, "rounds": rounds, "batch": BATCH,
        "median_keys_per_s": med,
        "resync_over_peer": round(med["resync"] / med["peer"], 2),
        "ranges_keys_per_s": {k: [round(min(v)), round(max(v))] for k, v in rates.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run(args.keys, args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    m = result["median_keys_per_s"]
    print(f"resync {m['resync']} keys/s, pool headers read directly {m['peer']} keys/s: "
          f"{result['resync_over_peer']}x (ranges {result['ranges_keys_per_s']})")


if __name__ == "__main__":
    main()
