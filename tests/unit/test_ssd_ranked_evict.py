"""The SSD tier's eviction by a ranking (``ssd-policy``): CLOCK over flat arrays, the registry's policies over
sequence numbers, reads and returns as accesses, the budget under churn, restart, rollback and the option."""

import random

import pytest

from kvstrata.config import Config
from kvstrata.engine.entry import Entry
from kvstrata.engine.policy.clock import ClockPolicy, scramble, unscramble
from kvstrata.engine.tiers.ssd import HEADER_SIZE, RECORD_OVERHEAD, SsdTier, data_key
from kvstrata.engine.tiers.ssd_rank import DEFAULT_SSD_POLICY, SSD_POLICIES, SsdRanking, create_ssd_ranking

VALUE = 4096


@pytest.fixture
def open_tier(tmp_path):
    """``open_tier(records, policy) -> SsdTier`` with room for ``records`` values of ``VALUE`` bytes."""
    tiers = []

    def make(records, policy, path="ssd"):
        per = len(data_key(b"key:0000")) + HEADER_SIZE + VALUE + RECORD_OVERHEAD
        tier = SsdTier(str(tmp_path / path), records * per, threaded=False, policy=policy)
        tiers.append(tier)
        return tier

    yield make
    for tier in tiers:
        tier.close()


def key(i):
    return b"key:%04d" % i


def put(tier, i, version=1):
    tier.put(key(i), Entry(bytes([i % 251]) * VALUE, version, 0))


def held(tier, n):
    return {i for i in range(n) if tier.get(key(i)) is not None}


def test_clock_gives_a_touched_key_a_second_chance():
    pol = ClockPolicy()
    for k in (1, 2, 3):
        pol.admit(k)
    pol.touch(1)
    assert pol.victim() == 2  # 1 was passed over (its count spent), 2 is the oldest unread key
    pol.remove(2)
    assert list(pol.victims()) == [3, 1]
    assert pol.victim() == 3
    pol.remove(3)
    assert pol.victim() == 1 and pol.count_of(1) == 0
    with pytest.raises(ValueError):
        pol.admit(0)
    assert all(unscramble(scramble(k)) == k for k in (1, 2, 3, 2**40 + 7, 2**61 - 1))


def test_clock_bulk_extend_ranks_as_admitting_one_by_one():
    rng = random.Random(3)
    keys = rng.sample(range(1, 10**9), 3000)
    one, bulk = ClockPolicy(), ClockPolicy()
    one.admit(keys[0])
    bulk.admit(keys[0])
    for k in keys[1:]:
        one.admit(k)
    bulk.extend(keys[1:])
    for pol in (one, bulk):
        for k in keys[::7]:
            pol.touch(k)
    order = []
    while len(one):
        v = one.victim()
        assert bulk.victim() == v
        one.remove(v)
        bulk.remove(v)
        order.append(v)
    assert sorted(order) == sorted(keys) and bulk.victim() is None


@pytest.mark.parametrize("policy", [p for p in SSD_POLICIES if p != "fifo"])
def test_a_read_record_outlives_an_older_unread_one(open_tier, policy):
    tier = open_tier(8, policy)
    for i in range(8):
        put(tier, i)
    assert tier.get(key(0)) is not None  # read from LMDB: an access
    put(tier, 8)  # over budget: one record leaves
    assert held(tier, 9) == set(range(9)) - {1}
    assert tier.info()["eviction_policy"] == policy


def test_fifo_evicts_the_oldest_write_even_if_read(open_tier):
    tier = open_tier(8, "fifo")
    for i in range(8):
        put(tier, i)
    assert tier.get(key(0)) is not None
    put(tier, 8)
    assert held(tier, 9) == set(range(1, 9))
    assert tier.info()["eviction_policy"] == "fifo"


def test_a_key_written_back_soon_after_it_left_counts_as_read(open_tier):
    """Under write-back a promotion deletes the record and a later demotion writes it again."""
    tier = open_tier(8, "clock")
    for i in range(8):
        put(tier, i)
    tier.delete(key(0))
    put(tier, 0, version=2)  # back: now the newest write, and marked as read
    put(tier, 8)
    put(tier, 9)  # two leave: the oldest unread ones (1, 2), not 0
    assert held(tier, 10) == set(range(10)) - {1, 2}
    assert tier._rank is not None and tier._rank.returns == 1


