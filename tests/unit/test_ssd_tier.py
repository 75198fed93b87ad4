"""SsdTier on its own (``threaded=False``: every write is applied and committed before the call returns)."""

import lmdb
import pytest

from kvstrata.engine.entry import Entry
from kvstrata.engine.keyspace import bucket_of
from kvstrata.engine.tiers.ssd import (
    HEADER_SIZE,
    MAX_INLINE_KEY,
    Corrupt,
    SsdTier,
    decode_record,
    encode_record,
)

MB = 1024 * 1024


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "ssd")


@pytest.fixture
def open_tier(path):
    """``open_tier(budget=..., on_commit=...) -> SsdTier`` on the test's path; every tier is closed at the end."""
    tiers = []

    def make(budget=16 * MB, **kwargs):
        tier = SsdTier(path, budget, threaded=False, **kwargs)
        tiers.append(tier)
        return tier

    yield make
    for tier in tiers:
        tier.close()


def entry(value, version=1, expire_at=0):
    return Entry(value, version, expire_at)


def same(found, value, version, expire_at=0):
    return (isinstance(found, Entry) and bytes(found.value) == value and found.version == version
            and found.expire_at == expire_at)


def corrupt_record(path, key, offset_from_value=0):
    """Flip a byte of ``key``'s record with the tier closed; ``offset_from_value`` counts from the value start
    (negative values reach into the header)."""
    env = lmdb.open(path, max_dbs=4)
    try:
        db = env.open_db(b"data")
        with env.begin(write=True) as txn:
            for lkey, rec in txn.cursor(db=db):
                if lkey[2:3] == b"k" and lkey[3:] == key:
                    value_at = HEADER_SIZE
                elif lkey[2:3] == b"h" and rec[HEADER_SIZE : HEADER_SIZE + len(key)] == key:
                    value_at = HEADER_SIZE + len(key)
                else:
                    continue
                damaged = bytearray(rec)
                damaged[value_at + offset_from_value] ^= 0xFF
                txn.put(lkey, bytes(damaged), db=db)
                return
        raise AssertionError(f"no record for {key!r}")
    finally:
        env.close()


# --------------------------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------------------------


def test_put_get_delete_round_trip(open_tier):
    tier = open_tier()
    assert tier.get(b"a") is None
    assert tier.read(b"a") is None
    seq = tier.put(b"a", entry(b"alpha", 7, 123456))
    assert seq == tier.enqueued_seq == tier.committed_seq
    assert tier.pending == {}
    assert same(tier.read(b"a"), b"alpha", 7, 123456)
    assert same(tier.get(b"a"), b"alpha", 7, 123456)
    assert tier.contains(b"a")
    assert len(tier) == 1
    assert tier.used > len(b"alpha")
    assert tier.delete(b"a")
    assert tier.get(b"a") is None and tier.read(b"a") is None
    assert not tier.contains(b"a")
    assert len(tier) == 0
    assert tier.used == 0


def test_put_snapshots_the_entry(open_tier):
    tier = open_tier()
    e = entry(b"v1", 1)
    tier.put(b"k", e)
    e.value, e.version = b"changed", 99
    assert same(tier.get(b"k"), b"v1", 1)


def test_overwrite_replaces_the_record(open_tier):
    tier = open_tier()
    tier.put(b"k", entry(b"x" * 1000, 1))
    used_big = tier.used
    tier.put(b"k", entry(b"y", 2))
    assert len(tier) == 1
    assert tier.used == used_big - 999
    assert same(tier.get(b"k"), b"y", 2)


def test_empty_and_binary_values(open_tier):
    tier = open_tier()
    tier.put(b"", entry(b"", 1))
    tier.put(b"\x00\xff\r\n", entry(b"\x00\r\n\xff" * 10, 2))
    assert same(tier.get(b""), b"", 1)
    assert same(tier.get(b"\x00\xff\r\n"), b"\x00\r\n\xff" * 10, 2)


def test_read_many(open_tier):
    tier = open_tier()
    tier.put(b"a", entry(b"1", 1))
    tier.put(b"b", entry(b"2", 2))
    found = tier.read_many([b"a", b"b", b"c"])
    assert same(found[b"a"], b"1", 1) and same(found[b"b"], b"2", 2)
    assert found[b"c"] is None


def test_bucket_keys_list_every_key(open_tier):
    tier = open_tier()
    keys = [f"key:{i}".encode() for i in range(200)]
    for i, key in enumerate(keys):
        tier.put(key, entry(b"v", i + 1))
    listed = []
    for b in sorted({bucket_of(k) for k in keys}):
        listed += tier.bucket_keys(b)
    assert sorted(listed) == sorted(keys)
    tier.delete(keys[0])
    assert keys[0] not in tier.bucket_keys(bucket_of(keys[0]))


