"""Shared by the policy unit tests: a cache of ``capacity`` keys driven through an eviction policy, one access at
a time, the way the engine drives it (touch on a hit; on a miss, evict the policy's victim when full, then admit)."""

from __future__ import annotations

from typing import Any


def drive(policy: Any, resident: set[bytes], capacity: int, key: bytes) -> bool:
    """One access of ``key``; returns whether it was a hit. ``resident`` is the cache's key set, updated."""
    if key in resident:
        policy.touch(key)
        return True
    if len(resident) >= capacity:
        victim = policy.victim()
        policy.remove(victim)
        resident.discard(victim)
    policy.admit(key)
    resident.add(key)
    return False
