"""When an entry read from a lower tier earns its way back up: N reads within a window (bounded memory)."""

from __future__ import annotations

from collections import OrderedDict


class Admission:
    def __init__(self, hits: int = 2, window_s: float = 60.0, capacity: int = 100_000) -> None:
        self.hits = hits
        self.window_ms = int(window_s * 1000)
        self._seen: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        self._capacity = capacity

    def should_promote(self, key: bytes, now_ms: int) -> bool:
        if self.hits <= 1:
            return True
        count, first = self._seen.pop(key, (0, now_ms))
        if now_ms - first > self.window_ms:
            count, first = 0, now_ms
        count += 1
        if count >= self.hits:
            return True
        self._seen[key] = (count, first)
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return False

    def forget(self, key: bytes) -> None:
        self._seen.pop(key, None)
