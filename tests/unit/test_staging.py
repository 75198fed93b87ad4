"""The staging engine of two-phase writes (kvstrata.engine.staging): per-writer segments, reservation bounds,
budget charges that always balance, and commits that verify the server's own copy."""

from __future__ import annotations

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.staging_support import MB, Budget

from kvstrata.engine.staging import StageError, Staging


def _staging(size: int = 4 * MB, **kw: int) -> tuple[Staging, Budget]:
    b = Budget()
    return Staging(size, charge=b.charge, uncharge=b.uncharge, **kw), b


def test_segments_are_per_client_and_reservations_carved_from_them() -> None:
    s, budget = _staging()
    a, b = s.segment(1), s.segment(2)
    assert a is s.segment(1) and a is not b and a.region.fd != b.region.fd
    r1, r2 = s.reserve(1, [100, 5000], 0)
    assert r1.off != r2.off and r2.off >= r1.off + r1.span and r1.span == 4096
    assert budget.used == s.reserved_bytes == r1.charge + r2.charge
    with pytest.raises(StageError, match="unknown reservation"):
        s.take(2, r1.id)  # another client's
    seg, res = s.take(1, r1.id)
    assert res is r1 and budget.used == r2.charge
    with pytest.raises(StageError, match="unknown reservation"):
        s.take(1, r1.id)
    assert s.unreserve(1, [r2.id, r2.id, 999]) == 1 and budget.used == 0


def test_bounds_refuse_all_or_nothing() -> None:
    s, budget = _staging(2 * MB, max_reservations=3)
    with pytest.raises(StageError, match="TAIR.KV.STAGE first"):
        s.reserve(1, [10], 0)
    s.segment(1)
    with pytest.raises(StageError, match="too many"):
        s.reserve(1, [10] * 4, 0)
    with pytest.raises(StageError, match="segment full"):
        s.reserve(1, [MB, MB, 10], 0)
    with pytest.raises(StageError, match="positive"):
        s.reserve(1, [10, 0], 0)
    assert budget.used == 0 and s.segment(1).extents.free_bytes == 2 * MB
    assert len(s.reserve(1, [MB, MB - 4096, 10], 0)) == 3


def test_expiry_and_clients_gone_end_reservations() -> None:
    s, budget = _staging(reserve_ms=100)
    s.segment(1)
    s.segment(2)
    s.reserve(1, [10], 0)
    s.reserve(2, [10, 20], 50)
    assert s.expire(100) == 1 and s.expire(149) == 0 and s.expire(150) == 2
    assert budget.used == 0
    s.reserve(1, [MB], 200)
    assert s.drop_clients(lambda c: c == 2) == 1 and 1 not in s.segments and budget.used == 0
    assert s.info()["stage_reservations_dropped"] == 1


def test_commit_verifies_the_copy_it_made() -> None:
    s, _ = _staging()
    seg = s.segment(1)
    data = bytes(range(256)) * 9000  # over two pieces
    [res] = s.reserve(1, [len(data)], 0)
    seg.region.view[res.off:res.off + len(data)] = data
    dst = bytearray(len(data))
    s.take(1, res.id)
    with pytest.raises(StageError, match="checksum mismatch"):
        s.copy_verified(seg, res, dst, xxhash.xxh3_64_intdigest(data) ^ 1)
    assert s.copy_verified(seg, res, dst, xxhash.xxh3_64_intdigest(data)) == xxhash.xxh3_64_intdigest(data)
    assert bytes(dst) == data
    assert s.info()["stage_checksum_failures"] == 1 and s.info()["stage_commits"] == 1


def test_disabled() -> None:
    s, _ = _staging(0)
    with pytest.raises(StageError, match="disabled"):
        s.segment(1)


ops = st.lists(st.tuples(st.sampled_from(["reserve", "take", "unreserve", "expire", "drop"]),
                         st.integers(1, 3), st.lists(st.integers(1, 700_000), min_size=1, max_size=4),
                         st.integers(0, 50)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_charges_balance_and_reservations_never_overlap(script) -> None:
    s, budget = _staging(2 * MB, max_reservations=5, reserve_ms=100)
    now = 0
    for op, client, lengths, step in script:
        now += step
        seg = s.segment(client) if client not in s.segments and op != "drop" else s.segments.get(client)
        if op == "reserve":
            try:
                s.reserve(client, lengths, now)
            except StageError:
                pass
        elif op in ("take", "unreserve") and seg is not None and seg.reservations:
            rid = sorted(seg.reservations)[lengths[0] % len(seg.reservations)]
            if op == "take":
                s.take(client, rid)
            else:
                s.unreserve(client, [rid])
        elif op == "expire":
            s.expire(now)
        elif op == "drop":
            s.drop_clients(lambda c, gone=client: c != gone)
        live = [r for sg in s.segments.values() for r in sg.reservations.values()]
        assert budget.used == s.reserved_bytes == sum(r.charge for r in live)
        for sg in s.segments.values():
            spans = sorted((r.off, r.off + r.span) for r in sg.reservations.values())
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
            assert sg.extents.free_bytes + sum(r.span for r in sg.reservations.values()) == sg.size
            assert len(sg.reservations) <= 5


def test_an_idle_segment_gives_its_pages_back() -> None:
    s, _ = _staging(2 * MB, reserve_ms=10_000)
    s.idle_ms = 1000
    seg = s.segment(1)
    [res] = s.reserve(1, [4096], 0)
    seg.region.view[res.off:res.off + 4] = b"data"
    s.expire(5000)  # a reservation is live: kept
    assert bytes(seg.region.view[res.off:res.off + 4]) == b"data" and not seg.trimmed
    s.unreserve(1, [res.id])
    s.expire(900)  # idle for less than idle_ms since the last reservation was made
    assert bytes(seg.region.view[res.off:res.off + 4]) == b"data"
    s.expire(1000)
    assert seg.trimmed and bytes(seg.region.view[res.off:res.off + 4]) == bytes(4)  # the pages went back
    assert s.info()["stage_segments_trimmed"] == 1
    s.expire(99_000)
    assert s.info()["stage_segments_trimmed"] == 1  # once per idle period
