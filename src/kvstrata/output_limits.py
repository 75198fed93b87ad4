"""``client-output-buffer-limit``: Redis's limits on a client's unsent replies, one per client class.

A value names classes with a hard limit, a soft limit and the seconds the soft limit may be passed for:
``normal 1gb 0 0 pubsub 32mb 8mb 60`` (Redis's syntax and checks; ``slave`` and ``replica`` are one class; a class
not named keeps its limits, as CONFIG SET in Redis). A bare size, the form kvstrata took before classes, is a
hard limit for every class. 0 is no limit. A client is closed when its pending replies reach the hard limit, or
stay past the soft limit for more than its seconds (checked as replies are added, as Redis does). Monitors are
normal clients, as in Redis; a client with any Pub/Sub subscription is a pubsub client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from kvstrata.sizes import parse_memory, parse_size

# Redis's order in CONFIG GET, where the replica class is spelled "slave".
CLASSES = ("normal", "replica", "pubsub")
_NAMES = {"normal": "normal", "slave": "replica", "replica": "replica", "pubsub": "pubsub"}
_SHOWN = {"normal": "normal", "replica": "slave", "pubsub": "pubsub"}
_SECONDS = re.compile(r"[+-]?\d+", re.ASCII)


@dataclass(frozen=True)
class Limit:
    """One class's limits: bytes (0: none) and the seconds the soft one may be passed for."""

    hard: int
    soft: int
    soft_seconds: int

    def passed(self, used: int, since: float, now: float) -> tuple[bool, float]:
        """Whether a client with ``used`` pending bytes is to be closed, and the time it has been past the soft
        limit since (0.0: it is not past it). ``since`` is the one returned last time. The first check past the
        soft limit only starts its clock, as Redis's."""
        if self.hard and used >= self.hard:
            return True, since
        if not self.soft or used < self.soft:
            return False, 0.0
        if not since:
            return False, now
        return now - since > self.soft_seconds, since


@dataclass(frozen=True)
class OutputLimits:
    """The limits of every class; ``str()`` is CONFIG GET's text."""

    normal: Limit
    replica: Limit
    pubsub: Limit

    def __str__(self) -> str:
        return " ".join(f"{_SHOWN[c]} {lim.hard} {lim.soft} {lim.soft_seconds}"
                        for c in CLASSES for lim in (getattr(self, c),))

    def lowest(self, klass: str) -> int:
        """The lowest limit of a class in bytes (0: none): where its transport starts pushing back."""
        lim: Limit = getattr(self, klass)
        return min((n for n in (lim.hard, lim.soft) if n), default=0)


DEFAULT = OutputLimits(normal=Limit(1024**3, 0, 0), replica=Limit(256 * 1024**2, 64 * 1024**2, 60),
                       pubsub=Limit(32 * 1024**2, 8 * 1024**2, 60))


def _seconds(word: str) -> int:
    if _SECONDS.fullmatch(word) is None or int(word) < 0:  # strtoll's digits, then nothing
        raise ValueError
    return int(word)


def parse(text: Any) -> dict[str, Limit]:
    """The classes a value names and their limits; ValueError with Redis's text when it is not valid (nothing
    is taken from a value with one bad class)."""
    if isinstance(text, int) or (isinstance(text, str) and len(text.split()) == 1):
        hard = parse_size(text)
        return dict.fromkeys(CLASSES, Limit(hard, 0, 0))
    words = str(text).split()
    if len(words) % 4:
        raise ValueError("Wrong number of arguments in buffer limit configuration.")
    found: dict[str, Limit] = {}
    for i in range(0, len(words), 4):
        klass = _NAMES.get(words[i].lower())
        if klass is None:
            raise ValueError("Invalid client class specified in buffer limit configuration.")
        try:
            found[klass] = Limit(parse_memory(words[i + 1]), parse_memory(words[i + 2]), _seconds(words[i + 3]))
        except ValueError:
            raise ValueError("Error in hard, soft or soft_seconds setting in buffer limit configuration.") from None
    return found


def merge(old: OutputLimits, given: dict[str, Limit] | OutputLimits) -> OutputLimits:
    """``old`` with the classes ``given`` names replaced."""
    if isinstance(given, OutputLimits):
        return given
    return replace(old, **given)
