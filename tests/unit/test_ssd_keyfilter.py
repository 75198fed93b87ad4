"""The SSD tier's key filter (tiers/keyfilter.py): reads of keys the tier never held are answered without LMDB,
and no key the tier holds is ever ruled out: not across a reopen, a rebuild, nor keys written while a scan runs."""

import threading

import pytest
from tests.integration.polling import wait_for

from kvstrata.engine.entry import Entry
from kvstrata.engine.tiers import keyfilter
from kvstrata.engine.tiers.keyfilter import KeyFilter
from kvstrata.engine.tiers.ssd import SsdTier

MB = 1024 * 1024
VALUE = b"v" * 5000


def keys(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def write(t: SsdTier, written: list[bytes], first: int = 1) -> None:
    """Put VALUE under each key, with versions ``first``, ``first + 1``, ..."""
    for i, k in enumerate(written):
        t.put(k, Entry(VALUE, first + i, 0))


def test_no_key_added_is_ruled_out_and_few_others_pass(monkeypatch) -> None:
    monkeypatch.setattr(keyfilter, "MIN_KEYS", 16)
    f = KeyFilter(20_000)
    one_by_one, in_bulk = keys("a", 10_000), keys("b", 10_000)
    for k in one_by_one:
        f.add(k)
    f.add_many(in_bulk)
    assert all(k in f for k in one_by_one + in_bulk)  # add and add_many set the same probes
    others = keys("c", 20_000)
    passed = sum(k in f for k in others) / len(others)
    assert passed < 0.03  # sized for ~1% at capacity
    assert f.count == 20_000 and not f.full()
    f.add(b"one more")
    assert f.full()


def test_a_merge_adds_the_other_filters_keys() -> None:
    a, b = KeyFilter(1000), KeyFilter(1000)
    a.add_many(keys("a", 500))
    b.add_many(keys("b", 500))
    a.merge(b)
    assert all(k in a for k in keys("a", 500) + keys("b", 500)) and a.count == 1000
    with pytest.raises(ValueError):
        a.merge(KeyFilter(10 * keyfilter.MIN_KEYS))


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "ssd")


def test_a_key_never_written_is_answered_without_a_read(path) -> None:
    t = SsdTier(path, 64 * MB, threaded=False)
    try:
        assert t.key_filter.ready()
        write(t, keys("k", 3))
        found = t.read_resident([b"k0", b"new", b"k1"], MB)
        assert found is not None and found[b"new"] is None and bytes(found[b"k0"].value) == VALUE
        assert t.inline_declined == 0 and t.key_filter.absent == 1 and t.inline_reads == 2
        assert t.read_resident([b"new2"], MB, probe=True) == {b"new2": None}
        reads = t.reads
        assert t.read_many([b"new3"]) == {b"new3": None} and t.probe_many([b"new4"]) == {b"new4": None}
        assert t.reads == reads and t.key_filter.absent == 4  # answered, never looked up
    finally:
        t.close()


def test_a_reopened_tier_rules_out_no_record_it_holds(path) -> None:
    t = SsdTier(path, 64 * MB, threaded=False)
    written = keys("k", 300)
    write(t, written)
    t.close()
    t = SsdTier(path, 64 * MB, threaded=False)  # the filter comes from a scan of the records on disk
    try:
        assert t.info()["key_filter_keys"] == 300
        found = t.read_many(written)
        assert all(found[k] is not None and bytes(found[k].value) == VALUE for k in written)
        assert t.read_resident([b"never"], MB) == {b"never": None}
    finally:
        t.close()


def test_a_filter_that_fills_up_is_rebuilt_larger_and_keeps_every_key(path, monkeypatch) -> None:
    monkeypatch.setattr(keyfilter, "MIN_KEYS", 16)
    t = SsdTier(path, 64 * MB, threaded=False)
    try:
        written = keys("k", 200)
        write(t, written)
        info = t.info()
        assert info["key_filter_scans"] >= 4 and info["key_filter_keys"] >= 200
        assert all(t.read(k) is not None for k in written)
        assert sum(t.read(k) is None for k in keys("x", 200)) == t.key_filter.absent >= 150
    finally:
        t.close()


