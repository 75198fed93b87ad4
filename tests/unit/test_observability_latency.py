"""Quantiles and cumulative buckets from the power-of-two µs histograms, and the INFO latencystats line."""

import re

import pytest

from kvstrata.observability.latency import cumulative_usec, latencystats_line, quantile_usec
from kvstrata.server.cmdstats import HIST_BUCKETS


def hist_of(*usecs):
    h = [0] * HIST_BUCKETS
    for us in usecs:
        h[us.bit_length()] += 1
    return h


def test_empty_histogram():
    h = [0] * HIST_BUCKETS
    assert quantile_usec(h, 0.5) == 0.0
    assert cumulative_usec(h) == []
    assert latencystats_line(h, [50, 99, 99.9]) == "p50=0.000,p99=0.000,p99.9=0.000"
    assert latencystats_line(h, []) == ""


def test_quantile_lies_in_the_bucket_of_the_true_value():
    values = [3, 5, 6, 7, 9, 100, 1000, 1500, 20_000, 70_000]
    h = hist_of(*values)
    for q in (0.1, 0.5, 0.9, 0.99, 1.0):
        true = sorted(values)[max(0, int(round(q * len(values))) - 1)]
        est = quantile_usec(h, q)
        lower = 2 ** (true.bit_length() - 1) if true else 0
        assert lower <= est <= 2 ** true.bit_length(), (q, true, est)


def test_quantile_interpolates_linearly_within_a_bucket():
    h = hist_of(*([5] * 4))  # all in [4, 8)
    assert quantile_usec(h, 0.5) == pytest.approx(6.0)
    assert quantile_usec(h, 1.0) == pytest.approx(8.0)
    assert quantile_usec(h, 0.25) == pytest.approx(5.0)
    assert quantile_usec(hist_of(0, 0), 0.5) == pytest.approx(0.5)  # bucket 0 is [0, 1)


def test_cumulative_bounds_are_powers_of_two_and_counts_are_below_them():
    values = [0, 1, 2, 3, 4, 1000, 1023, 1024]
    h = hist_of(*values)
    rows = cumulative_usec(h)
    assert [le for le, _ in rows] == [2**i for i in range(len(rows))]
    for le, n in rows:
        assert n == sum(1 for v in values if v < le)
    assert rows[-1][1] == len(values)
    assert cumulative_usec(h, upto=3) == rows[:4]


def test_latencystats_line_format():
    line = latencystats_line(hist_of(*range(1, 200)), [50, 99, 99.9])
    m = re.fullmatch(r"p50=(\d+\.\d{3}),p99=(\d+\.\d{3}),p99\.9=(\d+\.\d{3})", line)
    assert m
    p50, p99, p999 = map(float, m.groups())
    assert p50 <= p99 <= p999 <= 256
    other = latencystats_line(hist_of(*range(1, 200)), [0, 12.5, 100])  # the percentiles configured
    assert re.fullmatch(r"p0=\d+\.\d{3},p12\.5=\d+\.\d{3},p100=\d+\.\d{3}", other), other
