"""The copy of an arena restore with 1, 2, 4... threads, against one memcpy of the same bytes (no server).

A KV prefix shaped like a model's (layers x K/V x kv-heads x tokens x head-dim, LKHTD, bf16 as uint16, 256-token
chunks) is laid out as the arena holds it: each chunk contiguous in a memfd mapping, its payload 85 bytes after a
page boundary (after the value's header). Timed, interleaved, alternating order, after a warm-up round, medians:

* ``memcpy``: one ``np.copyto`` of the whole prefix into a touched buffer (the bench's reference; at or above
  glibc's ``x86_non_temporal_threshold`` it uses non-temporal stores);
* ``memcpy-below-nt``: the same minus 1 MiB, so always below that threshold: one ordinary-store copy;
* ``memcpy-new``: one ``np.copyto`` of the whole prefix into a new array (the reference of ``new-tN``);
* ``copy-tN``: the SDK's copy (``kvstrata.client.filler._copy_along`` through a ``CopyPool`` of N threads, the
  16 MiB engagement threshold as in the client) of the chunks into the touched buffer, as ``retrieve(out=)``;
* ``new-tN``: the same into a new array (``retrieve(tokens)``: first-touch page faults included);
* ``copy-tN-numpy``: ``copy-tN`` with the native streaming-store copy switched off for the call (as
  ``KVSTRATA_NATIVE_COPY=0``), where it is built: numpy's copy, in the same rounds.

    PYTHONPATH=src python3 benchmarks/restore_copy_threads.py --model llama-3.1-8b --tokens 1536 --threads 1,2,4

On a many-core host this shows what ``copy_threads`` buys; on the 2-core dev VM it is within noise of 1 thread.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from kvstrata.bench.restore import CHUNK, MODELS
from kvstrata.client.copypool import CopyPool
from kvstrata.client.filler import _copy_along
from kvstrata.native import ntcopy

MiB = 1024 * 1024
HEADER = 85  # a value's header: its payload starts this far into its page-aligned slot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b", choices=sorted(MODELS))
    ap.add_argument("--tokens", type=int, default=1536)
    ap.add_argument("--threads", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    layers, heads, dim = MODELS[args.model]
    tokens = args.tokens // CHUNK * CHUNK
    shape = (layers, 2, heads, tokens, dim)
    kv = np.random.default_rng(0).integers(0, 1 << 16, size=shape, dtype=np.uint16)
    n = tokens // CHUNK
    csize = layers * 2 * heads * CHUNK * dim * 2
    slot = -(-(csize + HEADER) // mmap.PAGESIZE) * mmap.PAGESIZE
    fd = os.memfd_create("kvstrata-copy-bench")
    os.ftruncate(fd, slot * n)
    arena = mmap.mmap(fd, slot * n)
    chunks = []
    for i in range(n):
        a = np.frombuffer(arena, np.uint8, csize, i * slot + HEADER)
        a[:] = np.ascontiguousarray(kv[:, :, :, i * CHUNK:(i + 1) * CHUNK]).view(np.uint8).reshape(-1)
        chunks.append(a.view(np.uint16).reshape(layers, 2, heads, CHUNK, dim))
    out = np.zeros_like(kv)
    flat_src, flat_dst = kv.reshape(-1), out.reshape(-1)
    below = (kv.nbytes - MiB) // 2
    pools = {t: CopyPool(t) for t in (int(x) for x in args.threads.split(","))}
    modes: dict[str, Callable[[], object]] = {
        "memcpy": lambda: np.copyto(out, kv),
        "memcpy-below-nt": lambda: np.copyto(flat_dst[:below], flat_src[:below]),
        "memcpy-new": lambda: np.copyto(np.empty_like(kv), kv),
    }
    for t, pool in pools.items():
        modes[f"copy-t{t}"] = lambda pool=pool: _copy_along(chunks, out, 3, pool)
        modes[f"new-t{t}"] = lambda pool=pool: _copy_along(chunks, np.empty_like(kv), 3, pool)
    native = ntcopy.NATIVE
    if native is not None:
        for t, pool in pools.items():
            def numpy_copy(pool: CopyPool = pool) -> None:
                ntcopy.NATIVE = None
                try:
                    _copy_along(chunks, out, 3, pool)
                finally:
                    ntcopy.NATIVE = native
            modes[f"copy-t{t}-numpy"] = numpy_copy
    times: dict[str, list[float]] = {m: [] for m in modes}
    for rnd in range(args.rounds + 1):
        for m in (list(modes) if rnd % 2 == 0 else list(modes)[::-1]):
            t0 = time.perf_counter()
            modes[m]()
            dt = time.perf_counter() - t0
            if rnd:
                times[m].append(dt * (kv.nbytes / (2 * below) if m == "memcpy-below-nt" else 1))
    if not np.array_equal(out, kv):
        sys.exit("the copy is wrong")
    for pool in pools.values():
        pool.close()
    ref = statistics.median(times["memcpy"])
    print(f"{args.model} {tokens} tokens, {kv.nbytes / MiB:.0f} MiB, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}, native copy: {native.level if native is not None else ntcopy.WHY}")
    for m, ts in times.items():
        med = statistics.median(ts)
        print(f"  {m:16s} {kv.nbytes / med / 1e9:6.2f} GB/s  {ref / med:5.2f}x memcpy")


if __name__ == "__main__":
    main()
