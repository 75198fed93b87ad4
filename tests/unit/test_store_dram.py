"""Unit tests for kvstrata.engine.store.Store with only the DRAM tier (no SSD), under a ManualClock, with both
eviction policies; and for the Redis glob matcher kvstrata.engine.keyspace.glob_match.

Every entry is charged ``len(key) + len(value) + OVERHEAD`` bytes against the DRAM budget.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstrata.clock import ManualClock
from kvstrata.engine.keyspace import SCAN_BUCKETS, bucket_of, glob_match
from kvstrata.engine.policy import create_policy
from kvstrata.engine.store import Store
from kvstrata.errors import OutOfMemoryError, VersionMismatchError

POLICIES = ["lru", "lru-k", "lru-k-compact"]
PROPERTY = settings(max_examples=100, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# The budgets in these tests are hand-computed with this per-entry charge; the production default is larger
# (engine/entry.py) and is checked against real memory use in test_entry_overhead_covers_rss.
OVERHEAD = 96


def make_store(budget: int, policy: str = "lru", clock: ManualClock | None = None, **kw) -> Store:
    clock = clock or ManualClock()
    kw.setdefault("entry_overhead", OVERHEAD)
    return Store(budget, policy=create_policy(policy, clock=clock), clock=clock, **kw)


def entry_size(key: bytes, value: bytes | bytearray) -> int:
    return len(key) + len(value) + OVERHEAD


def size_of(key: bytes, value_len: int) -> int:
    return len(key) + value_len + OVERHEAD


def check_invariants(store: Store) -> None:
    dram = store.dram
    assert dram.used <= dram.budget
    assert dram.used == sum(entry_size(k, e.value) for k, e in dram.entries.items())
    assert dram.pinned_bytes == sum(entry_size(k, e.value) for k, e in dram.entries.items() if e.pinned)
    # The policy ranks exactly the unpinned resident keys.
    unpinned = {k for k, e in dram.entries.items() if not e.pinned}
    assert len(store.policy) == len(unpinned)
    for k in unpinned:
        assert k in store.policy
    # The scan index holds exactly the resident keys, each in its bucket.
    indexed = {k for keys in dram.buckets.values() for k in keys}
    assert indexed == set(dram.entries)
    for b, keys in dram.buckets.items():
        assert keys and all(bucket_of(k) == b for k in keys)


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture(params=POLICIES)
def policy(request):
    return request.param


# ----------------------------------------------------------------------------------------------------------------
# Budget invariant
# ----------------------------------------------------------------------------------------------------------------

BUDGET = 4000
op_st = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 15),
              st.one_of(st.integers(0, 300), st.sampled_from([0, 1, 1000, BUDGET - OVERHEAD - 3,
                                                              BUDGET - OVERHEAD - 2, BUDGET])),
              st.one_of(st.just(0), st.integers(1, 5000))),
    st.tuples(st.just("delete"), st.integers(0, 15), st.just(0), st.just(0)),
    st.tuples(st.just("get"), st.integers(0, 15), st.just(0), st.just(0)),
    st.tuples(st.just("expire"), st.integers(0, 15), st.just(0), st.integers(0, 5000)),
    st.tuples(st.just("advance"), st.just(0), st.just(0), st.integers(1, 3000)),
    st.tuples(st.just("active"), st.just(0), st.just(0), st.integers(1, 5)),
)


def apply_op(store: Store, clock: ManualClock, op: tuple) -> None:
    kind, k, size, arg = op
    key = b"k%02d" % k
    if kind == "put":
        expire_at = clock.now_ms() + arg if arg else 0
        fits = size_of(key, size) <= store.dram.budget
        try:
            entry = store.put(key, b"v" * size, expire_at)
        except OutOfMemoryError:
            # Without SSD and without pins, only a value that cannot fit at all may be refused, whatever the policy.
            assert not fits
        else:
            assert fits
            assert store.get(key, touch=False) is entry
    elif kind == "delete":
        store.delete(key)
        assert store.get(key, touch=False) is None
    elif kind == "get":
        store.get(key)
    elif kind == "expire":
        store.set_expire(key, clock.now_ms() + arg if arg else 0)
    elif kind == "advance":
        clock.advance(arg / 1000)
    elif kind == "active":
        store.active_expire(arg)


@PROPERTY
@given(ops=st.lists(op_st, max_size=80))
@pytest.mark.parametrize("policy_name", POLICIES)
def test_budget_never_exceeded_random_ops(policy_name, ops):
    clock = ManualClock()
    store = make_store(BUDGET, policy_name, clock)
    for op in ops:
        apply_op(store, clock, op)
        check_invariants(store)


@pytest.mark.parametrize("seed", range(5))
def test_budget_never_exceeded_seeded_long_run(policy, seed):
    rng = random.Random(seed)
    clock = ManualClock()
    budget = 20_000
    store = make_store(budget, policy, clock)
    for _ in range(3000):
        r = rng.random()
        key = b"key%d" % rng.randrange(200)
        if r < 0.55:
            size = rng.choice([0, 10, 100, 1000, 5000, rng.randrange(0, 3000)])
            # Every value fits the budget and nothing is pinned: no policy may refuse a write here.
            store.put(key, b"x" * size, clock.now_ms() + rng.randrange(1, 2000) if rng.random() < 0.3 else 0)
        elif r < 0.7:
            store.delete(key)
        elif r < 0.85:
            store.get(key)
        elif r < 0.95:
            clock.advance(rng.random() / 2)
        else:
            store.active_expire(rng.randrange(1, 10))
        assert store.dram.used <= store.dram.budget
    check_invariants(store)


def test_entry_size_accounting(policy):
    store = make_store(10_000, policy)
    store.put(b"abc", b"12345")
    assert store.dram.used == 3 + 5 + OVERHEAD
    store.put(b"abc", b"1")  # replace: charged the new size only
    assert store.dram.used == 3 + 1 + OVERHEAD
    store.put(b"d", b"")
    assert store.dram.used == 3 + 1 + 1 + 2 * OVERHEAD
    store.delete(b"abc")
    assert store.dram.used == 1 + OVERHEAD
    store.flush()
    assert store.dram.used == 0


def test_entry_exactly_the_budget_fits(policy):
    key = b"k"
    store = make_store(1000, policy)
    store.put(b"other", b"x")
    store.put(key, b"v" * (1000 - OVERHEAD - len(key)))
    assert store.dram.used == 1000
    assert store.get(b"other") is None  # evicted to make room
    check_invariants(store)


# ----------------------------------------------------------------------------------------------------------------
# Eviction order
# ----------------------------------------------------------------------------------------------------------------

# Every entry below is 2 (key) + 2 (value) + 96 = 100 bytes; a 500-byte budget holds five.


def test_lru_eviction_order_hand_computed(clock):
    store = make_store(500, "lru", clock)
    for k in (b"k1", b"k2", b"k3", b"k4", b"k5"):
        store.put(k, b"vv")
    # recency, oldest first: k1 k2 k3 k4 k5
    store.get(b"k1")  # k2 k3 k4 k5 k1
    store.get(b"k3")  # k2 k4 k5 k1 k3
    store.put(b"k4", b"ww")  # overwrite is a use: k2 k5 k1 k3 k4
    store.get(b"k9")  # a miss changes nothing
    store.put(b"k6", b"vv")  # evicts k2 -> k5 k1 k3 k4 k6
    assert sorted(store.dram.entries) == [b"k1", b"k3", b"k4", b"k5", b"k6"]
    store.put(b"k7", b"vv")  # evicts k5 -> k1 k3 k4 k6 k7
    assert b"k5" not in store.dram.entries
    store.get(b"k1", touch=False)  # not a use
    store.put(b"k8", b"vv")  # evicts k1 -> k3 k4 k6 k7 k8
    assert sorted(store.dram.entries) == [b"k3", b"k4", b"k6", b"k7", b"k8"]
    # a 300-byte entry (2 + 202 + 96) evicts three: k3 k4 k6
    store.put(b"kA", b"z" * 202)
    assert sorted(store.dram.entries) == [b"k7", b"k8", b"kA"]
    assert store.stats.evicted_keys == 6
    assert store.tier_stats["dram"].evictions == 6
    check_invariants(store)


def test_lru_delete_removes_from_ranking(clock):
    store = make_store(300, "lru", clock)
    for k in (b"k1", b"k2", b"k3"):
        store.put(k, b"vv")
    store.delete(b"k1")
    store.put(b"k4", b"vv")  # room without eviction
    store.put(b"k5", b"vv")  # evicts k2 (oldest remaining)
    assert sorted(store.dram.entries) == [b"k3", b"k4", b"k5"]


def test_cold_lru_k_evicts_in_lru_order(clock):
    # The adaptive LRU-K starts in LRU order and departs from it only on evidence from its ghosts (see
    # engine/policy/lru_k.py and tests/unit/test_policy_lru_k.py for the learnt ordering).
    store = make_store(300, "lru-k", clock)
    store.put(b"ka", b"vv")
    clock.advance(2)
    store.get(b"ka")  # second, uncorrelated reference
    clock.advance(2)
    store.put(b"kb", b"vv")
    clock.advance(2)
    store.put(b"kc", b"vv")
    clock.advance(2)
    store.put(b"kd", b"vv")
    assert sorted(store.dram.entries) == [b"kb", b"kc", b"kd"]


def test_lru_evicts_least_recent_for_comparison(clock):
    store = make_store(300, "lru", clock)
    store.put(b"ka", b"vv")
    clock.advance(1)
    store.get(b"ka")
    clock.advance(1)
    store.put(b"kb", b"vv")
    store.put(b"kc", b"vv")
    store.put(b"kd", b"vv")
    assert sorted(store.dram.entries) == [b"kb", b"kc", b"kd"]


def test_overwrite_never_evicts_the_key_being_written(policy, clock):
    store = make_store(500, policy, clock)
    for k in (b"k1", b"k2", b"k3"):
        store.put(k, b"vv")
    clock.advance(1)
    # k1 is the least recently used; growing it must evict others, never k1 itself
    store.put(b"k1", b"v" * 302)  # 400 bytes
    assert store.get(b"k1").value == b"v" * 302
    check_invariants(store)


def test_lru_k_overwrite_spurious_oom(clock):
    store = make_store(500, "lru-k", clock)
    store.put(b"kb", b"x" * 100)  # 200 bytes
    clock.advance(1)
    store.get(b"kb")  # second reference: kb is in the protected segment
    store.put(b"ka", b"x" * 100)  # 200 bytes, probation, same instant
    store.put(b"ka", b"y" * 300)  # 400 bytes: kb must go
    assert store.get(b"ka").value == b"y" * 300
    assert store.get(b"kb") is None


def test_lru_overwrite_same_scenario_succeeds(clock):
    store = make_store(500, "lru", clock)
    store.put(b"kb", b"x" * 100)
    clock.advance(1)
    store.get(b"kb")
    store.put(b"ka", b"x" * 100)
    store.put(b"ka", b"y" * 300)
    assert store.get(b"ka").value == b"y" * 300
    assert store.get(b"kb") is None


# ----------------------------------------------------------------------------------------------------------------
# Out of memory
# ----------------------------------------------------------------------------------------------------------------


def test_noeviction_raises_oom_when_full(policy):
    store = make_store(300, policy, noeviction=True)
    for k in (b"k1", b"k2", b"k3"):
        store.put(k, b"vv")
    with pytest.raises(OutOfMemoryError) as info:
        store.put(b"k4", b"vv")
    assert info.value.message == "OOM command not allowed when used memory > 'maxmemory'."
    assert sorted(store.dram.entries) == [b"k1", b"k2", b"k3"]
    assert store.get(b"k4") is None
    # a same-size overwrite needs no room; a bigger one is refused and keeps the old value
    store.put(b"k1", b"ww")
    with pytest.raises(OutOfMemoryError):
        store.put(b"k2", b"www")
    assert store.get(b"k2").value == b"vv"
    # deleting makes room again
    store.delete(b"k3")
    store.put(b"k4", b"vv")
    assert store.stats.evicted_keys == 0
    check_invariants(store)


def test_noeviction_smaller_overwrite_allowed_when_full(policy):
    store = make_store(300, policy, noeviction=True)
    for k in (b"k1", b"k2", b"k3"):
        store.put(k, b"vv")
    store.put(b"k1", b"")
    assert store.dram.used == 298


@pytest.mark.parametrize("noeviction", [False, True])
def test_value_larger_than_budget_raises_oom(policy, noeviction):
    store = make_store(1000, policy, noeviction=noeviction)
    with pytest.raises(OutOfMemoryError):
        store.put(b"big", b"x" * 1000)
    assert store.get(b"big") is None
    assert store.dram.used == 0
    check_invariants(store)


def test_value_larger_than_budget_keeps_old_value_of_same_key(policy):
    store = make_store(1000, policy)
    store.put(b"big", b"small")
    with pytest.raises(OutOfMemoryError):
        store.put(b"big", b"x" * 2000)
    assert store.get(b"big").value == b"small"
    check_invariants(store)


def test_oversized_put_does_not_evict_other_keys(policy):
    store = make_store(1000, policy)
    for k in (b"k1", b"k2", b"k3"):
        store.put(k, b"v" * 10)
    with pytest.raises(OutOfMemoryError):
        store.put(b"big", b"x" * 2000)
    assert sorted(store.dram.entries) == [b"k1", b"k2", b"k3"]


def test_oom_when_everything_is_pinned(clock):
    store = make_store(1000, "lru", clock, hot_max_fraction=1.0)
    store.put(b"h1", b"x" * 300)
    store.put(b"h2", b"x" * 300)
    store.mark_hot(b"h*")
    with pytest.raises(OutOfMemoryError, match="pinned"):
        store.put(b"k", b"x" * 300)
    assert store.get(b"h1") is not None and store.get(b"h2") is not None


# ----------------------------------------------------------------------------------------------------------------
# TTL
# ----------------------------------------------------------------------------------------------------------------


def test_expired_key_never_returned(policy, clock):
    store = make_store(10_000, policy, clock)
    now = clock.now_ms()
    store.put(b"t", b"v", now + 1000)
    store.put(b"p", b"v")
    clock.advance(0.999)
    assert store.get(b"t").value == b"v"
    clock.advance(0.001)  # expire_at <= now: expired
    assert store.get(b"t", touch=False) is None
    assert store.get(b"t") is None
    assert b"t" not in store.dram.entries
    assert store.get(b"p").value == b"v"
    assert store.stats.expired_keys == 1
    check_invariants(store)


def test_expired_key_invisible_everywhere(policy, clock):
    store = make_store(10_000, policy, clock)
    now = clock.now_ms()
    for i in range(20):
        store.put(b"e%d" % i, b"v", now + 500)
        store.put(b"l%d" % i, b"v")
    clock.advance(1)
    assert sorted(store.keys(b"*")) == sorted(b"l%d" % i for i in range(20))
    cursor, seen = 0, []
    while True:
        cursor, batch = store.scan(cursor, 7)
        seen += batch
        if cursor == 0:
            break
    assert sorted(seen) == sorted(b"l%d" % i for i in range(20))
    assert store.delete(b"e1") is False
    assert store.set_expire(b"e2", 0) is False
    assert store.tier_of(b"e3") is None
    assert store.tier_of(b"l3") == "dram"
    for _ in range(50):
        assert store.random_key().startswith(b"l")


def test_past_expire_at_on_put_is_immediately_invisible(policy, clock):
    store = make_store(10_000, policy, clock)
    store.put(b"k", b"v", clock.now_ms() - 1)
    assert store.get(b"k") is None


def test_active_expire_is_bounded_and_eventually_complete(policy, clock):
    store = make_store(1_000_000, policy, clock)
    now = clock.now_ms()
    for i in range(100):
        store.put(b"d%03d" % i, b"v", now + 10 + i)
    for i in range(30):
        store.put(b"f%03d" % i, b"v", now + 100_000)
        store.put(b"n%03d" % i, b"v")
    clock.advance(1)
    rounds = 0
    while True:
        before = len(store.dram)
        done = store.active_expire(7)
        assert 0 <= done <= 7
        assert before - len(store.dram) == done
        rounds += 1
        if done == 0:
            break
        assert rounds < 100
    assert rounds >= 100 // 7
    assert not any(k.startswith(b"d") for k in store.dram.entries)
    assert len(store.dram) == 60
    assert store.stats.expired_keys == 100
    check_invariants(store)


def test_active_expire_skips_stale_heap_entries(policy, clock):
    store = make_store(1_000_000, policy, clock)
    now = clock.now_ms()
    for i in range(50):
        store.put(b"k%d" % i, b"v", now + 10)
    for i in range(0, 50, 2):
        store.put(b"k%d" % i, b"w")  # overwritten without a TTL
    for i in range(1, 50, 4):
        store.set_expire(b"k%d" % i, 0)  # persisted
    clock.advance(1)
    total = 0
    for _ in range(100):
        done = store.active_expire(3)
        assert done <= 3
        total += done
    survivors = {b"k%d" % i for i in range(0, 50, 2)} | {b"k%d" % i for i in range(1, 50, 4)}
    assert set(store.dram.entries) == survivors
    assert total == 50 - len(survivors)


def test_active_expire_leaves_future_keys(policy, clock):
    store = make_store(10_000, policy, clock)
    store.put(b"k", b"v", clock.now_ms() + 5000)
    assert store.active_expire(100) == 0
    clock.advance(4.999)
    assert store.active_expire(100) == 0
    clock.advance(0.001)
    assert store.active_expire(100) == 1
    assert len(store.dram) == 0


def test_set_expire_and_persist(policy, clock):
    store = make_store(10_000, policy, clock)
    store.put(b"k", b"v")
    assert store.set_expire(b"k", clock.now_ms() + 1000) is True
    assert store.get(b"k").expire_at == clock.now_ms() + 1000
    assert store.set_expire(b"k", 0) is True  # persist
    clock.advance(5)
    assert store.get(b"k").value == b"v"
    assert store.active_expire(10) == 0
    assert store.set_expire(b"missing", clock.now_ms() + 1000) is False
    assert store.set_expire(b"k", clock.now_ms() + 1000) is True
    clock.advance(1)
    assert store.get(b"k") is None
    assert store.set_expire(b"k", clock.now_ms() + 1000) is False


def test_set_expire_moves_expiry_later(policy, clock):
    store = make_store(10_000, policy, clock)
    store.put(b"k", b"v", clock.now_ms() + 1000)
    store.set_expire(b"k", clock.now_ms() + 3000)
    clock.advance(2)
    assert store.active_expire(10) == 0
    assert store.get(b"k") is not None
    clock.advance(1)
    assert store.get(b"k") is None


def test_put_replaces_ttl_and_replace_value_keeps_it(policy, clock):
    store = make_store(10_000, policy, clock)
    t = clock.now_ms() + 1000
    store.put(b"a", b"1", t)
    store.put(b"a", b"2")  # a plain SET drops the TTL
    assert store.get(b"a").expire_at == 0
    store.put(b"b", b"1", t)
    entry = store.replace_value(b"b", b"12")
    assert entry.expire_at == t
    assert store.replace_value(b"b", b"123", keep_ttl=False).expire_at == 0


def test_delete_returns_whether_live_key_existed(policy, clock):
    store = make_store(10_000, policy, clock)
    store.put(b"k", b"v")
    assert store.delete(b"k") is True
    assert store.delete(b"k") is False
    assert store.delete(b"never") is False


# ----------------------------------------------------------------------------------------------------------------
# Versions
# ----------------------------------------------------------------------------------------------------------------


def test_versions_strictly_increase_per_write(policy, clock):
    store = make_store(2000, policy, clock)
    rng = random.Random(7)
    last = 0
    for _ in range(300):
        key = b"k%d" % rng.randrange(10)
        if rng.random() < 0.8:
            entry = store.put(key, b"v" * rng.randrange(0, 400))
        else:
            entry = store.replace_value(key, b"r")
        assert entry.version > last
        assert store.get(key, touch=False).version == entry.version
        last = entry.version
    store.flush()
    assert store.put(b"after-flush", b"v").version > last


def test_set_expire_keeps_version(policy, clock):
    store = make_store(10_000, policy, clock)
    v = store.put(b"k", b"v").version
    store.set_expire(b"k", clock.now_ms() + 1000)
    assert store.get(b"k").version == v


def test_expected_version(policy, clock):
    store = make_store(10_000, policy, clock)
    store.put(b"new", b"v", expected_version=0)  # a missing key has version 0
    v1 = store.get(b"new").version
    with pytest.raises(VersionMismatchError) as info:
        store.put(b"new", b"w", expected_version=v1 + 5)
    assert info.value.message == f"VERMISMATCH version mismatch: expected {v1 + 5}, current {v1}"
    assert store.get(b"new").value == b"v"
    v2 = store.put(b"new", b"w", expected_version=v1).version
    assert v2 > v1
    with pytest.raises(VersionMismatchError):
        store.put(b"missing", b"x", expected_version=1)


# ----------------------------------------------------------------------------------------------------------------
# Keyspace: scan, keys, random_key, dbsize, flush
# ----------------------------------------------------------------------------------------------------------------


def full_scan(store: Store, count: int = 10, match: bytes | None = None, between=None) -> list[bytes]:
    cursor, out, calls = 0, [], 0
    while True:
        cursor, batch = store.scan(cursor, count, match)
        out += batch
        calls += 1
        assert calls <= SCAN_BUCKETS + 1
        if between is not None:
            between(calls)
        if cursor == 0:
            return out


def test_scan_returns_every_key_once(policy):
    store = make_store(10**7, policy)
    keys = {b"key:%d" % i for i in range(500)}
    for k in keys:
        store.put(k, b"v")
    for count in (1, 10, 1000):
        got = full_scan(store, count)
        assert sorted(got) == sorted(keys)


def test_scan_empty_store():
    store = make_store(10_000)
    assert store.scan(0) == (0, [])


def test_scan_with_match(policy):
    store = make_store(10**7, policy)
    for i in range(100):
        store.put(b"user:%d" % i, b"v")
        store.put(b"item:%d" % i, b"v")
    got = full_scan(store, 5, b"user:1*")
    assert sorted(got) == sorted([b"user:1"] + [b"user:1%d" % i for i in range(10)])


@pytest.mark.parametrize("seed", range(5))
def test_scan_returns_keys_present_throughout_while_keyspace_changes(policy, seed):
    rng = random.Random(seed)
    store = make_store(10**7, policy)
    stable = {b"stable:%d" % i for i in range(300)}
    for k in stable:
        store.put(k, b"v")
    churn = [b"churn:%d" % i for i in range(300)]
    ever = set(stable)

    def mutate(_call: int) -> None:
        for _ in range(5):
            k = rng.choice(churn)
            if rng.random() < 0.5:
                store.put(k, b"v")
                ever.add(k)
            else:
                store.delete(k)

    got = full_scan(store, rng.choice([1, 3, 20]), between=mutate)
    assert stable <= set(got)
    assert set(got) <= ever
    assert len(got) == len(set(got))


def test_keys_with_patterns(policy):
    store = make_store(10**6, policy)
    for k in (b"hello", b"hallo", b"hxllo", b"hllo", b"heeeello", b"h*llo", b"a", b"ab", b"abc"):
        store.put(k, b"v")
    assert sorted(store.keys(b"h?llo")) == [b"h*llo", b"hallo", b"hello", b"hxllo"]
    assert sorted(store.keys(b"h*llo")) == [b"h*llo", b"hallo", b"heeeello", b"hello", b"hllo", b"hxllo"]
    assert sorted(store.keys(b"h[ae]llo")) == [b"hallo", b"hello"]
    assert sorted(store.keys(b"h[^e]llo")) == [b"h*llo", b"hallo", b"hxllo"]
    assert sorted(store.keys(b"h[a-b]llo")) == [b"hallo"]
    assert sorted(store.keys(b"h\\*llo")) == [b"h*llo"]
    assert sorted(store.keys(b"*")) == sorted(store.dram.entries)
    assert sorted(store.keys(b"a*")) == [b"a", b"ab", b"abc"]
    assert store.keys(b"zzz*") == []


def test_random_key(policy):
    store = make_store(10**6, policy)
    assert store.random_key() is None
    keys = {b"r%d" % i for i in range(20)}
    for k in keys:
        store.put(k, b"v")
    seen = {store.random_key() for _ in range(400)}
    assert seen <= keys
    assert len(seen) > 5


def test_random_key_when_all_keys_expired(policy, clock):
    store = make_store(10**6, policy, clock)
    store.put(b"k", b"v", clock.now_ms() + 10)
    clock.advance(1)
    assert store.random_key() is None


def test_dbsize_and_flush(policy, clock):
    store = make_store(10**6, policy, clock)
    assert store.dbsize() == 0
    for i in range(10):
        store.put(b"k%d" % i, b"v")
    store.put(b"k0", b"w")
    assert store.dbsize() == 10
    store.delete(b"k1")
    assert store.dbsize() == 9
    store.flush()
    assert store.dbsize() == 0
    assert store.dram.used == 0
    assert len(store.policy) == 0
    assert store.keys(b"*") == []
    assert store.scan(0) == (0, [])
    assert store.random_key() is None
    # the store works normally afterwards, expiry heap included
    store.put(b"x", b"v", clock.now_ms() + 10)
    clock.advance(1)
    assert store.active_expire() == 1
    check_invariants(store)


def test_flush_then_fill_evicts_normally(policy):
    store = make_store(300, policy)
    for k in (b"k1", b"k2", b"k3"):
        store.put(k, b"vv")
    store.flush()
    for k in (b"k4", b"k5", b"k6", b"k7"):
        store.put(k, b"vv")
    assert len(store.dram) == 3
    check_invariants(store)


# ----------------------------------------------------------------------------------------------------------------
# Hot keys (pins)
# ----------------------------------------------------------------------------------------------------------------


def test_mark_hot_pins_and_pinned_keys_are_never_evicted(policy, clock):
    store = make_store(2000, policy, clock)
    store.put(b"hot:1", b"h" * 100)
    store.put(b"hot:2", b"h" * 100)
    store.put(b"cold:0", b"c")
    pinned, below = store.mark_hot(b"hot:*")
    assert (pinned, below) == (2, [])
    assert store.dram.entries[b"hot:1"].pinned and store.dram.entries[b"hot:2"].pinned
    assert b"hot:1" not in store.policy
    rng = random.Random(1)
    for _ in range(500):
        store.put(b"cold:%d" % rng.randrange(100), b"c" * rng.randrange(0, 500))
        clock.advance(0.01)
        assert b"hot:1" in store.dram.entries and b"hot:2" in store.dram.entries
        assert store.dram.used <= store.dram.budget
    assert store.get(b"hot:1").value == b"h" * 100
    check_invariants(store)


def test_new_key_matching_hot_pattern_is_pinned(policy):
    store = make_store(10_000, policy)
    store.mark_hot(b"hot:*")
    store.put(b"hot:new", b"v")
    store.put(b"cold", b"v")
    assert store.dram.entries[b"hot:new"].pinned
    assert not store.dram.entries[b"cold"].pinned
    check_invariants(store)


def test_overwriting_pinned_key_keeps_it_pinned(policy):
    store = make_store(10_000, policy)
    store.put(b"hot", b"v")
    store.mark_hot(b"hot")
    store.put(b"hot", b"w" * 10)
    assert store.dram.entries[b"hot"].pinned
    assert b"hot" not in store.policy
    check_invariants(store)


def test_pinned_bytes_cap(policy):
    budget = 10_000
    store = make_store(budget, policy, hot_max_fraction=0.25)
    for i in range(20):
        store.put(b"k%02d" % i, b"v" * 201)  # 300 bytes each
    pinned, _ = store.mark_hot(b"*")
    assert pinned == 8  # 8 * 300 = 2400 <= 2500 < 2700
    assert store.dram.pinned_bytes == 2400
    assert store.dram.pinned_bytes <= 0.25 * budget
    assert store.stats.pin_rejected == 12
    store.put(b"new", b"v" * 201)  # matches '*' but the cap is reached
    assert not store.dram.entries[b"new"].pinned
    assert store.dram.pinned_bytes <= 0.25 * budget
    check_invariants(store)


@pytest.mark.parametrize("seed", range(3))
def test_pinned_bytes_cap_random(policy, seed):
    rng = random.Random(seed)
    budget = 20_000
    store = make_store(budget, policy, hot_max_fraction=0.3)
    store.mark_hot(b"h*")
    for _ in range(500):
        key = (b"h" if rng.random() < 0.5 else b"c") + b"%d" % rng.randrange(40)
        if key in store.dram.entries and store.dram.entries[key].pinned:
            continue  # overwriting a pinned key: see test_overwrite_pinned_key_respects_cap
        try:
            store.put(key, b"x" * rng.randrange(0, 1500))
        except OutOfMemoryError:
            pass
        assert store.dram.pinned_bytes <= 0.3 * budget
        assert store.dram.used <= budget
    check_invariants(store)


def test_overwrite_pinned_key_respects_cap(policy):
    store = make_store(10_000, policy, hot_max_fraction=0.5)
    store.put(b"h", b"x" * 1000)
    store.mark_hot(b"h")
    store.put(b"h", b"x" * 8000)
    assert store.dram.pinned_bytes <= 0.5 * 10_000


def test_unmark_hot_unpins(policy):
    store = make_store(500, policy)
    store.put(b"h1", b"vv")
    store.put(b"h2", b"vv")
    store.mark_hot(b"h*")
    assert store.unmark_hot(b"nope") == 0
    assert store.unmark_hot(b"h*") == 2
    assert not store.dram.entries[b"h1"].pinned
    assert store.dram.pinned_bytes == 0
    assert b"h1" in store.policy and b"h2" in store.policy
    check_invariants(store)
    # evictable again
    for i in range(5):
        store.put(b"c%d" % i, b"vv")
    assert b"h1" not in store.dram.entries and b"h2" not in store.dram.entries
    # and new keys are no longer pinned
    store.put(b"h3", b"vv")
    assert not store.dram.entries[b"h3"].pinned


def test_unmark_hot_keeps_keys_matched_by_another_pattern(policy):
    store = make_store(10_000, policy)
    store.put(b"hot:a", b"v")
    store.put(b"hot:b", b"v")
    store.mark_hot(b"hot:*")
    store.mark_hot(b"hot:a")
    assert store.unmark_hot(b"hot:*") == 1
    assert store.dram.entries[b"hot:a"].pinned
    assert not store.dram.entries[b"hot:b"].pinned
    check_invariants(store)


def test_hot_pattern_with_past_deadline_pins_no_new_keys(policy, clock):
    store = make_store(10_000, policy, clock)
    store.mark_hot(b"h*", until_ms=clock.now_ms() + 1000)
    store.put(b"h1", b"v")
    assert store.dram.entries[b"h1"].pinned
    clock.advance(2)
    store.put(b"h2", b"v")
    assert not store.dram.entries[b"h2"].pinned


def test_timed_hot_mark_expires_without_ssd(policy, clock):
    store = make_store(10_000, policy, clock)
    store.put(b"h1", b"v")
    store.mark_hot(b"h*", until_ms=clock.now_ms() + 1000)
    assert store.dram.entries[b"h1"].pinned
    clock.advance(2)
    store.active_expire()
    assert not store.dram.entries[b"h1"].pinned


def test_pinned_key_expires_normally(policy, clock):
    store = make_store(10_000, policy, clock)
    store.put(b"h", b"v", clock.now_ms() + 100)
    store.mark_hot(b"h")
    clock.advance(1)
    assert store.get(b"h") is None
    assert store.dram.pinned_bytes == 0
    check_invariants(store)


# ----------------------------------------------------------------------------------------------------------------
# glob_match (Redis stringmatchlen semantics)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern,key,expected", [
    (b"*", b"", True),
    (b"*", b"anything", True),
    (b"", b"", True),
    (b"", b"a", False),
    (b"a*", b"a", True),
    (b"a*", b"abc", True),
    (b"a*", b"ba", False),
    (b"*c", b"abc", True),
    (b"a*c", b"ac", True),
    (b"a*c", b"abbbc", True),
    (b"a*c", b"abcd", False),
    (b"**", b"x", True),
    (b"?", b"a", True),
    (b"?", b"", False),
    (b"?", b"ab", False),
    (b"h?llo", b"hello", True),
    (b"h?llo", b"hllo", False),
    (b"?", b"\n", True),
    (b"*", b"a\nb", True),
    (b"[abc]", b"b", True),
    (b"[abc]", b"d", False),
    (b"[a-c]", b"b", True),
    (b"[a-c]", b"d", False),
    (b"[c-a]", b"b", True),  # reversed range, as in Redis
    (b"[c-a]", b"a", True),
    (b"[c-a]", b"d", False),
    (b"[9-0]x", b"5x", True),
    (b"[^a]", b"b", True),
    (b"[^a]", b"a", False),
    (b"[^a-c]", b"d", True),
    (b"[^a-c]", b"b", False),
    (b"[a-cx-z]", b"y", True),
    (b"[-a]", b"-", True),
    (b"[a\\]]", b"]", True),
    (b"[a\\-c]", b"-", True),
    (b"[a\\-c]", b"b", False),
    (b"[]", b"a", False),
    (b"\\*", b"*", True),
    (b"\\*", b"a", False),
    (b"\\?", b"?", True),
    (b"\\?", b"a", False),
    (b"a\\[b", b"a[b", True),
    (b"\\a", b"a", True),
    (b"a\\", b"a\\", True),  # a trailing backslash is literal
    (b"a.c", b"abc", False),  # regex metacharacters are literal
    (b"a.c", b"a.c", True),
    (b"a+", b"aa", False),
    (b"(a|b)", b"(a|b)", True),
    (b"$^", b"$^", True),
    (b"user:{*}", b"user:{42}", True),
    (b"[abc", b"a", True),  # unterminated class: up to the end of the pattern
    (b"\xff*", b"\xff\x00", True),
])
def test_glob_match(pattern, key, expected):
    assert glob_match(pattern, key) is expected


def test_glob_negated_empty_class():
    assert glob_match(b"[^]", b"a") is True
    assert glob_match(b"[^]", b"") is False


def test_glob_reversed_range_with_escaped_low_end():
    assert glob_match(b"[~-0]", b"!") is False
    assert glob_match(b"[~-0]", b"5") is True


def test_entry_overhead_covers_rss():
    """The per-entry charge must cover what an entry really costs, or the budget would be a lie for small values."""
    import gc
    import os

    from kvstrata.clock import SystemClock
    from kvstrata.engine.entry import ENTRY_OVERHEAD

    def rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    n = 100_000
    keys = [b"key:%012d" % i for i in range(n)]
    values = [b"v%d" % i for i in range(n)]
    store = Store(10**12, policy=create_policy("lru-k", clock=SystemClock(), crp=1.0))
    gc.collect()
    before = rss()
    for k, v in zip(keys, values, strict=True):
        store.put(k, v)
    gc.collect()
    per_entry = (rss() - before) / n
    assert per_entry < ENTRY_OVERHEAD, f"an entry costs {per_entry:.0f} B beyond its key and value"
