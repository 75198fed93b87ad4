"""The prefetch benchmark against a live server: the predictor's decisions through real sockets and threads.

:mod:`kvstrata.bench.prefetch` replays traces through the engine in trace time, which makes its figures exact
but leaves out the server: connections as streams, the prefetch queue and its loader thread, commands that take
over or wait for a prefetch. This replays a trace (or its first ``arrivals`` arrivals) against ``kvstrata serve``
(SSD tier on a temporary directory, DRAM a fraction of the replayed working set) on loopback, ``speedup`` times
faster than the trace, with the predictor off and on in the same run:

* DRAM holds as many chunks as in the engine replay of the whole trace at ``fraction``;
* every request opens its own connection (its stream), reads its prefix chunk after chunk with ``GET``, stops
  at the first missing chunk as the SDK does, pauses ``consume_ms / speedup`` after each chunk (the client
  using it), then stores the rest of its prompt and its new chunks with ``SET``;
* every time parameter of the server (the session gap, LRU-K's CRP, the prefetch protection, the promotion
  window, the half-life of the temporal score) is divided by ``speedup`` too, so the server sees the trace's rhythm, only faster;
* the figures are the server's own: ``INFO prefetch`` and the DRAM tier's hits and misses.

Timing on a shared machine is noisy, so *late* and *coverage* vary from run to run; accuracy does not depend on
timing much. Pacing uses ``time.sleep``: it paces the workload, it does not synchronise anything.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvstrata.bench.prefetch import Replay, Timing, dram_budget, dram_slots, sdk_requests
from kvstrata.bench.procs import start_server
from kvstrata.bench.rawclient import RawClient
from kvstrata.bench.traces import generate, preset, trace_stats

LIVE_MODES: dict[str, list[str]] = {
    "off": ["--prefetch-predict", "no"],
    "on": ["--prefetch-predict", "yes", "--chain-evict", "no"],
    "on+chain": ["--prefetch-predict", "yes", "--chain-evict", "yes"],
}


def _info(c: RawClient, section: str) -> dict[str, str]:
    text = c.call(b"INFO", section.encode()).decode()
    out: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.split(":", 1)
            out[k] = v
    return out


def _num(fields: dict[str, str], name: str) -> float:
    try:
        return float(fields.get(name, "0"))
    except ValueError:
        return 0.0


def run_live(trace_name: str = "multi_turn", *, arrivals: int | None = None, fraction: float = 0.1,
             speedup: float = 50.0, value_bytes: int = 16384, consume_ms: float = 8.0,
             modes: tuple[str, ...] = tuple(LIVE_MODES),
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    say = progress or (lambda _msg: None)
    full = preset(trace_name)
    arrivals = full.arrivals if arrivals is None else arrivals
    trace = generate(replace(full, arrivals=arrivals))
    stats = trace_stats(trace)
    requests = sdk_requests(trace)
    # The same DRAM, in chunks, as the engine replay of the whole trace at this fraction: the first arrivals
    # see the same pressure from concurrent sessions as the whole trace does.
    whole = stats if arrivals == full.arrivals else trace_stats(generate(full))
    slots = dram_slots(fraction, whole["distinct_chunks"])
    budget = dram_budget(slots, trace, value_bytes)
    value = b"\x5a" * value_bytes
    pause = consume_ms / 1000 / speedup
    scaled = {"--prefetch-session-gap": 1.0, "--lru-k-crp": 1.0, "--prefetch-protect": 2.0,
              "--promote-window": 60.0, "--prefetch-half-life": 60.0}
    rows: list[dict[str, Any]] = []
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix="kvstrata-bench-prefetch-live-") as ssd_dir:
            argv = [sys.executable, "-m", "kvstrata", "serve", "--loglevel", "warning", "--dram-size", str(budget),
                    "--essd-path", ssd_dir, "--fsync", "no", "--prefetch-min-value", "0", *LIVE_MODES[mode]]
            for flag, seconds in scaled.items():
                argv += [flag, f"{seconds / speedup:.6f}"]
            with start_server(f"kvstrata-prefetch-{mode}", argv) as srv:
                t0 = time.perf_counter()
                origin = requests[0][0]
                for when, reads, writes in requests:
                    delay = (when - origin) / speedup - (time.perf_counter() - t0)
                    if delay > 0:
                        time.sleep(delay)
                    with RawClient(srv.host, srv.port) as c:
                        filled = len(reads)
                        for i, key in enumerate(reads):
                            if c.get(key) is None:
                                filled = i
                                break
                            time.sleep(pause)
                        for key in reads[filled:]:
                            c.set(key, value)
                        for key in writes:
                            c.set(key, value)
                elapsed = time.perf_counter() - t0
                with RawClient(srv.host, srv.port) as c:
                    pf = _info(c, "prefetch")
                    dram = _info(c, "tier_dram")
                    ssd = _info(c, "tier_ssd")
        hits, misses = _num(dram, "hits"), _num(dram, "misses")
        row = {
            "mode": mode,
            "elapsed_s": round(elapsed, 2),
            "gets": int(hits + misses),
            "dram_hit_ratio": round(hits / (hits + misses), 4) if hits + misses else None,
            "ssd_reads": int(_num(ssd, "hits")),
            **{k: (_num(pf, k) if "." in pf.get(k, "") else int(_num(pf, k)))
               for k in ("prefetch_predicted", "prefetch_issued", "prefetch_used", "prefetch_late",
                         "prefetch_wasted", "prefetch_rejected", "prefetch_accuracy", "prefetch_coverage")},
        }
        rows.append(row)
        say(f"  live {trace_name} {mode:<8} hit {row['dram_hit_ratio']} ssd reads {row['ssd_reads']} "
            f"issued {row['prefetch_issued']} used {row['prefetch_used']} late {row['prefetch_late']} "
            f"accuracy {row['prefetch_accuracy']} coverage {row['prefetch_coverage']} ({elapsed:.1f}s)")
    # The engine replay of the same requests, budget and value size: what the deterministic benchmark predicts.
    replayed: list[dict[str, Any]] = []
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix="kvstrata-bench-prefetch-") as path:
            replay = Replay(trace, budget, path, mode=mode, timing=Timing(consume_ms=consume_ms),
                            value_bytes=value_bytes)
            try:
                r = replay.run()
            finally:
                replay.close()
        replayed.append({"mode": mode, "dram_hit_ratio": r["hit_ratio"], "ssd_reads": r["ssd_reads"],
                         **{k: r["prefetch"][k] for k in ("prefetch_issued", "prefetch_used", "prefetch_late",
                                                           "prefetch_wasted", "prefetch_accuracy",
                                                           "prefetch_coverage")}})
    return {
        "trace": trace_name,
        "arrivals": arrivals,
        "fraction": fraction,
        "dram_chunks": slots,
        "speedup": speedup,
        "value_bytes": value_bytes,
        "consume_ms": consume_ms,
        "stats": stats,
        "rows": rows,
        "replay": replayed,
    }
