"""Observability end to end: /metrics after a known load, /stats.json, SLOWLOG, LATENCY, MEMORY, INFO
latencystats, the dashboard in a real headless Chromium, password checks off loopback, ``kvstrata top`` and the
Prometheus rules under deploy/."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from polling import wait_for
from prometheus_client.parser import text_string_to_metric_families
from tests.unit.test_ssd_check import N, flipped, key_of, value_of

from kvstrata.bench.procs import free_port
from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.ssd import SsdTier

pytestmark = pytest.mark.kvstrata_only

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[2]

CHROMIUM_TIMEOUT = 90.0


# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------


def http_get(port: int, path: str, headers: dict | None = None, method: str = "GET", host: str = HOST):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


def scrape(port: int, headers: dict | None = None) -> dict:
    """``/metrics`` as {(sample name, frozenset of labels): value}."""
    status, hdrs, body = http_get(port, "/metrics", headers)
    assert status == 200, body
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def metric(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def stats_json(port: int, headers: dict | None = None) -> dict:
    status, hdrs, body = http_get(port, "/stats.json", headers)
    assert status == 200, body
    assert hdrs["content-type"].startswith("application/json")
    return json.loads(body)


def kvstrata_env() -> dict:
    env = dict(os.environ)
    src = str(REPO_ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@pytest.fixture(scope="module")
def obs(module_make_server):
    """A DRAM-only server with its HTTP endpoint on a free port, shared by the read-only tests."""
    port = free_port()
    srv = module_make_server({"http-port": port})
    srv.http_port = port
    return srv


# --------------------------------------------------------------------------------------------------------------
# /metrics
# --------------------------------------------------------------------------------------------------------------


def test_metrics_exact_deltas_after_known_load(make_server):
    port = free_port()
    srv = make_server({"http-port": port})
    r = srv.client()
    r.ping()  # the client's own handshake commands happen before the baseline
    before = scrape(port)
    n_set, n_hit, n_miss = 37, 23, 5
    for i in range(n_set):
        r.set(f"load:{i}", b"v" * (i + 1))
    for i in range(n_hit):
        assert r.get(f"load:{i}") is not None
    for i in range(n_miss):
        assert r.get(f"absent:{i}") is None
    after = scrape(port)

    def delta(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("kvstrata_commands_total", cmd="set") == n_set
    assert delta("kvstrata_commands_total", cmd="get") == n_hit + n_miss
    assert delta("kvstrata_command_errors_total", cmd="get") == 0
    assert delta("kvstrata_keyspace_hits_total") == n_hit
    assert delta("kvstrata_keyspace_misses_total") == n_miss
    assert delta("kvstrata_tier_hits_total", tier="dram") == n_hit
    assert delta("kvstrata_tier_misses_total", tier="dram") == n_miss
    assert delta("kvstrata_commands_processed_total") == n_set + n_hit + n_miss
    assert delta("kvstrata_version_counter") == n_set
    assert metric(after, "kvstrata_keys") == n_set
    assert metric(after, "kvstrata_tier_keys", tier="dram") == n_set
    used = sum(len(f"load:{i}") + i + 1 + 512 for i in range(n_set))
    assert metric(after, "kvstrata_tier_used_bytes", tier="dram") == used
    assert metric(after, "kvstrata_tier_budget_bytes", tier="dram") > used
    assert delta("kvstrata_net_input_bytes_total") > 0
    assert delta("kvstrata_net_output_bytes_total") > 0
    assert metric(after, "kvstrata_connected_clients") >= 1

    # Histograms: one observation per command, cumulative buckets, +Inf equal to _count.
    for cmd, calls in (("set", n_set), ("get", n_hit + n_miss)):
        count = metric(after, "kvstrata_command_duration_seconds_count", cmd=cmd)
        assert count == metric(after, "kvstrata_commands_total", cmd=cmd)
        assert count - metric(before, "kvstrata_command_duration_seconds_count", cmd=cmd) == calls
        buckets = sorted(
            (float(dict(labels)["le"]), v) for (name, labels), v in after.items()
            if name == "kvstrata_command_duration_seconds_bucket" and dict(labels).get("cmd") == cmd
        )
        assert buckets[-1] == (float("inf"), count)
        assert [le for le, _ in buckets[:-1]] == [2**i / 1e6 for i in range(len(buckets) - 1)]
        values = [v for _, v in buckets]
        assert values == sorted(values)
        # The sum lies within what the buckets allow: bucket "le=2^i us" holds durations of 2^(i-1) to 2^i us.
        low = high = 0.0
        prev = 0.0
        for i, (le, cum) in enumerate(buckets):
            n = cum - prev
            prev = cum
            if n:
                low += n * (buckets[i - 1][0] if i else 0.0)
                high += n * le
        total = metric(after, "kvstrata_command_duration_seconds_sum", cmd=cmd)
        assert low <= total + 1e-9 and total > 0
        if buckets[-1][1] == buckets[-2][1]:  # nothing beyond the last finite bucket: an upper bound too
            assert total <= high + 1e-9
    r.close()


def test_metrics_names_follow_conventions(obs):
    status, headers, body = http_get(obs.http_port, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    families = list(text_string_to_metric_families(body.decode()))
    ours = [f for f in families if f.name.startswith("kvstrata_")]
    assert len(ours) > 30
    for f in families:
        assert f.name.startswith(("kvstrata_", "process_")), f.name
        assert f.documentation, f.name
        if f.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in f.samples), f.name
    text = body.decode()
    for unit in ("kvstrata_tier_used_bytes", "kvstrata_command_duration_seconds_bucket", "kvstrata_uptime_seconds"):
        assert unit in text
    # gzip when asked for, as Prometheus does
    status, headers, zipped = http_get(obs.http_port, "/metrics", {"Accept-Encoding": "gzip"})
    assert headers.get("content-encoding") == "gzip"
    assert gzip.decompress(zipped).startswith(b"# HELP")


def test_tiered_metrics_and_alert_names(make_server, tmp_path):
    """Every kvstrata_* name the alert rules and the Grafana dashboard use is exported (the pool tier's aside)."""
    port = free_port()
    srv = make_server({"http-port": port, "essd-path": tmp_path / "ssd", "dram-size": "1mb", "promote-hits": 1})
    r = srv.client()
    for i in range(40):
        r.set(f"big:{i}", b"x" * 50_000)  # 2 MB into a 1 MB DRAM tier: demotions
    for i in range(40):
        r.get(f"big:{i}")
    queued_before = metric(scrape(port), "kvstrata_prefetch_queued_total")
    queued = r.execute_command("TAIR.KV.PREFETCH", "big:0", "big:1")
    samples = scrape(port)
    exported = {name for name, _ in samples}
    assert metric(samples, "kvstrata_tier_demotions_total", tier="dram") > 0
    assert metric(samples, "kvstrata_tier_keys", tier="ssd") > 0
    assert ("kvstrata_ssd_write_queue_bytes", frozenset()) in samples
    assert metric(samples, "kvstrata_tier_corrupt_reads_total", tier="ssd") == 0
    assert metric(samples, "kvstrata_prefetch_queued_total") - queued_before >= queued >= 1
    for name in ("issued", "used", "late", "wasted", "absent", "rejected", "predicted"):
        assert (f"kvstrata_prefetch_{name}_total", frozenset()) in samples
    assert 0 <= metric(samples, "kvstrata_prefetch_accuracy") <= 1
    assert 0 <= metric(samples, "kvstrata_prefetch_coverage") <= 1
    assert metric(samples, "kvstrata_profiled_keys") >= 40
    referenced = set()
    for path in ("deploy/prometheus/alerts.yml", "deploy/grafana/kvstrata-dashboard.json"):
        referenced |= set(re.findall(r"\bkvstrata_[a-z_]+", (REPO_ROOT / path).read_text()))
    missing = {n for n in referenced - exported if n != "kvstrata_pool_degraded"}
    assert not missing, f"used in deploy/ but not exported: {sorted(missing)}"
    r.close()


def test_per_tier_counters_match_info_on_a_damaged_ssd(make_server, tmp_path):
    """INFO tier_ssd's ``reads``, ``unreadable_pages``, ``expired`` and the inline counts are on /metrics too
    (kvstrata_tier_<field>_total{tier="ssd"}), scraped from the real endpoint of a server whose LMDB file has
    flipped bits: a listing meets damaged pages, and each GET of a key not in DRAM is one LMDB read."""
    pristine = tmp_path / "pristine"
    tier = SsdTier(str(pristine), 1 << 30, fsync="no", threaded=False)
    for i in range(N):
        tier.put(key_of(i), Entry(value_of(i), i + 1))
    tier.close()
    port = free_port()
    # seed 2 flips bits in B-tree pages (tests/unit/test_ssd_check.py); nothing is promoted on a read
    srv = make_server({"http-port": port, "essd-path": str(flipped(pristine, tmp_path / "ssd", 2)),
                       "dram-size": "1mb", "promote-hits": 100, "prefetch-predict": "no"})
    r = srv.client()
    cursor = 0
    while True:
        cursor, _ = r.scan(cursor, count=500)
        if cursor == 0:
            break
    before, info = scrape(port), r.info("tier_ssd")
    assert info["unreadable_pages"] > 0
    for field in ("reads", "unreadable_pages", "expired"):
        assert metric(before, f"kvstrata_tier_{field}_total", tier="ssd") == info[field], field
        assert ("kvstrata_tier_" + field + "_total", frozenset({("tier", "dram")})) not in before
    for i in range(5):
        r.get(key_of(i))
    after = scrape(port)
    assert metric(after, "kvstrata_tier_reads_total", tier="ssd") - metric(
        before, "kvstrata_tier_reads_total", tier="ssd") == 5
    info = r.info("tier_ssd")
    assert metric(after, "kvstrata_tier_reads_total", tier="ssd") == info["reads"]
    # Whether those GETs ran on the event loop or in a thread, /metrics counts them as INFO does.
    for field in ("reads_inline", "inline_declined", "inline_unknown", "inline_moved", "inline_direct"):
        assert metric(after, f"kvstrata_tier_{field}_total", tier="ssd") == info[field], field
    status, _, body = http_get(port, "/metrics")
    assert "# HELP kvstrata_tier_unreadable_pages_total Damaged LMDB pages" in body.decode()
    assert "# TYPE kvstrata_tier_reads_total counter" in body.decode()
    r.close()


def _write_and_drain(r, prefix: str, value: bytes, numbers: range) -> dict:
    """SET ``prefix:i`` for each number, then wait until the SSD writer has committed everything queued; INFO
    tier_ssd then."""
    for i in numbers:
        r.set(f"{prefix}:{i}", value)
    wait_for(lambda: r.info("tier_ssd")["pending"] == 0, what="the SSD writer to drain")
    return r.info("tier_ssd")


def test_ssd_writes_are_counted_in_info_and_metrics(make_server, tmp_path):
    """INFO tier_ssd's ``writes`` and ``write_bytes`` count the records the SSD writer committed (here: the
    demotions of keys DRAM had no room for), and /metrics exports the same numbers."""
    port = free_port()
    srv = make_server({"http-port": port, "essd-path": str(tmp_path / "ssd"), "dram-size": "32kb",
                       "prefetch-predict": "no"})
    r = srv.client()
    value = b"w" * 2048
    info = _write_and_drain(r, "w", value, range(40))
    demoted = sum(r.execute_command("TAIR.KV.TIER", f"w:{i}") == b"ssd" for i in range(40))
    assert info["writes"] == demoted > 0
    assert info["write_bytes"] >= demoted * len(value)
    got = scrape(port)
    assert metric(got, "kvstrata_tier_writes_total", tier="ssd") == info["writes"]
    assert metric(got, "kvstrata_tier_write_bytes_total", tier="ssd") == info["write_bytes"]
    r.close()


def test_ssd_writer_pauses_are_counted_and_set_at_run_time(make_server, tmp_path):
    """INFO tier_ssd's ``writer_pauses`` counts the SSD writer thread's pauses for the event loop and /metrics
    exports it; ``CONFIG SET ssd-writer-pause`` changes them at run time (1 us: a pause between nearly every two
    operations; 0: none), and a value out of bounds is refused."""
    port = free_port()
    srv = make_server({"http-port": port, "essd-path": str(tmp_path / "ssd"), "dram-size": "64kb",
                       "prefetch-predict": "no", "ssd-writer-pause": 1})
    r = srv.client()
    value = b"p" * 32768
    info = _write_and_drain(r, "p", value, range(40))
    assert info["writes"] > 0 and info["writer_pauses"] > 0
    assert metric(scrape(port), "kvstrata_tier_writer_pauses_total", tier="ssd") == info["writer_pauses"]
    assert r.config_set("ssd-writer-pause", 0)
    assert r.config_get("ssd-writer-pause") == {"ssd-writer-pause": "0"}
    after = _write_and_drain(r, "p", value, range(40, 80))
    assert after["writes"] > info["writes"] and after["writer_pauses"] == info["writer_pauses"]
    with pytest.raises(redis.ResponseError):
        r.config_set("ssd-writer-pause", -1)
    assert all(r.get(f"p:{i}") == value for i in range(80))  # every write kept, paused or not
    r.close()


# --------------------------------------------------------------------------------------------------------------
# /stats.json, /healthz, routing
# --------------------------------------------------------------------------------------------------------------


def test_stats_json_schema(obs):
    r = obs.client()
    r.flushall()
    for i in range(12):
        r.set(f"user:{i}", b"x" * 100)
    r.set("{doc}:chunk:1", b"y" * 1000)
    r.get("user:1")
    s = stats_json(obs.http_port)
    assert s["schema"] == 1
    assert isinstance(s["time"], float)
    assert s["server"]["port"] == obs.port and s["server"]["http_port"] == obs.http_port
    assert s["server"]["tiered"] is False
    assert s["keys"] == r.dbsize() == 13 and s["keys_estimated"] is False
    assert [t["name"] for t in s["tiers"]] == ["dram"]
    tier = s["tiers"][0]
    for field in ("used_bytes", "budget_bytes", "water_level", "keys", "hits", "misses", "promotions", "demotions",
                  "evictions", "corrupt_reads"):
        assert isinstance(tier[field], int | float), field
    assert tier["keys"] == 13
    assert 0 <= tier["water_level"] <= 1
    for section, fields in (("keyspace", ("hits", "misses", "hit_ratio", "expired_keys", "evicted_keys")),
                            ("clients", ("connected", "connections_received", "rejected")),
                            ("net", ("input_bytes", "output_bytes")),
                            ("prefetch", ("queue_depth", "capacity", "queued", "promoted", "dropped")),
                            ("slowlog", ("length", "total", "threshold_usec", "latest")),
                            ("prefixes", ("sampled_keys", "total_keys", "exact", "top"))):
        for field in fields:
            assert field in s[section], (section, field)
    names = {c["name"]: c for c in s["commands"]}
    assert names["set"]["calls"] >= 13
    for field in ("calls", "failed", "usec", "usec_per_call", "p50_usec", "p99_usec", "p999_usec", "histogram_usec"):
        assert field in names["set"], field
    assert names["set"]["p50_usec"] <= names["set"]["p99_usec"] <= names["set"]["p999_usec"]
    assert names["set"]["histogram_usec"][-1][1] == names["set"]["timed"]
    top = {p["prefix"]: p for p in s["prefixes"]["top"]}
    assert s["prefixes"]["exact"] is True
    assert top["user:"]["keys"] == 12 and top["{doc}:"]["keys"] == 1
    assert top["user:"]["bytes"] == sum(len(f"user:{i}") + 100 + 512 for i in range(12))
    assert s["prefixes"]["top"][0]["prefix"] == "user:"  # ordered by bytes
    assert set(s["history"]) >= {"t", "ops", "hit_ratio", "net_in", "net_out", "prefetch_promoted"}
    r.close()


def test_healthz_routes_and_methods(obs):
    assert http_get(obs.http_port, "/healthz")[0:3:2] == (200, b"ok\n")
    status, headers, body = http_get(obs.http_port, "/nope")
    assert status == 404
    status, headers, body = http_get(obs.http_port, "/metrics", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    assert http_get(obs.http_port, "/metrics", method="POST")[0] == 405
    status, headers, body = http_get(obs.http_port, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    # Self-contained: nothing loaded from elsewhere.
    assert not re.search(rb"""(src|href)\s*=\s*["']?(https?:)?//""", body)
    assert b"connect-src 'self'" in headers["content-security-policy"].encode()


def test_keep_alive_serves_several_requests(obs):
    conn = http.client.HTTPConnection(HOST, obs.http_port, timeout=10)
    try:
        for path in ("/healthz", "/stats.json", "/metrics", "/healthz"):
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------------------------
# SLOWLOG, LATENCY, MEMORY, INFO
# --------------------------------------------------------------------------------------------------------------


def test_slowlog_captures_commands_over_the_threshold(obs, expect_error):
    r = obs.client()
    try:
        r.config_set("slowlog-log-slower-than", 1_000_000_000)
        r.slowlog_reset()
        r.set("fast:key", "v")
        assert r.slowlog_len() == 0  # nothing takes 1000 s
        r.config_set("slowlog-log-slower-than", 0)  # every command is slow now
        t0 = time.perf_counter()
        r.set("slow:key", "value")
        round_trip_us = (time.perf_counter() - t0) * 1e6
        entries = r.slowlog_get(10)
        mine = [e for e in entries if e["command"] == b"SET slow:key value"]
        assert len(mine) == 1
        e = mine[0]
        # The server's time for the command fits inside the client's round trip (microseconds, not ms or ns).
        assert isinstance(e["id"], int) and isinstance(e["duration"], int) and 0 <= e["duration"] <= round_trip_us
        assert abs(e["start_time"] - time.time()) < 60
        assert e["client_address"].startswith(b"127.0.0.1:")
        raw = r.execute_command("SLOWLOG", "GET", "-1")
        assert len(raw) >= 3  # CONFIG SET, SET, SLOWLOG GET 10
        assert r.slowlog_len() == len(raw) + 1  # and now SLOWLOG GET -1 itself
        assert raw[0][0] > raw[-1][0]  # newest first
        assert len(r.execute_command("SLOWLOG", "GET", "1")) == 1
        with expect_error("ERR count should be greater than or equal to -1"):
            r.execute_command("SLOWLOG", "GET", "-2")
        r.config_set("slowlog-log-slower-than", -1)  # -1 logs nothing
        assert r.slowlog_reset()
        r.set("slow:key", "again")
        assert r.slowlog_len() == 0
        help_lines = r.execute_command("SLOWLOG", "HELP")
        assert any(b"RESET" in line for line in help_lines)
        assert stats_json(obs.http_port)["slowlog"]["threshold_usec"] == -1
    finally:
        r.config_set("slowlog-log-slower-than", 10000)
        r.close()


def test_latency_commands(obs):
    r = obs.client()
    r.set("lat:a", "1")
    r.get("lat:a")
    hist = r.execute_command("LATENCY", "HISTOGRAM", "set", "get", "nosuchcommand")
    hist = {k: dict(zip(v[::2], v[1::2], strict=True)) for k, v in zip(hist[::2], hist[1::2], strict=True)}
    assert set(hist) == {b"set", b"get"}
    set_calls = r.info("commandstats")["cmdstat_set"]["calls"]
    assert hist[b"set"][b"calls"] == set_calls
    buckets = hist[b"set"][b"histogram_usec"]
    bounds, counts = buckets[::2], buckets[1::2]
    assert all(b & (b - 1) == 0 for b in bounds)  # powers of two
    assert counts == sorted(counts) and counts[-1] == set_calls
    assert isinstance(r.execute_command("LATENCY", "LATEST"), list)
    assert isinstance(r.execute_command("LATENCY", "HISTORY", "set"), list)
    assert isinstance(r.execute_command("LATENCY", "RESET"), int)
    assert any(b"HISTOGRAM" in line for line in r.execute_command("LATENCY", "HELP"))
    r.close()


def test_latency_monitor_records_slow_commands(make_server):
    srv = make_server({"http-port": 0, "latency-monitor-threshold": 1})
    r = srv.client()
    pipe = r.pipeline(transaction=False)
    for i in range(20_000):
        pipe.set(f"lm:{i}", "v")
    pipe.execute()
    r.execute_command("LATENCY", "RESET")
    assert len(r.keys("*")) == 20_000  # a whole-keyspace walk: well over a millisecond
    deadline = time.monotonic() + 10
    while True:  # the monitor samples once a second
        latest = {e[0]: e for e in r.execute_command("LATENCY", "LATEST")}
        if b"keys" in latest or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # poll interval
    name, when, ms, max_ms = latest[b"keys"]
    assert abs(when - time.time()) < 30 and 1 <= ms <= max_ms
    history = r.execute_command("LATENCY", "HISTORY", "keys")
    assert history and history[-1] == [when, ms]
    assert r.execute_command("LATENCY", "RESET", "keys", "nonexistent") == 1
    assert r.execute_command("LATENCY", "HISTORY", "keys") == []
    r.close()


def test_memory_usage_and_stats(obs, expect_error):
    r = obs.client()
    r.set("mem:k", b"x" * 1000)
    assert r.memory_usage("mem:k") == len("mem:k") + 1000 + 512
    assert r.execute_command("MEMORY", "USAGE", "mem:k", "SAMPLES", "5") == len("mem:k") + 1000 + 512
    assert r.memory_usage("mem:absent") is None
    with expect_error("ERR syntax error"):
        r.execute_command("MEMORY", "USAGE", "mem:k", "BOGUS")
    stats = r.memory_stats()
    assert stats["keys.count"] == r.dbsize()
    assert stats["dram.used"] > 0 and stats["dram.budget"] > stats["dram.used"]
    assert stats["overhead.per-entry"] == 512
    assert b"mem:" in stats["prefixes.top-by-bytes"]
    assert isinstance(r.execute_command("MEMORY", "DOCTOR"), bytes)
    r.close()


def test_memory_usage_of_a_key_on_the_ssd_tier(make_server, tmp_path):
    srv = make_server({"http-port": 0, "essd-path": tmp_path / "ssd"})
    r = srv.client()
    r.execute_command("TAIR.KV.SETEX", "cold:k", 0, b"z" * 5000, "COLD_STORAGE")
    assert r.execute_command("TAIR.KV.TIER", "cold:k") == b"ssd"
    usage = r.memory_usage("cold:k")
    assert 5000 + len("cold:k") < usage < 5000 + 512
    r.close()


def test_info_latencystats_format(obs):
    r = obs.client()
    for i in range(20):
        r.set(f"ls:{i}", i)
        r.get(f"ls:{i}")
    conn = obs.raw()
    text = conn.cmd("INFO", "latencystats").decode()
    assert text.startswith("# Latencystats\r\n")
    lines = [line for line in text.split("\r\n")[1:] if line]
    pattern = re.compile(r"^latency_percentiles_usec_([a-z.|_-]+):p50=(\d+\.\d{3}),p99=(\d+\.\d{3}),p99\.9=(\d+\.\d{3})$")
    found = {}
    for line in lines:
        m = pattern.match(line)
        assert m, line
        p50, p99, p999 = map(float, m.groups()[1:])
        assert 0 <= p50 <= p99 <= p999
        found[m.group(1)] = (p50, p99, p999)
    assert {"set", "get"} <= set(found)
    # redis-py parses it as Redis 7's format
    parsed = r.info("latencystats")
    assert set(parsed["latency_percentiles_usec_get"]) == {"p50", "p99", "p99.9"}
    # commandstats is still there, and INFO everything has both
    everything = conn.cmd("INFO", "everything").decode()
    conn.close()
    assert "# Commandstats" in everything and "# Latencystats" in everything
    assert re.search(r"cmdstat_get:calls=\d+,usec=\d+", everything)
    r.close()


# --------------------------------------------------------------------------------------------------------------
# The dashboard in headless Chromium
# --------------------------------------------------------------------------------------------------------------


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed, but .ci/run installs it (apt-get install chromium)")
    pytest.skip("chromium is not installed (apt-get install chromium)")


def run_chromium(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--no-first-run",
            "--hide-scrollbars", f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=5000",
            *extra, url]
    return subprocess.run(argv, capture_output=True, timeout=CHROMIUM_TIMEOUT, check=False,
                          env={**os.environ, "HOME": str(tmp_path)})


def test_dashboard_renders_live_numbers_in_chromium(make_server, tmp_path):
    port = free_port()
    srv = make_server({"http-port": port})
    r = srv.client()
    pipe = r.pipeline(transaction=False)
    for i in range(1234):
        pipe.set(f"session:{i}", b"k" * 200)
    pipe.execute()
    for i in range(50):
        r.get(f"session:{i}")
    keys = r.dbsize()
    assert keys == 1234
    version = stats_json(port)["version_counter"]

    proc = run_chromium(f"http://{HOST}:{port}/", tmp_path, "--dump-dom")
    dom = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    # The page fetched /stats.json and filled in the server's own numbers.
    assert 'id="status" class="live"' in dom, dom[:3000]
    assert re.search(r'id="kpi-keys" data-value="1234"[^>]*>1,234<', dom), dom[:3000]
    assert f'id="kpi-version" data-value="{version}"' in dom
    assert 'data-tier="dram"' in dom and 'data-tier-keys="1234"' in dom
    assert 'data-command="set"' in dom and 'data-command="get"' in dom
    assert "session:*" in dom

    shot = tmp_path / "dashboard.png"
    proc = run_chromium(f"http://{HOST}:{port}/", tmp_path, f"--screenshot={shot}", "--window-size=1280,900")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    r.close()


# --------------------------------------------------------------------------------------------------------------
# Authentication off loopback; startup checks
# --------------------------------------------------------------------------------------------------------------


def test_non_loopback_bind_requires_the_password(make_server):
    port = free_port()
    make_server({"http-port": port, "http-bind": "0.0.0.0", "requirepass": "s3cret pass"})
    for path in ("/", "/metrics", "/stats.json"):
        status, headers, _ = http_get(port, path)
        assert status == 401, path
        assert headers["www-authenticate"].startswith("Basic")
    assert http_get(port, "/healthz")[0:3:2] == (200, b"ok\n")  # liveness probes need no password
    assert http_get(port, "/metrics", {"Authorization": "Bearer wrong"})[0] == 401
    basic_wrong = base64.b64encode(b"default:nope").decode()
    assert http_get(port, "/metrics", {"Authorization": f"Basic {basic_wrong}"})[0] == 401
    good_bearer = {"Authorization": "Bearer s3cret pass"}
    good_basic = {"Authorization": "Basic " + base64.b64encode(b"anyone:s3cret pass").decode()}
    for headers in (good_bearer, good_basic):
        for path in ("/", "/metrics", "/stats.json", "/healthz"):
            assert http_get(port, path, headers)[0] == 200, (path, headers)
    assert stats_json(port, good_bearer)["server"]["http_port"] == port


def test_loopback_bind_with_a_password_needs_it_too(make_server):
    port = free_port()
    srv = make_server({"http-port": port, "requirepass": "pw"})
    for path in ("/", "/index.html", "/metrics", "/stats.json"):
        assert http_get(port, path)[0] == 401, path
    assert http_get(port, "/healthz")[0] == 200
    assert http_get(port, "/stats.json", {"Authorization": "Bearer pw"})[0] == 200
    r = srv.client(password="pw")
    try:
        # An ACL user with every key and INFO may read the endpoint; a tenant restricted to its keys may not.
        r.execute_command("ACL", "SETUSER", "prom", "on", ">scrape", "~*", "+info")
        r.execute_command("ACL", "SETUSER", "tenant", "on", ">t", "~kvs:t:*", "+@all")
        ok = {"Authorization": "Basic " + base64.b64encode(b"prom:scrape").decode()}
        tenant = {"Authorization": "Basic " + base64.b64encode(b"tenant:t").decode()}
        assert http_get(port, "/metrics", ok)[0] == 200
        assert http_get(port, "/metrics", tenant)[0] == 401
        # Removing the password at run time opens the loopback endpoint again, as it is without one.
        r.config_set("requirepass", "")
        assert http_get(port, "/stats.json")[0] == 200
    finally:
        r.close()


def test_host_header_must_name_the_endpoint(obs):
    status, _, body = http_get(obs.http_port, "/metrics", {"Host": f"rebind.attacker.example:{obs.http_port}"})
    assert status == 421 and b"Host" in body
    assert http_get(obs.http_port, "/metrics", {"Host": f"localhost:{obs.http_port}"})[0] == 200
    assert http_get(obs.http_port, "/metrics", {"Host": f"127.0.0.1:{obs.http_port}"})[0] == 200


def _run_serve(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "kvstrata", "serve", "--port", str(free_port()), "--bind", HOST, *args]
    return subprocess.run(argv, capture_output=True, timeout=timeout, env=kvstrata_env(), check=False,
                          stdin=subprocess.DEVNULL)


def test_non_loopback_bind_without_password_refuses_to_start():
    proc = _run_serve("--http-port", str(free_port()), "--http-bind", "0.0.0.0")
    assert proc.returncode != 0
    err = proc.stderr.decode()
    assert "requirepass" in err and "not loopback" in err


def test_explicit_http_port_in_use_fails_to_start():
    with socket.socket() as s:
        s.bind((HOST, 0))
        s.listen()
        taken = s.getsockname()[1]
        proc = _run_serve("--http-port", str(taken))
    assert proc.returncode != 0
    assert "HTTP endpoint" in proc.stderr.decode()


def test_http_port_zero_disables_the_endpoint(make_server):
    srv = make_server({"http-port": 0})
    r = srv.client()
    r.set("a", "b")
    assert r.get("a") == b"b"
    assert "HTTP endpoint" not in srv.log_text()
    r.close()


# --------------------------------------------------------------------------------------------------------------
# kvstrata top
# --------------------------------------------------------------------------------------------------------------


def test_top_once_shows_the_servers_numbers(make_server):
    srv = make_server({"http-port": 0, "requirepass": "pw"})
    r = srv.client(password="pw")
    for i in range(321):
        r.set(f"top:{i}", "v")
    proc = subprocess.run(
        [sys.executable, "-m", "kvstrata", "top", "--port", str(srv.port), "--password", "pw", "--once",
         "--interval", "0.2"],
        capture_output=True, timeout=60, env={**kvstrata_env(), "COLUMNS": "160"}, check=False)
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()
    assert "kvstrata top" in out and "dram" in out
    assert "keys 321" in out
    assert re.search(r"\bset\b.*\b321\b", out)
    assert "top:*" in out
    bad = subprocess.run(
        [sys.executable, "-m", "kvstrata", "top", "--port", str(srv.port), "--password", "wrong", "--once"],
        capture_output=True, timeout=60, env=kvstrata_env(), check=False)
    assert bad.returncode == 1 and "WRONGPASS" in bad.stderr.decode()
    r.close()


# --------------------------------------------------------------------------------------------------------------
# deploy/: Prometheus rules and Grafana dashboard
# --------------------------------------------------------------------------------------------------------------


def promtool() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("promtool is not installed, but .ci/run installs it (apt-get install prometheus)")
    pytest.skip("promtool is not installed (apt-get install --no-install-recommends prometheus)")


@pytest.mark.parametrize("args", [
    ("check", "rules", "alerts.yml"),
    ("test", "rules", "alerts_test.yml"),
    ("check", "config", "prometheus.yml"),
])
def test_prometheus_rules_are_valid(args):
    proc = subprocess.run([promtool(), *args], cwd=REPO_ROOT / "deploy" / "prometheus", capture_output=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_grafana_dashboard_is_valid_json():
    dash = json.loads((REPO_ROOT / "deploy" / "grafana" / "kvstrata-dashboard.json").read_text())
    assert dash["title"] == "kvstrata"
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 15
    assert any("histogram_quantile(0.99" in e and "kvstrata_command_duration_seconds_bucket" in e for e in exprs)
    assert any("kvstrata_tier_used_bytes" in e and "kvstrata_tier_budget_bytes" in e for e in exprs)


def test_pubsub_tracking_and_blocked_clients_are_gauges(obs):
    """The Pub/Sub subscriptions, CLIENT TRACKING's clients, keys and prefixes and the blocked clients show on
    /metrics as INFO shows them, and go back when the clients go."""
    r = obs.client()
    sub, track, bcast, waiting = (obs.raw() for _ in range(4))
    sub.cmd_raw("SUBSCRIBE", "c1", "c2")
    sub.cmd_raw("PSUBSCRIBE", "p*")
    track.cmd_raw("CLIENT", "TRACKING", "on")
    track.cmd_raw("MGET", "t1", "t2", "t3")
    bcast.cmd_raw("CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "a", "PREFIX", "b")
    waiting.send(b"*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$1\r\n0\r\n")  # blocks until it disconnects
    wait_for(lambda: r.info()["blocked_clients"] == 1, what="WAIT to block")
    samples = scrape(obs.http_port)
    info = r.info()
    for name, field in (("kvstrata_pubsub_channels", "pubsub_channels"), ("kvstrata_pubsub_patterns",
                        "pubsub_patterns"), ("kvstrata_tracking_clients", "tracking_clients"),
                        ("kvstrata_tracking_keys", "tracking_total_keys"),
                        ("kvstrata_tracking_prefixes", "tracking_total_prefixes"),
                        ("kvstrata_blocked_clients", "blocked_clients")):
        assert metric(samples, name) == info[field], name
    assert metric(samples, "kvstrata_clients_memory_bytes") >= 5 * 8192  # five clients, each its own objects
    assert metric(samples, "kvstrata_clients_memory_limit_bytes") == 0
    assert r.config_set("maxmemory-clients", "1mb")
    assert metric(scrape(obs.http_port), "kvstrata_clients_memory_limit_bytes") == 1024 * 1024
    assert r.config_set("maxmemory-clients", "0")
    assert (info["pubsub_channels"], info["pubsub_patterns"], info["tracking_clients"], info["tracking_total_keys"],
            info["tracking_total_prefixes"]) == (2, 1, 2, 3, 2)
    for conn in (sub, track, bcast, waiting):
        conn.close()
    wait_for(lambda: metric(scrape(obs.http_port), "kvstrata_tracking_clients") == 0
             and metric(scrape(obs.http_port), "kvstrata_pubsub_channels") == 0
             and metric(scrape(obs.http_port), "kvstrata_blocked_clients") == 0, what="the gauges to go back")
    r.close()
