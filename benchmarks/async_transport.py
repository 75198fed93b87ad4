#!/usr/bin/env python3
"""SDK store + retrieve throughput over TCP, asyncio and sync clients, for comparing two client source trees.

    python benchmarks/async_transport.py --compare /work/main/src src [--rounds 6] [--chunks 16] [--json]

Starts one kvstrata server (this interpreter's source), then in every round runs a child process per source tree
(``PYTHONPATH=<tree>``), in alternating order, that stores ``--chunks`` chunks of SmolLM2-135M-shaped fp32 KV
(2.9 MB per 64-token chunk, raw codec, ``skip_existing=False``) with the asyncio client and retrieves them, then
the same with the sync client (``retrieve_chunks`` as bytes, and ``retrieve``), ``--repeats`` times each after a
warm-up, and reports the median GB/s of each. Prints per tree the range and the
median over rounds, and the ratio of medians (second / first). ``--url`` runs one child's measurement against a
running server. ``--tls``: the server also listens with TLS (a self-signed certificate made for the run, no client
certificates) and the children connect with ``rediss://`` (``openssl`` makes the certificate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64  # SmolLM2-135M


def _kv(chunks: int, chunk_tokens: int) -> np.ndarray:
    n_tokens = chunks * chunk_tokens
    return np.random.default_rng(0).standard_normal((LAYERS, 2, KV_HEADS, n_tokens, HEAD_DIM), dtype=np.float32)


async def _measure_async(url: str, ns: str, kv: np.ndarray, chunk_tokens: int,
                         repeats: int) -> dict[str, float]:
    from kvstrata.client import AsyncKVCacheClient, Namespace

    tokens = list(range(kv.shape[3]))
    times: dict[str, list[float]] = {"async_store": [], "async_retrieve": []}
    async with AsyncKVCacheClient(url, Namespace(ns, kv_dtype="float32"), chunk_size=chunk_tokens,
                                  compression="raw", local_plane=False) as c:
        for r in range(repeats + 1):  # the first round warms up (connections, probe, page cache)
            t = time.perf_counter()
            await c.store(tokens, kv, skip_existing=False)
            t1 = time.perf_counter()
            n, back = await c.retrieve(tokens)
            t2 = time.perf_counter()
            if n != len(tokens) or not np.array_equal(back, kv):
                raise SystemExit("retrieved KV differs from what was stored")
            if r:
                times["async_store"].append(t1 - t)
                times["async_retrieve"].append(t2 - t1)
    return {k: kv.nbytes / statistics.median(v) / 1e9 for k, v in times.items()}


def _measure_sync(url: str, ns: str, kv: np.ndarray, chunk_tokens: int, repeats: int) -> dict[str, float]:
    from kvstrata.client import KVCacheClient, Namespace

    tokens = list(range(kv.shape[3]))
    times: dict[str, list[float]] = {"sync_store": [], "sync_retrieve_chunks": [], "sync_retrieve": []}
    with KVCacheClient(url, Namespace(ns, kv_dtype="float32"), chunk_size=chunk_tokens, compression="raw",
                       local_plane=False) as c:
        for r in range(repeats + 1):
            t = time.perf_counter()
            c.store(tokens, kv, skip_existing=False)
            t1 = time.perf_counter()
            n, chunks = c.retrieve_chunks(tokens)
            t2 = time.perf_counter()
            m, back = c.retrieve(tokens)
            t3 = time.perf_counter()
            if n != len(tokens) or m != n or not np.array_equal(back, kv):
                raise SystemExit("retrieved KV differs from what was stored")
            del chunks
            if r:
                times["sync_store"].append(t1 - t)
                times["sync_retrieve_chunks"].append(t2 - t1)
                times["sync_retrieve"].append(t3 - t2)
    return {k: kv.nbytes / statistics.median(v) / 1e9 for k, v in times.items()}


def _measure(url: str, ns: str, chunks: int, chunk_tokens: int, repeats: int, clients: str) -> dict[str, float]:
    kv = _kv(chunks, chunk_tokens)
    out: dict[str, float] = {}
    if clients in ("both", "async"):
        out.update(asyncio.run(_measure_async(url, ns + "/a", kv, chunk_tokens, repeats)))
    if clients in ("both", "sync"):
        out.update(_measure_sync(url, ns + "/s", kv, chunk_tokens, repeats))
    return out


def _child(tree: str, url: str, ns: str, args: argparse.Namespace) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run([sys.executable, __file__, "--url", url, "--ns", ns, "--chunks", str(args.chunks),
                          "--chunk-tokens", str(args.chunk_tokens), "--repeats", str(args.repeats),
                          "--clients", args.clients],
                         env=env, check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _self_signed(d: str) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (its own CA) and its key, made by ``openssl`` in ``d``."""
    crt, key = os.path.join(d, "server.crt"), os.path.join(d, "server.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", crt], check=True, capture_output=True, timeout=60)
    return crt, key


