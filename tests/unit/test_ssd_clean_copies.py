"""Under write-through, and under write-back once saves keep what reached the SSD (``Store.keep_below``), a record
a read brings up from the SSD stays there as the DRAM entry's clean copy (``Entry.on_ssd``): demoting the entry
unchanged writes nothing, and a write to the key goes to the SSD too. Unless the SSD evicted the record between the
load that read it and the promotion: then the entry is dirty, and its demotion writes it again (the key is never
lost to a copy that is not there). Without saves, write-back tiers stay exclusive. A real LMDB SSD tier, its
writer run inline."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstrata.clock import ManualClock
from kvstrata.engine.entry import ENTRY_OVERHEAD
from kvstrata.engine.policy import create_policy
from kvstrata.engine.store import Store
from kvstrata.engine.tiers.ssd import SsdTier
from kvstrata.engine.tiers.ssd_record import HEADER_SIZE

VALUE = b"v" * 1000
RECORD = 1100 + HEADER_SIZE  # a record's share of the SSD budget, with room to spare for the key and overhead


MODES = ["write-through", "write-back-saved"]


def _store(tmp_path: Path, mode: str, ssd_records: int = 1000) -> Store:
    clock = ManualClock()
    ssd = SsdTier(str(tmp_path / "ssd"), ssd_records * RECORD, fsync="no", threaded=False)
    store = Store(4 * (4 + len(VALUE) + ENTRY_OVERHEAD), policy=create_policy("lru", clock=clock), clock=clock,
                  ssd=ssd, durability="write-through" if mode == "write-through" else "write-back", promote_hits=1)
    store.keep_below = store.keep_below or mode == "write-back-saved"
    return store


@pytest.mark.parametrize("mode", MODES)
def test_a_promoted_record_stays_below_and_its_demotion_writes_nothing(tmp_path: Path, mode: str) -> None:
    store = _store(tmp_path, mode)
    ssd = store.ssd
    assert ssd is not None
    keys = [b"k%03d" % i for i in range(12)]
    for key in keys:
        store.put(key, VALUE)
    store.make_room(store.dram.budget)  # all of them on the SSD
    assert not store.dram.entries
    writes = ssd.writes
    for key in keys[:4]:
        assert store.get(key) is not None  # promoted
        assert key in store.dram.entries and store.dram.entries[key].on_ssd
        assert ssd.read(key) is not None  # the record stayed
    store.make_room(store.dram.budget)
    assert ssd.writes == writes  # nothing written on the way down: the SSD had every one of them
    assert all(store.get(k) is not None and bytes(store.get(k).value) == VALUE for k in keys)


@pytest.mark.parametrize("mode", MODES)
def test_a_record_evicted_between_its_load_and_its_promotion_is_written_again(tmp_path: Path, mode: str) -> None:
    store = _store(tmp_path, mode, ssd_records=8)
    ssd = store.ssd
    assert ssd is not None
    old = [b"old%02d" % i for i in range(6)]
    for key in old:
        store.put(key, VALUE)
    store.make_room(store.dram.budget)
    assert ssd.read(old[0]) is not None
    # A load reads the oldest record off the loop ...
    ticket = store.begin_load(store.missing([old[0]]))
    found = store.read_lower(ticket)
    # ... and before its promotion, other keys' demotions fill the SSD, which evicts the oldest records (fifo).
    for i in range(8):
        store.put(b"new%02d" % i, VALUE)
    store.make_room(store.dram.budget)
    assert ssd.read(old[0]) is None and ssd.evictions > 0
    assert store.finish_load(ticket, found)
    assert store.get(old[0]) is not None  # promoted from the record the load read
    store.end_command()
    assert old[0] in store.dram.entries
    assert not store.dram.entries[old[0]].on_ssd  # there is no copy below any more
    store.make_room(store.dram.budget)  # so its demotion writes it
    assert old[0] not in store.dram.entries
    got = ssd.read(old[0])
    assert got is not None and bytes(got.value) == VALUE  # type: ignore[union-attr]


def test_write_back_with_kept_copies_writes_a_saved_key_through_and_without_them_drops_its_record(
        tmp_path: Path) -> None:
    for keep in (True, False):
        store = _store(tmp_path / str(keep), "write-back-saved" if keep else "write-back")
        ssd = store.ssd
        assert ssd is not None
        store.put(b"k", VALUE)
        store.make_room(store.dram.budget)  # demoted: on the SSD only
        assert b"k" not in store.dram.entries and ssd.read(b"k") is not None
        assert store.get(b"k") is not None  # promoted
        assert (ssd.read(b"k") is not None) is keep  # kept as a clean copy, or dropped (exclusive tiers)
        store.put(b"k", b"new")
        got = ssd.read(b"k")
        if keep:  # written through: the SSD has the new value at once
            assert got is not None and bytes(got.value) == b"new" and store.dram.entries[b"k"].on_ssd
        else:
            assert got is None and not store.dram.entries[b"k"].on_ssd
        store.put(b"fresh", VALUE)  # a key that never reached the SSD stays write-back in both modes
        assert ssd.read(b"fresh") is None and not store.dram.entries[b"fresh"].on_ssd
        assert store.delete(b"k") and ssd.read(b"k") is None
