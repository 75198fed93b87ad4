"""The compact policies (ghosts as fingerprints in arrays, no per-key objects) against the implementations they
replaced (tests/unit/legacy_policies): on random operation scripts and on generated traces both must offer the
same victims in the same order, keep the same state, and score the same hits."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.legacy_policies.arc_keys import ARCPolicy as OldARC
from tests.unit.legacy_policies.lru_k_objects import LRUKPolicy as OldLRUK
from tests.unit.legacy_policies.s3fifo_keys import S3FIFOPolicy as OldS3FIFO

from kvstrata.bench.hitrate import replay
from kvstrata.bench.traces import TraceParams, generate, trace_stats
from kvstrata.clock import ManualClock
from kvstrata.engine.policy.arc import ARCPolicy
from kvstrata.engine.policy.lru_k import LRUKPolicy
from kvstrata.engine.policy.s3fifo import S3FIFOPolicy

PROPERTY = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
ops = st.lists(
    st.tuples(st.sampled_from(["admit", "touch", "touch", "remove", "evict", "evict", "peek", "walk", "tick"]),
              st.integers(0, 15), st.integers(1, 4)),
    max_size=200,
)

Pair = tuple[Callable[[ManualClock], Any], Callable[[ManualClock], Any]]
PAIRS: dict[str, Pair] = {
    "lru-k": (lambda c: LRUKPolicy(), lambda c: OldLRUK()),
    "lru-k k=3 crp=2 clock": (lambda c: LRUKPolicy(k=3, crp=2.0, clock=c, retained=6, adapt_rate=0.3),
                              lambda c: OldLRUK(k=3, crp=2.0, clock=c, retained=6, adapt_rate=0.3)),
    "lru-k k=1": (lambda c: LRUKPolicy(k=1, retained=3), lambda c: OldLRUK(k=1, retained=3)),
    "s3-fifo": (lambda c: S3FIFOPolicy(), lambda c: OldS3FIFO()),
    "s3-fifo adaptive": (lambda c: S3FIFOPolicy(small_ratio=0.3, promote=2, ghost_ratio=0.5, adaptive=True),
                         lambda c: OldS3FIFO(small_ratio=0.3, promote=2, ghost_ratio=0.5, adaptive=True)),
    "arc": (lambda c: ARCPolicy(), lambda c: OldARC()),
}


def state(policy: Any) -> tuple[Any, ...]:
    extra: tuple[Any, ...] = ()
    if isinstance(policy, (LRUKPolicy, OldLRUK)):
        extra = (policy.log_theta, policy.theta, [policy.references(b"k%d" % i) for i in range(16)])
    elif isinstance(policy, (ARCPolicy, OldARC)):
        extra = (policy.p,)
    elif isinstance(policy, (S3FIFOPolicy, OldS3FIFO)):
        extra = (policy.small_ratio,)
    return (len(policy), policy.segment_sizes(), *extra)


@PROPERTY
@given(script=ops)
@pytest.mark.parametrize("pair", list(PAIRS))
def test_same_decisions_as_the_old_implementation(pair: str, script: list[tuple[str, int, int]]) -> None:
    clock = ManualClock()
    new, old = (make(clock) for make in PAIRS[pair])
    for op, k, n in script:
        key = b"k%d" % k
        if op == "tick":
            clock.advance(n / 2)
        elif op in ("admit", "touch"):
            for policy in (new, old):
                getattr(policy, op)(key)
        elif op == "remove":
            new.remove(key)
            old.remove(key)
        elif op == "peek":
            assert new.victim() == old.victim()
        elif op == "walk":
            assert list(new.victims()) == list(old.victims())
        else:  # evict n keys the engine's way
            chosen = []
            for victim in new.victims():
                chosen.append(victim)
                if len(chosen) == n:
                    break
            assert chosen == list(itertools.islice(old.victims(), len(chosen)))
            for victim in chosen:
                new.remove(victim)
                old.remove(victim)
        assert state(new) == state(old)
        assert [key in new for key in (b"k%d" % i for i in range(16))] == [
            key in old for key in (b"k%d" % i for i in range(16))]


@pytest.mark.parametrize("pair", ["lru-k", "s3-fifo", "arc"])
def test_same_hits_on_a_generated_trace(pair: str) -> None:
    trace = generate(TraceParams(seed=31, arrivals=500, documents=200, system_prompts=4))
    distinct = trace_stats(trace)["distinct_chunks"]
    clock = ManualClock()
    for fraction in (0.02, 0.1):
        cap = max(1, round(fraction * distinct))
        new, old = (make(clock) for make in PAIRS[pair])
        assert replay(trace, cap, new) == replay(trace, cap, old)


@pytest.mark.parametrize("pair", list(PAIRS))
def test_same_decisions_under_heavy_deletion(pair: str) -> None:
    # Many deletions from the middle of the queues: S3-FIFO's stale entries pile up and are swept several times.
    rng = random.Random(5)
    clock = ManualClock()
    new, old = (make(clock) for make in PAIRS[pair])
    resident: set[bytes] = set()
    for step in range(6000):
        key = b"k%d" % rng.randrange(60)
        roll = rng.random()
        if roll < 0.3 and key in resident:
            new.remove(key)
            old.remove(key)
            resident.discard(key)
        elif key in resident:
            new.touch(key)
            old.touch(key)
        else:
            if len(resident) >= 30:
                victim = new.victim()
                assert victim == old.victim(), step
                new.remove(victim)
                old.remove(victim)
                resident.discard(victim)
            new.admit(key)
            old.admit(key)
            resident.add(key)
        clock.advance(0.25)
        assert state(new) == state(old)
    assert list(new.victims()) == list(old.victims())
    if isinstance(new, S3FIFOPolicy):
        assert len(new._small) + len(new._main) <= 2 * len(new) + 64  # swept: stale entries stay bounded


def test_s3fifo_sweeps_stale_entries_and_keeps_its_order() -> None:
    new, old = S3FIFOPolicy(), OldS3FIFO()
    for policy in (new, old):
        for i in range(3000):
            policy.admit(b"k%d" % i)
        for i in range(0, 3000, 3):
            policy.touch(b"k%d" % i)
        for _ in range(40):  # some keys reach main
            policy.remove(policy.victim())
    for i in range(3000):  # deletions far from the heads: only a sweep can reclaim their entries
        if i % 3:
            new.remove(b"k%d" % i)
            old.remove(b"k%d" % i)
    entries = len(new._small) + len(new._main)
    assert entries - new._stale == len(new)
    assert entries < 1600  # without a sweep all 2960 entries would still be queued
    assert state(new) == state(old)
    assert list(new.victims()) == list(old.victims())
