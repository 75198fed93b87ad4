"""The registry of lower tiers: a name, and a factory that builds the tier from the configuration.

``tier-order`` (config) names the stack, fastest first, always starting with ``dram``; its allowed values are
the registered names. ``build`` makes the ordered list the Store walks (``Store.lower``). A tier's role
(authoritative, holds copies, in process, shared, evicts) is declared on its class (``tiers/base.py``), so
adding a tier is its class plus one ``register`` line; nothing else names it.

A factory returns None when the tier is not configured (no ``--essd-path``, no ``--pool``): the stack then goes
without it. A configured tier that ``tier-order`` leaves out is an error, not silently unused.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from kvstrata.clock import Clock
from kvstrata.engine.tiers.base import LowerTier

log = logging.getLogger("kvstrata.engine")

# (config, clock) -> the tier, or None when this node does not configure it.
TierFactory = Callable[[Any, Clock], "LowerTier | None"]

_FACTORIES: dict[str, TierFactory] = {}
# Which option configures a built-in tier, for the error when tier-order leaves it out.
_CONFIGURED_BY: dict[str, str] = {"ssd": "essd-path", "pool": "pool"}


def register(name: str, factory: TierFactory) -> None:
    """Make ``name`` a lower tier that ``tier-order`` may name; ``factory(config, clock)`` builds it."""
    if name == "dram" or not name.isidentifier():
        raise ValueError(f"bad tier name {name!r}")
    _FACTORIES[name] = factory


def unregister(name: str) -> None:
    _FACTORIES.pop(name, None)


def names() -> list[str]:
    return list(_FACTORIES)


def parse_order(text: str) -> list[str]:
    """The lower tiers ``tier-order`` names, in order; ValueError unless it is ``dram`` then registered names."""
    parts = [p.strip() for p in str(text).lower().split(",")]
    if not parts or parts[0] != "dram":
        raise ValueError(f"tier-order must start with dram (got {text!r})")
    lower = parts[1:]
    for name in lower:
        if name not in _FACTORIES:
            raise ValueError(f"unknown tier {name!r} in tier-order (known: dram, {', '.join(_FACTORIES)})")
    if len(set(lower)) != len(lower):
        raise ValueError(f"tier-order names a tier twice ({text!r})")
    return lower


def check_order(text: str) -> str:
    """The config parser for ``tier-order``."""
    return ",".join(["dram", *parse_order(text)])


def build(config: Any, clock: Clock) -> list[LowerTier]:
    """The configured lower tiers in ``tier-order``; at most one authoritative tier."""
    order = parse_order(config.get("tier-order"))
    for name, option in _CONFIGURED_BY.items():
        if name not in order and config.get(option):
            raise ValueError(f"--{option} configures the {name} tier, but tier-order "
                             f"({config.get('tier-order')}) leaves it out")
    tiers: list[LowerTier] = []
    try:
        for name in order:
            tier = _FACTORIES[name](config, clock)
            if tier is not None:
                tiers.append(tier)
        if sum(1 for t in tiers if t.authoritative) > 1:
            raise ValueError("tier-order: at most one tier may hold a key's only copy (authoritative): "
                             + ", ".join(t.name for t in tiers if t.authoritative))
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
    return tiers


def _ssd(config: Any, clock: Clock) -> LowerTier | None:
    if not config.get("essd-path"):
        return None
    from kvstrata.engine.tiers.ssd import SsdTier

    return SsdTier(config.get("essd-path"), int(config.get("essd-size")), fsync=config.get("fsync"),
                   policy=config.get("ssd-policy"))


def _pool(config: Any, clock: Clock) -> LowerTier | None:
    if not config.get("pool"):
        return None
    try:
        import redis  # noqa: F401  (the pool is reached with redis-py)
    except ImportError:
        raise ValueError("--pool needs redis-py: pip install 'kvstrata[sdk]'") from None
    from kvstrata.engine.tiers.pool import PoolTier

    pool = PoolTier(
        config.get("pool"), int(config.get("pool-size")),
        ttl_ms=max(1, int(float(config.get("pool-ttl")) * 1000)),
        timeout_ms=int(config.get("pool-timeout")),
        connect_timeout_ms=int(config.get("pool-connect-timeout")),
        backoff_max_ms=int(config.get("pool-backoff-max")),
        prefix=str(config.get("pool-key-prefix")).encode(),
        tombstone_ttl_ms=int(float(config.get("pool-tombstone-ttl")) * 1000),
        ack=str(config.get("pool-ack")),
        ack_replicas=int(config.get("pool-replicas")),
        pubsub=bool(config.get("pool-pubsub")),
        wall_ms=clock.now_ms,
        monotonic=clock.monotonic,
    )
    try:
        pool.check_connect()
    except ValueError as exc:
        if not config.get("pool-start-degraded"):
            pool.close()
            raise ValueError(f"{exc} (pool-start-degraded yes starts without it)") from None
        pool._failed("startup", exc)
        log.warning("starting with the pool degraded (pool-start-degraded): %s", exc)
    return pool


def pool_node_id(config: Any) -> int:
    """This node's id in the low bits of its versions (``pool-node-id``; -1: random)."""
    node_id = int(config.get("pool-node-id"))
    return int.from_bytes(os.urandom(1), "little") if node_id < 0 else node_id


register("ssd", _ssd)
register("pool", _pool)
