#!/usr/bin/env python3
"""What the SSD writer thread costs an event loop waiting for the GIL, with and without its pauses.

    PYTHONPATH=src python benchmarks/writer_pause.py [--values 32768] [--records 6000] [--rounds 6] [--json]

The server's event loop sleeps in epoll until a request arrives, then needs the GIL. While the SSD writer thread
runs a batch it lets go of the GIL inside every py-lmdb call and takes it back before the loop has woken, so the
loop waits until the batch ends or the switch interval (5 ms) runs out (engine/tiers/pause.py). Here a threaded
``SsdTier`` absorbs a stream of ``--values``-byte puts queued in batches (as demotions are), while an asyncio loop
on the main thread wakes every millisecond and records how late it ran (a request arriving at a random moment
waits as long). Modes ``ssd-writer-pause`` 0 (never) and the default alternate round by round; per mode: the
loop's lateness percentiles while the writer was busy, and the writer's throughput (records a second, from the
first put queued to the last one committed), the pauses' cost. Figures in BENCHMARKS.md ("Prefetch: the SSD
writer pauses for the event loop").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from typing import Any

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.pause import EVERY_US
from kvstrata.engine.tiers.ssd import SsdTier
from kvstrata.server.read_waits import percentile

BATCH = 24  # puts queued at once: about what one promotion's victims and a few SETs hand the writer


def _pct(xs: list[int], q: float) -> float:
    return round(percentile(sorted(xs), q) / 1000, 1)


async def _one(tier: SsdTier, pause_us: int, value: bytes, records: int, base: int) -> tuple[list[int], float]:
    """Queue ``records`` puts in batches, one batch per loop turn, while a ticker measures the loop's lateness."""
    tier.set_writer_pause(pause_us)
    loop = asyncio.get_running_loop()
    tier.set_delivery(loop.call_soon_threadsafe)  # completions settle on the loop, as in the server
    late: list[int] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t = time.perf_counter_ns()
            await asyncio.sleep(0.001)
            late.append(time.perf_counter_ns() - t - 1_000_000)

    tick = loop.create_task(ticker())
    t0 = time.perf_counter()
    last = 0
    for i in range(0, records, BATCH):
        for j in range(i, min(records, i + BATCH)):
            last = tier.put(b"kvs:ns:%08d" % (base + j), Entry(value, base + j + 1))
        await asyncio.sleep(0)
        while tier.queued_bytes > 8 * BATCH * len(value):  # the server's ssd-write-queue bound, scaled down
            await asyncio.sleep(0.0005)
    while tier.committed_seq < last:
        await asyncio.sleep(0.0005)
    elapsed = time.perf_counter() - t0
    done.set()
    await tick
    return late, records / elapsed


def run(value_bytes: int = 32768, records: int = 6000, rounds: int = 6) -> dict[str, Any]:
    modes = (0, EVERY_US)
    late: dict[int, list[int]] = {m: [] for m in modes}
    rates: dict[int, list[float]] = {m: [] for m in modes}
    pauses: dict[int, int] = dict.fromkeys(modes, 0)
    value = b"z" * value_bytes
    with tempfile.TemporaryDirectory(prefix="kvstrata-writer-pause-") as d:
        tier = SsdTier(d + "/ssd", 1 << 33, fsync="no")
        try:
            asyncio.run(_one(tier, 0, value, 500, 10**8))  # warm-up: the map's first pages, the code paths
            for r in range(rounds):
                for m in (modes if r % 2 == 0 else modes[::-1]):
                    before = tier.pacer.pauses
                    lat, rate = asyncio.run(_one(tier, m, value, records, r * 2 * records + (m > 0) * records))
                    late[m] += lat
                    rates[m].append(rate)
                    pauses[m] += tier.pacer.pauses - before
        finally:
            tier.close()
    rows = []
    for m in modes:
        rs = sorted(rates[m])
        rows.append({"ssd_writer_pause_us": m, "loop_late_p50_us": _pct(late[m], 0.5),
                     "loop_late_p99_us": _pct(late[m], 0.99), "loop_late_p999_us": _pct(late[m], 0.999),
                     "loop_late_max_us": _pct(late[m], 1.0), "writer_records_per_s": round(rs[len(rs) // 2]),
                     "pauses": pauses[m]})
    return {"value_bytes": value_bytes, "records": records, "rounds": rounds, "rows": rows,
            "writer_rate_ratio": round(rows[1]["writer_records_per_s"] / rows[0]["writer_records_per_s"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--values", type=int, default=32768)
    ap.add_argument("--records", type=int, default=6000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = run(args.values, args.records, args.rounds)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{args.values}-byte puts, {args.records} a round, {args.rounds} rounds, modes alternating")
    for row in out["rows"]:
        print(f"ssd-writer-pause {row['ssd_writer_pause_us']:>4} us: loop late p50 {row['loop_late_p50_us']:>7} us"
              f"  p99 {row['loop_late_p99_us']:>8} us  p99.9 {row['loop_late_p999_us']:>8} us"
              f"  max {row['loop_late_max_us']:>8} us  writer {row['writer_records_per_s']:>6} records/s"
              f"  pauses {row['pauses']}")
    print(f"writer throughput, pauses / none: {out['writer_rate_ratio']}")


if __name__ == "__main__":
    main()
