"""Prefetch benchmark: replay KV-cache traces through the engine with the predictor off and on.

The engine is the real one: :class:`~kvstrata.engine.store.Store` with its DRAM budget, LRU-K, admission rule
and an LMDB :class:`~kvstrata.engine.tiers.ssd.SsdTier` in a temporary directory, the real
:class:`~kvstrata.engine.predict.Predictor`, and ``Store.promote`` doing each prefetch. The DRAM budget is a
fraction of the trace's working set (distinct chunks, all of one value size); everything else lives on SSD.

Time is trace time on a :class:`~kvstrata.clock.ManualClock`; the durations of data movement are modelled, so
results are deterministic and do not depend on how busy this machine is:

* a request reads its prefix chunk after chunk; a chunk in DRAM takes ``consume_ms`` (the client receiving and
  using it);
* the SSD is one device that serves one chunk read at a time in ``ssd_ms``: a read that misses DRAM waits for
  the device (after the load it is on, if any) plus ``ssd_ms``, then ``consume_ms``;
* prefetches queue behind demand reads (low priority) and run one at a time on the same device; the queue
  holds at most ``queue_capacity`` keys. A read whose chunk is still queued takes it over as a demand read; a
  read whose chunk is being loaded waits for that load (a *late* prefetch);
* as with the SDK, a request's cached prefix ends at the first chunk missing from every tier: that chunk and
  the rest of the prompt are computed by the client (prefill is not timed) and written back without being
  looked up, then every chunk the request generated is written.

Reported per (trace, DRAM fraction, mode): DRAM hit ratio (reads that found their chunk in DRAM), reads that
waited for the SSD (demand loads plus late prefetches), the modelled time they waited, and the prefetch
outcomes of ``Store.prefetch_info`` (issued, used, late, wasted, accuracy, coverage). Modes: ``off`` (no
predictor), ``on`` (predictor) and ``on+chain`` (predictor, and demotion takes a chain's tail before its head).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvstrata.bench.procs import describe_machine, machine_summary
from kvstrata.bench.report import target_lines, target_table
from kvstrata.bench.traces import PRESETS, Request, generate, preset, trace_stats
from kvstrata.clock import ManualClock
from kvstrata.engine.entry import ENTRY_OVERHEAD
from kvstrata.engine.policy import create_policy
from kvstrata.engine.predict import Predictor
from kvstrata.engine.store import Store
from kvstrata.engine.tiers.ssd import SsdTier

DEFAULT_TRACES: tuple[str, ...] = ("multi_turn", "default", "independent", "rag")
DEFAULT_FRACTIONS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3)
TARGET_FRACTIONS: tuple[float, ...] = (0.1, 0.2, 0.3)
MODES: tuple[str, ...] = ("off", "on", "on+chain")
TARGET_ACCURACY = 0.95
TARGET_COVERAGE = 0.80
TARGET_TRACE = "multi_turn"


@dataclass(frozen=True)
class Timing:
    """The modelled durations (see the module docstring); defaults describe a 32 MiB chunk (256 tokens of a
    Llama-3-8B-shaped bf16 KV) served at this server's measured DRAM GET rate and read from an NVMe SSD."""

    consume_ms: float = 8.0
    """Serving one DRAM chunk to the client: 32 MiB at ~4 GB/s (BENCHMARKS.md, SSD tier section, DRAM GET)."""
    ssd_ms: float = 5.5
    """One chunk read from the SSD device: 32 MiB at ~6 GB/s (a PCIe 4 NVMe drive's sequential read)."""
    queue_capacity: int = 256
    """Most prefetches waiting at once; more are dropped."""


@dataclass
class _Device:
    free_at: float = 0.0
    loading: bytes | None = None
    done_at: float = 0.0


