"""What the prefetch unit tests share: a store whose predictor has learnt a chain and whose DRAM holds none of it."""

from __future__ import annotations

from kvstrata.clock import ManualClock
from kvstrata.engine.entry import ENTRY_OVERHEAD
from kvstrata.engine.policy import create_policy
from kvstrata.engine.predict import Predictor
from kvstrata.engine.store import Store
from kvstrata.engine.tiers.ssd import SsdTier


def chain_store(ssd: SsdTier, slots: int, chain: list[bytes], value: bytes) -> Store:
    """A store of ``slots`` entries of ``value`` over ``ssd`` (LRU, a predictor with a window of 4): ``chain``
    written by one stream, read through by another, then all of it demoted to the SSD."""
    clock = ManualClock()
    store = Store(slots * (3 + len(value) + ENTRY_OVERHEAD), policy=create_policy("lru", clock=clock), clock=clock,
                  ssd=ssd, predictor=Predictor(clock, window=4))
    assert store.predictor is not None
    for sid in (1, 3):
        store.command.stream = sid
        for key in chain:
            if sid == 1:
                store.put(key, value)
            else:
                assert store.get(key) is not None
        store.predictor.forget_stream(sid)
    store.make_room(store.dram.budget)
    return store
