"""The live prefetch benchmark end to end on a few requests: real servers, several clients, figures from INFO."""

from __future__ import annotations

import pytest

from kvstrata.bench.prefetch_live import (
    SCAN_CHUNKS,
    format_table,
    live_targets,
    predictor_cost,
    run_live,
    untuned_trace,
    write_markdown,
)

pytestmark = pytest.mark.kvstrata_only


def test_live_runs_each_rate_fraction_and_mode_through_concurrent_clients() -> None:
    result = run_live(("multi_turn",), (0.05,), clients=3, slow_rate=400.0, value_bytes=1024, arrivals=6)
    rows = result["rows"]
    assert {(r["rate"], r["mode"]) for r in rows} == {("fast", "off"), ("fast", "on"), ("slow", "off"),
                                                       ("slow", "on")}
    # Rows in mode order; the modes took turns at running first: off first at the fast rate, on first at the slow.
    assert [(r["rate"], r["mode"], r["ran"]) for r in rows] == [
        ("fast", "off", 1), ("fast", "on", 2), ("slow", "off", 2), ("slow", "on", 1)]
    reads = result["traces"]["multi_turn"]["chunk_reads"]
    for r in rows:
        # Every request ran (GETs stop at the first missing chunk, so at most all of its reads).
        assert 0 < r["gets"] <= reads
        assert r["p50_us"] <= r["p99_us"]
        # Each request's first GET is one of its GETs: timed apart, and part of the slowest 1% or not.
        assert 0 < r["first_p99_us"] and 0.0 <= r["first_share_of_top1pct"] <= 1.0
        assert r["prefetch_used"] <= r["prefetch_issued"]
        if r["mode"] == "off":
            assert r["prefetch_issued"] == 0 and r["coverage_vs_off"] is None
    # The slow rate is set from the fast runs (at most slow_rate and a sixth of what the fast runs reached without
    # the predictor) and enforced by pacing, so each slow run lasts at least its paced schedule. (Comparing
    # measured reads/s between runs is not deterministic on a loaded machine.)
    slow_rate = result["traces"]["multi_turn"]["slow_rate"]
    fast_off = [r["reads_per_s"] for r in rows if r["rate"] == "fast" and r["mode"] == "off"]
    assert 0 < slow_rate <= min(400.0, *(x / 6 for x in fast_off)) + 0.1
    for r in rows:
        if r["rate"] == "slow":
            assert r["elapsed_s"] >= 0.98 * reads / slow_rate - 0.01
    assert set(result["targets"]) >= {"accuracy_ge_95pct_at_5pct", "predictor_cost_le_3us", "missed"}
    assert "| multi_turn | slow | 5% | on |" in write_markdown(result)
    assert "predictor cost" in format_table(result)


def test_targets_name_where_they_are_missed() -> None:
    base = {"trace": "t", "rate": "fast", "fraction": 0.05, "prefetch_late": 0}
    rows = [
        {**base, "mode": "off", "dram_hit_ratio": 0.5, "ssd_reads": 100, "p99_us": 100.0,
         "prefetch_accuracy": None, "prefetch_used": 0, "coverage_vs_off": None},
        {**base, "mode": "on", "dram_hit_ratio": 0.6, "ssd_reads": 40, "p99_us": 120.0,
         "prefetch_accuracy": 0.97, "prefetch_used": 60, "coverage_vs_off": 0.6},
    ]
    got = live_targets(rows, {"cost_us": 1.0})
    assert got["accuracy_ge_95pct_at_5pct"] and got["coverage_ge_50pct_of_off_ssd_reads_at_5pct"]
    assert got["hit_ratio_higher_with_predictor_at_5pct"] and got["predictor_cost_le_3us"]
    assert not got["p99_not_worse_at_5pct"] and got["missed"] == {"p99": ["t/fast"]}


def test_the_untuned_trace_adds_one_off_scans() -> None:
    trace = untuned_trace(20)
    scans = [r for r in trace if r.kind == "scan"]
    stores = {r.writes for r in trace if r.kind == "scan-store"}
    assert scans and all(len(r.reads) == SCAN_CHUNKS and r.reads in stores for r in scans)
    assert [r.time for r in trace] == sorted(r.time for r in trace)


def test_predictor_cost_is_measured_against_no_predictor() -> None:
    cost = predictor_cost(chains=20, chain_len=8, rounds=3)
    assert cost["get_us_without"] > 0 and cost["get_us_with"] > 0
    # Each figure is rounded to 0.001 on its own, so their difference may be off by one in the last digit.
    assert cost["cost_us"] == pytest.approx(cost["get_us_with"] - cost["get_us_without"], abs=2.5e-3)
    # The server's predictor is the compiled one, and the Python one is measured beside it.
    assert cost["native"] is True and cost["python_cost_us"] > -cost["get_us_without"]
