"""SsdTier's direct reads on the event loop: records the writer found right after committing them are copied
straight out of LMDB's memory map (no py-lmdb call, so the loop keeps the GIL) and verified against the write's
sequence number and checksum; a place that no longer holds its record is never served (the lookup answers
instead) and is forgotten. A real LMDB tier; its writer inline, and in its own thread for the history check."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from tests.integration.polling import wait_for

from kvstrata.engine.entry import Entry, Meta
from kvstrata.engine.tiers.ssd import SsdTier, data_key

MB = 1024 * 1024


def _value(key: bytes, version: int, size: int) -> bytes:
    """A value that says which key and version it is, so that a read of the wrong one shows."""
    stamp = b"%s@%d;" % (key, version)
    return (stamp * (size // len(stamp) + 1))[:size]


class _NoLookups:
    """Stands in for the LMDB environment where the test asserts that nothing opens a transaction."""

    def begin(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("an LMDB transaction was opened")


@pytest.fixture
def tier(tmp_path: Path):
    t = SsdTier(str(tmp_path / "ssd"), 256 * MB, fsync="no", threaded=False)
    yield t
    t.close()


def test_records_the_writer_found_are_read_without_a_lookup(tier: SsdTier) -> None:
    keys = [b"c%02d" % i for i in range(6)]
    for i, key in enumerate(keys):
        tier.put(key, Entry(_value(key, 1, 40_000), 1, 7_000 + i))
    env, tier.env = tier.env, _NoLookups()  # type: ignore[assignment]
    try:
        got = tier.read_resident(keys, MB)
        metas = tier.read_resident(keys, MB, probe=True)
    finally:
        tier.env = env
    assert got is not None and metas is not None
    for i, key in enumerate(keys):
        entry = got[key]
        assert isinstance(entry, Entry) and bytes(entry.value) == _value(key, 1, 40_000)
        assert entry.version == 1 and entry.expire_at == 7_000 + i
        meta = metas[key]
        assert isinstance(meta, Meta) and (meta.version, meta.expire_at, meta.value_len) == (1, 7_000 + i, 40_000)
    assert tier.inline_direct == 2 * len(keys) and tier.inline_reads == 2 * len(keys)
    assert tier.reads == len(keys) and tier.probes == len(keys)
    assert tier.info()["inline_direct"] == 2 * len(keys)


def test_the_writer_forgets_a_place_before_it_frees_the_pages(tmp_path: Path) -> None:
    """Direct reads rest on this: a record's place is forgotten in the transaction that removes or rewrites it,
    before its pages can be reused (deletes, rewrites, evictions, expiry, FLUSH)."""
    t = SsdTier(str(tmp_path / "ssd"), 12 * 41_000, fsync="no", threaded=False)  # room for about 12 records
    try:
        t.put(b"gone", Entry(_value(b"gone", 1, 40_000), 1, 0))
        t.delete(b"gone")
        assert data_key(b"gone") not in t._direct
        t.put(b"re", Entry(_value(b"re", 1, 40_000), 1, 0))
        first = t._direct[data_key(b"re")]
        t.put(b"re", Entry(_value(b"re", 2, 40_000), 2, 0))
        assert t._direct[data_key(b"re")][2] > first[2]  # the new write's place, with its sequence number
        got = t.read_resident([b"re"], MB)
        assert got is not None and got[b"re"].version == 2  # type: ignore[union-attr]
        for i in range(30):  # over the budget: the oldest records are evicted
            t.put(b"e%02d" % i, Entry(_value(b"e%02d" % i, 1, 40_000), 1, 0))
        assert t.evictions > 0
        assert set(t._direct) <= {data_key(k) for k in (b"re", *(b"e%02d" % i for i in range(30)))}
        assert all(t.read(bytes(lkey[3:])) is not None for lkey in t._direct)  # every place remembered exists
        t.flush()
        assert not t._direct
    finally:
        t.close()


def test_a_place_that_holds_other_bytes_is_never_served(tier: SsdTier) -> None:
    one, two = b"one", b"two"
    tier.put(one, Entry(_value(one, 1, 40_000), 1, 0))
    tier.put(two, Entry(_value(two, 2, 40_000), 2, 0))
    for wrong in (tier._direct[data_key(two)][:2] + tier._direct[data_key(one)][2:],  # another record's place
                  (tier._direct[data_key(two)][0] + 4096,) + tier._direct[data_key(one)][1:]):  # inside a value
        tier._direct[data_key(one)] = wrong
        got = tier.read_resident([one], MB)
        assert got is not None and bytes(got[one].value) == _value(one, 1, 40_000)  # type: ignore[union-attr]
        assert data_key(one) not in tier._direct  # forgotten: the lookup answered
    assert tier.inline_moved == 2  # each time the lookup found the record elsewhere than remembered


def test_small_records_moved_with_their_leaf_pages_always_read_their_latest_write(tier: SsdTier) -> None:
    """Values smaller than a page live inside B-tree leaves, which move whenever a neighbour changes."""
    rng = random.Random(5)
    keys = [b"s%03d" % i for i in range(300)]
    latest = dict.fromkeys(keys, 0)
    for _ in range(30):
        for key in rng.sample(keys, 40):
            latest[key] += 1
            tier.put(key, Entry(_value(key, latest[key], rng.randrange(50, 900)), latest[key], 0))
        batch = [k for k in rng.sample(keys, 20) if latest[k]]
        got = tier.read_resident(batch, MB)
        if got is None:
            continue  # a place unknown: a thread's read (not this test's subject)
        for key in batch:
            entry = got[key]
            assert isinstance(entry, Entry) and entry.version == latest[key]
            assert bytes(entry.value).startswith(b"%s@%d;" % (key, latest[key]))
    assert tier.inline_direct > 0


def test_direct_reads_under_a_writer_thread_never_go_back_in_time(tmp_path: Path) -> None:
    """A history: the writer thread rewrites keys while this thread (the event loop's place) reads them directly;
    every read returns a version at least as new as the last one committed before the read began, with that
    version's own bytes."""
    t = SsdTier(str(tmp_path / "ssd"), 256 * MB, fsync="no")
    try:
        t.set_writer_pause(0)
        keys = [b"h%02d" % i for i in range(24)]
        committed: dict[bytes, int] = {}  # version whose commit this thread has seen, per key
        queued: list[tuple[int, bytes, int]] = []  # (seq, key, version) in queue order
        seq = 0
        for key in keys:
            seq = t.put(key, Entry(_value(key, 1, 20_000), 1, 0))
            queued.append((seq, key, 1))
        wait_for(lambda: t.committed_seq >= seq, what="the first writes")
        stop = threading.Event()
        errors: list[str] = []

        def rewrite() -> None:
            rng = random.Random(9)
            version = 1
            while not stop.is_set() and version < 400:
                version += 1
                key = rng.choice(keys)
                queued.append((t.put(key, Entry(_value(key, version, rng.randrange(8_000, 40_000)), version, 0)),
                               key, version))

        writer = threading.Thread(target=rewrite)
        writer.start()
        direct = 0
        while writer.is_alive() or t.committed_seq < queued[-1][0]:
            done = t.committed_seq
            for s, key, version in list(queued):
                if s <= done:
                    committed[key] = max(committed.get(key, 0), version)
            batch = random.sample(keys, 3)
            before = t.inline_direct
            got = t.read_resident(batch, MB)
            if got is None:
                continue
            direct += t.inline_direct - before
            for key in batch:
                entry = got[key]
                if not isinstance(entry, Entry) or entry.version < committed.get(key, 0) or not bytes(
                        entry.value).startswith(b"%s@%d;" % (key, entry.version)):
                    errors.append(f"{key!r}: {entry!r} after version {committed.get(key)} committed")
        stop.set()
        writer.join()
        assert not errors, errors[:5]
        assert direct > 0
    finally:
        t.close()


def test_a_closed_tier_reads_nothing_directly(tmp_path: Path) -> None:
    t = SsdTier(str(tmp_path / "ssd"), 64 * MB, fsync="no", threaded=False)
    t.put(b"k", Entry(b"v" * 10_000, 1, 0))
    assert t._direct
    t.close()
    assert not t._direct and t.read_resident([b"k"], MB) is None
