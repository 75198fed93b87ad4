#!/usr/bin/env python3
"""Two-phase writes: does the server's verification overlap the client's next copy?

    python benchmarks/stage_pipeline.py [--tokens 1536] [--repeats 9] [--json]

Stores Qwen2.5-7B-shaped bf16 KV (28 layers, 4 KV heads, head dim 128, 256-token chunks) through a staging
segment with ``StageWriter.put_many`` against a local ``kvstrata serve``, in two ways, alternating, medians:

* ``pipelined`` (what the SDK does): each chunk's ``TAIR.KV.COMMIT`` is sent as soon as the chunk is written,
  so the server copies and verifies chunk i while the client writes chunk i+1;
* ``batched``: every chunk written first, then all commits (no overlap);

and ``memcpy`` of the same bytes. The whole comparison runs twice: with the client and the server free to run
anywhere, then pinned to two different CPUs (``sched_setaffinity``): a Unix-socket write wakes the server with a
*sync* wakeup, which lets the scheduler put it on the writer's own CPU, and pinning shows whether that costs the
pipeline anything.

Last, the SDK's store both ways (``sdk-stage``: the default with a local server; ``sdk-unix``: the same client
with ``local_plane=False``, the value through the Unix socket), alternating: wall time and the CPU time the
client and the server spent (getrusage, /proc/PID/stat), per store.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from kvstrata.bench.procs import start_server
from kvstrata.client.codec import CHECKSUM_OFFSET, prepare_parts
from kvstrata.client.stage import StageWriter

CHUNK = 256


def _batched(w: StageWriter, items: list[tuple[bytes, int, list[Any]]]) -> list[Any]:
    slots = w.reserve([sum(memoryview(p).nbytes for p in parts) for _, _, parts in items])
    cmds = []
    for (key, ttl, parts), (rid, off) in zip(items, slots, strict=True):
        digest = w.write(off, parts, CHECKSUM_OFFSET)
        cmds.append((b"TAIR.KV.COMMIT", key, ttl, rid, b"%016x" % digest, b"SUMAT", CHECKSUM_OFFSET))
    w.send_many(cmds)
    return [w.read_reply() for _ in cmds]


def _measure(w: StageWriter, kv: np.ndarray, repeats: int) -> dict[str, float]:
    out = np.empty_like(kv)
    tokens = kv.shape[3]
    times: dict[str, list[float]] = {"memcpy": [], "pipelined": [], "batched": []}
    for rnd in range(repeats + 1):
        order = list(times) if rnd % 2 else list(times)[::-1]
        for mode in order:
            items = [(b"c%d" % i, 0, prepare_parts(kv[:, :, :, i:i + CHUNK])) for i in range(0, tokens, CHUNK)]
            t = time.perf_counter()
            if mode == "memcpy":
                np.copyto(out, kv)
                replies: list[Any] = []
            elif mode == "pipelined":
                replies = w.put_many(items, CHECKSUM_OFFSET)
            else:
                replies = _batched(w, items)
            dt = time.perf_counter() - t
            if not all(isinstance(r, int) for r in replies):
                raise RuntimeError(f"{mode}: a commit failed: {replies}")
            if rnd:
                times[mode].append(dt)
    return {m: kv.nbytes / statistics.median(v) / 1e9 for m, v in times.items()}


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sdk(sock: str, pid: int, kv: np.ndarray, repeats: int) -> dict[str, dict[str, float]]:
    """Per store, ms: wall, client CPU, server CPU; the SDK through the segment and through the socket."""
    from kvstrata.client.keys import Namespace
    from kvstrata.client.sdk import KVCacheClient

    clients = {"sdk-stage": KVCacheClient(f"unix://{sock}", Namespace("s", kv_dtype="uint16")),
               "sdk-unix": KVCacheClient(f"unix://{sock}", Namespace("u", kv_dtype="uint16"), local_plane=False)}
    tokens = list(range(kv.shape[3]))
    acc = {k: [0.0, 0.0, 0.0] for k in clients}
    try:
        for rnd in range(repeats + 1):
            for k in (list(clients) if rnd % 2 else list(clients)[::-1]):
                c0, s0, t0 = _cpu_self(), _cpu_of(pid), time.perf_counter()
                clients[k].store(tokens, kv, skip_existing=False)
                if rnd:
                    acc[k][0] += time.perf_counter() - t0
                    acc[k][1] += _cpu_self() - c0
                    acc[k][2] += _cpu_of(pid) - s0
    finally:
        for c in clients.values():
            c.close()
    return {k: {"wall_ms": round(w / repeats * 1e3, 1), "client_cpu_ms": round(c / repeats * 1e3, 1),
                "server_cpu_ms": round(s / repeats * 1e3, 1)} for k, (w, c, s) in acc.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1536)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    kv = rng.integers(0, 1 << 16, (28, 2, 4, args.tokens, 128), dtype=np.uint16)
    sockdir = tempfile.mkdtemp(prefix="kvs-stage-")
    sock = os.path.join(sockdir, "kv.sock")
    srv = start_server("kvstrata", [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning",
                                    "--http-port", "0", "--dram-size", str(4 * kv.nbytes + (256 << 20)),
                                    "--unixsocket", sock])
    result: dict[str, Any] = {"mb": round(kv.nbytes / (1 << 20), 1)}
    mine = os.sched_getaffinity(0)
    try:
        w = StageWriter(sock)
        try:
            result["free"] = _measure(w, kv, args.repeats)
            cpus = sorted(mine)
            if len(cpus) >= 2:
                os.sched_setaffinity(0, {cpus[0]})
                os.sched_setaffinity(srv.pid, {cpus[1]})
                result["pinned"] = _measure(w, kv, args.repeats)
        finally:
            os.sched_setaffinity(0, mine)
            os.sched_setaffinity(srv.pid, mine)
            w.close()
        result["sdk"] = _sdk(sock, srv.pid, kv, args.repeats)
    finally:
        srv.stop()
    for key in ("free", "pinned"):
        if key in result:
            g = result[key]
            result[key] = {m: round(v, 3) for m, v in g.items()}
            result[key]["pipelined/memcpy"] = round(g["pipelined"] / g["memcpy"], 3)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key in ("free", "pinned"):
            if key in result:
                print(key, " ".join(f"{m} {v}" for m, v in result[key].items()))
        for mode, v in result["sdk"].items():
            print(mode, " ".join(f"{m} {x}" for m, x in v.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
