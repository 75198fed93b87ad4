"""LMCache 0.5.6 with kvstrata as its remote backend (``remote_url: redis://``), driven by
tests/integration/test_lmcache_backend.py in LMCache's own virtual environment.

Run by that environment's interpreter: it imports only LMCache, torch and the standard library, never kvstrata.
One JSON request per line on stdin, one JSON answer per line on stdout:

* ``{"op": "store", "engine": name, "seed": s, "tokens": n}``: a random KV tensor (seeded) stored by engine
  ``name`` (created on first use: chunk 256, no local CPU tier, so every chunk goes to the remote); answers once
  LMCache's lookup sees every token (its remote puts are asynchronous);
* ``{"op": "retrieve", "engine": name, "seed": s, "tokens": n}``: retrieve into a zeroed tensor; answers the
  number of tokens restored (whole chunks), whether their bytes equal the seeded tensor's, and whether the
  tokens after them were left alone;
* ``{"op": "lookup", "engine": name, "seed": s, "tokens": n}``: LMCache's hit length.

The copying GPU connector is kvstrata's ``bench/lmcache_connector.py``, loaded by path (kvstrata itself is not
installed in LMCache's environment).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

# kvstrata is not importable here; its LMCache connector module is (it imports only LMCache and torch).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src" / "kvstrata" / "bench"))
from lmcache_connector import CopyConnector

LAYERS, HEADS, DIM, CHUNK = 4, 2, 16, 256


ENGINES: dict[str, tuple[Any, CopyConnector]] = {}


def engine(name: str, url: str) -> tuple[Any, CopyConnector]:
    if name not in ENGINES:
        from lmcache.v1.cache_engine import LMCacheEngineBuilder
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.metadata import LMCacheMetadata

        cfg = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, local_cpu=False, max_local_cpu_size=0.5,
                                                remote_url=url, remote_serde="naive")
        meta = LMCacheMetadata(model_name="kvstrata-test/model", world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=(LAYERS, 2, CHUNK, HEADS, DIM))
        conn = CopyConnector((2, LAYERS, CHUNK, HEADS * DIM))
        eng = LMCacheEngineBuilder.get_or_create(name, cfg, meta, conn, None, None)
        eng.post_init()
        ENGINES[name] = (eng, conn)
    return ENGINES[name]


def data(seed: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50_000, (tokens,), generator=g)
    kv = torch.randn(2, LAYERS, tokens, HEADS * DIM, generator=g).to(torch.bfloat16)
    return ids, kv


def main() -> None:
    url = sys.argv[1]
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # LMCache logs to stdout: keep the protocol apart
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "quit":
                proto.write('{"result": null}\n')
                proto.flush()
                os._exit(0)  # LMCacheEngineBuilder.destroy can hang on exit
            eng, conn = engine(req["engine"], url)
            ids, kv = data(req["seed"], req["tokens"])
            if req["op"] == "store":
                conn.src = kv
                eng.store(ids)
                deadline = time.monotonic() + 30
                while eng.lookup(ids) < len(ids) and time.monotonic() < deadline:
                    time.sleep(0.02)  # LMCache's remote put is asynchronous: its own lookup says when it is in
                result: Any = eng.lookup(ids)
            elif req["op"] == "retrieve":
                conn.dst = torch.zeros_like(kv)
                n = int(eng.retrieve(ids).sum())
                got, want = conn.dst[:, :, :n].view(torch.int16), kv[:, :, :n].view(torch.int16)
                result = {"tokens": n, "equal": bool(torch.equal(got, want)),
                          "rest_untouched": bool(torch.all(conn.dst[:, :, n:] == 0))}
            elif req["op"] == "lookup":
                result = eng.lookup(ids)
            else:
                raise ValueError(f"unknown op {req['op']!r}")
            proto.write(json.dumps({"result": result}) + "\n")
        except Exception as exc:
            proto.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()
