"""Trace generator (determinism, chained chunk keys) and hit-ratio simulator (every policy, Belady, replay rate)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from kvstrata.bench.hitrate import (
    POLICIES,
    WALL_LRU_K,
    cpu_cost,
    main,
    replay,
    replay_optimal,
    run,
    simulate_optimal,
    simulate_policy,
    write_markdown,
)
from kvstrata.bench.traces import PRESETS, Request, TraceParams, chunk_chain, generate, preset, trace_stats
from kvstrata.engine.policy.registry import DEFAULT_POLICY

SMALL = TraceParams(seed=11, arrivals=150, documents=60, system_prompts=4)


def _one_key_requests(keys: list[int]) -> list[Request]:
    return [Request(float(i), (b"%d" % k,), ()) for i, k in enumerate(keys)]


def test_same_seed_same_trace_and_other_seed_differs() -> None:
    a = generate(SMALL)
    b = generate(SMALL)
    assert a == b
    assert [r.kind for r in a] == [r.kind for r in b]
    c = generate(TraceParams(seed=12, arrivals=150, documents=60, system_prompts=4))
    assert a != c


def test_trace_sorted_and_every_family_present() -> None:
    trace = generate(SMALL)
    times = [r.time for r in trace]
    assert times == sorted(times)
    assert {r.kind for r in trace} == {"chat", "single", "rag"}


def test_identical_prefixes_give_identical_keys() -> None:
    c = 256
    x = chunk_chain([(b"sys:0", 600), (b"u:1", 100)], c)
    y = chunk_chain([(b"sys:0", 600), (b"u:2", 300)], c)
    assert len(x) == 2 and len(y) == 3
    assert x == y[:2]  # the two full chunks lie inside the shared 600-token system prompt
    # A partial chunk gets no key; filling it with different tokens gives different keys.
    assert chunk_chain([(b"sys:0", 600), (b"u:1", 200)], c)[2] != y[2]


def test_same_content_after_different_prefix_is_a_different_chunk() -> None:
    x = chunk_chain([(b"sys:0", 256), (b"doc:7", 512)], 256)
    y = chunk_chain([(b"sys:1", 256), (b"doc:7", 512)], 256)
    assert x[0] != y[0] and x[1] != y[1] and x[2] != y[2]


def test_system_prompt_chunks_shared_across_sessions() -> None:
    trace = generate(SMALL)
    first_reads = Counter(r.reads[0] for r in trace if r.reads)
    key, count = first_reads.most_common(1)[0]
    assert count >= 20  # the most popular system prompt's first chunk opens many requests
    opened = [r for r in trace if r.reads and r.reads[0] == key]
    assert len({r.kind for r in opened}) == 2  # chat sessions and single requests share the prompt


def test_chain_property() -> None:
    """A key always has the same predecessor: chunk i is shared only if chunks 0..i-1 are."""
    trace = generate(SMALL)
    parent: dict[bytes, bytes | None] = {}
    position: dict[bytes, int] = {}
    for r in trace:
        chain = r.reads + r.writes
        assert len(set(chain)) == len(chain)
        prev: bytes | None = None
        for i, key in enumerate(chain):
            assert parent.setdefault(key, prev) == prev
            assert position.setdefault(key, i) == i
            prev = key


def test_chat_turn_rereads_previous_turn() -> None:
    trace = generate(TraceParams(seed=5, arrivals=40, weight_chat=1.0, weight_single=0.0, weight_rag=0.0))
    written: set[bytes] = set()
    rereads = 0
    for r in trace:
        rereads += sum(k in written for k in r.reads)
        written.update(r.writes)
    assert rereads > 0


def test_default_trace_is_modest() -> None:
    stats = trace_stats(generate(PRESETS["default"]))
    accesses = stats["chunk_reads"] + stats["chunk_writes"]
    assert 50_000 <= accesses <= 200_000
    assert preset("independent").seed != preset("default").seed
    assert preset("default", seed_offset=3).seed == preset("default").seed + 3
    with pytest.raises(ValueError):
        preset("nope")


def test_belady_classic_sequence_capacity_3() -> None:
    # Silberschatz's reference string: with 3 frames OPT faults 9 times, LRU 12 times (20 references).
    seq = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1]
    trace = _one_key_requests(seq)
    assert simulate_optimal(trace, 3) == 20 - 9
    assert simulate_policy(trace, 3, "lru") == 20 - 12


def _exhaustive_optimal(seq: list[int], capacity: int) -> int:
    """Fewest misses over every eviction choice (demand paging), by memoised search."""
    memo: dict[tuple[int, frozenset[int]], int] = {}

    def best(i: int, cache: frozenset[int]) -> int:
        if i == len(seq):
            return 0
        state = (i, cache)
        if state not in memo:
            x = seq[i]
            if x in cache:
                memo[state] = best(i + 1, cache)
            elif len(cache) < capacity:
                memo[state] = 1 + best(i + 1, cache | {x})
            else:
                memo[state] = 1 + min(best(i + 1, (cache - {y}) | {x}) for y in cache)
        return memo[state]

    return best(0, frozenset())


def test_belady_matches_exhaustive_search() -> None:
    rng = random.Random(3)
    for _ in range(40):
        seq = [rng.randrange(6) for _ in range(14)]
        for cap in (1, 2, 3, 4):
            assert simulate_optimal(_one_key_requests(seq), cap) == len(seq) - _exhaustive_optimal(seq, cap)


def test_lru_and_belady_hand_computed_with_writes() -> None:
    a, b, c = b"a", b"b", b"c"
    trace = [
        Request(0.0, (a,), (b,)),  # miss a; write b -> {a, b}
        Request(1.0, (a, b), (c,)),  # hit a, hit b; write c evicts a (LRU) -> {b, c}
        Request(2.0, (a, b, c), ()),  # LRU: miss a, miss b, miss c
    ]
    assert simulate_policy(trace, 2, "lru") == 2
    # MIN: writing c evicts b (next used after a); then b's miss evicts a (never used again); c hits.
    assert simulate_optimal(trace, 2) == 4
    assert simulate_policy(trace, 3, "lru") == 5
    assert simulate_optimal(trace, 3) == 5


def test_belady_bounds_every_policy() -> None:
    trace = generate(SMALL)
    distinct = trace_stats(trace)["distinct_chunks"]
    for cap in (1, 2, 5, distinct // 20, distinct // 5, distinct):
        opt = simulate_optimal(trace, cap)
        # (Not the "+guard" variants: a cache that may refuse to admit is bounded by MIN with bypass, not by
        # demand-paging MIN; with one slot, refusing one-off keys beats MIN outright.)
        for policy in (*POLICIES, WALL_LRU_K, "s3-fifo+tail"):
            assert opt >= simulate_policy(trace, cap, policy), policy


def test_registered_policies_do_not_depend_on_the_replay_rate() -> None:
    trace = generate(SMALL)
    cap = trace_stats(trace)["distinct_chunks"] // 20
    for policy in POLICIES:
        assert simulate_policy(trace, cap, policy) == simulate_policy(trace, cap, policy, time_scale=0.001)
    # The former wall-clock LRU-K does: 1000x faster, every re-reference falls inside its 1 s CRP.
    slow = simulate_policy(trace, cap, WALL_LRU_K)
    assert slow != simulate_policy(trace, cap, WALL_LRU_K, time_scale=0.001)


def test_full_capacity_only_compulsory_misses() -> None:
    trace = generate(SMALL)
    stats = trace_stats(trace)
    first_reads = set()
    seen: set[bytes] = set()
    for r in trace:
        first_reads.update(k for k in r.reads if k not in seen)
        seen.update(r.reads)
        seen.update(r.writes)
    expected = stats["chunk_reads"] - len(first_reads)
    for policy in POLICIES:
        assert simulate_policy(trace, stats["distinct_chunks"], policy) == expected
    assert simulate_optimal(trace, stats["distinct_chunks"]) == expected


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> str:
    """A small preset, so the whole benchmark runs in seconds."""
    monkeypatch.setitem(PRESETS, "tiny", SMALL)
    return "tiny"


def test_run_json_and_markdown(capsys: pytest.CaptureFixture[str], tiny: str) -> None:
    assert main(["--trace", tiny, "--fractions", "0.05", "--no-cost", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmark"] == "hitrate" and doc["default"] == DEFAULT_POLICY
    assert set(doc["traces"]) == {tiny}
    (row,) = doc["results"]
    assert set(row["hit_ratio"]) == set(POLICIES)
    assert all(row["optimal"] >= ratio for ratio in row["hit_ratio"].values())
    assert {r["policy"] for r in doc["rates"]} == {*POLICIES, WALL_LRU_K}
    assert len(doc["features"]) == 3 * len(POLICIES)
    assert all(0.0 <= f["usable_ratio"] <= f["hit_ratio"] for f in doc["features"])
    assert set(doc["targets"]) == {"default_at_5pct_ge_90pct_of_optimal", "default_never_below_lru",
                                   "default_same_hit_ratio_slow_and_fast"}
    assert doc["targets"]["default_same_hit_ratio_slow_and_fast"] is True
    md = write_markdown(doc)
    assert "kvstrata bench hitrate" in md and f"| {tiny} | 5% |" in md and f"| {tiny} | lru | " in md
    assert ("PASS" in md) or ("MISS" in md)


def test_usable_hits_stop_at_a_request_s_first_miss() -> None:
    a, b, c = b"a", b"b", b"c"
    trace = [
        Request(0.0, (), (a, b, c)),
        Request(1.0, (a, b, c), ()),  # all three hit, all usable
        Request(2.0, (b, c), ()),  # with 3 slots: both hit and usable
    ]
    assert replay(trace, 3, "lru") == (5, 5)
    assert replay_optimal(trace, 3) == (5, 5)
    # Two slots, LRU: writing c evicts a; then a, b, c each miss (evicting b, c, a); request 3 hits b and c.
    assert replay(trace, 2, "lru") == (2, 2)
    # MIN: writing c evicts b (needed after a). Request 2: a hits (usable), b misses (a goes), c hits but
    # behind a miss, so not usable. Request 3: b and c hit, usable.
    assert replay_optimal(trace, 2) == (4, 3)


def test_cpu_cost_measured_against_the_driver() -> None:
    trace = generate(SMALL)
    cap = trace_stats(trace)["distinct_chunks"] // 20
    costs = cpu_cost(trace, cap, ["lru", "s3-fifo"], repeats=1)
    assert set(costs) == {"lru", "s3-fifo"} and all(0.0 <= c < 100.0 for c in costs.values())


def test_run_without_target_fraction_reports_target_missed(tiny: str) -> None:
    doc = run([tiny], [0.5], costs=False)
    assert doc["targets"]["default_at_5pct_ge_90pct_of_optimal"] is False