def test_keys_written_while_a_scan_runs_are_never_ruled_out(path, monkeypatch) -> None:
    """The scan's snapshot misses what commits after it starts and what is still queued: those keys go into the
    new filter from ``pending`` and as they are written."""
    t = SsdTier(path, 64 * MB, threaded=False)
    before = keys("before", 50)
    write(t, before)
    t.close()
    go = threading.Event()
    scan = SsdTier._scan

    def held_scan(self: SsdTier, capacity: int) -> KeyFilter | None:
        assert go.wait(30)
        return scan(self, capacity)

    monkeypatch.setattr(SsdTier, "_scan", held_scan)
    t = SsdTier(path, 64 * MB, threaded=True)
    try:
        during = keys("during", 50)
        write(t, during[:25], first=100)
        seq = t.barrier()
        wait_for(lambda: t.committed_seq >= seq, what="the first writes to commit")
        assert not t.key_filter.ready()  # no filter until the scan is in: every unknown key is read
        go.set()
        write(t, during[25:], first=200)
        wait_for(t.key_filter.ready, what="the scan to finish")
        seq = t.barrier()
        wait_for(lambda: t.committed_seq >= seq, what="the writer to drain")
        after = keys("after", 50)
        write(t, after, first=300)
        seq = t.barrier()
        wait_for(lambda: t.committed_seq >= seq, what="the writer to drain")
        every = before + during + after
        assert all(t.read(k) is not None for k in every)
        assert t.read(b"nowhere") is None and t.key_filter.absent >= 1
    finally:
        t.close()


def test_keys_still_queued_when_a_rebuild_starts_are_kept(path, monkeypatch) -> None:
    """A rebuild's scan does not see writes the writer has not committed: they go in from ``pending``."""
    monkeypatch.setattr(keyfilter, "MIN_KEYS", 16)
    release = threading.Event()
    process = SsdTier._process

    def held_process(self: SsdTier, batch: list) -> None:
        assert release.wait(30)
        process(self, batch)

    t = SsdTier(path, 64 * MB, threaded=True)
    try:
        wait_for(t.key_filter.ready, what="the first scan")
        monkeypatch.setattr(SsdTier, "_process", held_process)
        queued = keys("q", 40)
        write(t, queued)  # past 16 keys: a rebuild starts while all of them are queued
        assert t.key_filter.scans >= 2
        wait_for(lambda: t.key_filter.ready() and t.key_filter.filling is None, what="the rebuild's scan")
        release.set()
        seq = t.barrier()
        wait_for(lambda: t.committed_seq >= seq, what="the writer to drain")
        assert all(t.read(k) is not None for k in queued)
    finally:
        release.set()
        t.close()


def test_under_churn_the_filter_stays_sized_to_what_the_tier_holds(path, monkeypatch) -> None:
    """A last tier evicting as new keys come: rebuilds size the filter to the records held, not to every key
    ever written (which grows without bound)."""
    monkeypatch.setattr(keyfilter, "MIN_KEYS", 16)
    t = SsdTier(path, 40 * len(VALUE), threaded=False)  # room for a few dozen records
    try:
        written = keys("k", 2000)
        write(t, written)
        assert t.evictions > 1500 and t.count < 60
        assert t.info()["key_filter_scans"] > 10
        assert t.key_filter.current is not None and t.key_filter.current.capacity <= 4 * 60
        assert all(t.read(k) is not None for k in written[-10:])
    finally:
        t.close()


def test_a_scan_that_fails_leaves_the_filter_in_use_and_stops_rebuilds(path, monkeypatch) -> None:
    monkeypatch.setattr(keyfilter, "MIN_KEYS", 16)
    t = SsdTier(path, 64 * MB, threaded=False)
    try:
        first = keys("k", 10)
        write(t, first)
        scans = t.key_filter.scans
        monkeypatch.setattr(SsdTier, "_scan", lambda self, capacity: None)  # as on a damaged page
        more = keys("m", 40)
        write(t, more, first=100)
        assert t.key_filter.scans == scans + 1  # one failed rebuild, not one per write after it
        assert t.key_filter.ready() and all(t.read(k) is not None for k in first + more)
    finally:
        t.close()
