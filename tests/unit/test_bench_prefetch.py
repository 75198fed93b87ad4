"""The prefetch benchmark's replay: deterministic, consistent accounting, targets and report."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvstrata.bench.prefetch import Replay, Timing, dram_budget, dram_slots, targets, write_markdown
from kvstrata.bench.traces import generate, preset, trace_stats

TRACE = generate(replace(preset("multi_turn"), arrivals=60))
DISTINCT = trace_stats(TRACE)["distinct_chunks"]


def replay(tmp_path: Path, mode: str, fraction: float = 0.05, **timing: float) -> dict:
    path = tmp_path / f"{mode}-{fraction}-{sorted(timing.items())}"
    r = Replay(TRACE, dram_budget(dram_slots(fraction, DISTINCT), TRACE, 64), str(path), mode=mode,
               timing=Timing(**timing), value_bytes=64)
    try:
        return r.run()
    finally:
        r.close()


def test_replay_is_deterministic_and_its_counts_add_up(tmp_path: Path) -> None:
    a = replay(tmp_path / "a", "on")
    b = replay(tmp_path / "b", "on")
    assert a == b
    pf = a["prefetch"]
    assert pf["prefetch_issued"] > 0
    assert pf["prefetch_used"] + pf["prefetch_wasted"] + pf["prefetch_pending_use"] == pf["prefetch_issued"]
    assert a["reads"] == sum(len(r.reads) for r in TRACE)
    assert a["dram_hits"] + a["ssd_reads"] + a["late"] + a["computed"] == a["reads"]


def test_the_predictor_raises_the_hit_ratio_and_cuts_ssd_waits(tmp_path: Path) -> None:
    off = replay(tmp_path, "off")
    on = replay(tmp_path, "on")
    assert off["prefetch"]["prefetch_issued"] == 0
    assert on["hit_ratio"] > off["hit_ratio"]
    assert on["ssd_waits"] < off["ssd_waits"]
    assert on["computed"] == off["computed"]  # the same chunks exist either way


def test_a_slow_ssd_makes_prefetches_late(tmp_path: Path) -> None:
    fast = replay(tmp_path, "on")
    slow = replay(tmp_path, "on", ssd_ms=40.0)
    assert fast["late"] == 0 < slow["late"]
    assert slow["prefetch"]["prefetch_late"] == slow["late"]


def test_targets_and_report(tmp_path: Path) -> None:
    rows = []
    for mode in ("off", "on", "on+chain"):
        r = replay(tmp_path, mode, fraction=0.1)
        rows.append({"trace": "multi_turn", "fraction": 0.1, "mode": mode, "ssd_ms": 5.5, **r})
    got = targets(rows)
    chain = rows[2]["prefetch"]
    assert got["multi_turn_accuracy_ge_95pct"] == (chain["prefetch_accuracy"] >= 0.95)
    assert got["hit_ratio_higher_with_predictor"] == (rows[2]["hit_ratio"] > rows[0]["hit_ratio"])
    doc = {"machine": {"cpu_model": "x", "cores": 2}, "timing": {"consume_ms": 8.0, "ssd_ms": 5.5},
           "results": rows, "sensitivity": [], "targets": got}
    text = write_markdown(doc)
    assert "| multi_turn | 10% | off |" in text and "n/a" in text
    # Nothing measured is not a pass.
    assert targets([])["multi_turn_coverage_ge_80pct"] is False


def test_the_share_of_first_reads_in_the_slowest_percent() -> None:
    from kvstrata.bench.prefetch_live import _share_at_or_above

    whole = sorted([*range(1, 101), 500, 600])  # 102 samples: the 0.99 quantile is 500, the slowest two above it
    assert _share_at_or_above([500, 600], whole, 0.99) == 1.0
    assert _share_at_or_above([5, 600], whole, 0.99) == 0.5
    assert _share_at_or_above([5, 99], whole, 0.99) == 0.0
    assert _share_at_or_above([500, 600], whole, 0.9) == round(2 / 11, 3)  # 92..100, 500, 600 at or above 92
    assert _share_at_or_above([], [], 0.99) is None
