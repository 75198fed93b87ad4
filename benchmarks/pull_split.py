#!/usr/bin/env python3
"""Where a pull store's time goes: the SDK's pull store against its staged store, and raw PULLs of strided and
contiguous ranges, against a memcpy of the same bytes.

    PYTHONPATH=src python benchmarks/pull_split.py [--shape 28,2,4,1536,128] [--rounds 8]

Starts a kvstrata server on a Unix socket with ``--pull-store yes``; one 2-byte KV tensor of ``--shape`` (layers,
K/V, kv heads, tokens, head dim; 256-token chunks), then rounds of, in alternating order: ``memcpy`` (the whole
tensor into an existing array), ``sdk-pull`` (``KVCacheClient.store``, pulled by the server), ``sdk-stage`` (the
same through the staging segment, ``pull_store = False``), ``raw-strided`` (pipelined ``TAIR.KV.PULL`` of each
chunk's runs, what the SDK sends without its planning), ``raw-contig`` (the same bytes as one contiguous range per
chunk). Medians after the first round, with the server's minor page faults per store. Figures in BENCHMARKS.md ("Store: pull stores").
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

from kvstrata.bench.procs import start_server
from kvstrata.client.keys import Namespace
from kvstrata.client.pull_store import PullWriter, address, pull_command, value_ranges
from kvstrata.client.sdk import KVCacheClient

CHUNK = 256


def _minflt(pid: int) -> int:
    """Minor page faults of process ``pid`` so far (``/proc/PID/stat`` field 10)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        text = f.read()
    return int(text[text.rindex(")") + 2:].split()[7])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="28,2,4,1536,128")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    kv = np.random.default_rng(0).integers(0, 1 << 16, shape, dtype=np.uint16)
    flat = np.ascontiguousarray(kv)
    out = np.empty_like(kv)
    tokens = list(range(shape[3]))
    chunks = shape[3] // CHUNK
    d = tempfile.mkdtemp(prefix="kvs-pull-")
    path = os.path.join(d, "kv.sock")
    srv = start_server("kvstrata", [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning",
                                    "--http-port", "0", "--dram-size", str(4 * kv.nbytes + (256 << 20)),
                                    "--unixsocket", path, "--pull-store", "yes"])
    pull = KVCacheClient(f"unix://{path}", Namespace("pull", kv_dtype="bfloat16"))
    pull.pull_store = True
    stage = KVCacheClient(f"unix://{path}", Namespace("stage", kv_dtype="bfloat16"))
    stage.pull_store = False
    w = PullWriter(path)
    try:
        def raw(contiguous: bool) -> None:
            per = flat.nbytes // chunks
            for i in range(chunks):
                if contiguous:
                    ranges = [(address(flat) + i * per, per)]
                else:
                    _, ranges, _ = value_ranges([b"", kv[:, :, :, i * CHUNK:(i + 1) * CHUNK]])
                w.sock.sendall(pull_command(b"raw%d" % i, 0, b"", ranges))
            for _ in range(chunks):
                w.read_reply()

        modes: dict[str, Callable[[], object]] = {
            "memcpy": lambda: np.copyto(out, kv),
            "sdk-pull": lambda: pull.store(tokens, kv, skip_existing=False),
            "sdk-stage": lambda: stage.store(tokens, kv, skip_existing=False),
            "raw-strided": lambda: raw(False),
            "raw-contig": lambda: raw(True),
        }
        times: dict[str, list[float]] = {m: [] for m in modes}
        faults: dict[str, list[int]] = {m: [] for m in modes}
        for rnd in range(args.rounds):
            order = list(modes.items())
            for name, fn in order if rnd % 2 else order[::-1]:
                f0 = _minflt(srv.pid)
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
                faults[name].append(_minflt(srv.pid) - f0)
        if getattr(pull, "_pull_off", False):
            raise SystemExit("the server refused to pull from this process (see the log)")
        ref = statistics.median(times["memcpy"][1:])
        print(f"{kv.nbytes / 1e6:.1f} MB, shape {shape}, load {os.getloadavg()[0]:.1f}")
        for name, ts in times.items():
            med = statistics.median(ts[1:])
            print(f"  {name:12s} {kv.nbytes / med / 1e9:6.2f} GB/s  x{ref / med:.2f} memcpy  "
                  f"server minor faults {statistics.median(faults[name][1:]):.0f}")
    finally:
        w.close()
        pull.close()
        stage.close()
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
