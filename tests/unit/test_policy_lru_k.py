"""LRU-K policy (kvstrata.engine.policy.lru_k): correlated references, promotion, victim order, ghost adaptation,
bounded history, and a hit-ratio comparison with LRU on a small generated trace. ManualClock, no sleeps."""

from __future__ import annotations

import math
import random

import pytest

from kvstrata.bench.hitrate import simulate_policy
from kvstrata.bench.traces import TraceParams, generate, trace_stats
from kvstrata.clock import ManualClock
from kvstrata.engine.policy import create_policy
from kvstrata.engine.policy.lru import LRUPolicy
from kvstrata.engine.policy.lru_k import LRUKPolicy

LN8 = math.log(8.0)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def make(clock: ManualClock, **kw) -> LRUKPolicy:
    kw.setdefault("crp", 1.0)
    return LRUKPolicy(clock=clock, **kw)


def evict(policy: LRUKPolicy, expected: bytes) -> None:
    """Ask for the victim, check it, and move it out as the engine does."""
    assert policy.victim() == expected
    policy.remove(expected)


def lower_theta(policy: LRUKPolicy, clock: ManualClock, hits: int) -> None:
    """Produce ``hits`` protected ghost hits, each inside its window, with a throwaway key.

    Each round: touch the filler (so the cycling key is the protected head), evict the cycling key after it has
    been idle 2 s (window: 2 s), admit it again 1 s later. Needs ``adapt_rate`` large enough that every step is
    capped at 0.25, so ln(theta) drops by exactly 0.25 per hit.
    """
    x, filler = b"cycle", b"filler"
    for key in (x, filler):
        policy.admit(key)
    clock.advance(2)
    policy.touch(x)
    policy.touch(filler)  # both proven now
    for _ in range(hits):
        clock.advance(1)
        policy.touch(filler)
        clock.advance(1)
        evict(policy, x)  # idle 2 s: the protected head
        clock.advance(1)
        policy.admit(x)  # back within its window: a protected ghost hit
    policy.remove(x)
    policy.remove(filler)


# ---- correlated references and promotion ----


def test_burst_within_crp_counts_once(clock):
    p = make(clock)
    p.admit(b"a")
    for _ in range(5):  # each reference within 1 s of the previous one: one burst
        clock.advance(0.9)
        p.touch(b"a")
    assert p.references(b"a") == 1
    assert p.segment_sizes() == (1, 0, 0)
    clock.advance(1.5)  # more than the CRP after the last reference of the burst
    p.touch(b"a")
    assert p.references(b"a") == 2
    assert p.segment_sizes() == (0, 1, 0)


def test_kth_uncorrelated_reference_promotes(clock):
    p = make(clock, k=3)
    p.admit(b"a")
    clock.advance(2)
    p.touch(b"a")
    assert (p.references(b"a"), p.segment_sizes()) == (2, (1, 0, 0))
    clock.advance(2)
    p.touch(b"a")
    assert (p.references(b"a"), p.segment_sizes()) == (3, (0, 1, 0))
    clock.advance(2)
    p.touch(b"a")
    assert p.references(b"a") == 3  # remembered up to K


def test_k1_is_exactly_lru():
    clock = ManualClock()
    p, lru = make(clock, k=1), LRUPolicy()
    rng = random.Random(5)
    resident: set[bytes] = set()
    for _ in range(3000):
        clock.advance(rng.random())
        key = b"%d" % rng.randrange(60)
        if key in resident:
            p.touch(key)
            lru.touch(key)
            continue
        if len(resident) >= 20:
            v = lru.victim()
            assert p.victim() == v
            p.remove(v)
            lru.remove(v)
            resident.discard(v)
        p.admit(key)
        lru.admit(key)
        resident.add(key)


# ---- victim order ----


def test_cold_policy_orders_as_lru(clock):
    p = make(clock)
    p.admit(b"a")
    clock.advance(2)
    p.touch(b"a")  # proven, last used at t=2
    clock.advance(1)
    p.admit(b"b")  # unproven, last used at t=3
    clock.advance(7)
    assert (p.theta, p.log_theta) == (1.0, pytest.approx(LN8))
    assert p.victim() == b"a"  # idle 8 s vs 7 s: without evidence yet, LRU order


def test_probation_first_once_theta_is_below_one(clock):
    p = make(clock, adapt_rate=10.0)
    lower_theta(p, clock, 12)  # ln 8 - 12 * 0.25
    assert p.log_theta == pytest.approx(LN8 - 3.0)
    theta = math.exp(LN8 - 3.0)
    assert p.theta == pytest.approx(theta)  # 0.398
    p.admit(b"a")
    clock.advance(2)
    p.touch(b"a")  # proven
    p.admit(b"b")
    clock.advance(1)
    p.admit(b"c")  # b, c unproven
    clock.advance(7)
    # idle: a 8 s (protected head), b 8 s, c 7 s. Probation goes first while idle >= 0.398 * 8 = 3.18 s.
    assert list(p.victims()) == [b"b", b"c", b"a"]
    evict(p, b"b")
    evict(p, b"c")
    p.admit(b"d")
    clock.advance(2)
    # d idle 2 s < 0.398 * 10 s: the protected head is older by more than the ratio, so it goes first.
    assert list(p.victims()) == [b"a", b"d"]
    evict(p, b"a")
    evict(p, b"d")
    assert p.victim() is None


