"""Lazy victim iteration for policies whose eviction step changes their own queues (S3-FIFO, W-TinyLFU).

The engine asks ``victims()`` for keys lowest-ranked first and removes only the ones it needs; the rest stay
tracked. A FIFO with reinsertion cannot be walked with a plain iterator (deciding the next victim moves other
keys), so each offered key is taken off its queue into a *stash* (key -> queue, value). ``remove`` of a stashed
key is an eviction; every other call first puts stashed keys back at the heads of their queues, in order, so a
key offered but not taken keeps its rank. Each step is O(1); the stash holds only keys offered by the last call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any


class Stash:
    """The keys offered by the last victim()/victims() call, with the queue and value each came from."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: dict[bytes, tuple[OrderedDict[bytes, Any], Any]] = {}

    def take(self, key: bytes, queue: OrderedDict[bytes, Any]) -> bytes:
        """Move ``key`` from the head of ``queue`` into the stash; returns the key."""
        self.items[key] = (queue, queue.pop(key))
        return key

    def restore(self) -> None:
        """Put every stashed key back at the head of its queue, keeping their order."""
        for key, (queue, value) in reversed(self.items.items()):
            queue[key] = value
            queue.move_to_end(key, last=False)
        self.items.clear()


def walk(next_victim: Any) -> Iterator[bytes]:
    """Yield ``next_victim()`` until it returns None."""
    while True:
        key = next_victim()
        if key is None:
            return
        yield key
