"""The cost figures of `kvstrata bench hitrate`: bytes per key counts what only the policy keeps alive (a ghost
that stores key objects pays for them), and the hot-path touch cost is measured for every policy in one run."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from kvstrata.bench.hitrate import memory_per_key, touch_cost
from kvstrata.engine.policy import registry
from kvstrata.engine.policy.lru import LRUPolicy


class _KeepsEvictedKeys(LRUPolicy):
    """LRU that remembers every evicted key object (as an ordered-dict ghost queue of keys would)."""

    name = "keeps-keys"

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[bytes] = []

    def remove(self, key: bytes) -> None:
        super().remove(key)
        self.kept.append(key)
        if len(self.kept) > len(self):
            del self.kept[0]


@pytest.fixture
def keeps_keys() -> Iterator[str]:
    registry.register("keeps-keys", lambda clock=None, **_: _KeepsEvictedKeys())
    yield "keeps-keys"
    registry._FACTORIES.pop("keeps-keys")


def test_key_objects_kept_only_by_the_policy_are_counted(keeps_keys: str) -> None:
    lru = memory_per_key("lru", keys=3000)
    keeping = memory_per_key(keeps_keys, keys=3000)
    # Each kept key is a 14-byte bytes object (47 B) plus a list slot: the engine does not hold it any more.
    assert keeping - lru >= 45
    assert 40 <= lru <= 200  # the engine's own (resident) key objects are not the policy's


def test_touch_cost_covers_every_policy_in_one_run() -> None:
    costs = touch_cost(["lru", "lru-k", "s3-fifo"], keys=500, rounds=2, repeats=1)
    assert set(costs) == {"lru", "lru-k", "s3-fifo"}
    assert all(math.isfinite(c) and 0.0 <= c < 1000.0 for c in costs.values())
