#!/usr/bin/env python3
"""A TCP restore right after the client sat idle, with the server and the client on separate CPUs or not.

    PYTHONPATH=src python benchmarks/idle_restore.py [--case qwen2.5-7b:bfloat16:1536] [--rounds 8]
                                                     [--idle-ms 500] [--json]

An engine asks for a prefix's KV after a pause (between requests), not in a tight loop. On a small host Linux
then runs the client on the server's CPU: a task waiting on a socket is woken on the CPU of the task that woke
it, so the server's first reply pulls the idle client onto its core, and the large reply is received and sent
on one core until the load balancer separates them. ``kvstrata bench restore`` never shows it (its client is
busy between modes). Two servers hold the same KV, one started without ``server-cpulist`` and one pinned to the
upper half of the CPUs (``kvstrata.cpulist.split_cpus``); each round, in alternating order, the client (unpinned
for the first, on the other half for the second) sleeps ``--idle-ms``, then restores over TCP into an existing
buffer (``retrieve(out=)``), then restores again at once (busy). Single-stream loopback moving the same bytes
(the sender on the servers' half when pinned) is the reference. Medians; figures in BENCHMARKS.md
("Restore on an Intel host").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from kvstrata.bench.large import loopback_gbps
from kvstrata.bench.procs import describe_machine, machine_summary, start_server
from kvstrata.bench.restore import MB, Case
from kvstrata.client.sdk import KVCacheClient
from kvstrata.cpulist import format_cpus, split_cpus


def _restore_gbps(cl: KVCacheClient, c: Case) -> float:
    t0 = time.perf_counter()
    n, _ = cl.retrieve(c.token_ids, out=c.out)
    dt = time.perf_counter() - t0
    if n != c.tokens:
        raise RuntimeError(f"restored {n} of {c.tokens} tokens")
    return c.nbytes / dt / 1e9


def run(case: str, rounds: int, idle_ms: int) -> dict[str, Any]:
    c = Case(case, seed=0)
    everyone = tuple(sorted(os.sched_getaffinity(0)))
    server_cpus, client_cpus = split_cpus(everyone)
    base = [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning", "--http-port", "0",
            "--dram-size", str(2 * c.nbytes + 256 * MB)]
    servers = {"unpinned": start_server("kvstrata", base),
               "pinned": start_server("kvstrata", [*base, "--server-cpulist", format_cpus(server_cpus)])}
    placement = {"unpinned": (everyone, ()), "pinned": (client_cpus, server_cpus)}
    got: dict[str, list[float]] = {f"{p} {m}": [] for p in servers for m in ("idle", "busy", "loopback")}
    try:
        clients = {p: KVCacheClient(f"redis://127.0.0.1:{s.port}", c.namespace(), local_plane=False)
                   for p, s in servers.items()}
        for cl in clients.values():
            cl.store(c.token_ids, c.kv, skip_existing=False)
            _restore_gbps(cl, c)  # warm-up: the connection, the buffers
        for r in range(rounds):
            order = list(servers) if r % 2 == 0 else list(servers)[::-1]
            for p in order:
                mine, theirs = placement[p]
                os.sched_setaffinity(0, mine)
                time.sleep(idle_ms / 1000)  # the pause being measured, not a synchronisation
                got[f"{p} idle"].append(_restore_gbps(clients[p], c))
                got[f"{p} busy"].append(_restore_gbps(clients[p], c))
                got[f"{p} loopback"].append(loopback_gbps(c.nbytes, msg=-(-c.nbytes // MB) * MB,
                                                          sender_cpus=theirs))
        os.sched_setaffinity(0, everyone)
        for cl in clients.values():
            cl.close()
    finally:
        for s in servers.values():
            s.stop()
    med = {k: round(statistics.median(v), 3) for k, v in got.items()}
    return {
        "benchmark": "idle_restore", "machine": describe_machine(), "case": c.name, "mb": round(c.nbytes / MB, 1),
        "rounds": rounds, "idle_ms": idle_ms, "servers_cpus": format_cpus(server_cpus),
        "clients_cpus": format_cpus(client_cpus), "median_gbps": med,
        "ratios": {f"{p} {m}/loopback": round(med[f"{p} {m}"] / med[f"{p} loopback"], 3)
                   for p in servers for m in ("idle", "busy")}
                  | {"idle pinned/unpinned": round(med["pinned idle"] / med["unpinned idle"], 3)},
        "runs_gbps": {k: [round(x, 2) for x in v] for k, v in got.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="qwen2.5-7b:bfloat16:1536")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--idle-ms", type=int, default=500)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        print("needs two CPUs", file=sys.stderr)
        return 2
    res = run(args.case, args.rounds, args.idle_ms)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{res['case']} ({res['mb']} MB), {machine_summary(res['machine'])}; pinned: servers on CPU "
          f"{res['servers_cpus']}, client on CPU {res['clients_cpus']}; idle {res['idle_ms']} ms; medians of "
          f"{res['rounds']} rounds, GB/s")
    print("| placement | after idle | busy | loopback | idle/loopback | busy/loopback |")
    print("|---|---:|---:|---:|---:|---:|")
    med, rat = res["median_gbps"], res["ratios"]
    for p in ("unpinned", "pinned"):
        print(f"| {p} | {med[p + ' idle']} | {med[p + ' busy']} | {med[p + ' loopback']} | "
              f"{rat[p + ' idle/loopback']} | {rat[p + ' busy/loopback']} |")
    print(f"after idle, pinned / unpinned: {rat['idle pinned/unpinned']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
