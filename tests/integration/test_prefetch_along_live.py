"""A running server's GET of a demoted chain's first chunk brings the next chunks up with its own load: they are
in DRAM when its reply arrives (that only the rest of the walk goes through the prefetch queue is pinned by
tests/unit/test_prefetch_along.py; here the queue's first batch could be as quick on an idle machine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.integration.polling import wait_for

pytestmark = pytest.mark.kvstrata_only

VALUE = b"x" * 4096


@pytest.fixture
def srv(make_server: Any, tmp_path: Path) -> Any:
    # ~10 values fit in DRAM; a prefetch may displace anything not pinned and not predicted to be read now.
    return make_server({"essd-path": str(tmp_path / "ssd"), "dram-size": "48kb", "prefetch-protect": "0"})


def test_the_chunks_after_a_missed_first_chunk_are_up_with_its_reply(srv: Any) -> None:
    writer = srv.client()
    chain = [f"doc:{i}".encode() for i in range(8)]
    for key in chain:
        writer.set(key, VALUE)
    first = srv.client()
    for key in chain:  # a first reader crosses every link (untested links are trusted one chunk at a time)
        assert first.get(key) == VALUE
    for i in range(24):
        writer.set(f"filler:{i}", VALUE)
    # Committed, not only queued for the SSD writer: a chunk still in its pending writes is known without a load,
    # so a TIER of it would not wait for the promotion below (and answers "ssd" until that turn).
    wait_for(lambda: all(writer.execute_command("TAIR.KV.TIER", k) == b"ssd" for k in chain)
             and writer.info("tier_ssd")["pending"] == 0, what="the chain demoted to SSD and committed")
    before = writer.info("prefetch")
    reader = srv.client()
    # One pipeline: the TIER probes run right after the GET (they wait behind its load): what came up with the
    # GET's own load is in DRAM by then.
    pipe = reader.pipeline(transaction=False)
    pipe.get(chain[0])
    for key in chain[1:3]:
        pipe.execute_command("TAIR.KV.TIER", key)
    got, *tiers = pipe.execute()
    assert got == VALUE
    assert tiers == [b"dram", b"dram"], repr((tiers, reader.info("prefetch")))
    after = reader.info("prefetch")
    assert after["predict_expects"] == before["predict_expects"] + 1
    assert after["prefetch_issued"] >= before["prefetch_issued"] + 2
    for key in chain[1:]:
        assert reader.get(key) == VALUE
    done = wait_for(lambda: (i := reader.info("prefetch"))["prefetch_queue_depth"] == 0 and i, what="queue drained")
    assert done["prefetch_wasted"] == 0 and done["prefetch_used"] == done["prefetch_issued"]


def test_prefetch_along_is_a_checked_setting(srv: Any) -> None:
    r = srv.client()
    assert r.config_get("prefetch-along") == {"prefetch-along": "4"}
    with pytest.raises(Exception, match="non-negative"):
        r.config_set("prefetch-along", "-1")
    assert r.config_get("prefetch-along") == {"prefetch-along": "4"}  # a refused value changes nothing
    assert r.config_set("prefetch-along", "0")
    assert r.config_get("prefetch-along") == {"prefetch-along": "0"}
