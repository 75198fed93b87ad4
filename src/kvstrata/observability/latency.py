"""Quantiles and cumulative buckets from the per-command latency histograms.

``CommandStats.hist[i]`` counts commands whose duration in whole microseconds has bit length ``i``: bucket 0
holds 0 µs, bucket ``i >= 1`` holds ``[2**(i-1), 2**i)`` µs. Every duration in buckets ``0..i`` is therefore
below ``2**i`` µs, which makes ``2**i`` µs the ``le`` bound of the cumulative bucket ``i`` (Prometheus and
``LATENCY HISTOGRAM`` alike).
"""

from __future__ import annotations

from collections.abc import Sequence


def quantile_usec(hist: Sequence[int], q: float) -> float:
    """The q-quantile (0 < q <= 1) in µs, linearly interpolated inside its power-of-two bucket; 0 without data.

    The same estimate as Prometheus's ``histogram_quantile`` over these buckets: the true value lies in the same
    bucket, so the error is below a factor of two and usually much less.
    """
    total = sum(hist)
    if total <= 0:
        return 0.0
    rank = min(max(q, 0.0), 1.0) * total
    seen = 0
    for i, n in enumerate(hist):
        if n and seen + n >= rank:
            lower = 0.0 if i == 0 else float(2 ** (i - 1))
            upper = float(2**i)
            return lower + (upper - lower) * max(rank - seen, 0.0) / n
        seen += n
    return float(2 ** (len(hist) - 1))


def cumulative_usec(hist: Sequence[int], upto: int | None = None) -> list[tuple[int, int]]:
    """``[(le_usec, count of commands below le_usec), ...]`` for buckets 0..upto (default: the last non-empty)."""
    if upto is None:
        upto = max((i for i, n in enumerate(hist) if n), default=-1)
    out: list[tuple[int, int]] = []
    seen = 0
    for i in range(upto + 1):
        seen += hist[i] if i < len(hist) else 0
        out.append((2**i, seen))
    return out


def percentile_text(value: float) -> str:
    """A percentile as Redis prints it (``%f`` without trailing zeros): 50 -> ``50``, 99.9 -> ``99.9``."""
    return f"{value:f}".rstrip("0").rstrip(".")


def latencystats_line(hist: Sequence[int], percentiles: Sequence[float]) -> str:
    """``p50=...,p99=...,p99.9=...`` as in Redis's ``INFO latencystats`` (µs with three decimals), for the
    configured percentiles (latency-tracking-info-percentiles)."""
    return ",".join(f"p{percentile_text(p)}={quantile_usec(hist, p / 100):.3f}" for p in percentiles)
