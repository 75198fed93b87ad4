"""The SGLang HiCache backend's data path on a CPU machine: pages from a host pool to a kvstrata node and back.

    python benchmarks/sglang_backend_cpu.py [--pages 32] [--rounds 5] [--json]

Starts a kvstrata node on a free loopback port, builds a host pool shaped like Qwen3-8B's KV at page size 64
(36 layers, 8 KV heads, head dim 128, bf16: 4.5 MiB per K or V object, 9 MiB per page) with the page methods
of SGLang 0.5.23 (tests/sglang_support.py), and times ``batch_set_v1`` (host pool -> node) and ``batch_get_v1``
(node -> other slots of the pool) of one batch of pages, as SGLang's backup and prefetch threads call them; and,
in the same run, redis-py moving the same pages with copies (bytes per page, MSET/MGET, copy into the pool).
Needs torch and sglang installed as for the tests (docs/sglang.md). Reports medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvstrata.bench.procs import free_port

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    from sglang_support import MHAHostPool, import_sglang, page_indices, storage_config

    hicache = import_sglang()
    if hicache is None:
        sys.exit("sglang is not installed (docs/sglang.md)")
    from kvstrata.integrations.sglang import KvstrataHiCacheStorage

    page = 64
    pool = MHAHostPool(size=2 * args.pages * page, page_size=page, layer_num=36, head_num=8, head_dim=128,
                       dtype=torch.bfloat16)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    log = tempfile.NamedTemporaryFile(prefix="kvstrata-", suffix=".log", delete=False)
    server = subprocess.Popen([sys.executable, "-m", "kvstrata", "serve", "--port", str(port), "--http-port", "0",
                               "--dram-size", "4G"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        cfg = storage_config(hicache, extra_config={"url": f"redis://127.0.0.1:{port}", "skip_existing": False})
        backend = KvstrataHiCacheStorage(cfg, {})
        backend.register_mem_pool_host(pool)
        hashes = [f"{i:064x}" for i in range(args.pages)]
        src = page_indices(range(args.pages), page)
        dst = page_indices(range(args.pages, 2 * args.pages), page)
        nbytes = args.pages * 2 * pool.get_ksize_per_token() * page
        set_s, get_s = [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            assert all(backend.batch_set_v1(hashes, src))
            set_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            assert all(backend.batch_get_v1(hashes, dst))
            get_s.append(time.perf_counter() - t)
        assert pool.page_bytes(0) == pool.page_bytes(args.pages * page)
        backend.close()
        # Peer, in the same run: redis-py (with hiredis) moving the same pages the simple way: each flat page
        # copied to bytes, MSET K and V per page in one pipeline; MGET, then each value copied into the pool.
        peer_set_s, peer_get_s = [], []
        try:
            import redis
        except ImportError:
            redis = None
        if redis is not None:
            r = redis.Redis(port=port)
            keys = [(f"peer:{h}_k", f"peer:{h}_v") for h in hashes]
            for _ in range(args.rounds):
                t = time.perf_counter()
                pipe = r.pipeline(transaction=False)
                for i, (k, v) in enumerate(keys):
                    data = pool.get_data_page(i * page).contiguous().view(torch.uint8).numpy().tobytes()
                    half = len(data) // 2
                    pipe.mset({k: data[:half], v: data[half:]})
                pipe.execute()
                peer_set_s.append(time.perf_counter() - t)
                t = time.perf_counter()
                values = r.mget([x for kv in keys for x in kv])
                for i in range(args.pages):
                    flat = torch.frombuffer(bytearray(values[2 * i] + values[2 * i + 1]), dtype=pool.dtype)
                    pool.set_from_flat_data_page((args.pages + i) * page, flat)
                peer_get_s.append(time.perf_counter() - t)
            r.close()
    finally:
        server.terminate()
        server.wait(30)
    result = {"benchmark": "sglang_backend_cpu", "pages": args.pages, "bytes_per_page": nbytes // args.pages,
              "batch_bytes": nbytes, "rounds": args.rounds,
              "set_v1_gbps": round(nbytes / statistics.median(set_s) / 1e9, 2),
              "get_v1_gbps": round(nbytes / statistics.median(get_s) / 1e9, 2),
              "set_v1_ms": round(1000 * statistics.median(set_s), 1),
              "get_v1_ms": round(1000 * statistics.median(get_s), 1),
              "machine": f"{os.cpu_count()} cores, {sys.platform}"}
    if peer_set_s:
        result["peer_redis_py"] = {"set_gbps": round(nbytes / statistics.median(peer_set_s) / 1e9, 2),
                                   "get_gbps": round(nbytes / statistics.median(peer_get_s) / 1e9, 2),
                                   "set_ms": round(1000 * statistics.median(peer_set_s), 1),
                                   "get_ms": round(1000 * statistics.median(peer_get_s), 1)}
        result["set_speedup"] = round(statistics.median(peer_set_s) / statistics.median(set_s), 2)
        result["get_speedup"] = round(statistics.median(peer_get_s) / statistics.median(get_s), 2)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.pages} pages of {nbytes // args.pages / 2**20:.1f} MiB (K+V), median of {args.rounds}:")
        print(f"  batch_set_v1 (host pool -> kvstrata): {result['set_v1_ms']:8.1f} ms  {result['set_v1_gbps']} GB/s")
        print(f"  batch_get_v1 (kvstrata -> host pool): {result['get_v1_ms']:8.1f} ms  {result['get_v1_gbps']} GB/s")
        if "peer_redis_py" in result:
            peer = result["peer_redis_py"]
            print(f"  redis-py, copies (same pages):  set {peer['set_ms']:8.1f} ms  get {peer['get_ms']:8.1f} ms"
                  f"  -> backend {result['set_speedup']}x / {result['get_speedup']}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
