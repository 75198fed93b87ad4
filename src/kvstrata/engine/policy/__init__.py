"""Eviction policies: they rank the keys of one tier; the engine decides what to move."""

from kvstrata.engine.policy.base import EvictionPolicy
from kvstrata.engine.policy.registry import create_policy, policy_names

__all__ = ["EvictionPolicy", "create_policy", "policy_names"]
