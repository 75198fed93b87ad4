#!/usr/bin/env python3
"""retrieve_chunks with and without the fetch of the next window overlapping the decode of the current one.

    python benchmarks/sdk_overlap.py [--chunks 32] [--chunk-tokens 64] [--codec zstd] [--repeats 15] [--json]

Starts a kvstrata server on a free loopback port, stores ``--chunks`` chunks of SmolLM2-135M-shaped fp32 KV
(30 layers x K/V x 3 heads x 64 dims: 2.9 MB per 64-token chunk) with ``--codec``, then times
``retrieve_chunks`` of the whole prefix with ``overlap=False`` and ``overlap=True``, alternating the two in every
repeat so that both see the same machine (it is shared), for the sync client and the asyncio one. Prints the
median of each and the ratio of medians (off / on: above 1 means overlap is faster). Without overlap one MGET
reads ``batch_size`` (64) chunks, with it one window (4): a third setting, ``overlap=False`` with
``batch_size`` = the window, separates what the smaller MGETs do from what the overlap does. For context it also
times the fetches alone (MGETs of the windows, no decode) and the decodes alone: overlap can at best bring the
total down to about the larger of the two. Every setting is checked to return the same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from kvstrata.bench.procs import describe_machine, machine_summary, start_server
from kvstrata.client import AsyncKVCacheClient, KVCacheClient, Namespace
from kvstrata.client.codec import decode

LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64  # SmolLM2-135M


def _namespace() -> Namespace:
    return Namespace("bench/sdk-overlap", kv_dtype="float32", layout="LKHTD")


# The settings compared: label -> client keyword arguments ("windows" is replaced by the window size).
SETTINGS: dict[str, dict[str, Any]] = {
    "off": {"overlap": False},
    "off_windowed": {"overlap": False, "batch_size": "windows"},
    "on": {"overlap": True},
}


def _kwargs(args: argparse.Namespace, setting: str, window: int) -> dict[str, Any]:
    kw = {k: window if v == "windows" else v for k, v in SETTINGS[setting].items()}
    return {"chunk_size": args.chunk_tokens, **kw}


def _sync_reader(url: str, args: argparse.Namespace, setting: str, window: int) -> KVCacheClient:
    return KVCacheClient(url, _namespace(), **_kwargs(args, setting, window))


def _time_sync(c: KVCacheClient, tokens: list[int], reuse: bool) -> tuple[float, list[np.ndarray]]:
    t = time.perf_counter()
    n, chunks = c.retrieve_chunks(tokens, reuse_buffers=reuse)
    dt = time.perf_counter() - t
    assert n == len(tokens), f"only {n} of {len(tokens)} tokens found"
    return dt, chunks


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
                                    for x, y in zip(a, b, strict=True))


def _order(r: int) -> list[str]:
    """The settings in a different order each repeat, so that none always runs first or last."""
    names = list(SETTINGS)
    k = r % len(names)
    return names[k:] + names[:k]


def _summary(times: dict[str, list[float]], nbytes: int) -> dict[str, Any]:
    med = {name: statistics.median(t) for name, t in times.items()}
    out: dict[str, Any] = {f"{name}_ms": m * 1e3 for name, m in med.items()}
    out["ratio_off_on"] = med["off"] / med["on"]
    out["ratio_off_windowed_on"] = med["off_windowed"] / med["on"]
    out["on_gbps"] = nbytes / med["on"] / 1e9
    out["all_ms"] = {name: [round(x * 1e3, 2) for x in t] for name, t in times.items()}
    return out


def bench_sync(url: str, tokens: list[int], args: argparse.Namespace, nbytes: int, window: int,
               reuse: bool) -> dict[str, Any]:
    clients = {name: _sync_reader(url, args, name, window) for name in SETTINGS}
    try:
        first = {name: _time_sync(c, tokens, reuse)[1] for name, c in clients.items()}  # warm up
        if not reuse:  # reused buffers are overwritten by a client's next call: compare fresh ones
            assert all(_same(first["off"], f) for f in first.values()), "a setting changed the result"
        times: dict[str, list[float]] = {name: [] for name in SETTINGS}
        for r in range(args.repeats):
            for name in _order(r):
                times[name].append(_time_sync(clients[name], tokens, reuse)[0])
    finally:
        for c in clients.values():
            c.close()
    return _summary(times, nbytes)


def bench_async(url: str, tokens: list[int], args: argparse.Namespace, nbytes: int, window: int) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        clients = {name: AsyncKVCacheClient(url, _namespace(), **_kwargs(args, name, window)) for name in SETTINGS}
        try:
            first = {name: (await c.retrieve_chunks(tokens))[1] for name, c in clients.items()}
            assert all(_same(first["off"], f) for f in first.values()), "a setting changed the result"
            times: dict[str, list[float]] = {name: [] for name in SETTINGS}
            for r in range(args.repeats):
                for name in _order(r):
                    t = time.perf_counter()
                    n, _ = await clients[name].retrieve_chunks(tokens)
                    times[name].append(time.perf_counter() - t)
                    assert n == len(tokens)
        finally:
            for c in clients.values():
                await c.aclose()
        return _summary(times, nbytes)

    return asyncio.run(run())


def parts(url: str, tokens: list[int], args: argparse.Namespace) -> dict[str, float]:
    """Median time of the MGETs alone (windows of the overlapped read, no decode) and of the decodes alone."""
    c = _sync_reader(url, args, "on", 0)
    keys = c.keys(tokens)
    w = c._window()
    fetch, dec = [], []
    try:
        for _ in range(max(3, args.repeats // 2)):
            t = time.perf_counter()
            values = []
            for i in range(0, len(keys), w):
                values += c.redis.execute_command("TAIR.KV.MGET", *keys[i:i + w])
            fetch.append(time.perf_counter() - t)
            t = time.perf_counter()
            for v in values:
                decode(v)
            dec.append(time.perf_counter() - t)
    finally:
        c.close()
    return {"fetch_only_ms": statistics.median(fetch) * 1e3, "decode_only_ms": statistics.median(dec) * 1e3,
            "window_chunks": w, "stored_bytes": sum(len(v) for v in values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--chunk-tokens", type=int, default=64)
    ap.add_argument("--codec", default="zstd")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()

    n_tokens = args.chunks * args.chunk_tokens
    rng = np.random.default_rng(args.seed)
    kv = rng.standard_normal((LAYERS, 2, KV_HEADS, n_tokens, HEAD_DIM), dtype=np.float32)
    tokens = list(range(n_tokens))
    srv = start_server("kvstrata", [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning",
                                    "--http-port", "0", "--dram-size", str(max(1 << 30, 4 * kv.nbytes))])
    try:
        url = f"redis://{srv.host}:{srv.port}"
        writer = KVCacheClient(url, _namespace(), chunk_size=args.chunk_tokens, compression=args.codec)
        assert writer.store(tokens, kv) == args.chunks
        writer.close()
        result: dict[str, Any] = {
            "machine": describe_machine(), "chunks": args.chunks, "chunk_tokens": args.chunk_tokens,
            "codec": args.codec, "repeats": args.repeats, "decoded_bytes": kv.nbytes,
        }
        result.update(parts(url, tokens, args))
        w = result["window_chunks"]
        result["sync"] = bench_sync(url, tokens, args, kv.nbytes, w, reuse=False)
        result["sync_reuse_buffers"] = bench_sync(url, tokens, args, kv.nbytes, w, reuse=True)
        result["async"] = bench_async(url, tokens, args, kv.nbytes, w)
    finally:
        srv.stop()

    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"machine: {machine_summary(result['machine'])}")
    print(f"{args.chunks} chunks x {args.chunk_tokens} tokens, {args.codec}: {kv.nbytes / 1e6:.1f} MB decoded, "
          f"{result['stored_bytes'] / 1e6:.1f} MB stored; windows of {result['window_chunks']} chunks; "
          f"median of {args.repeats}, the settings interleaved")
    print(f"  fetch only (MGETs, no decode): {result['fetch_only_ms']:.1f} ms; "
          f"decode only: {result['decode_only_ms']:.1f} ms")
    print(f"  {'':<19} {'off':>9} {'off, windowed':>14} {'on':>9}   off/on   off windowed/on")
    for name in ("sync", "sync_reuse_buffers", "async"):
        r = result[name]
        print(f"  {name:<19} {r['off_ms']:6.1f} ms {r['off_windowed_ms']:11.1f} ms {r['on_ms']:6.1f} ms   "
              f"{r['ratio_off_on']:5.2f}x   {r['ratio_off_windowed_on']:5.2f}x")


if __name__ == "__main__":
    main()
