"""The predictor in a running server: a returning reader's chain comes up from SSD before it reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.integration.polling import wait_for

pytestmark = pytest.mark.kvstrata_only

VALUE = b"x" * 4096


def info(client: Any) -> dict[str, Any]:
    return client.info("prefetch")


@pytest.fixture
def srv(make_server: Any, tmp_path: Path) -> Any:
    # ~10 values fit in DRAM; a prefetch may displace anything not pinned and not predicted to be read now.
    return make_server({"essd-path": str(tmp_path / "ssd"), "dram-size": "48kb", "prefetch-protect": "0"})


def test_a_returning_reader_finds_its_chain_prefetched(srv: Any) -> None:
    writer = srv.client()
    chain = [f"chat:{i}".encode() for i in range(8)]
    for key in chain:  # one connection, in chain order: the profiler learns the links
        writer.set(key, VALUE)
    first = srv.client()
    for key in chain:  # a first reader follows them (a chain nobody has read is trusted one chunk at a time)
        assert first.get(key) == VALUE
    for i in range(24):
        writer.set(f"filler:{i}", VALUE)
    wait_for(lambda: all(writer.execute_command("TAIR.KV.TIER", k) == b"ssd" for k in chain)
             and writer.info("tier_ssd")["pending"] == 0, what="the chain demoted to SSD and committed")
    reader = srv.client()
    assert reader.get(chain[0]) == VALUE
    # As far ahead as a fair share of this small DRAM allows (half of ~10 values), then one more per read.
    got = wait_for(lambda: (i := info(reader))["prefetch_issued"] >= 4 and i,
                   what="the next chunks of the chain prefetched")
    assert got["prefetch_predicted"] >= 4
    tiers = [reader.execute_command("TAIR.KV.TIER", k) for k in chain[1:5]]
    assert tiers == [b"dram"] * 4, repr((tiers, got, reader.info("tier_dram")))
    for key in chain[1:]:
        assert reader.get(key) == VALUE
    after = wait_for(lambda: (i := info(reader))["prefetch_queue_depth"] == 0 and i, what="the queue drained")
    assert after["prefetch_used"] == after["prefetch_issued"] >= 4
    assert after["prefetch_wasted"] == 0
    assert after["prefetch_accuracy"] == 1.0
    assert 0 < after["prefetch_coverage"] <= 1.0
    assert after["profiled_keys"] >= len(chain)
    assert after["predict_native"] == 1  # the server ran the compiled predictor (kvstrata.native._predict)


def test_prefetch_of_missing_and_expired_keys_is_harmless(srv: Any) -> None:
    c = srv.client()
    c.set("gone-soon", VALUE, px=50)
    for i in range(24):
        c.set(f"filler:{i}", VALUE)
    c.execute_command("TAIR.KV.PREFETCH", "never-written", "gone-soon")
    wait_for(lambda: info(c)["prefetch_queue_depth"] == 0 and c.get("gone-soon") is None,
             what="the prefetch queue drained and the key expired")
    c.execute_command("TAIR.KV.PREFETCH", "never-written", "gone-soon")
    wait_for(lambda: info(c)["prefetch_absent"] >= 2, what="both prefetches found nothing")
    assert c.get("never-written") is None and c.get("gone-soon") is None
    assert c.get("filler:23") == VALUE
    assert c.ping()


def test_default_info_has_the_prefetch_section(srv: Any) -> None:
    c = srv.client()
    fields = c.info()  # INFO with no section: the default set
    for name in ("prefetch_issued", "prefetch_used", "prefetch_late", "prefetch_wasted", "prefetch_accuracy",
                 "prefetch_coverage", "session_score", "profiled_keys"):
        assert name in fields, name


def _demoted(srv: Any, chain: list[bytes]) -> None:
    """Push ``chain`` out of DRAM with filler written on another connection, and wait until it is on SSD."""
    filler = srv.client()
    for i in range(24):
        filler.set(f"filler:{i}", VALUE)
    # Committed, not only queued for the SSD writer (a key in its pending writes is known without a load).
    wait_for(lambda: all(filler.execute_command("TAIR.KV.TIER", k) == b"ssd" for k in chain)
             and filler.info("tier_ssd")["pending"] == 0, what="the chain demoted to SSD and committed")


def test_an_exists_batch_prefetches_the_chunks_it_found(srv: Any) -> None:
    writer = srv.client()
    chain = [f"doc:{i}".encode() for i in range(6)]
    for key in chain:
        writer.set(key, VALUE)
    _demoted(srv, chain)
    before = info(writer)
    lookup = srv.client()
    # A lookup of the prefix, as SGLang's batch_exists and vLLM's scheduler do before they read: never read yet.
    assert lookup.exists(*chain, "doc:missing") == len(chain)
    got = wait_for(lambda: (i := info(lookup))["prefetch_issued"] - before["prefetch_issued"] >= len(chain) and i,
                   what="the chunks found prefetched")
    assert got["predict_lookups"] >= 1
    assert [lookup.execute_command("TAIR.KV.TIER", k) for k in chain] == [b"dram"] * len(chain)
    for key in chain:
        assert lookup.get(key) == VALUE
    after = info(lookup)
    assert after["prefetch_used"] - before["prefetch_used"] == len(chain)
    assert after["prefetch_wasted"] == before["prefetch_wasted"]


def test_an_exists_batch_reads_each_chunk_from_ssd_once(srv: Any) -> None:
    """EXISTS probes its keys' record headers before it answers (INFO tier_ssd ``probes``); the chunks it found are
    read from LMDB once, by the prefetcher (``reads`` counts full record reads)."""
    writer = srv.client()
    chain = [f"once:{i}".encode() for i in range(6)]
    for key in chain:
        writer.set(key, VALUE)
    _demoted(srv, chain)
    wait_for(lambda: writer.info("tier_ssd")["pending"] == 0, what="the SSD writer to drain")
    ssd = writer.info("tier_ssd")
    before, reads, probes = info(writer), ssd["reads"], ssd["probes"] + ssd["key_filter_absent"]
    lookup = srv.client()
    assert lookup.exists(*chain, "once:missing") == len(chain)
    wait_for(lambda: info(lookup)["prefetch_issued"] - before["prefetch_issued"] >= len(chain),
             what="the chunks found prefetched")
    ssd = lookup.info("tier_ssd")
    # Each key EXISTS named, once: probed, or (the missing one) answered by the key filter without a probe.
    assert ssd["probes"] + ssd["key_filter_absent"] - probes == len(chain) + 1
    assert ssd["reads"] - reads == len(chain)  # each chunk found, once; never the missing key
    assert [lookup.execute_command("TAIR.KV.TIER", k) for k in chain] == [b"dram"] * len(chain)
    assert [lookup.get(k) for k in chain] == [VALUE] * len(chain)
    assert info(lookup)["prefetch_used"] - before["prefetch_used"] == len(chain)


def test_a_whole_prefix_announced_with_prefetch_is_loaded_once(srv: Any) -> None:
    writer = srv.client()
    chain = [f"conv:{i}".encode() for i in range(8)]
    for key in chain:
        writer.set(key, VALUE)
    reader = srv.client()
    for key in chain:  # the links are known and confirmed: the predictor would bring the chain up by itself too
        assert reader.get(key) == VALUE
    _demoted(srv, chain)
    before = info(reader)
    ssd_before = reader.info("tier_ssd")["hits"]
    client = srv.client()
    assert client.execute_command("TAIR.KV.PREFETCH", *chain) == len(chain)
    for key in chain:  # read at once, while the announced prefix may still be loading
        assert client.get(key) == VALUE
    after = wait_for(lambda: (i := info(client))["prefetch_queue_depth"] == 0 and i, what="the queue drained")
    issued = after["prefetch_issued"] - before["prefetch_issued"]
    ssd_reads = client.info("tier_ssd")["hits"] - ssd_before
    # Every chunk came up once: by the announced prefetch or by its own read, never both.
    assert issued + ssd_reads == len(chain), (issued, ssd_reads)
    assert after["prefetch_wasted"] == before["prefetch_wasted"]
