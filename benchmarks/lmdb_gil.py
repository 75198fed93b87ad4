#!/usr/bin/env python3
"""How long a loader thread's SSD read takes while another thread runs Python: the GIL hand-back after LMDB.

    PYTHONPATH=src python benchmarks/lmdb_gil.py [--values 16384] [--reads 400] [--json]

py-lmdb lets go of the GIL inside its calls (``Transaction.get`` among them), so a thread that reads records
gives the GIL away once per record, and when another thread is running Python it gets it back only when that
thread blocks or its switch interval (``sys.getswitchinterval()``, 5 ms by default) runs out. The server's
loader threads read records while its event loop runs Python; this measures what that costs one load:
``SsdTier.read_many`` of 1 and of 5 records (a GET's chunk, and one with four chunks loaded along), alone and
with a thread spinning in Python, at the default switch interval and at 0.5 ms. Modes alternate round by round;
percentiles of all reads of a mode. Figures in BENCHMARKS.md ("Prefetch: a request's first read and the GIL").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from typing import Any

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.ssd import SsdTier


def _pct(xs: list[int], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(len(xs) * q))] / 1000, 1)


def _spin(stop: threading.Event) -> None:
    """Python work until told to stop (what the server's event loop is to its loader threads)."""
    x = 0
    while not stop.is_set():
        x += 1


def run(value_bytes: int = 16384, reads: int = 400, rounds: int = 4) -> dict[str, Any]:
    keys = [b"kvs:ns:%05d" % i for i in range(2000)]
    results: dict[str, list[int]] = {}
    default_interval = sys.getswitchinterval()
    with tempfile.TemporaryDirectory(prefix="kvstrata-lmdb-gil-") as d:
        tier = SsdTier(d + "/ssd", 1 << 32, fsync="no", threaded=False)
        value = b"z" * value_bytes
        for i, key in enumerate(keys):
            tier.put(key, Entry(value, i + 1))
        tier.flush()
        modes = [(n, spin, interval) for n in (1, 5) for spin in (False, True)
                 for interval in (default_interval, 0.0005)]
        for r in range(rounds):
            for n, spin, interval in (modes if r % 2 == 0 else modes[::-1]):
                name = f"{n} record{'s' if n > 1 else ''}, {'a Python thread spinning' if spin else 'alone'}, " \
                       f"switch interval {interval * 1000:g} ms"
                stop = threading.Event()

                sys.setswitchinterval(interval)
                th = threading.Thread(target=_spin, args=(stop,), daemon=True) if spin else None
                if th is not None:
                    th.start()
                times = results.setdefault(name, [])
                try:
                    for i in range(reads // rounds):
                        start = (i * n * 7 + r * 131) % (len(keys) - n)
                        t0 = time.perf_counter_ns()
                        tier.read_many(keys[start:start + n])
                        times.append(time.perf_counter_ns() - t0)
                finally:
                    stop.set()
                    if th is not None:
                        th.join()
                    sys.setswitchinterval(default_interval)
        tier.close()
    return {"benchmark": "lmdb-gil", "value_bytes": value_bytes, "reads_per_mode": reads,
            "rows": [{"mode": k, "p50_us": _pct(v, 0.5), "p90_us": _pct(v, 0.9), "p99_us": _pct(v, 0.99)}
                     for k, v in results.items()]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=16384, help="value bytes of each record")
    parser.add_argument("--reads", type=int, default=400, help="read_many calls per mode")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.values, args.reads)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for row in result["rows"]:
            print(f"{row['mode']:<60} p50 {row['p50_us']:>8} us  p90 {row['p90_us']:>8} us  p99 {row['p99_us']:>8} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
