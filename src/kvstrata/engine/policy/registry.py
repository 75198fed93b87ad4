"""Name -> policy factory. New policies register here; nothing else branches on policy names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstrata.clock import Clock
from kvstrata.engine.policy.base import EvictionPolicy
from kvstrata.engine.policy.lru import LRUPolicy
from kvstrata.engine.policy.lru_k import LRUKPolicy

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


register("lru", lambda clock=None, **_: LRUPolicy())
register(
    "lru-k",
    # Only the options given are passed on, so LRUKPolicy's own defaults (K=2, CRP 0, 100k retained) apply.
    lambda clock=None, **options: LRUKPolicy(
        clock=clock, **{name: value for name, value in options.items() if name in ("k", "crp", "retained")}
    ),
)