def _compare(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    from kvstrata.bench.procs import describe_machine, free_port, machine_summary, start_server

    a, b = args.compare
    need = 4 * LAYERS * 2 * KV_HEADS * args.chunks * args.chunk_tokens * HEAD_DIM * 4
    tls_dir = tempfile.mkdtemp(prefix="kvs-tls-") if args.tls else None
    tls_args: list[str] = []
    if tls_dir is not None:
        crt, key = _self_signed(tls_dir)
        tls_port = free_port()
        tls_args = ["--tls-port", str(tls_port), "--tls-cert-file", crt, "--tls-key-file", key,
                    "--tls-auth-clients", "no"]
    srv = start_server("kvstrata", [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning",
                                    "--http-port", "0", "--dram-size", str(max(1 << 30, need)), *tls_args])
    runs: dict[str, list[dict[str, float]]] = {a: [], b: []}
    try:
        url = f"redis://{srv.host}:{srv.port}"
        if tls_dir is not None:
            url = f"rediss://{srv.host}:{tls_port}/?ssl_ca_certs={crt}"
        for r in range(args.rounds):
            for tree in ((a, b) if r % 2 == 0 else (b, a)):
                runs[tree].append(_child(tree, url, f"bench/async/{r}/{tree}", args))
    finally:
        srv.stop()
        if tls_dir is not None:
            shutil.rmtree(tls_dir, ignore_errors=True)
    machine = describe_machine()
    result: dict[str, Any] = {"machine": machine, "trees": [a, b], "rounds": args.rounds, "tls": args.tls,
                              "runs": runs}
    metrics = list(runs[a][0])
    for metric in metrics:
        med = {t: statistics.median(x[metric] for x in runs[t]) for t in (a, b)}
        result[metric] = {t: {"median": med[t], "min": min(x[metric] for x in runs[t]),
                              "max": max(x[metric] for x in runs[t])} for t in (a, b)}
        result[metric]["ratio"] = med[b] / med[a]
    if not args.json:
        print(machine_summary(machine))
        for metric in metrics:
            m = result[metric]
            for t in (a, b):
                print(f"{metric:20s} {t:16s} GB/s median {m[t]['median']:.2f}  "
                      f"range {m[t]['min']:.2f}-{m[t]['max']:.2f}")
            print(f"{metric:20s} ratio {b} / {a}: {m['ratio']:.2f}")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare", nargs=2, metavar=("BEFORE_SRC", "AFTER_SRC"))
    p.add_argument("--url")
    p.add_argument("--ns", default="bench/async")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--chunk-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--clients", choices=("both", "async", "sync"), default="both",
                   help="which clients a child measures (both: the async one first, in the same process)")
    p.add_argument("--tls", action="store_true", help="connect with rediss:// to the server's TLS port")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.url:
        print(json.dumps(_measure(args.url, args.ns, args.chunks, args.chunk_tokens, args.repeats, args.clients)))
    elif args.compare:
        result = _compare(args)
        if args.json:
            print(json.dumps(result, indent=2))
    else:
        p.error("give --compare BEFORE_SRC AFTER_SRC or --url URL")


if __name__ == "__main__":
    main()
