"""Memory refusals say what holds the DRAM budget, and ``denyoom`` commands are refused the Redis way.

A server with a tiny budget and no lower tier: once DRAM is over its budget (here: the budget lowered at run
time) and nothing can be moved out (noeviction, or pinned keys), every command flagged ``denyoom`` is refused
with -OOM before it runs (a rejected call in INFO commandstats), even one that would write nothing (SETNX of an
existing key) or shrink a value; reads and deletes still run, and writes run again once DRAM is back under the
budget. The -OOM text names what blocks: pinned keys, two-phase reservations, leased values. A SETRANGE or APPEND
whose result no tier could hold is refused before the value is built (a few bytes of request must not allocate
hundreds of MB only to be refused). A DRAM budget of 0 is an SSD-only server when there is an SSD tier, and refused
without one (Redis's "maxmemory 0 = no limit" would otherwise evict everything)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from tests.integration.support import memory_info, unix_server

from kvstrata.client.fast import RespError
from kvstrata.client.stage import StageWriter

KB = 1024
MB = 1024 * KB


def _peak_rss(pid: int) -> int:
    """The process's resident-memory high-water mark (bytes): VmHWM in /proc, which only ever grows."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * KB for line in f if line.startswith("VmHWM:"))


def _rejected(r: redis.Redis, name: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{name}", {}).get("rejected_calls", 0))


def test_denyoom_commands_are_refused_while_over_budget_with_nothing_to_move(make_server) -> None:
    srv = make_server({"dram-size": "2mb", "maxmemory-policy": "noeviction"})
    r = srv.client()
    keys = [b"k%d" % i for i in range(8)]
    values = {k: os.urandom(128 * KB) for k in keys}
    for k in keys:
        r.set(k, values[k])
    r.config_set("maxmemory", "512kb")  # below what is stored; noeviction: nothing moves
    info = memory_info(r)
    assert info["dram_used"] > info["dram_budget"]
    for call in (lambda: r.setnx(b"k0", b"x"),  # would write nothing (k0 exists): refused all the same
                 lambda: r.set(b"k1", b"small"),  # would shrink a value
                 lambda: r.incr(b"counter"),
                 lambda: r.execute_command("TAIR.KV.SETEX", b"kv", 0, b"v")):
        with pytest.raises(redis.exceptions.OutOfMemoryError, match="maxmemory"):
            call()
    assert _rejected(r, "setnx") == 1 and _rejected(r, "incrby") == 1  # redis-py sends INCR as INCRBY
    assert all(r.get(k) == values[k] for k in keys) and r.exists(b"counter", b"kv") == 0  # nothing changed
    assert r.delete(*keys[:6]) == 6  # deletes and reads still run
    assert memory_info(r)["dram_used"] <= 512 * KB
    assert r.setnx(b"k6", b"x") is False and r.incr(b"counter") == 1  # under budget: writes run again
    assert r.ping()


def test_oom_text_names_pinned_keys(make_server) -> None:
    srv = make_server({"dram-size": "2mb"})
    r = srv.client()
    assert r.execute_command("TAIR.KV.MARKHOT", b"pin:*") == 0
    for i in range(6):
        r.set(b"pin:%d" % i, os.urandom(128 * KB))  # 768 KB pinned (at most half the budget)
    r.set(b"plain", os.urandom(64 * KB))
    r.config_set("maxmemory", "512kb")  # the pinned keys alone are over it
    with pytest.raises(redis.exceptions.OutOfMemoryError) as err:
        r.set(b"x", b"1")
    text = str(err.value)
    assert "over its budget of 524288 bytes" in text and "bytes pinned" in text
    assert "reserved" not in text and "leased" not in text
    assert r.exists(b"plain") == 1  # nothing moves when moving everything movable would not be enough
    assert r.get(b"x") is None


def test_oom_text_names_reserved_bytes(make_server, sockdir) -> None:
    srv, path = unix_server(make_server, sockdir, **{"dram-size": "4mb", "stage-size": "16mb"})
    r = srv.client()
    w = StageWriter(path)
    try:
        w.reserve([1536 * KB, 1536 * KB])
        with pytest.raises(redis.exceptions.OutOfMemoryError) as err:
            r.set(b"big", b"\0" * (2 * MB))
        text = str(err.value)
        assert "do not fit in the DRAM budget of 4194304 bytes" in text
        assert "reserved by two-phase writes" in text and "pinned" not in text
        with pytest.raises(RespError, match="OOM .*reserved by two-phase writes"):
            w.reserve([2 * MB])  # a reservation is refused the same way
    finally:
        w.close()


def test_a_value_no_tier_could_hold_is_refused_before_it_is_built(make_server) -> None:
    srv = make_server({"dram-size": "4mb"})
    r = srv.client()
    r.set(b"s", b"abc")
    peak = _peak_rss(srv.proc.pid)
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="do not fit in the DRAM budget of 4194304 bytes"):
        r.setrange(b"s", 256 * MB, b"x")  # 18 bytes of arguments, a 256 MB value
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="do not fit in the DRAM budget"):
        r.setrange(b"new", 5 * MB, b"x")
    r.set(b"a", os.urandom(3 * MB))
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="do not fit in the DRAM budget"):
        r.append(b"a", os.urandom(MB + 1))
    assert _peak_rss(srv.proc.pid) - peak < 32 * MB, "a refused value was allocated"
    assert r.get(b"s") == b"abc" and r.exists(b"new") == 0 and len(r.get(b"a")) == 3 * MB  # nothing changed
    # What fits is built as before: the gap up to the offset is zeros, the rest of the old value stays.
    assert r.setrange(b"s", 10, b"xy") == 12 and r.get(b"s") == b"abc" + bytes(7) + b"xy"
    assert r.setrange(b"s", 1, b"Z") == 12 and r.get(b"s") == b"aZc" + bytes(7) + b"xy"
    assert r.append(b"s", b"!") == 13 and r.get(b"s") == b"aZc" + bytes(7) + b"xy!"


def test_a_dram_budget_of_0_is_refused_where_it_could_store_nothing(make_server, tmp_path) -> None:
    srv = make_server({"dram-size": "4mb"})
    r = srv.client()
    r.set(b"kept", b"v")
    for args in (("maxmemory", "0"), ("maxmemory-policy", "noeviction", "maxmemory", "0")):
        with pytest.raises(redis.ResponseError, match=r"'maxmemory'\) - a DRAM budget of 0 without an SSD tier"):
            r.execute_command("CONFIG", "SET", *args)
    assert r.config_get("maxmemory") == {"maxmemory": "4194304"}
    assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "allkeys-lru"}  # all or nothing
    assert r.get(b"kept") == b"v"  # nothing was evicted
    done = subprocess.run([sys.executable, "-m", "kvstrata", "serve", "--port", "0", "--http-port", "0",
                           "--dram-size", "0"], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
    assert done.returncode == 1 and "DRAM budget of 0 without an SSD tier" in done.stderr
    # With an SSD tier it is an SSD-only server: every value goes straight down.
    ssd_only = make_server({"dram-size": "0", "essd-path": str(tmp_path / "ssd")}).client()
    ssd_only.set(b"k", b"on the ssd")
    assert ssd_only.get(b"k") == b"on the ssd"
    assert ssd_only.execute_command("TAIR.KV.TIER", b"k") == b"ssd"
