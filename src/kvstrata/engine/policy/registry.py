"""Name -> policy factory. New policies register here; nothing else branches on policy names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstrata.clock import Clock
from kvstrata.engine.policy.arc import ARCPolicy
from kvstrata.engine.policy.base import EvictionPolicy
from kvstrata.engine.policy.lru import LRUPolicy
from kvstrata.engine.policy.lru_k import LRUKPolicy
from kvstrata.engine.policy.lru_k_compact import CompactLRUKPolicy
from kvstrata.engine.policy.s3fifo import S3FIFOPolicy
from kvstrata.engine.policy.wtinylfu import WTinyLFUPolicy

_FACTORIES: dict[str, Callable[..., EvictionPolicy]] = {}


def register(name: str, factory: Callable[..., EvictionPolicy]) -> None:
    _FACTORIES[name] = factory


def policy_names() -> list[str]:
    return sorted(_FACTORIES)


def create_policy(name: str, *, clock: Clock | None = None, **options: Any) -> EvictionPolicy:
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; known: {', '.join(policy_names())}") from None
    return factory(clock=clock, **options)


DEFAULT_POLICY = "lru-k"
"""The live server's default, chosen by `kvstrata bench hitrate` (see BENCHMARKS.md, "Eviction policies"). Its
twin ``lru-k-compact`` makes the same decisions in a quarter of the memory but costs ~4x more per DRAM hit
(BENCHMARKS.md, "Eviction: LRU-K in flat arrays")."""


def _pick(options: dict[str, Any], *names: str) -> dict[str, Any]:
    """The options a factory understands; the server passes every policy's settings to every factory."""
    return {name: value for name, value in options.items() if name in names}


# No policy takes the clock: every parameter is counted in accesses or keys, so a ranking is the same whether
# the clients replay a trace slowly or at full speed. (``clock`` is accepted for the registry's signature.)
register("lru", lambda clock=None, **_: LRUPolicy())
register("lru-k", lambda clock=None, **options: LRUKPolicy(**_pick(options, "k", "crp", "retained")))
# The same decisions as lru-k in flat arrays (no Python object per key): the memory target of 64 B per key.
register("lru-k-compact",
         lambda clock=None, **options: CompactLRUKPolicy(**_pick(options, "k", "crp", "retained")))
register("s3-fifo", lambda clock=None, **options: S3FIFOPolicy(**_pick(options, "small_ratio", "promote")))
register("w-tinylfu", lambda clock=None, **options: WTinyLFUPolicy(**_pick(options, "window_ratio", "adaptive")))
register("arc", lambda clock=None, **_: ARCPolicy())
