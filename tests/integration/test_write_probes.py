"""Writes that replace a value read only the old record's header, not its value (``load="meta"``): SET without
GET, SETEX, PSETEX, SETNX, MSET, MSETNX and TAIR.KV.SETEX of a key held below DRAM, on the SSD tier or (another
node's) in the pool. Before, each read the whole old value first (a KV chunk: megabytes from LMDB or over the
network) and discarded it. What the header decides still holds: NX/XX/SETNX/MSETNX see the key, KEEPTTL keeps
its TTL, VER compares its version; SET ... GET still reads the value it returns.
"""

from __future__ import annotations

import shutil

import pytest
from polling import wait_for
from tests.integration.support import pool_info, tier, tier_info

pytestmark = pytest.mark.kvstrata_only

KB = 1024
BIG = b"\x5a" * (256 * KB)


@pytest.fixture
def ssd_node(make_server, tmp_path):
    srv = make_server({"essd-path": str(tmp_path / "ssd"), "dram-size": "1mb", "http-port": 0,
                       "prefetch-predict": "no"})  # the SSD reads counted are the commands' own
    r = srv.client()
    yield r
    r.close()


def _on_ssd(r, keys, ttl_ms=0):
    """``keys`` written straight to the SSD tier (COLD_STORAGE), committed; their versions."""
    versions = {k: r.execute_command("TAIR.KV.SETEX", k, ttl_ms, BIG, "COLD_STORAGE") for k in keys}
    wait_for(lambda: tier_info(r, "ssd")["pending"] == 0, what="the SSD writer")
    assert all(tier(r, k) == "ssd" for k in keys)
    return versions


def test_replacing_writes_probe_ssd_records_without_reading_them(ssd_node):
    r = ssd_node
    keys = [f"probe:{i}" for i in range(9)]
    versions = _on_ssd(r, keys)
    before = tier_info(r, "ssd")
    assert r.set(keys[0], b"new0")
    assert r.setex(keys[1], 100, b"new1")
    assert r.psetex(keys[2], 100_000, b"new2")
    v3 = r.execute_command("TAIR.KV.SETEX", keys[3], 0, b"new3")
    assert r.mset({keys[4]: b"new4", keys[5]: b"new5"})
    assert r.set(keys[6], b"no", nx=True) is None  # the key exists (on the SSD tier): not written
    assert r.setnx(keys[7], b"no") is False
    assert r.msetnx({keys[8]: b"no", "probe:absent": b"no"}) is False
    assert r.set(keys[8], b"new8", xx=True)
    after = tier_info(r, "ssd")
    assert after["reads"] == before["reads"], (before, after)  # no old value read
    assert after["probes"] - before["probes"] >= 9
    assert v3 > versions[keys[3]]
    got = r.mget(keys + ["probe:absent"])
    assert got == [b"new0", b"new1", b"new2", b"new3", b"new4", b"new5", BIG, BIG, b"new8", None]


def test_header_decisions_hold_keepttl_ver_and_get(ssd_node):
    r = ssd_node
    versions = _on_ssd(r, ["ttl:k", "ver:k", "get:k"], ttl_ms=600_000)
    assert r.set("ttl:k", b"kept", keepttl=True)
    assert 0 < r.pttl("ttl:k") <= 600_000  # the SSD record's TTL, read from its header
    with pytest.raises(Exception, match="VERMISMATCH"):
        r.execute_command("TAIR.KV.SETEX", "ver:k", 0, b"x", "VER", versions["ver:k"] + 1)
    assert r.execute_command("TAIR.KV.SETEX", "ver:k", 0, b"cas", "VER", versions["ver:k"]) > versions["ver:k"]
    assert r.get("ver:k") == b"cas"
    reads = tier_info(r, "ssd")["reads"]
    assert r.set("get:k", b"after", get=True) == BIG  # GET returns the old value: that one is read
    assert tier_info(r, "ssd")["reads"] > reads
    assert r.get("get:k") == b"after"


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (.ci/run installs it)")
def test_writes_and_exists_of_another_nodes_pool_keys_move_no_value(make_server, cluster):
    """A diskless node writing or probing keys another node put in the pool reads their headers (GETRANGE,
    STRLEN), not their values; its writes get versions above the pool's (no refusal, no rewrite)."""
    cfg = {"dram-size": "4mb", "pool": cluster.url, "pool-timeout": 1000, "http-port": 0}
    a, b = make_server(cfg).client(), make_server(cfg).client()
    keys = [f"pw:{i}" for i in range(6)]
    versions = {k: a.execute_command("TAIR.KV.SETEX", k, 0, BIG) for k in keys}
    before = pool_info(b)
    assert b.exists(*keys) == len(keys)
    assert b.ttl(keys[0]) == -1
    v = b.execute_command("TAIR.KV.SETEX", keys[1], 0, b"b1")
    assert b.set(keys[2], b"b2")
    assert b.set(keys[3], b"no", nx=True) is None
    after = pool_info(b)
    assert after["read_bytes"] == before["read_bytes"], (before, after)  # no value came over
    assert after["probes"] - before["probes"] >= len(keys)
    assert v > versions[keys[1]] and after["conflicts"] == before["conflicts"]
    assert a.execute_command("TAIR.KV.MGET", *keys[:4], "CONSISTENCY_LEVEL", "STRONG") == [BIG, b"b1", b"b2", BIG]
    assert b.get(keys[0]) == BIG  # a read still brings the value
    assert pool_info(b)["read_bytes"] > after["read_bytes"]
