"""The register linearizability checker used by the pool history test: it accepts what is linearizable and
rejects classic anomalies (stale read, lost write, double CAS success, a read of a deleted key coming back)."""

from __future__ import annotations

import math

from tests.integration.linearizability import Op, check

INF = math.inf


def test_sequential_history_is_linearizable():
    h = [Op(0, 1, "write", "a"), Op(2, 3, "read", out="a"), Op(4, 5, "delete"), Op(6, 7, "read", out=None)]
    assert check(h) is None


def test_concurrent_write_may_be_seen_or_not():
    h = [Op(0, 10, "write", "b"), Op(1, 2, "read", out=None), Op(3, 4, "read", out="b")]
    assert check(h) is None


def test_stale_read_after_a_completed_write_is_caught():
    h = [Op(0, 1, "write", "a"), Op(2, 3, "write", "b"), Op(4, 5, "read", out="a")]
    assert check(h) is not None


def test_read_going_back_in_time_is_caught():
    h = [Op(0, 10, "write", "b"), Op(1, 2, "read", out="b"), Op(3, 4, "read", out=None)]
    assert check(h) is not None


def test_double_cas_success_is_caught():
    h = [Op(0, 1, "write", "a"), Op(2, 5, "cas", ("a", "x"), True), Op(2, 5, "cas", ("a", "y"), True)]
    assert check(h) is not None
    ok = [Op(0, 1, "write", "a"), Op(2, 5, "cas", ("a", "x"), True), Op(2, 5, "cas", ("a", "y"), False)]
    assert check(ok) is None


def test_resurrected_delete_is_caught():
    h = [Op(0, 1, "write", "a"), Op(2, 3, "delete"), Op(4, 5, "read", out="a")]
    assert check(h) is not None


def test_unknown_outcomes_may_or_may_not_take_effect():
    took = [Op(0, 1, "write", "a"), Op(2, INF, "write", "b"), Op(5, 6, "read", out="b")]
    assert check(took) is None
    lost = [Op(0, 1, "write", "a"), Op(2, INF, "write", "b"), Op(5, 6, "read", out="a")]
    assert check(lost) is None
    # But not both: once b was seen, a cannot come back.
    flip = [Op(0, 1, "write", "a"), Op(2, INF, "write", "b"), Op(5, 6, "read", out="b"), Op(7, 8, "read", out="a")]
    assert check(flip) is not None
    cas = [Op(0, 1, "write", "a"), Op(2, INF, "cas", ("a", "c")), Op(5, 6, "read", out="c")]
    assert check(cas) is None
