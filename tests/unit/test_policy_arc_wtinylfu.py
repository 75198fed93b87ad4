"""ARC (kvstrata.engine.policy.arc), W-TinyLFU (wtinylfu) and its frequency sketch (sketch): hand-checked
behaviour of each rule: ARC's target p moving on ghost hits, TinyLFU's duel, doorkeeper, aging, saturation."""

from __future__ import annotations

from tests.unit.policy_support import drive

from kvstrata.engine.policy._ghosts import fingerprint
from kvstrata.engine.policy.arc import ARCPolicy
from kvstrata.engine.policy.sketch import FrequencySketch
from kvstrata.engine.policy.wtinylfu import WTinyLFUPolicy

# ---- ARC ----


def test_arc_second_reference_moves_to_t2_and_t1_is_evicted_first() -> None:
    p = ARCPolicy()
    resident: set[bytes] = set()
    for key in (b"a", b"b", b"c"):
        drive(p, resident, 3, key)
    drive(p, resident, 3, b"a")  # a: t1 -> t2
    assert p.segment_sizes() == (2, 1, 0, 0)
    drive(p, resident, 3, b"d")  # p = 0: t1's LRU (b) goes, into b1
    assert resident == {b"a", b"c", b"d"} and p.segment_sizes() == (2, 1, 1, 0)


def test_arc_b1_ghost_hit_raises_p_and_b2_ghost_hit_lowers_it() -> None:
    p = ARCPolicy()
    resident: set[bytes] = set()
    for key in (b"a", b"b", b"c"):
        drive(p, resident, 3, key)
    drive(p, resident, 3, b"a")
    drive(p, resident, 3, b"d")  # b -> b1
    drive(p, resident, 3, b"b")  # b1 hit: p grows, b enters t2
    assert p.p >= 1.0 and p.segment_sizes()[1] == 2
    raised = p.p
    for key in (b"a", b"b"):
        drive(p, resident, 3, key)  # keep t2 warm
    for key in (b"x", b"y", b"z", b"w"):  # t1 churns; with |t1| <= p, t2's LRU leaves too
        drive(p, resident, 3, key)
    if p.segment_sizes()[3]:  # something reached b2: bring it back, p must drop
        ghost = next(k for k in (b"a", b"b", b"c", b"d", b"x", b"y", b"z", b"w") if fingerprint(k) in p._b2)
        drive(p, resident, 3, ghost)
        assert p.p < raised


def test_arc_deletion_leaves_no_ghost() -> None:
    p = ARCPolicy()
    p.admit(b"a")
    p.remove(b"a")
    assert p.segment_sizes() == (0, 0, 0, 0)


# ---- the sketch ----


def test_sketch_doorkeeper_then_counters_then_saturation() -> None:
    s = FrequencySketch(64)
    assert s.estimate(b"k") == 0
    s.add(b"k")
    assert s.estimate(b"k") == 1  # first sight: doorkeeper bit only
    for _ in range(5):
        s.add(b"k")
    assert s.estimate(b"k") == 6
    for _ in range(40):
        s.add(b"k")
    assert s.estimate(b"k") == 16  # counters saturate at 15, plus the doorkeeper


def test_sketch_ages_after_ten_times_its_width() -> None:
    s = FrequencySketch(16)
    for _ in range(9):
        s.add(b"hot")
    assert s.estimate(b"hot") == 9
    for _ in range(10 * s.width - 9):  # the sample ends: counters halve, the doorkeeper clears
        s.add(b"other")
    assert s.estimate(b"hot") == 4
    assert s.nbytes() == 5 * s.width


def test_sketch_estimates_are_the_same_in_every_process() -> None:
    s = FrequencySketch(1024)
    s.add(b"a")
    assert s._slots(b"a") == FrequencySketch(1024)._slots(b"a")
    assert s._slots(b"a") == (579, 86, 1641, 2172, 3727)  # CRC-32 based, not the salted hash()


# ---- W-TinyLFU ----


def test_wtinylfu_one_off_candidate_loses_to_a_frequent_victim() -> None:
    p = WTinyLFUPolicy(window_ratio=0.2, adaptive=False)
    resident: set[bytes] = set()
    for i in range(10):
        drive(p, resident, 10, b"hot%d" % i)
    for _ in range(5):
        for i in range(10):
            drive(p, resident, 10, b"hot%d" % i)
    for i in range(50):  # a scan: every scan key is a candidate that loses its duel
        drive(p, resident, 10, b"scan%d" % i)
    # The 7 hot keys in main stay; the window (20% + 1 = 3 keys) turns over, as it is LRU.
    assert sum(b"hot%d" % i in resident for i in range(10)) >= 7


def test_wtinylfu_recurring_candidate_wins_its_duel() -> None:
    p = WTinyLFUPolicy(window_ratio=0.1, adaptive=False)
    resident: set[bytes] = set()
    for i in range(10):
        drive(p, resident, 10, b"old%d" % i)
    for _ in range(3):  # "new" recurs while it is out of the cache: the sketch remembers it
        drive(p, resident, 10, b"new")
        for i in range(12):
            drive(p, resident, 10, b"fill%d" % i)
    assert b"new" in resident or p._sketch.estimate(b"new") >= 3


def test_wtinylfu_window_climbs_on_recency_traffic() -> None:
    p = WTinyLFUPolicy(window_ratio=0.01)
    resident: set[bytes] = set()
    # A sliding working set: each key is read a few times soon after it first appears, then never again.
    for i in range(20_000):
        drive(p, resident, 100, b"k%d" % (i // 4 + (i % 4) * 20))
    assert p.window_ratio != 0.01
