"""Chain-aware features any policy can use: evict chain tails before heads, and refuse one-off keys.

KV chunks come in prefix chains (chunk ``i`` is only usable after chunks ``0..i-1``), so a deep chunk is worth
less than a shallow one of the same recency: it serves only contexts that share the whole prefix, and it is
worthless once its prefix is gone. Both features wrap any registered policy and keep its interface:

* :class:`TailFirst`: the engine hints each key's depth in its chain (``hint(key, depth)``); ``victims()``
  looks at the inner policy's ``window`` lowest-ranked keys and offers the deepest of them first (ties in the
  inner order), so among keys the inner policy considers about equally cold, tails leave before heads.
* :class:`ScanGuard`: ``admits(key)`` is False for a key not seen within the last ``memory`` misses (a
  doorkeeper of keys only): the engine then writes such a key past the tier instead of caching it, so a
  one-off scan cannot flush the tier. A key refused once is admitted when it comes back.

Both are optional to the engine: without hints ``TailFirst`` orders exactly as the inner policy, and an engine
that never asks ``admits`` admits everything. Metadata: one small int per tracked key (depth) and one key per
remembered miss, both bounded by the tracked key count.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from kvstrata.engine.policy.base import EvictionPolicy


class _Wrapper:
    """Forwards the policy protocol to an inner policy."""

    def __init__(self, inner: EvictionPolicy) -> None:
        self.inner = inner
        self.name = inner.name

    def admit(self, key: bytes) -> None:
        self.inner.admit(key)

    def touch(self, key: bytes) -> None:
        self.inner.touch(key)

    def remove(self, key: bytes) -> None:
        self.inner.remove(key)

    def victim(self) -> bytes | None:
        return next(self.victims(), None)

    def victims(self) -> Iterator[bytes]:
        return self.inner.victims()

    def hint(self, key: bytes, depth: int) -> None:
        hint = getattr(self.inner, "hint", None)
        if hint is not None:
            hint(key, depth)

    def admits(self, key: bytes) -> bool:
        admits = getattr(self.inner, "admits", None)
        return True if admits is None else bool(admits(key))

    def __len__(self) -> int:
        return len(self.inner)

    def __contains__(self, key: object) -> bool:
        return key in self.inner

    def clear(self) -> None:
        self.inner.clear()


class TailFirst(_Wrapper):
    def __init__(self, inner: EvictionPolicy, window: int = 8) -> None:
        super().__init__(inner)
        if window < 1:
            raise ValueError("window must be at least 1")
        self.window = window
        self.name = f"{inner.name}+tail"
        self._depth: dict[bytes, int] = {}

    def hint(self, key: bytes, depth: int) -> None:
        self._depth[key] = depth
        super().hint(key, depth)

    def remove(self, key: bytes) -> None:
        self._depth.pop(key, None)
        self.inner.remove(key)

    def clear(self) -> None:
        self._depth.clear()
        self.inner.clear()

    def victims(self) -> Iterator[bytes]:
        source = self.inner.victims()
        depth = self._depth.get
        window: list[bytes] = []
        for key in source:
            window.append(key)
            if len(window) == self.window:
                break
        while window:
            best = max(range(len(window)), key=lambda i: (depth(window[i], 0), -i))
            yield window.pop(best)
            nxt = next(source, None)
            if nxt is not None:
                window.append(nxt)


class ScanGuard(_Wrapper):
    def __init__(self, inner: EvictionPolicy) -> None:
        super().__init__(inner)
        self.name = f"{inner.name}+guard"
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def admits(self, key: bytes) -> bool:
        seen = self._seen
        if key in seen:
            del seen[key]
            return True
        seen[key] = None
        bound = max(1, len(self.inner))
        while len(seen) > bound:
            seen.popitem(last=False)
        return False

    def clear(self) -> None:
        self._seen.clear()
        self.inner.clear()
