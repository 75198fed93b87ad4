"""The staging engine's newer parts: the arena reuses slots of overwritten values inside a command only when
nothing outside it references them (``ArenaPool.collect_unreferenced``), commits that skip a prefix of their
reservation, and the idle time before a segment's pages go back (``stage-idle-ms``)."""

from __future__ import annotations

import pytest
import xxhash

from kvstrata.config import Config
from kvstrata.engine.arena import ArenaPool
from kvstrata.engine.staging import StageError, Staging

MB = 1024 * 1024


def test_collect_unreferenced_frees_limbo_only_when_nothing_else_holds_a_view() -> None:
    a = ArenaPool(16 * MB, hugepages=False)
    try:
        v = a.held_slot(MB)
        assert v is not None and a.allocated == MB
        reply = [v]  # a reply being built that holds the dropped value (e.g. GETDEL's)
        a.release(v)
        del v
        a.collect_unreferenced()
        assert a.allocated == MB  # referenced: kept in limbo
        assert bytes(reply[0][:1]) == b"\x00"  # and still readable
        reply.clear()
        a.collect_unreferenced()
        assert a.allocated == 0  # nothing holds it any more: freed, its room reused by the next slot
        w = a.held_slot(MB)
        assert w is not None and a.slot(w).off == 0
        a.release(w)
    finally:
        a.collect()


def test_commit_skip_copies_the_value_after_the_prefix_and_checks_bounds() -> None:
    s = Staging(2 * MB)
    seg = s.segment(1)
    [res] = s.reserve(1, [4096 + 100], 0)
    data = bytes(range(100))
    seg.region.view[res.off + 4096:res.off + 4096 + 100] = data
    assert s.value_length(res, 4096) == 100
    with pytest.raises(StageError, match="SKIP"):
        s.value_length(res, 4196)
    out = bytearray(100)
    s.take(1, res.id)
    assert s.copy_verified(seg, res, out, xxhash.xxh3_64_intdigest(data), None, 4096) == xxhash.xxh3_64_intdigest(data)
    assert bytes(out) == data
    with pytest.raises(StageError, match="checksum mismatch"):
        s.copy_verified(seg, res, bytearray(100), 1, None, 4096)


def test_idle_time_is_configurable() -> None:
    assert Staging(MB).idle_ms == 60_000
    assert Staging(MB, idle_ms=5).idle_ms == 5
    cfg = Config()
    assert cfg.get("stage-idle-ms") == 60_000