class Replay:
    """One replay of a trace through a fresh engine (see the module docstring)."""

    def __init__(self, trace: Sequence[Request], budget: int, path: str, *, mode: str, timing: Timing,
                 value_bytes: int) -> None:
        self.trace = sdk_requests(trace)
        self.timing = timing
        self.clock = ManualClock()
        self.value = b"\x5a" * value_bytes
        predictor = Predictor(self.clock) if mode != "off" else None
        self.ssd = SsdTier(path, 1 << 40, fsync="no", threaded=False)
        self.store = Store(budget, policy=create_policy("lru-k", clock=self.clock, k=2, crp=1.0),
                           clock=self.clock, ssd=self.ssd, predictor=predictor, chain_evict=mode == "on+chain")
        self.queue: deque[bytes] = deque()
        self.queued: set[bytes] = set()
        self.dev = _Device()
        self.reads = self.dram_hits = self.ssd_reads = self.late = self.computed = self.dropped = 0
        self.wait_s = 0.0

    def _at(self, t: float) -> None:
        dt = t - self.clock.monotonic()
        if dt > 0:
            self.clock.advance(dt)

    def _run_device(self, until: float) -> None:
        """Let the device finish and start prefetch loads up to time ``until``."""
        dev = self.dev
        store = self.store
        while True:
            if dev.loading is not None:
                if dev.done_at > until:
                    return
                self._at(dev.done_at)
                key = dev.loading
                dev.loading = None
                store.promote(key)
                store.end_command()
            if not self.queue:
                return
            start = max(dev.free_at, self.clock.monotonic())
            if start > until:
                return
            key = self.queue.popleft()
            self.queued.discard(key)
            if key in store.dram.entries:
                continue
            self._at(start)
            dev.loading = key
            dev.done_at = start + self.timing.ssd_ms / 1000
            dev.free_at = dev.done_at

    def _submit(self) -> None:
        predictor = self.store.predictor
        if predictor is None or not predictor.pending:
            return
        entries = self.store.dram.entries
        for key in predictor.take():
            if key in entries or key in self.queued or key == self.dev.loading:
                continue
            if len(self.queue) >= self.timing.queue_capacity:
                self.dropped += 1
                continue
            self.queue.append(key)
            self.queued.add(key)
            self.store.stats.prefetch_predicted += 1

    def _read(self, key: bytes, t: float) -> tuple[float, bool]:
        """Read one chunk at time ``t``; returns when the client is done with it and whether it was cached."""
        store = self.store
        timing = self.timing
        self._run_device(t)
        self._at(t)
        self.reads += 1
        dev = self.dev
        waited = dev.loading == key
        if waited:
            # Late: the chunk is on its way up; wait for that load instead of reading it again.
            self.wait_s += dev.done_at - t
            t = dev.done_at
            self._run_device(t)
            self._at(t)
            if key in store.dram.entries:
                self.late += 1
                store.mark_late([key])
            # else the prefetch could not make room: the read goes to the device itself, below.
        elif key in self.queued:
            self.queue.remove(key)
            self.queued.discard(key)
        in_dram = key in store.dram.entries
        entry = store.get(key)
        store.end_command()
        if entry is None:
            self.computed += 1
            store.put(key, self.value)
            done = t
        elif in_dram:
            if not waited:
                self.dram_hits += 1
            done = t + timing.consume_ms / 1000
        else:
            self.ssd_reads += 1
            start = max(t, dev.free_at)
            # A demand read goes before queued prefetches, after the load the device is doing.
            if dev.loading is not None:
                start = max(start, dev.done_at)
            dev.free_at = start + timing.ssd_ms / 1000
            self.wait_s += dev.free_at - t
            done = dev.free_at + timing.consume_ms / 1000
        self._submit()
        return done, entry is not None

    def run(self) -> dict[str, Any]:
        store = self.store
        sid = 0
        for when, reads, writes in self.trace:
            sid += 1
            store.command.stream = sid
            t = max(when, self.clock.monotonic())
            for i, key in enumerate(reads):
                t, found = self._read(key, t)
                if not found:
                    # Like the SDK: the cached prefix ends at the first missing chunk; the rest of the prompt is
                    # computed and stored without being looked up (it cannot be cached: chunks chain).
                    for rest in reads[i + 1:]:
                        self.reads += 1
                        self.computed += 1
                        store.put(rest, self.value)
                        store.end_command()
                    break
            self._run_device(t)
            self._at(t)
            for key in writes:
                store.put(key, self.value)
                store.end_command()
            self._submit()
            if store.predictor is not None:
                store.predictor.forget_stream(sid)
        self._run_device(float("inf"))
        info = store.prefetch_info()
        reads = self.reads
        waits = self.ssd_reads + self.late
        # None where there is nothing to measure (no prefetch issued, no read needed a lower tier).
        info["prefetch_accuracy"], info["prefetch_coverage"] = store.prefetch_ratios()
        return {
            "reads": reads,
            "dram_hits": self.dram_hits,
            "hit_ratio": round(self.dram_hits / reads, 4) if reads else 0.0,
            "ssd_reads": self.ssd_reads,
            "late": self.late,
            "ssd_waits": waits,
            "ssd_wait_s": round(self.wait_s, 3),
            "computed": self.computed,
            "prefetch_dropped": self.dropped,
            "prefetch": {k: v for k, v in info.items() if k.startswith("prefetch_")},
            "predictor": {k: v for k, v in info.items() if not k.startswith("prefetch_")},
        }

    def close(self) -> None:
        self.ssd.close()