def test_sweep_removes_expired_records(open_tier):
    tier = open_tier()
    tier.put(b"old", entry(b"v", 1, expire_at=1000))
    tier.put(b"later", entry(b"v", 2, expire_at=5000))
    tier.put(b"never", entry(b"v", 3))
    tier.sweep_expired(2000)
    assert tier.read(b"old") is None
    assert same(tier.read(b"later"), b"v", 2, 5000)
    assert tier.read(b"never") is not None
    assert len(tier) == 2
    assert tier.expired == 1


# --------------------------------------------------------------------------------------------------------------
# Reopening
# --------------------------------------------------------------------------------------------------------------


def test_reopen_finds_every_record(path, open_tier):
    tier = open_tier()
    for i in range(100):
        tier.put(f"k{i}".encode(), entry(f"value {i}".encode() * 10, i + 1, 10_000_000 + i if i % 2 else 0))
    tier.delete(b"k5")
    used, count = tier.used, len(tier)
    tier.close()
    tier = open_tier()
    assert (tier.used, len(tier)) == (used, count) == (used, 99)
    for i in range(100):
        found = tier.get(f"k{i}".encode())
        if i == 5:
            assert found is None
        else:
            assert same(found, f"value {i}".encode() * 10, i + 1, 10_000_000 + i if i % 2 else 0), i
    # Writes after a reopen keep going (sequence numbers continue: the newest is still evicted last).
    tier.put(b"new", entry(b"n", 500))
    assert same(tier.get(b"new"), b"n", 500)


def test_threaded_writer_drains_on_close(path):
    tier = SsdTier(path, 16 * MB)  # threaded, completions delivered inline
    try:
        for i in range(50):
            tier.put(f"k{i}".encode(), entry(b"v%d" % i, i + 1))
        tier.delete(b"k0")
    finally:
        tier.close()
    tier = SsdTier(path, 16 * MB, threaded=False)
    try:
        assert len(tier) == 49
        assert tier.get(b"k0") is None
        assert same(tier.get(b"k49"), b"v49", 50)
    finally:
        tier.close()


def test_version_high_water_survives_reopen(open_tier):
    tier = open_tier()
    assert tier.version_high_water == 0
    tier.save_version_high_water(100_001)
    assert tier.version_high_water == 100_001
    tier.close()
    tier = open_tier()
    assert tier.version_high_water == 100_001
    tier.save_version_high_water(200_002)
    tier.flush()  # a flush empties the data, not the version high-water
    tier.close()
    assert open_tier().version_high_water == 200_002


# --------------------------------------------------------------------------------------------------------------
# Integrity
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 50, 99], ids=["first", "middle", "last"])
def test_corrupted_value_returns_a_corrupt_marker(path, open_tier, offset):
    tier = open_tier()
    tier.put(b"victim", entry(b"x" * 100, 3))
    tier.put(b"other", entry(b"y" * 100, 4))
    tier.close()
    corrupt_record(path, b"victim", offset)
    tier = open_tier()
    found = tier.read(b"victim")
    assert isinstance(found, Corrupt)
    assert found.key == b"victim"
    assert "checksum" in found.reason
    assert isinstance(tier.read_many([b"victim"])[b"victim"], Corrupt)
    assert tier.get(b"victim") is None  # get never hands out a corrupt record
    assert same(tier.read(b"other"), b"y" * 100, 4)
    # Deleting the corrupt record works and keeps the accounting right.
    tier.delete(b"victim")
    assert tier.read(b"victim") is None
    assert len(tier) == 1


@pytest.mark.parametrize("offset, reason", [
    (-HEADER_SIZE, "bad magic"),  # magic
    (-HEADER_SIZE + 4, "checksum"),  # version
    (-HEADER_SIZE + 12, "checksum"),  # expire_at
    (-12, "checksum"),  # stored checksum
])
def test_corrupted_header_returns_a_corrupt_marker(path, open_tier, offset, reason):
    tier = open_tier()
    tier.put(b"victim", entry(b"x" * 100, 3, 10_000_000))
    tier.close()
    corrupt_record(path, b"victim", offset)
    found = open_tier().read(b"victim")
    assert isinstance(found, Corrupt)
    assert reason in found.reason