def test_recently_referenced_key_is_not_evictable(clock):
    p = make(clock, adapt_rate=10.0)
    lower_theta(p, clock, 12)  # theta 0.398
    p.admit(b"a")
    clock.advance(2)
    p.touch(b"a")  # proven, last used now
    clock.advance(1.1)
    p.admit(b"b")
    clock.advance(0.9)
    # idle b 0.9 s >= 0.398 * 2.0 s would put b first, but b is within the CRP and a is not.
    assert p.victim() == b"a"
    assert list(p.victims()) == [b"a", b"b"]
    clock.advance(0.2)  # b is outside the CRP too now: idle 1.1 >= 0.398 * 2.2
    assert p.victim() == b"b"
    # When every key is within the CRP, one must still go: the ratio rule decides (here LRU order).
    q = make(clock)
    q.admit(b"x")
    clock.advance(2)
    q.touch(b"x")
    clock.advance(0.3)
    q.admit(b"y")
    clock.advance(0.2)
    assert q.victim() == b"x"


def test_touching_the_victim_yields_another_key(clock):
    # A caller that must keep the offered key (the one being written) touches it and asks again.
    p = make(clock)
    for key in (b"a", b"b"):
        p.admit(key)
        clock.advance(3)
    assert p.victim() == b"a"
    p.touch(b"a")
    assert p.victim() == b"b"


def test_victims_matches_successive_victim_calls(clock):
    rng = random.Random(3)
    p = make(clock, adapt_rate=10.0)
    lower_theta(p, clock, 12)  # theta 0.398: the merge interleaves the segments
    for i in range(40):
        clock.advance(rng.random() * 2)
        p.admit(b"%d" % i)
        if rng.random() < 0.5:
            clock.advance(1.5)
            p.touch(b"%d" % rng.randrange(i + 1))
    order = list(p.victims())
    assert len(order) == len(set(order)) == len(p) == 40
    for key in order:
        evict(p, key)
    assert len(p) == 0


# ---- ghosts and adaptation ----


def test_ghost_hits_adapt(clock):
    p = make(clock, adapt_rate=0.1)
    for key in (b"a", b"b"):
        p.admit(key)
    clock.advance(2)
    p.touch(b"a")
    p.touch(b"b")  # t=2: a, b proven
    clock.advance(1)
    p.admit(b"c")  # t=3: c unproven
    clock.advance(7)
    # t=10: idle a 8, c 7: LRU order. Window 8 s; exposure (decayed by 1 - 1/3 per eviction): protected 8.
    evict(p, b"a")
    clock.advance(2)
    p.admit(b"a")  # t=12 < 18: protected ghost hit, step 0.1 * 8 / (2 * 8)
    assert p.log_theta == pytest.approx(LN8 - 0.05)
    assert p.references(b"a") == 2 and p.segment_sizes() == (1, 2, 0)
    clock.advance(1)
    evict(p, b"b")  # t=13: idle b 11 > c 10. Protected exposure 8 * 2/3 + 11 = 49/3
    clock.advance(1)
    p.admit(b"b")  # t=14: protected ghost hit, step 0.1 * (49/3) / (2 * 49/3)
    assert p.log_theta == pytest.approx(LN8 - 0.10)
    clock.advance(1)
    evict(p, b"c")  # t=15: idle c 12, a 3. Exposure: protected 49/3 * 2/3 = 98/9, probation 12
    clock.advance(5)
    p.admit(b"c")  # t=20 < 27: probation ghost hit, step 0.1 * (98/9 + 12) / (2 * 12)
    assert p.log_theta == pytest.approx(LN8 - 0.10 + 0.1 * (98 / 9 + 12) / 24)
    assert p.references(b"c") == 2 and p.segment_sizes() == (0, 3, 0)  # its second reference proved it


def test_late_return_is_history_but_not_evidence(clock):
    p = make(clock, adapt_rate=0.1)
    for key in (b"a", b"b"):
        p.admit(key)
        clock.advance(2)
        p.touch(key)
    clock.advance(1)
    evict(p, b"a")  # idle 3 s: window until 3 s from now
    clock.advance(3.5)
    p.admit(b"a")  # too late to count
    assert p.log_theta == pytest.approx(LN8)
    assert p.references(b"a") == 2  # but its history came back