@pytest.mark.parametrize("policy", SSD_POLICIES)
def test_budget_holds_and_ranking_tracks_every_record_under_churn(open_tier, policy):
    rng = random.Random(5)
    tier = open_tier(20, policy)
    for step in range(600):
        i = rng.randrange(60)
        op = rng.random()
        if op < 0.55:
            tier.put(key(i), Entry(b"v" * rng.randrange(1, 2 * VALUE), step + 1, 0))
        elif op < 0.85:
            tier.get(key(i))
        elif op < 0.97:
            tier.delete(key(i))
        else:
            tier.flush()
        assert tier.used <= tier.budget
        if tier._rank is not None:
            assert len(tier._rank) == tier.count
    assert tier.evictions > 20  # the budget was tested, not just stayed under


def test_restart_ranks_the_records_on_disk_in_write_order(open_tier):
    tier = open_tier(8, "clock")
    for i in range(8):
        put(tier, i)
    tier.close()
    again = open_tier(8, "clock")
    assert again._rank is not None and len(again._rank) == again.count == 8
    assert again.get(key(0)) is not None
    put(again, 8)
    put(again, 9)
    assert held(again, 10) == set(range(10)) - {1, 2}  # write order after the restart, the read counted
    assert again.get(key(9)).value == bytes([9]) * VALUE


def test_a_fifo_tier_reopened_with_a_ranking_and_back(open_tier):
    tier = open_tier(8, "fifo")
    for i in range(6):
        put(tier, i)
    tier.close()
    ranked = open_tier(8, "s3-fifo")
    assert len(ranked._rank) == 6
    for i in range(6, 12):
        put(ranked, i)
    assert ranked.used <= ranked.budget and held(ranked, 12) == set(range(4, 12))
    ranked.close()
    assert held(open_tier(8, "fifo"), 12) == set(range(4, 12))


def test_rollback_undoes_a_failed_transaction():
    rank = SsdRanking("clock")
    rank.admit(1, b"a")
    rank.admit(2, b"b")
    rank.commit()
    rank.remove(1, b"a")
    rank.admit(3, b"c")
    rank.admit(4, b"d")
    rank.remove(4, b"d")
    assert rank.rollback()
    assert 1 in rank.policy and 2 in rank.policy and 3 not in rank.policy and 4 not in rank.policy
    rank.clear()
    assert not rank.rollback()  # a FLUSH cannot be undone here: the tier rebuilds from disk


def test_ssd_policy_option():
    assert create_ssd_ranking("fifo") is None
    with pytest.raises(ValueError, match="unknown SSD eviction policy"):
        create_ssd_ranking("random")
    cfg = Config()
    assert cfg.get("ssd-policy") == DEFAULT_SSD_POLICY
    for name in SSD_POLICIES:
        cfg.set("ssd-policy", name)
        assert cfg.get("ssd-policy") == name
    with pytest.raises(ValueError, match="must be one of the following: " + ", ".join(SSD_POLICIES)):
        cfg.set("ssd-policy", "mru")


def test_compact_s3fifo_takes_the_victims_s3fifo_takes():
    """The array form (``s3-compact``) against the registry's S3-FIFO on one random script of int keys."""
    from kvstrata.engine.policy import create_policy
    from kvstrata.engine.policy.s3compact import CompactS3FIFOPolicy

    rng = random.Random(11)
    ref, arr = create_policy("s3-fifo"), CompactS3FIFOPolicy()
    live: list[int] = []
    gone: list[int] = []
    nxt = 1
    for _ in range(6000):
        op = rng.random()
        if op < 0.4 or len(live) < 50:
            if gone and rng.random() < 0.3:  # an evicted key comes back (a ghost hit when it left small unread)
                k = gone.pop(rng.randrange(len(gone)))
                live.append(k)
            elif rng.random() < 0.1 and live:
                k = rng.choice(live)
            else:
                k = nxt
                nxt += 1
                live.append(k)
            ref.admit(k)
            arr.admit(k)
        elif op < 0.75:
            k = rng.choice(live)
            ref.touch(k)
            arr.touch(k)
        elif op < 0.97:
            v = ref.victim()
            assert arr.victim() == v
            ref.remove(v)
            arr.remove(v)
            live.remove(v)
            gone.append(v)
        else:
            k = live.pop(rng.randrange(len(live)))
            ref.remove(k)
            arr.remove(k)
        assert len(ref) == len(arr)
    assert arr.segment_sizes()[2] > 0 and ref.segment_sizes() == arr.segment_sizes()