def test_sweep_after_a_corrupt_record_spares_the_new_value(path, open_tier):
    tier = open_tier()
    tier.put(b"K", entry(b"old", 1, expire_at=1000))
    tier.close()
    corrupt_record(path, b"K", -HEADER_SIZE + 12)  # a bit of expire_at
    tier = open_tier()
    assert isinstance(tier.read(b"K"), Corrupt)
    tier.delete(b"K")  # what the engine does with a corrupt record
    tier.put(b"K", entry(b"new", 2))  # no expiry
    tier.sweep_expired(2000)
    assert same(tier.get(b"K"), b"new", 2)


def test_decode_record_rejects_damage():
    assert HEADER_SIZE == 40  # the record layout the integration tests corrupt
    parts = encode_record(b"k", b"value", 5, 0, 1)
    record = b"".join(parts)
    assert same(decode_record(b"k", record), b"value", 5)
    assert isinstance(decode_record(b"k", record[:10]), Corrupt)
    assert isinstance(decode_record(b"k", record[:-1]), Corrupt)
    assert isinstance(decode_record(b"k", record + b"!"), Corrupt)


# --------------------------------------------------------------------------------------------------------------
# Long keys (stored under their hash)
# --------------------------------------------------------------------------------------------------------------


def test_long_keys(path, open_tier):
    tier = open_tier()
    a = b"L" * 500 + b"a"
    b = b"L" * 500 + b"b"  # same first 400 bytes as a
    edge = b"E" * MAX_INLINE_KEY
    over = b"E" * (MAX_INLINE_KEY + 1)
    big = b"K" * 100_000
    for i, key in enumerate((a, b, edge, over, big)):
        tier.put(key, entry(b"value-%d" % i, i + 1))
    for i, key in enumerate((a, b, edge, over, big)):
        assert same(tier.get(key), b"value-%d" % i, i + 1), len(key)
    assert tier.get(b"L" * 500 + b"c") is None
    assert a in tier.bucket_keys(bucket_of(a))
    assert big in tier.bucket_keys(bucket_of(big))
    tier.delete(b)
    assert tier.get(b) is None
    assert same(tier.get(a), b"value-0", 1)
    tier.close()
    tier = open_tier()
    assert same(tier.get(a), b"value-0", 1)
    assert same(tier.get(over), b"value-3", 4)
    assert tier.get(b) is None
    assert len(tier) == 4
    tier.close()
    corrupt_record(path, a, 3)
    tier = open_tier()
    assert isinstance(tier.read(a), Corrupt)
    assert same(tier.get(big), b"value-4", 5)


# --------------------------------------------------------------------------------------------------------------
# Budget
# --------------------------------------------------------------------------------------------------------------


def test_budget_evicts_oldest_first(open_tier):
    evicted = []
    tier = open_tier(budget=20_000, on_commit=lambda seq, keys: evicted.extend(keys))
    keys = [f"k{i:03d}".encode() for i in range(60)]
    for i, key in enumerate(keys):
        tier.put(key, entry(b"x" * 1000, i + 1))
        assert tier.used <= 20_000
    survivors = [k for k in keys if tier.get(k) is not None]
    assert 0 < len(survivors) < 60
    assert survivors == keys[-len(survivors):], "the newest records survive"
    assert evicted == keys[: 60 - len(survivors)], "evicted oldest first and reported to on_commit"
    assert tier.evictions == len(evicted)
    assert len(tier) == len(survivors)


def test_rewritten_record_counts_as_new(open_tier):
    tier = open_tier(budget=10_000)
    for i in range(8):
        tier.put(b"k%d" % i, entry(b"x" * 1000, i + 1))
    tier.put(b"k0", entry(b"x" * 1000, 100))  # k0 becomes the newest
    for i in range(8, 12):
        tier.put(b"k%d" % i, entry(b"x" * 1000, i + 1))
    assert tier.get(b"k0") is not None
    assert tier.get(b"k1") is None


def test_budget_is_kept_across_reopen(open_tier):
    tier = open_tier(budget=20_000)
    for i in range(40):
        tier.put(b"k%d" % i, entry(b"x" * 1000, i + 1))
    tier.close()
    tier = open_tier(budget=20_000)
    for i in range(40, 80):
        tier.put(b"k%d" % i, entry(b"x" * 1000, i + 1))
    assert tier.used <= 20_000
    assert tier.get(b"k79") is not None
    assert tier.get(b"k39") is None


def test_lmdb_map_full_is_survived(open_tier):
    evicted = []
    tier = open_tier(budget=MB, on_commit=lambda seq, keys: evicted.extend(keys))
    for i in range(30):
        tier.put(b"s%d" % i, entry(b"s" * 100, i + 1))
    tier.put(b"huge", entry(b"z" * (66 * MB), 99))  # more than the whole map (budget + 64 MiB)
    assert tier.write_errors == 0
    # The tier stays consistent: the huge record is either stored or reported as evicted.
    assert tier.get(b"huge") is not None or b"huge" in evicted
    assert tier.used <= MB
    tier.put(b"after", entry(b"a", 100))
    assert same(tier.get(b"after"), b"a", 100)