def test_hysteresis_keeps_lru_order_until_evidence_outweighs(clock):
    p = make(clock, adapt_rate=10.0)
    lower_theta(p, clock, 8)  # ln 8 - 2.0 = 0.079 > 0
    assert p.theta == 1.0
    lower_theta(p, clock, 1)
    assert p.theta == pytest.approx(math.exp(LN8 - 2.25))
    assert p.theta < 1.0


def test_deleted_then_readmitted_key(clock):
    p = make(clock, adapt_rate=10.0)
    p.admit(b"a")
    p.admit(b"b")
    clock.advance(2)
    p.touch(b"a")  # proven
    p.remove(b"a")  # deleted (never offered as a victim)
    assert b"a" not in p and len(p) == 1
    assert p.references(b"a") == 2  # history retained
    assert p.victim() == b"b"
    clock.advance(0.5)
    p.admit(b"a")  # SET again: back as a proven key, and a deletion is no evidence
    assert p.log_theta == pytest.approx(LN8)
    assert b"a" in p and p.references(b"a") == 2 and p.segment_sizes() == (1, 1, 0)
    # and once its history is gone it starts over as an unproven key
    q = make(clock, retained=0)
    q.admit(b"a")
    clock.advance(2)
    q.touch(b"a")
    q.remove(b"a")
    assert q.references(b"a") == 0
    q.admit(b"a")
    assert q.references(b"a") == 1


def test_remove_unknown_key_is_harmless(clock):
    p = make(clock)
    p.remove(b"nope")
    p.admit(b"a")
    p.remove(b"nope")
    assert len(p) == 1 and p.segment_sizes() == (1, 0, 0)
    p.remove(b"a")
    p.remove(b"a")
    assert len(p) == 0


def test_victim_on_empty_policy(clock):
    p = make(clock)
    assert p.victim() is None
    assert list(p.victims()) == []
    p.admit(b"a")
    p.clear()
    assert p.victim() is None and len(p) == 0 and p.references(b"a") == 0


def test_touch_of_untracked_key_admits_it(clock):
    p = make(clock)
    p.touch(b"a")
    assert b"a" in p and p.references(b"a") == 1


@pytest.mark.parametrize("retained", [0, 25, 100_000])
def test_ghost_history_stays_bounded(clock, retained):
    rng = random.Random(retained)
    p = make(clock, retained=retained, adapt_rate=0.05)
    resident: set[bytes] = set()
    capacity = 150
    most = 0
    for step in range(20_000):
        clock.advance(rng.random() * 0.5)
        key = b"k%d" % min(int(rng.paretovariate(0.7)), 5000)
        r = rng.random()
        if r < 0.05 and resident:  # a deletion
            gone = rng.choice(sorted(resident)) if step % 97 == 0 else key
            if gone in resident:
                p.remove(gone)
                resident.discard(gone)
        elif key in resident:
            p.touch(key)
        else:
            while len(resident) >= capacity:
                v = p.victim()
                assert v in resident
                p.remove(v)
                resident.discard(v)
            p.admit(key)
            resident.add(key)
        probation, protected, ghosts = p.segment_sizes()
        assert probation + protected == len(p) == len(resident)
        assert ghosts <= min(retained, len(p))
        assert 1 / 256 - 1e-12 <= p.theta <= 1.0
        most = max(most, ghosts)
    assert most == min(retained, capacity - 1)  # the bound is reached, and held


# ---- registry and hit ratio ----


def test_registry_passes_options_through(clock):
    p = create_policy("lru-k", clock=clock, k=3, crp=0.5, retained=7)
    assert isinstance(p, LRUKPolicy)
    assert (p.k, p.crp, p.retained) == (3, 0.5, 7)
    q = create_policy("lru-k", clock=clock)
    assert isinstance(q, LRUKPolicy) and (q.k, q.crp, q.retained) == (2, 0.0, 100_000)
    with pytest.raises(ValueError):
        LRUKPolicy(k=0)
    with pytest.raises(ValueError):
        LRUKPolicy(crp=-1.0)


MIXED = TraceParams(seed=21, arrivals=700, documents=300, system_prompts=5)
RAG = TraceParams(
    seed=22, arrivals=1200, arrival_rate=2.0, weight_chat=0.0, weight_single=0.0, weight_rag=1.0, documents=400
)


@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.3])
def test_never_below_lru_on_small_generated_trace(fraction):
    trace = generate(MIXED)
    cap = max(1, round(fraction * trace_stats(trace)["distinct_chunks"]))
    assert simulate_policy(trace, cap, "lru-k") >= simulate_policy(trace, cap, "lru")


def test_beats_lru_on_retrieval_traffic():
    trace = generate(RAG)
    cap = round(0.1 * trace_stats(trace)["distinct_chunks"])
    assert simulate_policy(trace, cap, "lru-k") > simulate_policy(trace, cap, "lru") * 1.02
