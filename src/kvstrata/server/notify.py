"""Keyspace notifications: Redis's ``notify-keyspace-events``, published through the server's Pub/Sub.

An event of a class the configuration selects goes out as Redis sends it: ``__keyspace@0__:<key>`` with the event
name as the message (class ``K``), ``__keyevent@0__:<event>`` with the key (class ``E``). Commands report their
events (``notify``); the store reports keys that expired and keys the last tier evicted (``Notifier.from_store``,
on the loop: the server hands it the events of loader and writer threads), and, through the server's hooks
``Store.on_miss`` and ``Store.on_new`` (set only while class m or n is on), a counted read that found nothing
(``keymiss``) and a write that created its key (``new``). Demotion to a lower tier is not an eviction: the key is
still there.
"""

from __future__ import annotations

from typing import Any

KEYSPACE, KEYEVENT, GENERIC, STRING = 1 << 0, 1 << 1, 1 << 2, 1 << 3
LIST, SET, HASH, ZSET, EXPIRED, EVICTED, STREAM, KEY_MISS = (1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8, 1 << 9,
                                                             1 << 10, 1 << 11)
MODULE, NEW = 1 << 13, 1 << 14
ALL = GENERIC | STRING | LIST | SET | HASH | ZSET | EXPIRED | EVICTED | STREAM | MODULE  # not m, not n: Redis's A
_CLASSES = {"A": ALL, "g": GENERIC, "$": STRING, "l": LIST, "s": SET, "h": HASH, "z": ZSET, "x": EXPIRED,
            "e": EVICTED, "K": KEYSPACE, "E": KEYEVENT, "t": STREAM, "m": KEY_MISS, "d": MODULE, "n": NEW}
# The order Redis writes the classes back (keyspaceEventsFlagsToString), after A or the single classes.
_ORDER = "g$lshzxetdn"


def flags_of(text: str) -> int:
    flags = 0
    for ch in text:
        bit = _CLASSES.get(ch)
        if bit is None:
            raise ValueError("Invalid event class character. Use 'Ag$lshzxeKEtmdn'.")
        flags |= bit
    return flags


class Classes(str):
    """The setting as Redis shows it, with the classes as they were set: Redis shows ``KEAn`` as ``AKE`` (its
    keyspaceEventsFlagsToString writes n only without A) yet sends the ``new`` events."""

    flags: int


def canonical(text: str) -> Classes:
    """``notify-keyspace-events`` as Redis shows it (``KEA`` is ``AKE``); ValueError as Redis's."""
    flags = flags_of(str(text))
    out = "A" if flags & ALL == ALL else "".join(c for c in _ORDER if flags & _CLASSES[c])
    classes = Classes(out + "".join(c for c in "KEm" if flags & _CLASSES[c]))
    classes.flags = flags
    return classes


class Notifier:
    """The configured classes and the publishing of events (``emit`` on the event loop)."""

    def __init__(self, pubsub: Any) -> None:
        self.pubsub = pubsub
        self.flags = 0

    def configure(self, text: str) -> None:
        self.flags = text.flags if isinstance(text, Classes) else flags_of(text)

    def emit(self, cls: int, event: bytes, key: bytes, current: Any = None) -> None:
        flags = self.flags
        if not flags & cls:
            return
        subs = self.pubsub.subs
        if not subs[0] and not subs[1]:  # no channel and no pattern has a subscriber: nothing to build
            return
        key = bytes(key)
        if flags & KEYSPACE:
            self.pubsub.publish(b"__keyspace@0__:" + key, event, current)
        if flags & KEYEVENT:
            self.pubsub.publish(b"__keyevent@0__:" + event, key, current)

    def wants(self, event: bytes) -> bool:
        """Whether an event the store saw (``expired``, ``evicted``) is of a class the configuration selects."""
        return bool(self.flags & (EXPIRED if event == b"expired" else EVICTED))

    def from_store(self, event: bytes, key: bytes) -> None:
        """An event the store saw, on the loop (the server hands it there from loader and writer threads)."""
        self.emit(EXPIRED if event == b"expired" else EVICTED, event, key)


def notify(ctx: Any, cls: int, event: bytes, key: bytes) -> None:
    """A command's event: published when its class is on, behind the running connection's pending replies."""
    notifier = getattr(ctx.server, "notifier", None)  # none without a server (unit tests drive handlers bare)
    if notifier is None or not notifier.flags & cls:
        return
    notifier.emit(cls, event, key, ctx.server.clients.get(ctx.client.id))


def set_events(ctx: Any, key: bytes, expires: Any) -> None:
    """A SET's events, as Redis sends them: ``set``, then ``expire`` when it gave the key an expiry time (SET and
    its family, TAIR.KV writes)."""
    notify(ctx, STRING, b"set", key)
    if expires:
        notify(ctx, GENERIC, b"expire", key)
