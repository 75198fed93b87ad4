"""Snapshots, key prefixes, the Prometheus collector and the per-second sampler, on a real (not started)
Server object: no sockets, no event loop."""

import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvstrata.commands.registry import lookup_full
from kvstrata.config import Config
from kvstrata.observability.history import History
from kvstrata.observability.prometheus import LE_BUCKETS, render
from kvstrata.observability.snapshot import key_prefix, sample_dram, top_prefixes
from kvstrata.server.app import Server


@pytest.fixture
def server():
    srv = Server(Config({"http-port": 0, "dram-size": 64 * 1024 * 1024}))
    yield srv
    srv._io.shutdown(wait=False)


def run(srv, name, usec, failed=False):
    """What the connection does for one command, without a connection (``config|get``: the subcommand's row, as
    the dispatcher counts subcommands)."""
    st = srv.command_counts[lookup_full(name)]
    st.calls += 1
    st.usec += usec
    st.hist[usec.bit_length()] += 1
    if failed:
        st.failed += 1


@pytest.mark.parametrize("key, prefix", [
    (b"user:42", "user:"),
    (b"user:42:profile", "user:"),
    (b"{doc7}:chunk:3", "{doc7}:"),
    (b"kv{s1}x", "kv{"),
    (b"plainkey", "(no prefix)"),
    (b":leading", "(no prefix)"),
    (b"caf\xc3\xa9:1", "café:"),
    (b"\xff\xfe:1", "\\xff\\xfe:"),
])
def test_key_prefix(key, prefix):
    assert key_prefix(key) == prefix


def test_top_prefixes_exact_on_a_small_tier(server):
    store = server.store
    for i in range(30):
        store.put(b"a:%d" % i, b"x" * 10)
    for i in range(5):
        store.put(b"b:%d" % i, b"y" * 10_000)
    dram = store.dram
    out = top_prefixes(dram, sample_dram(dram))
    assert out["exact"] is True and out["sampled_keys"] == 35 == out["total_keys"]
    assert [p["prefix"] for p in out["top"]] == ["b:", "a:"]  # by bytes, not keys
    assert out["top"][0]["bytes"] == sum(dram.size(b"b:%d" % i, b"y" * 10_000) for i in range(5))
    assert out["top"][1]["keys"] == 30


def test_top_prefixes_sampled_on_a_large_tier(server):
    store = server.store
    for i in range(6000):
        store.put((b"big:" if i % 3 == 0 else b"small:") + str(i).encode(), b"v" * (3000 if i % 3 == 0 else 10))
    sample = sample_dram(store.dram, limit=1000, rng=random.Random(7))
    assert 1000 <= len(sample) < 1200  # whole buckets, bounded
    assert len(set(sample)) == len(sample)
    out = top_prefixes(store.dram, sample)
    assert out["exact"] is False
    by = {p["prefix"]: p for p in out["top"]}
    assert by["big:"]["keys"] == pytest.approx(2000, rel=0.15)
    assert by["small:"]["keys"] == pytest.approx(4000, rel=0.15)
    assert out["top"][0]["prefix"] == "big:"


def test_snapshot_counts(server):
    store = server.store
    for i in range(10):
        store.put(b"k:%d" % i, b"v")
    store.get(b"k:1")
    store.get(b"nope")
    run(server, b"set", 5)
    run(server, b"get", 3, failed=True)
    snap = server.snapshot()
    assert snap["keys"] == 10 and snap["version_counter"] == 10
    assert snap["keyspace"]["hits"] == 1 and snap["keyspace"]["misses"] == 1
    assert snap["keyspace"]["hit_ratio"] == 0.5
    rows = {r["name"]: r for r in snap["commands"]}
    assert rows["get"]["failed"] == 1 and rows["set"]["calls"] == 1
    assert rows["set"]["histogram_usec"] == [[1, 0], [2, 0], [4, 0], [8, 1]]
    assert "_hist" not in rows["set"]
    assert snap["tiers"][0]["keys"] == 10


