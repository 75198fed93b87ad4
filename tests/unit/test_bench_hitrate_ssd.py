"""``kvstrata bench hitrate --ssd``: a trace replayed through a real Store over a real LMDB SSD tier that evicts."""

import pytest

from kvstrata.bench.hitrate import main
from kvstrata.bench.hitrate_ssd import format_ssd, ranking_bytes_per_key, replay_store
from kvstrata.bench.traces import generate, preset


@pytest.fixture(scope="module")
def trace():
    return generate(preset("default"))[:500]


def test_replay_through_a_store_whose_ssd_evicts(trace):
    rows = {p: replay_store(trace, dram_slots=20, ssd_slots=60, ssd_policy=p) for p in ("fifo", "clock")}
    for row in rows.values():
        assert row["ssd_evictions"] > 0 and row["max_ssd_used"] <= row["ssd_budget"]
        assert row["hits"] == row["dram_hits"] + row["ssd_hits"] and 0 < row["hits"] < row["reads"]
    assert rows["fifo"]["reads"] == rows["clock"]["reads"]
    result = {"dram_fraction": 0.01, "ssd_fraction": 0.04, "value_size": 1024, "dram_policy": "lru-k",
              "results": [{"trace": "default", "dram_slots": 20, "ssd_slots": 60, "policies": rows}],
              "bytes_per_key": {}}
    assert "| default | 20 | 60 |" in format_ssd(result) and "exceeded: never" in format_ssd(result)


def test_ranking_memory_is_counted():
    assert ranking_bytes_per_key("fifo") == 0
    clock = ranking_bytes_per_key("clock", keys=2000)
    assert 10 < clock < ranking_bytes_per_key("lru", keys=2000)


def test_bad_ssd_options_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--ssd", "--ssd-policies", "fifo,mru"])
    assert "--ssd-policies from fifo, clock" in capsys.readouterr().err