def test_map_full_reports_every_evicted_key(open_tier):
    evicted = []
    tier = open_tier(budget=MB, on_commit=lambda seq, keys: evicted.extend(keys))
    keys = [b"s%d" % i for i in range(30)]
    for i, key in enumerate(keys):
        tier.put(key, entry(b"s" * 100, i + 1))
    tier.put(b"huge", entry(b"z" * (66 * MB), 99))
    gone = [k for k in keys if tier.get(k) is None]
    assert gone, "map full evicted nothing: the premise of this test no longer holds"
    assert set(gone) <= set(evicted), f"evicted but not reported: {sorted(set(gone) - set(evicted))[:5]}"


# --------------------------------------------------------------------------------------------------------------
# Flush
# --------------------------------------------------------------------------------------------------------------


def test_flush(path, open_tier):
    tier = open_tier()
    for i in range(50):
        tier.put(b"k%d" % i, entry(b"v", i + 1, 10_000 if i % 2 else 0))
    tier.flush()
    assert not tier.flush_pending
    assert len(tier) == 0 and tier.used == 0
    assert tier.get(b"k1") is None
    assert all(tier.bucket_keys(b) == [] for b in {bucket_of(b"k%d" % i) for i in range(50)})
    tier.put(b"again", entry(b"a", 60))
    tier.sweep_expired(20_000)  # the expiry index was emptied too
    assert len(tier) == 1
    tier.close()
    tier = open_tier()
    assert len(tier) == 1
    assert same(tier.get(b"again"), b"a", 60)
    assert tier.get(b"k0") is None


@pytest.mark.parametrize(("fsync", "synchronous"), [("always", True), ("everysec", False), ("no", False)])
def test_fsync_always_uses_lmdbs_synchronous_commit(tmp_path, fsync: str, synchronous: bool) -> None:
    # LMDB's own synchronous commit flushes the data pages before the meta page that points at them; an
    # env.sync after an unsynced commit does not give that order (see docs/architecture.md, "Durability").
    tier = SsdTier(str(tmp_path / "ssd"), 1 << 20, fsync=fsync, threaded=False)
    try:
        flags = tier.env.flags()
        assert flags["sync"] is synchronous and flags["metasync"] is synchronous
        tier.put(b"k", Entry(b"v", 1))
        assert tier.read(b"k").value == b"v"
    finally:
        tier.close()


def test_the_lower_tiers_share_one_interface(tmp_path) -> None:
    from kvstrata.engine.tiers.base import LowerTier
    from kvstrata.engine.tiers.pool import PoolTier

    ssd = SsdTier(str(tmp_path / "ssd"), 1 << 20, threaded=False)
    pool = PoolTier("redis://127.0.0.1:1", 1 << 20, threaded=False)
    try:
        for tier in (ssd, pool):
            assert isinstance(tier, LowerTier), tier.name
            info = tier.info()
            assert info["pending"] == 0 and info["queued_bytes"] == 0
        assert ssd.info()["reads"] == 0
        ssd.put(b"k", Entry(b"v", 1))
        assert ssd.read_many([b"k", b"x"])[b"x"] is None
        # Each key once: looked up, or ruled out by the key filter (a key never written) without a lookup.
        assert ssd.info()["reads"] == 1 and ssd.info()["key_filter_absent"] == 1
    finally:
        ssd.close()
        pool.close()


def test_committed_versions_walks_every_record_once_in_pages(open_tier):
    """The pool resync's walk (server/pool_resync.py): every committed record, as (key, version), page by page;
    long keys (kept in the record, not the LMDB key) too; nothing twice, nothing left out."""
    tier = open_tier()
    keys = [f"k{i}".encode() for i in range(50)] + [b"L" * (MAX_INLINE_KEY + 10 + i) for i in range(5)]
    for i, key in enumerate(keys):
        tier.put(key, entry(b"v" * (i + 1), version=1000 + i))
    tier.delete(keys[3])
    seen: list[tuple[bytes, int]] = []
    after, pages = None, 0
    while True:
        got, after = tier.committed_versions(after, 7)
        assert len(got) <= 7
        seen.extend(got)
        pages += 1
        if after is None:
            break
    expected = {key: 1000 + i for i, key in enumerate(keys) if i != 3}
    assert len(seen) == len(expected) and dict(seen) == expected
    assert pages == -(-len(expected) // 7)
    assert tier.committed_versions(None, 1000) == (seen, None)  # one page: the same order
