"""The live server's SSD tier evicts by ``ssd-policy``: a record read from the SSD outlives older unread ones
under ``clock`` and ``s3-compact``, and is the first to go under ``fifo``; the budget holds and INFO names the
policy."""

import pytest
from polling import wait_for
from tests.integration.support import tier_info

pytestmark = pytest.mark.kvstrata_only

VALUE = 8192


def value(i):
    return b"%02d" % i * (VALUE // 2)


def settled(r):
    wait_for(lambda: tier_info(r, "ssd")["pending"] == 0, what="the SSD writer to drain")


@pytest.mark.parametrize("policy", ["fifo", "clock", "s3-compact"])
def test_ssd_eviction_follows_the_policy(make_server, tmp_path, policy):
    srv = make_server({"essd-path": str(tmp_path / "ssd"), "dram-size": "64kb", "essd-size": "200kb",
                       "ssd-policy": policy, "promote-hits": "1000", "prefetch-predict": "no"})
    r = srv.client()
    for i in range(20):  # DRAM keeps the newest few, the oldest go down to the SSD
        r.set(f"k{i}", value(i))
    settled(r)
    info = tier_info(r, "ssd")
    assert info["eviction_policy"] == policy and info["evictions"] == 0 and info["keys"] >= 10
    assert r.get("k0") == value(0)  # read from the SSD (not promoted: promote-hits)
    for i in range(20, 35):  # more demotions than the SSD has room for: a few records leave
        r.set(f"k{i}", value(i))
    settled(r)
    info = tier_info(r, "ssd")
    assert 2 <= info["evictions"] <= 8 and info["used"] <= info["budget"]
    assert r.exists("k1") == 0  # the oldest unread record is gone either way
    assert r.exists("k0") == (0 if policy == "fifo" else 1)
    assert r.get("k12") == value(12)
