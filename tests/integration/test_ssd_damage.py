"""A server on an SSD tier with bytes flipped in ``data.mdb``: SCAN, KEYS, RANDOMKEY and DBSIZE answer (damaged
pages are skipped and counted in INFO), GET never returns wrong bytes, and the server keeps serving."""

from __future__ import annotations

import pytest
from tests.integration.support import tier_info
from tests.unit.test_ssd_check import N, flipped, key_of, value_of

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers.ssd import SsdTier

pytestmark = pytest.mark.kvstrata_only


@pytest.mark.parametrize("seed", [2, 3])  # seeds whose flips hit B-tree pages (see tests/unit/test_ssd_check.py)
def test_keyspace_commands_survive_damaged_pages(make_server, tmp_path, seed):
    pristine = tmp_path / "pristine"
    tier = SsdTier(str(pristine), 1 << 30, fsync="no", threaded=False)
    for i in range(N):
        tier.put(key_of(i), Entry(value_of(i), i + 1))
    tier.close()
    path = flipped(pristine, tmp_path / "ssd", seed)
    srv = make_server({"essd-path": str(path), "dram-size": "1mb"})
    r = srv.client()
    cursor, listed = 0, set()
    while True:
        cursor, keys = r.scan(cursor, count=500)
        listed.update(keys)
        if cursor == 0:
            break
    assert len(listed) > N * 0.9
    assert set(r.keys("*")) >= listed - {k for k in listed if r.get(k) is None}
    assert r.randomkey() is not None
    assert r.dbsize() > 0
    for i in range(0, N, 7):
        got = r.get(key_of(i))
        assert got is None or got == value_of(i)  # a damaged record is a miss, never wrong bytes
    assert tier_info(r, "ssd")["unreadable_pages"] > 0
    assert r.set("after", b"still serving") and r.get("after") == b"still serving"
    assert srv.log_text().count("unreadable LMDB page") == 1  # logged once
