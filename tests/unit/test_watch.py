"""Watch tickets are per load: one client's unwatch never takes another client's ticket off the watch list."""

from __future__ import annotations

from kvstrata.engine.tiers.watch import Watchers


def test_unwatch_removes_only_its_own_ticket() -> None:
    w = Watchers()
    a = w.watch([b"k"])
    b = w.watch([b"k"])  # equal keys and state: a value comparison could not tell them apart
    w.unwatch(a)
    w.touched(b"k")
    assert b.stale  # still watched
    assert not a.stale  # no longer watched
    w.unwatch(b)
    assert len(w) == 0


def test_unwatch_of_a_stale_ticket_beside_a_fresh_one() -> None:
    # The reported failure: a stale ticket and a fresh one on the same key; the fresh one's unwatch removed
    # the stale one by value, and the stale one's unwatch then failed with ValueError.
    w = Watchers()
    a = w.watch([b"k", b"j"])
    w.touched(b"j")
    b = w.watch([b"k"])
    w.unwatch(b)
    w.unwatch(a)
    w.unwatch(a)  # twice is harmless
    assert a.stale and not b.stale
    assert len(w) == 0


def test_touch_all_marks_every_ticket() -> None:
    w = Watchers()
    tickets = [w.watch([b"k%d" % i]) for i in range(3)]
    w.touch_all()
    assert all(t.stale for t in tickets)
