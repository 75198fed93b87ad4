"""The live prefetch benchmark end to end on a few requests: a real server per mode, figures from its INFO."""

from __future__ import annotations

import pytest

from kvstrata.bench.prefetch_live import run_live

pytestmark = pytest.mark.kvstrata_only


def test_live_replay_reports_each_mode_and_its_engine_twin() -> None:
    result = run_live("multi_turn", arrivals=12, speedup=400.0, value_bytes=1024, modes=("off", "on"))
    rows = {r["mode"]: r for r in result["rows"]}
    assert set(rows) == {"off", "on"} == {r["mode"] for r in result["replay"]}
    reads = result["stats"]["chunk_reads"]
    # Both servers saw every read (GETs stop at the first missing chunk, so at most all of them).
    assert 0 < rows["off"]["gets"] == rows["on"]["gets"] <= reads
    assert rows["off"]["prefetch_issued"] == 0
    on = rows["on"]
    assert on["prefetch_used"] <= on["prefetch_issued"]
    assert 0.0 <= on["prefetch_accuracy"] <= 1.0
