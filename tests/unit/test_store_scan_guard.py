"""``eviction-scan-guard``: with DRAM full, a client write of a key DRAM's admission has not seen goes straight to
the SSD tier (a real Store over a real LMDB tier); written again, it is admitted; without the guard it displaces."""

import pytest

from kvstrata.clock import ManualClock
from kvstrata.config import Config
from kvstrata.engine.entry import ENTRY_OVERHEAD
from kvstrata.engine.policy import create_policy
from kvstrata.engine.policy.chain import ScanGuard
from kvstrata.engine.store import Store
from kvstrata.engine.tiers.ssd import SsdTier
from kvstrata.server.app import build_store

VALUE = 1000


@pytest.fixture
def make_store(tmp_path):
    tiers = []

    def make(guard):
        ssd = SsdTier(str(tmp_path / f"ssd{len(tiers)}"), 1 << 20, threaded=False)
        tiers.append(ssd)
        policy = create_policy("lru-k")
        return Store(4 * (6 + VALUE + ENTRY_OVERHEAD), policy=ScanGuard(policy) if guard else policy,
                     clock=ManualClock(), ssd=ssd)

    yield make
    for tier in tiers:
        tier.close()


def fill(store):
    for i in range(4):
        store.put(b"key:%d" % i, b"v" * VALUE)
    assert len(store.dram) == 4


def test_a_one_off_write_goes_past_a_full_dram(make_store):
    store = make_store(guard=True)
    fill(store)
    store.put(b"key:9", b"w" * VALUE)
    assert store.tier_of(b"key:9") == "ssd" and len(store.dram) == 4
    assert all(store.tier_of(b"key:%d" % i) == "dram" for i in range(4))
    assert store.get(b"key:9").value == b"w" * VALUE
    store.put(b"key:8", b"x" * VALUE)
    store.put(b"key:8", b"y" * VALUE)  # seen before: admitted, one DRAM entry demoted for it
    assert store.tier_of(b"key:8") == "dram" and store.dram.used <= store.dram.budget


def test_without_the_guard_a_write_displaces(make_store):
    store = make_store(guard=False)
    fill(store)
    store.put(b"key:9", b"w" * VALUE)
    assert store.tier_of(b"key:9") == "dram"
    assert sum(store.tier_of(b"key:%d" % i) == "ssd" for i in range(4)) == 1


def test_the_option(tmp_path):
    cfg = Config()
    assert cfg.get("eviction-scan-guard") is False
    with pytest.raises(ValueError, match="yes"):
        cfg.set("eviction-scan-guard", "sometimes")
    cfg.set("essd-path", str(tmp_path / "ssd"))
    cfg.set("eviction-scan-guard", "yes")
    store = build_store(cfg)
    try:
        assert isinstance(store.policy, ScanGuard) and store._admits is not None
    finally:
        for tier in store.lower:
            tier.close()