def samples_of(body):
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_prometheus_histogram_buckets(server):
    for us in (0, 1, 3, 900, 1500, 40_000_000):  # the last one is beyond the largest finite bucket
        run(server, b"get", us)
    body, headers = render(lambda: server.observability.snapshot(), process_metrics=False)
    assert headers["Content-Type"].startswith("text/plain")
    s = samples_of(body)
    buckets = sorted(((float(dict(labels)["le"]), v) for (name, labels), v in s.items()
                      if name == "kvstrata_command_duration_seconds_bucket" and ("cmd", "get") in labels))
    assert len(buckets) == LE_BUCKETS + 1
    assert buckets[0] == (1e-6, 1)  # 0 µs
    assert dict(buckets)[2e-6] == 2  # 0 and 1 µs
    assert dict(buckets)[0.001024] == 4
    assert dict(buckets)[0.002048] == 5
    assert buckets[-2][1] == 5 and buckets[-1] == (float("inf"), 6)
    assert s[("kvstrata_command_duration_seconds_count", (("cmd", "get"),))] == 6
    assert s[("kvstrata_command_duration_seconds_sum", (("cmd", "get"),))] == pytest.approx(40_002_404 / 1e6)
    assert s[("kvstrata_commands_total", (("cmd", "get"),))] == 6


def test_prometheus_subcommands_are_a_breakdown(server):
    run(server, b"config|get", 10)
    run(server, b"config|get", 20, failed=True)
    run(server, b"config|set", 3000)
    server.command_counts[lookup_full(b"config|get")].rejected += 2
    body, _ = render(lambda: server.observability.snapshot(), process_metrics=False)
    s = samples_of(body)
    # the container once per call of any of its subcommands: calls, errors and time folded together
    assert s[("kvstrata_commands_total", (("cmd", "config"),))] == 3
    assert s[("kvstrata_command_errors_total", (("cmd", "config"),))] == 1
    assert s[("kvstrata_command_duration_seconds_count", (("cmd", "config"),))] == 3
    assert s[("kvstrata_command_duration_seconds_sum", (("cmd", "config"),))] == pytest.approx(3030 / 1e6)
    buckets = {float(dict(labels)["le"]): v for (name, labels), v in s.items()
               if name == "kvstrata_command_duration_seconds_bucket" and ("cmd", "config") in labels}
    assert (buckets[8e-6], buckets[16e-6], buckets[32e-6], buckets[0.002048], buckets[0.004096]) == (0, 1, 2, 2, 3)
    assert ("kvstrata_commands_total", (("cmd", "config|get"),)) not in s
    assert s[("kvstrata_subcommands_total", (("cmd", "config|get"),))] == 2
    assert s[("kvstrata_subcommands_total", (("cmd", "config|set"),))] == 1
    assert s[("kvstrata_command_rejected_total", (("cmd", "config|get"),))] == 2


def test_history_series_and_latency_events(server):
    server.config.set("latency-monitor-threshold", 2)
    h = History(server)
    h.sample(now=1000.0, mono=10.0)
    server.store.put(b"a", b"1")
    server.store.get(b"a")
    server.store.get(b"b")
    run(server, b"get", 3000)  # ~3 ms: bucket [2048, 4096) µs -> 4 ms
    run(server, b"set", 100)  # under the threshold
    h.sample(now=1001.0, mono=11.0)
    js = h.as_json()
    assert js["t"] == [1001.0] and js["ops"] == [2.0] and js["hit_ratio"] == [0.5]
    assert js["tier_used_bytes"]["dram"] == [server.store.dram.used]
    assert h.latest() == [["get", 1001, 4, 4]]
    assert h.history("get") == [[1001, 4]]
    assert h.history("set") == []
    h.sample(now=1002.0, mono=12.0)  # nothing new
    assert h.history("get") == [[1001, 4]]
    assert js["hit_ratio"] == [0.5] and h.as_json()["hit_ratio"] == [0.5, None]
    assert h.reset(["get", "nope"]) == 1 and h.latest() == []


def test_history_survives_resetstat(server):
    h = History(server)
    run(server, b"get", 5)
    h.sample(now=1.0, mono=1.0)
    server.reset_stats()
    h.sample(now=2.0, mono=2.0)  # counters went down: no point, no crash
    run(server, b"get", 5)
    h.sample(now=3.0, mono=3.0)
    assert h.as_json()["ops"] == [1.0]


def test_pool_degraded_is_exported_only_with_a_pool_tier(server):
    snap = server.observability.snapshot()
    assert "pool" not in snap  # no pool tier on this node
    body, _ = render(lambda: snap, process_metrics=False)
    assert b"kvstrata_pool_degraded" not in body
    for degraded in (True, False):
        with_pool = {**snap, "pool": {"degraded": degraded, "errors": 3}}
        s = samples_of(render(lambda snap=with_pool: snap, process_metrics=False)[0])
        assert s[("kvstrata_pool_degraded", ())] == (1 if degraded else 0)
        assert s[("kvstrata_pool_errors_total", ())] == 3
