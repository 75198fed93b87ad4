"""Access profiles and the predictor on hand-written traces, with an injected clock."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from kvstrata.clock import ManualClock
from kvstrata.engine.predict import Predictor
from kvstrata.engine.profile import BOUNDARY, BRANCH, HEAD, AccessProfiles


def keys(prefix: str, n: int) -> list[bytes]:
    """Chunk keys of one family (``ns:``): the predictor links keys only within a family."""
    return [f"ns:{prefix}.{i}".encode() for i in range(n)]


def flags(pred: Predictor, key: bytes) -> int:
    p = pred.profiles
    return p.flags[p.slots[key]]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def pred(clock: ManualClock) -> Predictor:
    return Predictor(clock, window=4, session_max=32)


def write_chain(pred: Predictor, clock: ManualClock, chain: list[bytes], sid: int) -> None:
    for k in chain:
        pred.write(k, sid)
        clock.advance(0.001)
    pred.forget_stream(sid)


def read_chain(pred: Predictor, clock: ManualClock, chain: list[bytes], sid: int) -> None:
    """One reader goes through the chain: its links are now ones a reader has followed."""
    for k in chain:
        pred.read(k, sid)
        clock.advance(0.001)
    pred.take()
    pred.forget_stream(sid)


# ---- scores ----
def test_temporal_score_decays_with_the_half_life_in_accesses(clock: ManualClock) -> None:
    p = AccessProfiles(clock, max_keys=16)
    p.horizon = 10.0  # accesses per half-life; the predictor sets it from the keys DRAM holds
    s = p.slot(b"k")
    other = p.slot(b"other")
    p.touch(s, clock.monotonic())
    p.touch(s, clock.monotonic())
    heat = p.temporal(b"k")
    assert heat == pytest.approx(1.0 + 0.5 ** 0.1, rel=1e-4)  # the first use decayed by one access
    clock.advance(3600.0)  # time alone changes nothing: only accesses count
    assert p.temporal(b"k") == heat
    for _ in range(10):
        p.touch(other, clock.monotonic())
    assert p.temporal(b"k") == pytest.approx(heat / 2, rel=1e-3)
    for _ in range(10):
        p.touch(other, clock.monotonic())
    assert p.temporal(b"k") == pytest.approx(heat / 4, rel=1e-3)
    assert p.temporal(b"unknown") == 0.0
    # Idle for 20 accesses after two uses: its next use is expected no sooner than 20 accesses from now.
    assert p.reuse_distance(s) >= 20.0
    assert p.reuse_distance(other) < p.reuse_distance(s)


def test_spatial_score_learns_the_chain_and_branches_predict_nothing(pred: Predictor, clock: ManualClock) -> None:
    a, b, c, x = b"ns:a", b"ns:b", b"ns:c", b"ns:x"
    write_chain(pred, clock, [a, b, c], 1)
    p = pred.profiles
    assert p.next_key(a) == b and p.next_key(b) == c and p.next_key(c) is None
    assert p.spatial(a) > 0.6
    assert p.spatial(c) == 0.0  # nothing after it
    write_chain(pred, clock, [a, x], 2)
    assert flags(pred, a) & BRANCH
    assert p.spatial(a) == 0.0
    assert flags(pred, b) & HEAD and flags(pred, x) & HEAD


def test_read_outcomes_move_the_spatial_score(pred: Predictor, clock: ManualClock) -> None:
    a, b, other = b"ns:a", b"ns:b", b"ns:other"
    write_chain(pred, clock, [a, b], 1)
    before = pred.profiles.spatial(a)
    for sid in range(10, 14):  # readers that stop after a and read something else
        clock.advance(5.0)
        pred.read(a, sid)
        pred.read(other + bytes([sid]), sid)
    # Each reader stopped after a: its score fell. Reads alone never relink (only writes make new branches).
    assert pred.profiles.stop[pred.profiles.slots[a]] >= 1
    assert pred.profiles.spatial(a) < before


def test_session_score_learns_whether_returns_cross_the_previous_turn(clock: ManualClock) -> None:
    # Chat: each turn reads the whole context, then writes its own chunks; the next turn crosses the boundary.
    chat = Predictor(clock)
    ctx: list[bytes] = []
    for turn in range(6):
        for k in ctx:
            chat.read(k, turn)
        new = keys(f"t{turn}", 2)
        for k in new:
            chat.write(k, turn)
        chat.take()
        chat.forget_stream(turn)
        ctx += new
        clock.advance(30.0)
    assert flags(chat, ctx[1]) & BOUNDARY  # where turn 1 started writing after turn 0's prefix
    assert chat.profiles.session_score > 0.8

    # Documents: every request reads the document and then writes its own query; nobody reads past the document.
    rag = Predictor(clock)
    doc = keys("doc", 4)
    for req in range(6):
        for k in doc:
            rag.read(k, 100 + req)
        rag.write(f"ns:q{req}".encode(), 100 + req)
        rag.take()
        rag.forget_stream(100 + req)
        clock.advance(30.0)
    assert rag.profiles.session_score < 0.5
    assert flags(rag, doc[-1]) & BRANCH


# ---- the predictor ----
def test_a_returning_session_brings_up_its_whole_context(pred: Predictor, clock: ManualClock) -> None:
    chain = keys("c", 10)
    write_chain(pred, clock, chain, 1)
    read_chain(pred, clock, chain, 2)
    clock.advance(30.0)
    walks = pred.session_walks
    pred.read(chain[0], 3)
    assert pred.take() == chain[1:]
    assert pred.session_walks == walks + 1
    assert pred.take() == []  # handed out once


def test_a_chain_nobody_has_read_is_trusted_one_chunk_at_a_time(clock: ManualClock) -> None:
    # Without the trusted walk (trust_ahead=0); with it, a walk TRUST_STREAK reads confirmed goes further
    # (tests/unit/test_predict_short.py).
    pred = Predictor(clock, window=4, session_max=32, trust_ahead=0)
    chain = keys("c", 5)
    write_chain(pred, clock, chain, 1)
    clock.advance(30.0)
    for i in range(len(chain) - 1):
        pred.read(chain[i], 2)
        assert pred.take() == [chain[i + 1]]
    pred.read(chain[-1], 2)
    assert pred.take() == []
    # That reader confirmed every link: the next return gets the whole chain at once.
    pred.forget_stream(2)
    clock.advance(30.0)
    pred.read(chain[0], 3)
    assert pred.take() == chain[1:]


def test_inside_a_request_the_window_slides(clock: ManualClock) -> None:
    pred = Predictor(clock, window=4, session_max=32, trust_ahead=0, refill=1)  # one chunk per read
    chain = keys("c", 10)
    write_chain(pred, clock, chain, 1)
    read_chain(pred, clock, chain, 3)
    pred.attach(set(chain))  # the chain is in DRAM: not a returning session, a window of 4
    pred.read(chain[0], 2)
    assert pred.take() == chain[1:5]
    for i in range(1, 6):
        pred.read(chain[i], 2)
        got = pred.take()
        assert got == ([chain[i + 4]] if i + 4 < len(chain) else [])


def test_the_window_is_topped_up_in_batches(clock: ManualClock) -> None:
    # refill=2 (REFILL, at most half the window of 4): every second read hands out two chunks, the others none
    # (and take() has nothing to do: pending stays false).
    pred = Predictor(clock, window=4, session_max=32, trust_ahead=0, refill=2)
    chain = keys("c", 10)
    write_chain(pred, clock, chain, 1)
    read_chain(pred, clock, chain, 3)
    pred.attach(set(chain))
    pred.read(chain[0], 2)
    assert pred.take() == chain[1:5]
    got = []
    for i in range(1, 7):
        pred.read(chain[i], 2)
        got.append((pred.pending, pred.take()))
    assert got == [(False, []), (True, chain[5:7]), (False, []), (True, chain[7:9]), (False, []),
                   (True, chain[9:10])]


def test_a_multi_key_read_does_not_prefetch_what_it_reads(pred: Predictor, clock: ManualClock) -> None:
    chain = keys("c", 6)
    write_chain(pred, clock, chain, 1)
    read_chain(pred, clock, chain, 3)
    clock.advance(30.0)
    for k in chain[:4]:  # one MGET: four reads before the server asks for predictions
        pred.read(k, 2)
    assert pred.take() == chain[4:]


def test_the_walk_stops_at_a_shared_prefix(pred: Predictor, clock: ManualClock) -> None:
    system = keys("sys", 3)
    a = keys("a", 3)
    b = keys("b", 3)
    write_chain(pred, clock, system + a, 1)
    write_chain(pred, clock, system + b, 2)
    read_chain(pred, clock, system + b, 4)
    clock.advance(30.0)
    pred.read(system[0], 3)
    assert pred.take() == system[1:]  # not a guess at which conversation follows
    pred.read(system[1], 3)
    pred.read(system[2], 3)
    assert pred.take() == []
    pred.read(b[0], 3)  # the conversation's own first chunk identifies it
    assert pred.take() == b[1:]


def test_low_confidence_links_are_not_followed(clock: ManualClock) -> None:
    pred = Predictor(clock, min_confidence=0.6)
    doc = keys("doc", 3)
    for req in range(4):  # documents followed by queries: the session score drops
        for k in doc:
            pred.read(k, req)
        pred.write(f"ns:q{req}".encode(), req)
        pred.forget_stream(req)
        clock.advance(30.0)
    pred.take()
    fresh = keys("fresh", 3)  # a new document read once, its query written after
    for k in fresh:
        pred.read(k, 50)
    pred.write(b"ns:fresh-q", 50)
    pred.forget_stream(50)
    pred.take()
    clock.advance(30.0)
    pred.read(fresh[0], 51)
    assert pred.take() == fresh[1:]  # the document, not the earlier request's query


def test_keys_of_different_families_are_not_linked(pred: Predictor, clock: ManualClock) -> None:
    write_chain(pred, clock, [b"ns:a", b"ns:b", b"other:c", b"other:d", b"plain"], 1)
    p = pred.profiles
    assert p.next_key(b"ns:a") == b"ns:b"
    assert p.next_key(b"ns:b") is None and p.next_key(b"other:d") is None
    assert p.next_key(b"other:c") == b"other:d"


def test_clear_forgets_every_profile_and_stream(pred: Predictor, clock: ManualClock) -> None:
    chain = keys("c", 4)
    write_chain(pred, clock, chain, 1)
    read_chain(pred, clock, chain, 2)
    pred.read(chain[0], 3)
    pred.clear()
    assert len(pred.profiles) == 0 and pred.profiles.next_key(chain[0]) is None
    assert pred.take() == []
    clock.advance(30.0)
    pred.read(chain[0], 4)
    assert pred.take() == []


def test_unknown_keys_and_forgotten_streams_are_harmless(pred: Predictor) -> None:
    pred.read(b"never-written", 1)
    assert pred.take() == []
    pred.forget_stream(1)
    pred.forget_stream(12345)
    assert pred.take() == []


# ---- memory bound ----
def test_profiles_stay_within_their_bound_on_a_long_random_trace(clock: ManualClock) -> None:
    pred = Predictor(clock, max_keys=500, max_streams=8)
    rng = random.Random(5)
    universe = [f"k{i}".encode() for i in range(20_000)]
    for step in range(60_000):
        key = universe[int(rng.paretovariate(0.8)) % len(universe)] if step % 3 else rng.choice(universe)
        if rng.random() < 0.3:
            pred.write(key, rng.randrange(20))
        else:
            pred.read(key, rng.randrange(20))
        if step % 7 == 0:
            pred.take()
        clock.advance(0.01)
        assert len(pred.profiles) <= 500
    p = pred.profiles
    assert p.aged_out > 0
    assert len(pred._streams) <= 8
    # The slot table and the key index agree.
    for key, s in p.slots.items():
        assert p.keys[s] == key
    assert sum(1 for k in p.keys if k is not None) == len(p.slots)


def test_a_profile_costs_a_small_fixed_number_of_bytes(clock: ManualClock) -> None:
    n = 20_000
    ks = [f"key-{i:08d}".encode() for i in range(n)]  # the keys exist anyway: the store holds them
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        p = AccessProfiles(clock, max_keys=n)
        for i, k in enumerate(ks):
            p.touch(p.slot(k), float(i))
        per_key = (tracemalloc.get_traced_memory()[0] - base) / n
    finally:
        tracemalloc.stop()
    assert AccessProfiles.bytes_per_key() < 56
    # Arrays, the key index (dict) and the slot list: no Python object per profile.
    assert per_key < 160, per_key


# ---- several conversations on one connection ----
def test_interleaved_reads_of_one_family_keep_both_chains(pred: Predictor, clock: ManualClock) -> None:
    a = keys("a", 6)
    b = keys("b", 6)
    write_chain(pred, clock, a, 1)
    write_chain(pred, clock, b, 2)
    read_chain(pred, clock, a, 3)
    read_chain(pred, clock, b, 4)
    # One connection reads both conversations chunk by chunk, interleaved (a batch of two requests).
    for x, y in zip(a, b, strict=True):
        pred.read(x, 5)
        pred.read(y, 5)
    pred.take()
    p = pred.profiles
    for chain in (a, b):
        for i in range(len(chain) - 1):
            assert p.next_key(chain[i]) == chain[i + 1]
            assert not flags(pred, chain[i]) & BRANCH
            assert p.spatial(chain[i]) >= 0.6
    pred.forget_stream(5)
    pred.read(a[0], 6)
    assert pred.take() == a[1:]


def test_interleaved_writes_of_tagged_conversations_are_not_chained_together(pred: Predictor,
                                                                             clock: ManualClock) -> None:
    # Keys carrying a shard tag ({session}) are of separate families: one lane each in the stream.
    a = [f"kvs:ns:{{u1}}:{i}".encode() for i in range(5)]
    b = [f"kvs:ns:{{u2}}:{i}".encode() for i in range(5)]
    for x, y in zip(a, b, strict=True):
        pred.write(x, 1)
        pred.write(y, 1)
    p = pred.profiles
    assert [p.next_key(k) for k in a[:-1]] == a[1:]
    assert [p.next_key(k) for k in b[:-1]] == b[1:]
    assert p.next_key(a[-1]) is None and p.next_key(b[-1]) is None


def test_a_read_after_a_write_starts_a_new_request(pred: Predictor, clock: ManualClock) -> None:
    # A pooled connection: request 1 stores its chunks, request 2 starts reading another chain at once.
    first = keys("one", 3)
    second = keys("two", 3)
    write_chain(pred, clock, second, 9)
    for k in first:
        pred.write(k, 1)
    pred.read(second[0], 1)
    assert pred.profiles.next_key(first[-1]) is None
    assert pred.profiles.predecessor(pred.profiles.slots[second[0]]) < 0


def test_a_lookup_announces_the_chunks_not_in_dram(pred: Predictor) -> None:
    chain = keys("c", 5)
    pred.attach({chain[0]})
    pred.lookup(chain, 1)
    assert pred.pending
    assert pred.take() == chain[1:]
    assert pred.lookups == 1
    # Each announced key is expected in order, nearest first.
    uses = [pred.next_use(k) for k in chain[1:]]
    assert uses == sorted(uses) and uses[0] < uses[-1]


def test_a_prefetch_displaces_only_keys_expected_later(pred: Predictor, clock: ManualClock) -> None:
    chain = keys("c", 12)
    write_chain(pred, clock, chain, 1)
    read_chain(pred, clock, chain, 2)
    idle = b"ns:idle"
    pred.write(idle, 3)
    for _ in range(100):  # other traffic: the idle key is not expected back soon
        pred.read(b"ns:busy", 4)
    pred.read(chain[0], 5)
    predicted = pred.take()
    assert predicted == chain[1:]
    near, far = predicted[0], predicted[-1]
    assert pred.may_displace(near, [idle])
    assert not pred.may_displace(far, [near])  # a prediction never displaces one that is due sooner
    assert not pred.may_displace(near, [b"ns:busy"])  # nor a key in use every access


def test_a_read_about_to_load_predicts_what_follows_before_it_is_read(pred: Predictor, clock: ManualClock) -> None:
    chain = keys("c", 6)
    write_chain(pred, clock, chain, 1)
    read_chain(pred, clock, chain, 2)
    clock.advance(30.0)
    pred.attach(set())  # the chain left DRAM: its first chunk is about to be loaded by stream 3
    pred.expect(chain[0], 3)
    assert pred.pending and pred.take() == chain[1:]  # before the read: they load right behind that chunk
    assert pred.expects == 1
    pred.read(chain[0], 3)  # the read is recorded as any other (the queue skips what it holds already)
    assert pred.take() == chain[1:]
    # A chunk the stream's walk predicted already announces nothing more.
    pred.expect(chain[1], 3)
    assert pred.take() == [] and pred.expects == 1
    pred.expect(b"ns:unknown", 3)
    assert pred.take() == []


def test_remembered_due_times_stay_bounded_and_keep_the_newest(clock: ManualClock,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstrata.engine import predict

    monkeypatch.setattr(predict, "DUE_MAX", 8)
    pred = Predictor(clock, window=4, session_max=32)
    taken: list[bytes] = []
    for c in range(12):  # twelve chains, each predicting its next chunks when its head is read
        chain = keys(f"d{c}", 6)
        write_chain(pred, clock, chain, 1)
        read_chain(pred, clock, chain, 3)
        pred.attach(set(chain))
        pred.read(chain[0], 2)
        got = pred.take()
        assert got and set(got) <= set(chain[1:])
        taken += got
        pred.forget_stream(2)
        assert len(pred._due) <= 8
    # Whatever was forgotten went oldest first: what remains is the newest predictions, in order.
    remembered = list(pred._due)
    assert remembered and remembered == taken[len(taken) - len(remembered):]