def sdk_key(digest: bytes) -> bytes:
    """A trace chunk as the SDK names it (docs/chunk-keys.md): one namespace, the chunk digest in hex."""
    return SDK_PREFIX + digest.hex().encode()


SDK_PREFIX = b"kvs:6788bb73290c1167:"


def sdk_requests(trace: Sequence[Request]) -> list[tuple[float, list[bytes], list[bytes]]]:
    """(time, reads, writes) of each request, with the chunks named as the SDK names them."""
    return [(r.time, [sdk_key(k) for k in r.reads], [sdk_key(k) for k in r.writes]) for r in trace]


def dram_slots(fraction: float, distinct: int) -> int:
    """How many chunks a DRAM of ``fraction`` of a working set of ``distinct`` chunks holds."""
    return max(1, int(round(fraction * distinct)))


def dram_budget(slots: int, trace: Sequence[Request], value_bytes: int) -> int:
    """The DRAM budget, in bytes, that holds ``slots`` of the trace's chunks (key, value, entry overhead)."""
    key_len = len(sdk_key(trace[0].reads[0] if trace[0].reads else trace[0].writes[0]))
    return slots * (key_len + value_bytes + ENTRY_OVERHEAD)


def run(traces: Sequence[str], fractions: Sequence[float] = DEFAULT_FRACTIONS, *,
        modes: Sequence[str] = MODES, timing: Timing | None = None, value_bytes: int = 256,
        seed_offset: int = 0, slow_ssd_ms: float | None = None,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Replay every (trace, fraction, mode) and return the benchmark's JSON document.

    With ``slow_ssd_ms``, the multi-turn trace at 10% is replayed again with that SSD read time (a device slower
    than the client, so prefetches can arrive late): the ``sensitivity`` rows.
    """
    say = progress or (lambda _msg: None)
    timing = timing or Timing()
    plan: list[tuple[str, float, Timing, str]] = [(n, f, timing, "results") for n in traces for f in fractions]
    if slow_ssd_ms is not None:
        plan.append((TARGET_TRACE, 0.1, Timing(timing.consume_ms, slow_ssd_ms, timing.queue_capacity),
                     "sensitivity"))
    started = time.perf_counter()
    trace_info: dict[str, Any] = {}
    out: dict[str, list[dict[str, Any]]] = {"results": [], "sensitivity": []}
    traces_cache: dict[str, list[Request]] = {}
    for name, fraction, tm, where in plan:
        if name not in traces_cache:
            params = preset(name, seed_offset=seed_offset)
            traces_cache = {name: generate(params)}
            stats = trace_stats(traces_cache[name])
            trace_info[name] = {"params": params.to_dict(), "stats": stats}
            say(f"{name}: {stats['requests']} requests, {stats['chunk_reads']} chunk reads, "
                f"{stats['distinct_chunks']} distinct chunks")
        trace = traces_cache[name]
        results = out[where]
        budget = dram_budget(dram_slots(fraction, trace_info[name]["stats"]["distinct_chunks"]), trace, value_bytes)
        for mode in modes:
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="kvstrata-bench-prefetch-") as path:
                replay = Replay(trace, budget, path, mode=mode, timing=tm, value_bytes=value_bytes)
                try:
                    row = replay.run()
                finally:
                    replay.close()
            row = {"trace": name, "fraction": fraction, "mode": mode, "ssd_ms": tm.ssd_ms, **row}
            results.append(row)
            pf = row["prefetch"]
            say(f"  {name} {fraction:.0%} ssd {tm.ssd_ms}ms {mode:<8} hit {row['hit_ratio']:.4f} "
                f"ssd waits {row['ssd_waits']} ({row['ssd_wait_s']:.1f}s) issued {pf['prefetch_issued']} "
                f"accuracy {_ratio(pf['prefetch_accuracy'])} coverage {_ratio(pf['prefetch_coverage'])} "
                f"late {row['late']} ({time.perf_counter() - t0:.1f}s)")
    return {
        "benchmark": "prefetch",
        "machine": describe_machine(),
        "timing": asdict(timing),
        "value_bytes": value_bytes,
        "traces": trace_info,
        "results": out["results"],
        "sensitivity": out["sensitivity"],
        "targets": targets(out["results"]),
        "runtime_s": round(time.perf_counter() - started, 3),
    }


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def targets(results: Sequence[dict[str, Any]], mode: str = "on+chain") -> dict[str, bool]:
    """The issue's targets for the default mode (predictor and chain-aware demotion) at 10-30% DRAM.

    Accuracy and coverage on the multi-turn trace, where there is something to measure (a budget at which no
    read needs the SSD has no coverage to speak of); the hit ratio with the predictor above the one without
    wherever reads needed the SSD without it, and never below it anywhere.
    """
    rows = [r for r in results if r["mode"] == mode and r["fraction"] in TARGET_FRACTIONS]
    on = [r for r in rows if r["trace"] == TARGET_TRACE]
    base = {(r["trace"], r["fraction"]): r for r in results if r["mode"] == "off"}
    accuracy = [r["prefetch"]["prefetch_accuracy"] for r in on if r["prefetch"]["prefetch_accuracy"] is not None]
    coverage = [r["prefetch"]["prefetch_coverage"] for r in on if r["prefetch"]["prefetch_coverage"] is not None]
    pairs = [(r, base[(r["trace"], r["fraction"])]) for r in rows if (r["trace"], r["fraction"]) in base]
    return {
        "multi_turn_accuracy_ge_95pct": bool(accuracy) and all(a >= TARGET_ACCURACY for a in accuracy),
        "multi_turn_coverage_ge_80pct": bool(coverage) and all(c >= TARGET_COVERAGE for c in coverage),
        "hit_ratio_higher_with_predictor": bool(pairs) and all(
            r["hit_ratio"] > b["hit_ratio"] if b["ssd_waits"] else r["hit_ratio"] >= b["hit_ratio"]
            for r, b in pairs),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvstrata bench prefetch",
                                     description="Replay KV-cache traces through the engine, predictor off and on.")
    parser.add_argument("--trace", action="append", choices=[*PRESETS, "untuned", "all"],
                        help=f"trace preset, repeatable (default: {', '.join(DEFAULT_TRACES)})")
    parser.add_argument("--fractions", default=",".join(str(f) for f in DEFAULT_FRACTIONS),
                        help="DRAM budgets as fractions of the working set (default: 0.1,0.2,0.3)")
    parser.add_argument("--modes", default=",".join(MODES), help="modes to run (default: off,on,on+chain)")
    parser.add_argument("--consume-ms", type=float, default=Timing.consume_ms)
    parser.add_argument("--ssd-ms", type=float, default=Timing.ssd_ms)
    parser.add_argument("--queue", type=int, default=Timing.queue_capacity)
    parser.add_argument("--value-bytes", type=int, default=256,
                        help="stored bytes per chunk (the budget scales with it; hit ratios do not)")
    parser.add_argument("--seed", type=int, default=0, help="offset added to each preset's seed")
    parser.add_argument("--slow-ssd-ms", type=float, default=None,
                        help="also replay multi_turn at 10%% with this SSD read time (sensitivity rows)")
    parser.add_argument("--live", action="store_true",
                        help="measure a live server instead of the replay: several clients, two request rates, "
                             "3/5/10%% DRAM (kvstrata.bench.prefetch_live)")
    parser.add_argument("--live-clients", type=int, default=4, help="client connections of --live")
    parser.add_argument("--live-slow-rate", type=float, default=150.0,
                        help="most chunk reads a second of --live's slow rate (the fast one is unpaced; slow is "
                             "also at most a sixth of it)")
    parser.add_argument("--live-arrivals", type=int, default=None,
                        help="arrivals of each trace in --live (default: a per-trace size of a few seconds)")
    parser.add_argument("--live-value-bytes", type=int, default=16384, help="chunk size of --live")
    parser.add_argument("--live-server-arg", action="append", default=[], metavar="ARG",
                        help="an argument passed on to --live's servers, repeatable (an experiment's setting: "
                             "--live-server-arg=--prefetch-along --live-server-arg=0)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    args = parser.parse_args(argv)
    names = list(DEFAULT_TRACES) if not args.trace else (list(PRESETS) if "all" in args.trace else args.trace)
    fractions = [float(f) for f in args.fractions.split(",") if f.strip()]
    modes = [m for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            parser.error(f"unknown mode {m!r}; known: {', '.join(MODES)}")
    timing = Timing(args.consume_ms, args.ssd_ms, args.queue)
    if "untuned" in names and not args.live:
        parser.error("the untuned trace is replayed by --live only")

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.live:
        from kvstrata.bench import prefetch_live

        live_names = prefetch_live.LIVE_TRACES if not args.trace else tuple(
            ["untuned", *PRESETS] if "all" in args.trace else args.trace)
        live_fractions = (prefetch_live.LIVE_FRACTIONS if args.fractions == parser.get_default("fractions")
                          else tuple(fractions))
        live = prefetch_live.run_live(live_names, live_fractions, clients=args.live_clients,
                                      slow_rate=args.live_slow_rate, value_bytes=args.live_value_bytes,
                                      arrivals=args.live_arrivals,
                                      modes=[m for m in modes if m in prefetch_live.LIVE_MODES] or ["off", "on"],
                                      server_args=args.live_server_arg, progress=progress)
        print(json.dumps(live, indent=2) if args.json else prefetch_live.format_table(live))
        return 0
    result = run(names, fractions, modes=modes, timing=timing, value_bytes=args.value_bytes,
                 seed_offset=args.seed, slow_ssd_ms=args.slow_ssd_ms, progress=progress)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result))
    return 0


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{'trace':<12} {'dram':>5} {'ssd ms':>6} {'mode':<9} {'hit':>7} {'waits':>7} {'wait s':>8} "
             f"{'issued':>7} {'acc':>6} {'cov':>6} {'late':>5} {'wasted':>6}"]
    for r in [*result["results"], *result.get("sensitivity", [])]:
        pf = r["prefetch"]
        lines.append(
            f"{r['trace']:<12} {r['fraction']:>5.0%} {r['ssd_ms']:>6} {r['mode']:<9} {r['hit_ratio']:>7.4f} "
            f"{r['ssd_waits']:>7} {r['ssd_wait_s']:>8.1f} {pf['prefetch_issued']:>7} "
            f"{_ratio(pf['prefetch_accuracy']):>6} {_ratio(pf['prefetch_coverage']):>6} {r['late']:>5} "
            f"{pf['prefetch_wasted']:>6}")
    lines.append("")
    lines += target_lines(result["targets"])
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))


def _row_md(r: dict[str, Any]) -> str:
    pf = r["prefetch"]
    return (f"| {r['trace']} | {r['fraction']:.0%} | {r['mode']} | {r['hit_ratio']:.4f} | {r['ssd_waits']} | "
            f"{r['ssd_wait_s']:.1f} | {pf['prefetch_issued']} | {_ratio(pf['prefetch_accuracy'])} | "
            f"{_ratio(pf['prefetch_coverage'])} | {r['late']} | {pf['prefetch_wasted']} |")


def write_markdown(result: dict[str, Any]) -> str:
    """A BENCHMARKS.md section for a :func:`run` result."""
    tm = result["timing"]
    head = ("| trace | DRAM | mode | DRAM hit ratio | reads that waited for SSD | modelled wait s | prefetches issued "
            "| accuracy | coverage | late | wasted |")
    rule = "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    out = [
        "## Prefetch: access profiles and the predictor",
        "",
        "Command: `kvstrata bench prefetch --json --slow-ssd-ms 16`  ",
        f"Machine: {machine_summary(result['machine'])}",
        "",
        "Trace replay through the real engine (Store, LRU-K, admission, LMDB SSD tier, predictor; "
        "`src/kvstrata/bench/prefetch.py`) in trace time. DRAM is a fraction of the trace's distinct chunks; "
        f"modelled durations: {tm['consume_ms']} ms to serve a DRAM chunk to the client, {tm['ssd_ms']} ms per "
        "chunk read on the one SSD device (demand reads before prefetches). Modes: *off* no predictor; *on* "
        "predictor; *on+chain* predictor and chain-aware demotion (the default: `chain-evict yes`). "
        "Accuracy = used / issued; coverage = reads served in time by a prefetch / reads that needed a lower "
        "tier; n/a where there was nothing to measure. The `independent` trace's parameters were fixed (issue 4) "
        "before the predictor existed and were not tuned on; `rag` has no conversations at all.",
        "",
        head,
        rule,
        *[_row_md(r) for r in result["results"]],
    ]
    if result.get("sensitivity"):
        slow = result["sensitivity"][0]["ssd_ms"]
        out += [
            "",
            f"A slower SSD ({slow} ms per chunk, slower than the client consumes): prefetches arrive late.",
            "",
            head,
            rule,
            *[_row_md(r) for r in result["sensitivity"]],
        ]
    labels = {
        "multi_turn_accuracy_ge_95pct": "accuracy >= 95% on multi_turn at 10-30% DRAM",
        "multi_turn_coverage_ge_80pct": "coverage >= 80% on multi_turn at 10-30% DRAM",
        "hit_ratio_higher_with_predictor": "hit ratio with the predictor above without (where the SSD was read)",
    }
    out += ["", *target_table(result["targets"], labels, "target (mode on+chain)")]
    out.append("")
    return "\n".join(out)
