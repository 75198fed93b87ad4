"""A server's loads of SSD records whose pages are in memory run on the event loop (INFO tier_ssd
``reads_inline``), others in a loader thread (``inline_declined``; ``ssd-inline-max``), and answer the same.
Records on the disk are tests/unit/test_ssd_inline.py's: a server's own mapping keeps the pages it touched."""


import pytest
from polling import wait_for
from tests.integration.support import tier, tier_info

pytestmark = pytest.mark.kvstrata_only

KB = 1024


def value(i: int) -> bytes:
    return bytes([i]) * (4 * KB) + f"#{i}".encode()


@pytest.fixture
def node(make_server, tmp_path):
    # 64 KB of DRAM: the first keys written are on SSD once the later ones are in. No predictor: the only LMDB
    # reads are the commands' own. Every read of an SSD key promotes it.
    srv = make_server({"essd-path": str(tmp_path / "ssd"), "dram-size": "64kb", "prefetch-predict": "no",
                       "prefetch-protect": "0", "promote-hits": "1"})
    r = srv.client()
    for i in range(40):
        r.set(f"k{i:02d}", value(i))
    wait_for(lambda: tier_info(r, "ssd")["pending"] == 0, what="the SSD writer to drain")
    assert all(tier(r, f"k{i:02d}") == "ssd" for i in range(6))
    return srv


def _counts(r) -> tuple[int, int, int]:
    info = tier_info(r, "ssd")
    return info["reads"], info["reads_inline"], info["inline_declined"]


def test_records_just_demoted_are_read_on_the_loop(node) -> None:
    r = node.client()
    reads, inline, declined = _counts(r)
    # The SSD writer found where it wrote them; their pages are still in the page cache.
    assert r.exists("k00", "k01", "k02") == 3
    assert _counts(r) == (reads, inline + 3, declined)
    assert r.get("k00") == value(0)
    assert r.execute_command("TAIR.KV.MGET", "k01", "k02") == [value(1), value(2)]
    assert _counts(r) == (reads + 3, inline + 6, declined)
    assert tier(r, "k00") == "dram"
    # A key with no record: the key filter rules it out on the loop, with no read at all.
    wait_for(lambda: tier_info(r, "ssd")["key_filter"] == 1, what="the key filter's first scan")
    absent = tier_info(r, "ssd")["key_filter_absent"]
    assert r.get("nosuch") is None
    assert _counts(r) == (reads + 3, inline + 6, declined)
    assert tier_info(r, "ssd")["key_filter_absent"] == absent + 1


def test_a_key_the_filter_cannot_rule_out_goes_to_a_thread(node) -> None:
    r = node.client()
    wait_for(lambda: tier_info(r, "ssd")["key_filter"] == 1, what="the key filter's first scan")
    assert tier(r, "k05") == "ssd"
    assert r.delete("k05") == 1  # its record goes, its bits stay: a lookup cannot tell it from an unknown place
    wait_for(lambda: tier_info(r, "ssd")["pending"] == 0, what="the SSD writer to drain")
    reads, inline, declined = _counts(r)
    unknown = tier_info(r, "ssd")["inline_unknown"]
    assert r.get("k05") is None
    assert _counts(r) == (reads + 1, inline, declined + 1)
    assert tier_info(r, "ssd")["inline_unknown"] == unknown + 1


def test_the_cap_and_zero_send_loads_to_a_thread(node) -> None:
    r = node.client()
    reads, inline, declined = _counts(r)
    r.config_set("ssd-inline-max", "1kb")
    assert r.get("k00") == value(0)
    assert _counts(r) == (reads + 1, inline, declined + 1)
    r.config_set("ssd-inline-max", "0")
    assert r.get("k01") == value(1)
    assert _counts(r) == (reads + 2, inline, declined + 1)  # 0: not even tried
    r.config_set("ssd-inline-max", "256kb")
    assert r.get("k02") == value(2)
    assert _counts(r) == (reads + 3, inline + 1, declined + 1)


def test_a_record_goes_down_and_up_again_on_the_loop(node) -> None:
    r = node.client()
    reads, inline, declined = _counts(r)
    assert r.get("k10") == value(10)
    assert _counts(r) == (reads + 1, inline + 1, declined)
    assert tier(r, "k10") == "dram"
    # Push k10 back down (the SSD writer finds where its record went) and read it again.
    for i in range(40, 60):
        r.set(f"k{i:02d}", value(i))
    wait_for(lambda: tier_info(r, "ssd")["pending"] == 0 and tier(r, "k10") == "ssd", what="k10 to go back down")
    reads, inline, declined = _counts(r)
    assert r.get("k10") == value(10)
    assert _counts(r) == (reads + 1, inline + 1, declined)
    assert tier_info(r, "ssd")["inline_moved"] == 0


def test_ssd_key_filter_no_sends_such_misses_to_a_thread_again(node) -> None:
    r = node.client()
    wait_for(lambda: tier_info(r, "ssd")["key_filter"] == 1, what="the key filter's first scan")
    r.config_set("ssd-key-filter", "no")
    reads, inline, declined = _counts(r)
    absent = tier_info(r, "ssd")["key_filter_absent"]
    assert r.get("nosuch") is None
    assert _counts(r) == (reads + 1, inline, declined + 1)
    r.set("written-meanwhile", value(7))
    for i in range(60, 80):  # push it down to the SSD tier
        r.set(f"k{i:02d}", value(i))
    wait_for(lambda: tier_info(r, "ssd")["pending"] == 0 and tier(r, "written-meanwhile") == "ssd",
             what="written-meanwhile to go down")
    r.config_set("ssd-key-filter", "yes")
    assert r.get("written-meanwhile") == value(7)  # the filter was kept while lookups did not use it
    assert tier_info(r, "ssd")["key_filter_absent"] == absent
    assert r.get("nosuch2") is None
    assert tier_info(r, "ssd")["key_filter_absent"] == absent + 1
