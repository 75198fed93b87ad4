#!/usr/bin/env python3
"""What a large two-phase store costs the server's *other* clients: PING latency during staged stores.

    python benchmarks/commit_latency.py --src main=/work/main/src --src branch=src [--rounds 3] [--seconds 4]

For each ``--src`` (a kvstrata source tree; the server runs from it, the clients from this one), alternating the
order each round: a fresh ``kvstrata serve`` with a Unix socket, one writer process storing Llama-3.1-8B-sized
stores (6 values of 32 MiB, 192 MiB, through ``StageWriter.put_many``: each value's TAIR.KV.COMMIT makes the
server copy and verify 32 MiB) back to back, and this process sending a PING every ``--interval-ms`` over TCP.
Reports PING round-trip p50/p99/max (ms) while the writer runs, the writer's store throughput (GB/s), and an idle
baseline of the same pings before the writer starts.

``--store-only [--chunk-mb 14]``: no pinger; one server per ``--src`` at once, the same ``put_many`` of 6 values
(pipelined commits, as the SDK sends them) timed against each in turn, alternating, medians: what moving the
copy to a thread costs the writer itself.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

from kvstrata.bench.procs import start_server
from kvstrata.client.stage import StageWriter

MB = 1 << 20


def _writer(sock: str, seconds: float, ready: Any, out: Any) -> None:
    w = StageWriter(sock)
    vals = [os.urandom(32 * MB) for _ in range(6)]
    items = [(b"v%d" % i, 0, [v]) for i, v in enumerate(vals)]
    w.put_many(items)  # warm-up: the arena slots and the segment's pages are resident from here on
    ready.set()
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if not all(isinstance(r, int) for r in w.put_many(items)):
            raise RuntimeError("a commit failed")
        n += 1
    out.put((n * 192 * MB) / (time.perf_counter() - t0) / 1e9)
    w.close()


def _pings(port: int, until: Any, interval_s: float, limit_s: float) -> list[float]:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lat = []
    t_end = time.perf_counter() + limit_s
    while not until() and time.perf_counter() < t_end:
        t = time.perf_counter()
        s.sendall(b"*1\r\n$4\r\nPING\r\n")
        if s.recv(64) != b"+PONG\r\n":
            raise RuntimeError("bad PING reply")
        lat.append((time.perf_counter() - t) * 1e3)
        time.sleep(interval_s)  # pacing, not synchronisation
    s.close()
    return lat


def _stats(lat: list[float]) -> dict[str, float]:
    q = statistics.quantiles(lat, n=100)
    return {"n": len(lat), "p50": round(q[49], 3), "p99": round(q[98], 3), "max": round(max(lat), 3)}


def _one(src: str, seconds: float, interval_s: float) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="kvcl-")
    sock = os.path.join(tmp, "kv.sock")
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    srv = start_server("kvstrata", [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning",
                                    "--unixsocket", sock, "--dram-size", "1gb", "--stage-size", "256mb"],
                       env=env)
    try:
        idle = _pings(srv.port, lambda: False, interval_s, 1.0)
        ctx = mp.get_context("spawn")
        ready, out = ctx.Event(), ctx.Queue()
        p = ctx.Process(target=_writer, args=(sock, seconds, ready, out))
        p.start()
        ready.wait(120)
        busy = _pings(srv.port, lambda: not p.is_alive(), interval_s, seconds)
        gbs = out.get(timeout=120)
        p.join(30)
    finally:
        srv.stop()
    return {"idle": _stats(idle), "busy": _stats(busy), "store_gbs": round(gbs, 3)}


def _store_only(srcs: list[tuple[str, str]], chunk_mb: int, rounds: int) -> dict[str, float]:
    servers: dict[str, tuple[Any, StageWriter]] = {}
    try:
        for name, src in srcs:
            sock = os.path.join(tempfile.mkdtemp(prefix="kvcl-"), "kv.sock")
            srv = start_server("kvstrata", [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning",
                                            "--unixsocket", sock, "--dram-size", "1gb"],
                               env={**os.environ, "PYTHONPATH": os.path.abspath(src)})
            servers[name] = (srv, StageWriter(sock))
        items = [(b"c%d" % i, 0, [os.urandom(chunk_mb * MB)]) for i in range(6)]
        times: dict[str, list[float]] = {n: [] for n in servers}
        for rnd in range(rounds + 2):  # two warm-up rounds
            for name in (list(servers) if rnd % 2 else list(servers)[::-1]):
                t = time.perf_counter()
                if not all(isinstance(r, int) for r in servers[name][1].put_many(items)):
                    raise RuntimeError("a commit failed")
                if rnd >= 2:
                    times[name].append(time.perf_counter() - t)
    finally:
        for srv, w in servers.values():
            w.close()
            srv.stop()
    return {n: round(6 * chunk_mb * MB / statistics.median(v) / 1e9, 3) for n, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", action="append", required=True, help="NAME=PATH of a kvstrata src tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--interval-ms", type=float, default=2.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--store-only", action="store_true")
    ap.add_argument("--chunk-mb", type=int, default=14)
    a = ap.parse_args()
    srcs = [(s.split("=", 1)[0], s.split("=", 1)[1]) for s in a.src]
    if a.store_only:
        print(json.dumps({"chunk_mb": a.chunk_mb, "store_gbs": _store_only(srcs, a.chunk_mb, max(a.rounds, 8))}))
        return
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in srcs}
    for rnd in range(a.rounds):
        for name, path in (srcs if rnd % 2 == 0 else srcs[::-1]):
            r = _one(path, a.seconds, a.interval_ms / 1e3)
            results[name].append(r)
            if not a.json:
                print(f"round {rnd} {name:>8}: busy PING p50 {r['busy']['p50']:.2f} p99 {r['busy']['p99']:.2f} "
                      f"max {r['busy']['max']:.2f} ms (n={r['busy']['n']}); idle p99 {r['idle']['p99']:.2f} ms; "
                      f"store {r['store_gbs']:.2f} GB/s", flush=True)
    summary = {name: {k: statistics.median(r["busy"][k] for r in rs) for k in ("p50", "p99", "max")}
               | {"store_gbs": statistics.median(r["store_gbs"] for r in rs)} for name, rs in results.items()}
    if a.json:
        print(json.dumps({"runs": results, "median": summary}, indent=1))
    else:
        for name, s in summary.items():
            print(f"median {name:>8}: busy PING p50 {s['p50']:.2f} p99 {s['p99']:.2f} max {s['max']:.2f} ms; "
                  f"store {s['store_gbs']:.2f} GB/s")


if __name__ == "__main__":
    main()
