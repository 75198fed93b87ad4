#!/usr/bin/env python3
"""Where an arena restore's time goes: the MGETREF apart from the copy, and the copy against other copies.

    PYTHONPATH=src python benchmarks/arena_split.py [--cases qwen2.5-7b:bfloat16:1536,...] [--rounds 4] [--json]

Starts a kvstrata server on a Unix socket, stores each case (``kvstrata bench restore``'s KV shapes), then:

* ``mgetref``: the time of the SDK's one ``TAIR.KV.MGETREF`` for the whole prefix, right after a store through
  the staging segment, right after a store over the socket, and with no store since the last read; with
  ``NOSUM`` (what the SDK sends) and without it (the server then hashes each value it has no checksum for);
* ``copy``: the chunks leased, then copied into the case's buffer (the SDK's ``_into``, 64 KB runs): ``arena``
  out of the read-only mapping, ``anon`` the same runs out of anonymous memory, ``anon85`` the same at the
  arena payload's alignment, ``memcpy`` one copy of the whole prefix (the reference of ``bench restore``).

Medians; the copy modes alternate their order round by round. Figures in BENCHMARKS.md ("Arena restore without
the server's hash pass").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from kvstrata.bench.procs import start_server
from kvstrata.bench.restore import Case
from kvstrata.client.codec import decode
from kvstrata.client.sdk import KVCacheClient

MB = 1024 * 1024


def _anon_copies(chunks: list[np.ndarray], skew: int | None) -> list[np.ndarray]:
    """Each chunk copied into anonymous memory (at ``skew`` bytes past a page boundary when given)."""
    out = []
    for x in chunks:
        if skew is None:
            out.append(np.ascontiguousarray(x))
            continue
        buf = np.empty(x.nbytes + 4096, np.uint8)
        off = ((-buf.ctypes.data) % 4096 + skew) % 4096
        a = buf[off:off + x.nbytes].view(x.dtype).reshape(x.shape)
        a[...] = x
        out.append(a)
    return out


def run(specs: list[str], rounds: int) -> dict[str, Any]:
    cases = [Case(s, seed=i) for i, s in enumerate(specs)]
    total = sum(c.nbytes for c in cases)
    sock = os.path.join(tempfile.mkdtemp(prefix="kvs-split-"), "kv.sock")
    srv = start_server("kvstrata", [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning",
                                    "--http-port", "0", "--dram-size", str(2 * total + 256 * MB),
                                    "--unixsocket", sock])
    result: dict[str, Any] = {"cases": []}
    try:
        staged = KVCacheClient(f"unix://{sock}", stage_writes=True)
        socketed = KVCacheClient(f"unix://{sock}", local_plane=False)
        for c in cases:
            staged.namespace = c.namespace()
            staged.store(c.token_ids, c.kv, skip_existing=False)
        for c in cases:
            staged.namespace = socketed.namespace = c.namespace()
            ac = staged._arena()
            keys = staged.keys(c.token_ids)
            ms: dict[str, list[float]] = {}
            for rnd in range(rounds + 1):
                for nosum in (True, False):
                    for before in ("stage", "socket", "none"):
                        if before != "none":
                            (staged if before == "stage" else socketed).store(c.token_ids, c.kv, skip_existing=False)
                        t0 = time.perf_counter()
                        lease, _ = ac.mgetref(keys, checksums=not nosum)
                        dt = time.perf_counter() - t0
                        ac.release(lease, now=True)
                        if rnd:
                            ms.setdefault(f"after {before}{' NOSUM' if nosum else ''}", []).append(1e3 * dt)
            lease, refs = ac.mgetref(keys, checksums=False)
            try:
                chunks = [decode(ac.value(r), check=False)[0] for r in refs]
                sources = {"arena": chunks, "anon": _anon_copies(chunks, None), "anon85": _anon_copies(chunks, 85)}
                fns = {name: (lambda ch=ch, c=c: staged._into(ch, c.out)) for name, ch in sources.items()}
                fns["memcpy"] = lambda c=c: np.copyto(c.out, c.kv)
                times: dict[str, list[float]] = {k: [] for k in fns}
                order = list(fns)
                for rnd in range(2 * rounds + 1):
                    for name in order if rnd % 2 else order[::-1]:
                        t0 = time.perf_counter()
                        fns[name]()
                        if rnd:
                            times[name].append(time.perf_counter() - t0)
            finally:
                ac.release(lease, now=True)
            result["cases"].append({
                "case": c.name, "mb": round(c.nbytes / MB, 1),
                "mgetref_ms": {k: round(statistics.median(v), 2) for k, v in ms.items()},
                "copy_gbps": {k: round(c.nbytes / statistics.median(v) / 1e9, 2) for k, v in times.items()},
            })
        staged.close()
        socketed.close()
    finally:
        srv.stop()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="qwen2.5-7b:bfloat16:1536,smollm2-135m:float32:1536,llama-3.1-8b:bfloat16:1536")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = run(args.cases.split(","), args.rounds)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        for r in res["cases"]:
            print(f"{r['case']} ({r['mb']} MB)")
            print("  MGETREF ms: " + ", ".join(f"{k} {v}" for k, v in r["mgetref_ms"].items()))
            print("  copy GB/s:  " + ", ".join(f"{k} {v}" for k, v in r["copy_gbps"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
