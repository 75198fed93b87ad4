"""Prefetch in the engine: what a prefetch may displace, how its outcome is counted, chain-aware demotion."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstrata.clock import ManualClock
from kvstrata.engine.entry import ENTRY_OVERHEAD
from kvstrata.engine.policy import create_policy
from kvstrata.engine.predict import Predictor
from kvstrata.engine.store import Store
from kvstrata.engine.tiers.ssd import SsdTier

VALUE = b"v" * 100
SLOT = 3 + len(VALUE) + ENTRY_OVERHEAD  # keys below are 3 bytes


def make_store(tmp_path: Path, slots: int, *, predict: bool = True, chain: bool = False,
               protect: float = 1.0) -> tuple[Store, ManualClock]:
    clock = ManualClock()
    ssd = SsdTier(str(tmp_path / "ssd"), 1 << 30, fsync="no", threaded=False)
    store = Store(slots * SLOT, policy=create_policy("lru", clock=clock), clock=clock, ssd=ssd,
                  predictor=Predictor(clock) if predict else None, chain_evict=chain, prefetch_protect=protect)
    return store, clock


def k(i: int) -> bytes:
    return b"k%02d" % i


def demote_all(store: Store) -> None:
    store.make_room(store.dram.budget)
    assert not store.dram.entries


def test_prefetch_never_evicts_a_pinned_key(tmp_path: Path) -> None:
    store, clock = make_store(tmp_path, 3)
    for i in range(3):
        store.put(k(i), VALUE)
    demote_all(store)
    store.hot_max_fraction = 1.0
    store.mark_hot(b"p*")
    for i in range(3):
        store.put(b"p%02d" % i, VALUE)
    assert all(store.dram.entries[b"p%02d" % i].pinned for i in range(3))
    clock.advance(60.0)
    assert store.promote(k(0)) is False
    assert store.stats.prefetch_rejected == 1
    assert all(b"p%02d" % i in store.dram.entries for i in range(3))
    assert store.get(k(0), touch=False) is not None  # still on SSD, nothing lost


def test_prefetch_displaces_only_keys_expected_to_be_used_later(tmp_path: Path) -> None:
    store, clock = make_store(tmp_path, 2)
    store.put(k(0), VALUE)
    demote_all(store)
    store.put(k(1), VALUE)
    store.put(k(2), VALUE)
    for _ in range(40):  # both in use every other access: expected again long before a prefetch's window
        store.get(k(1))
        store.get(k(2))
    assert store.promote(k(0)) is False
    assert store.stats.prefetch_rejected == 1
    clock.advance(3600.0)  # an hour changes nothing: reuse is counted in accesses, not seconds
    assert store.promote(k(0)) is False
    for i in range(200):  # k2 stays in use while k1 goes idle for 400 accesses
        store.put(b"x%03d" % i, VALUE, cold=True)
        store.get(k(2))
    assert store.promote(k(0)) is True
    assert k(1) not in store.dram.entries and k(2) in store.dram.entries


def test_prefetch_of_a_missing_or_expired_key_is_harmless(tmp_path: Path) -> None:
    store, clock = make_store(tmp_path, 4)
    store.put(k(1), VALUE, expire_at=clock.now_ms() + 1000)
    store.put(k(2), VALUE)
    demote_all(store)
    clock.advance(5.0)
    used = store.dram.used
    assert store.promote(b"nope") is False
    assert store.promote(k(1)) is False
    assert store.stats.prefetch_absent == 2
    assert store.dram.used == used
    assert store.get(k(1)) is None
    assert store.get(k(2)) is not None
    assert store.stats.prefetch_issued == 0


def test_used_wasted_late_accuracy_and_coverage(tmp_path: Path) -> None:
    store, clock = make_store(tmp_path, 2, predict=False)
    for i in range(4):
        store.put(k(i), VALUE)
    demote_all(store)
    clock.advance(10.0)
    assert store.promote(k(0)) and store.promote(k(1))
    store.mark_late([k(1)])
    assert store.get(k(0)) is not None and store.get(k(1)) is not None  # used; k1 late
    clock.advance(10.0)
    assert store.promote(k(2))
    store.put(k(2), b"overwritten")  # unread and replaced: wasted
    clock.advance(10.0)
    assert store.get(k(3)) is not None  # a read from SSD that no prefetch served
    info = store.prefetch_info()
    assert (info["prefetch_issued"], info["prefetch_used"], info["prefetch_late"], info["prefetch_wasted"]) == (
        3, 2, 1, 1)
    assert info["prefetch_accuracy"] == pytest.approx(2 / 3, abs=1e-4)
    # Served in time: k0 only; needed a lower tier: k0, k1 (prefetched) and k3.
    assert info["prefetch_coverage"] == pytest.approx(1 / 3, abs=1e-4)


def test_a_prefetched_key_demoted_unread_is_wasted(tmp_path: Path) -> None:
    store, clock = make_store(tmp_path, 1, predict=False, protect=0.0)
    store.put(k(0), VALUE)
    store.put(k(1), VALUE)
    clock.advance(10.0)
    assert store.promote(k(0))
    clock.advance(10.0)
    store.put(k(2), VALUE)  # pushes k0 out before anyone read it
    assert store.stats.prefetch_wasted == 1
    assert store.get(k(0)) is not None  # on SSD again, intact


def test_reads_drive_predictions_into_promotions(tmp_path: Path) -> None:
    store, clock = make_store(tmp_path, 4)
    chain = [k(i) for i in range(6)]
    store.begin_command(1)
    for key in chain:
        store.put(key, VALUE)
    clock.advance(30.0)
    store.begin_command(3)
    for key in chain:  # read once: links a reader has followed
        assert store.get(key) is not None
    store.predictor.take()
    demote_all(store)
    clock.advance(30.0)
    store.begin_command(2)
    assert store.get(chain[0]) is not None
    predicted = store.predictor.take()
    assert predicted == chain[1:]
    promoted = [key for key in predicted if store.promote(key)]
    # The chunk just read came up too (its second SSD read within promote-window) and three more fit. The
    # others would have to displace keys that DRAM, this small, keeps for fewer accesses than they are away
    # (they would be dropped again before their reads) or that are predicted sooner than themselves.
    assert promoted == chain[1:4]
    assert chain[0] in store.dram.entries
    assert store.stats.prefetch_rejected == 2
    for key in chain[1:4]:
        assert store.get(key) is not None
    assert store.stats.prefetch_used == 3


def test_chain_aware_demotion_keeps_conversation_heads(tmp_path: Path) -> None:
    store, clock = make_store(tmp_path, 6, chain=True)
    system = [b"s%02d" % i for i in range(2)]
    conv_a = [b"a%02d" % i for i in range(2)]
    conv_b = [b"b%02d" % i for i in range(2)]
    store.begin_command(1)
    for key in system + conv_a:
        store.put(key, VALUE)
        clock.advance(0.01)
    store.begin_command(2)
    for key in system + conv_b:
        store.put(key, VALUE)
        clock.advance(0.01)
    # a00 and b00 follow the shared system prompt: conversation heads.
    clock.advance(5.0)
    store.begin_command(3)
    store.put(b"x00", VALUE)  # DRAM is full: one key must go
    # Plain LRU order would demote s00 (oldest) ... a00 before a01; a head is passed over until it has been idle
    # head_keep times as long as the key taken instead.
    gone = {key for key in system + conv_a + conv_b if key not in store.dram.entries}
    assert len(gone) == 1 and not gone & {b"a00", b"b00"}
