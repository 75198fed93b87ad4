"""The interface every eviction policy implements: it only ranks keys, it never moves data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol


class EvictionPolicy(Protocol):
    """Ranks the keys resident in one tier.

    The engine calls ``admit`` when a key enters the tier, ``touch`` on every reference, ``remove`` when the key
    leaves (deleted, demoted, pinned), and ``victim`` to learn which key it should move out next.
    """

    name: str

    def admit(self, key: bytes) -> None: ...

    def touch(self, key: bytes) -> None: ...

    def remove(self, key: bytes) -> None: ...

    def victim(self) -> bytes | None:
        """The lowest-ranked key, or None when the policy tracks no key. The key stays tracked."""
        ...

    def victims(self) -> Iterator[bytes]:
        """Tracked keys from the lowest rank up, lazily; the caller must not change the policy while iterating."""
        ...

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...

    def clear(self) -> None: ...


# Optional extras a policy may offer; callers look them up with getattr and work without them:
#   hint(key, depth) -> None   the key's depth in its prefix chain (chain-aware eviction, engine/policy/chain.py)
#   admits(key) -> bool        False: do not cache the key here (admission that refuses one-off keys)
# Every registered policy ranks without a clock: sizes and windows are counted in keys and accesses.
