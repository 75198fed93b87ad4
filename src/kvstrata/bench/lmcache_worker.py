"""LMCache 0.5.6 ``local_cpu`` driven for `kvstrata bench restore`, in LMCache's own virtual environment.

Run as a script by that environment's interpreter (it imports only LMCache, torch and the standard library, never
kvstrata). It reads one JSON request per line on stdin and answers one JSON line on stdout:

* ``{"op": "setup", "cases": [{"model", "dtype", "tokens", "shape"}]}``: one engine per case (chunk 256,
  ``local_cpu``, no remote), a random KV tensor in LMCache's own memory layout (``KV_2LTD``: K/V, layers,
  tokens, kv heads x head dim),
  an existing destination tensor of the same shape, each prefix stored once; answers LMCache's version;
* ``{"op": "store" | "retrieve", "case": i}``: one timed ``engine.store`` (of new token ids, so every chunk is
  copied; cleared again afterwards, untimed) / ``engine.retrieve`` of the whole prefix, answered in seconds; the retrieve is
  checked to restore every token;
* ``{"op": "quit"}``.

The copying GPU connector is ``lmcache_connector.CopyConnector`` (beside this file, imported by path: this
script's directory is first on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch
from lmcache_connector import CopyConnector


def setup(cases: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata

    import lmcache

    built = []
    for i, c in enumerate(cases):
        layers, two, heads, tokens, dim = c["shape"]
        dtype = torch.float32 if c["dtype"] == "float32" else torch.bfloat16
        src = torch.randn(two, layers, tokens, heads * dim).to(dtype)
        dst = torch.zeros_like(src)
        gb = 4 * src.numel() * src.element_size() / 2**30 + 0.5  # room for the stores below (LRU beyond)
        cfg = LMCacheEngineConfig.from_defaults(chunk_size=256, local_cpu=True, max_local_cpu_size=gb,
                                                remote_url=None)
        meta = LMCacheMetadata(model_name=f"{c['model']}-{i}", world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=dtype, kv_shape=(layers, 2, 256, heads, dim))
        conn = CopyConnector(tuple(src.shape), src, dst)
        engine = LMCacheEngineBuilder.get_or_create(f"bench-{i}", cfg, meta, conn, None, None)
        engine.post_init()
        ids = torch.randint(0, 50_000, (tokens,))
        engine.store(ids)
        engine.retrieve(ids)
        if not torch.equal(dst, src):
            raise RuntimeError("LMCache restored different bytes than it stored")
        built.append({"engine": engine, "ids": ids, "conn": conn, "tokens": tokens})
    return built, getattr(lmcache, "__version__", "0.5.6")


def main() -> None:
    built: list[dict[str, Any]] = []
    out = sys.stdout
    # LMCache logs to stdout: keep the protocol on a private copy of it, and the logs on stderr.
    proto = os.fdopen(os.dup(out.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), out.fileno())
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "setup":
                built, version = setup(req["cases"])
                result: Any = f"lmcache {version}, torch {torch.__version__}"
            elif req["op"] in ("store", "retrieve"):
                b = built[req["case"]]
                t0 = time.perf_counter()
                if req["op"] == "store":
                    # New tokens each time: a prefix LMCache holds already would not be copied again.
                    fresh = torch.randint(0, 50_000, (b["tokens"],))
                    t0 = time.perf_counter()
                    b["engine"].store(fresh)
                    result = time.perf_counter() - t0
                    b["engine"].clear(fresh)  # untimed: as an overwrite frees the old value in kvstrata
                else:
                    mask = b["engine"].retrieve(b["ids"])
                    result = time.perf_counter() - t0
                    got = int(mask.sum()) if hasattr(mask, "sum") else b["tokens"]
                    if got != b["tokens"]:
                        raise RuntimeError(f"LMCache restored {got} of {b['tokens']} tokens")
            elif req["op"] == "quit":
                proto.write(json.dumps({"result": None}) + "\n")
                proto.flush()
                os._exit(0)  # LMCacheEngineBuilder.destroy can hang on exit
            else:
                raise ValueError(f"unknown op {req['op']!r}")
            proto.write(json.dumps({"result": result}) + "\n")
        except Exception as exc:  # reported to the benchmark, which then skips LMCache
            proto.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()
