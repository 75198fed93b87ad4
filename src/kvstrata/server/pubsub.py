"""Pub/Sub: who listens to which channel and pattern, and the delivery of published messages, as Redis 7.0 does.

Three namespaces, as in Redis: channels (SUBSCRIBE), patterns (PSUBSCRIBE, Redis's glob) and shard channels
(SSUBSCRIBE; one node is one shard, so they behave as channels of their own). A message goes to every connection
subscribed to its channel and once per matching pattern subscription, as a RESP3 push or a RESP2 array, written
behind the replies the subscriber already has pending; a subscriber that does not read is closed at
``client-output-buffer-limit`` (its pubsub class), as any client whose replies pile up. Subscriptions live in insertion order (an
UNSUBSCRIBE without channels answers for them in the order they were made) and end with the connection or RESET.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvstrata.commands.context import held
from kvstrata.engine.keyspace import glob_match
from kvstrata.protocol.encoder import Push

CHANNEL, PATTERN, SHARD = 0, 1, 2
# The reply names per namespace: (subscribe, unsubscribe, message).
_NAMES = {
    CHANNEL: (b"subscribe", b"unsubscribe", b"message"),
    PATTERN: (b"psubscribe", b"punsubscribe", b"pmessage"),
    SHARD: (b"ssubscribe", b"sunsubscribe", b"smessage"),
}


class _Frames:
    """A message's frame per protocol (a RESP2 ``*`` array or a RESP3 ``>`` push), each built the first time a
    subscriber speaking it needs it, then shared by every such subscriber (most servers' subscribers all speak
    one protocol: one copy of the message, not two)."""

    __slots__ = ("kind", "pattern", "channel", "message", "resp2", "resp3")

    def __init__(self, kind: bytes, pattern: bytes | None, channel: bytes, message: bytes) -> None:
        self.kind, self.pattern, self.channel, self.message = kind, pattern, channel, message
        self.resp2: bytes | None = None
        self.resp3: bytes | None = None

    def _build(self, head: bytes) -> bytes:
        kind, pattern, channel, message = self.kind, self.pattern, self.channel, self.message
        if pattern is None:
            return b"%b3\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (
                head, len(kind), kind, len(channel), channel, len(message), message)
        return b"%b4\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (
            head, len(kind), kind, len(pattern), pattern, len(channel), channel, len(message), message)

    def of(self, proto: int) -> bytes:
        if proto == 3:
            if self.resp3 is None:
                self.resp3 = self._build(b">")
            return self.resp3
        if self.resp2 is None:
            self.resp2 = self._build(b"*")
        return self.resp2


def _send(conn: Any, frames: _Frames, current: Any) -> None:
    conn.deliver(frames.of(conn.client.proto), current)


class PubSub:
    """The server's subscriptions: per namespace, name -> {client id: connection}."""

    def __init__(self) -> None:
        self.subs: tuple[dict[bytes, dict[int, Any]], ...] = ({}, {}, {})

    # ---- a connection's subscriptions ----
    @staticmethod
    def count(conn: Any, kind: int) -> int:
        """What Redis's (un)subscribe replies count: channels + patterns, or shard channels alone."""
        own = conn.client.pubsub
        return len(own[SHARD]) if kind == SHARD else len(own[CHANNEL]) + len(own[PATTERN])

    def subscribe(self, conn: Any, kind: int, names: Iterable[bytes]) -> list[Push]:
        own = conn.client.pubsub[kind]
        table = self.subs[kind]
        replies = []
        for name in names:
            name = bytes(name)
            if name not in own:
                own[name] = None
                conn.client.held_bytes += held(name)
                table.setdefault(name, {})[conn.client.id] = conn
            replies.append(Push([_NAMES[kind][0], name, self.count(conn, kind)]))
        conn.client.subscribed = True
        return replies

    def unsubscribe(self, conn: Any, kind: int, names: Iterable[bytes] | None) -> list[Push]:
        """``names`` None: every subscription of the namespace (a nil name when there was none, as Redis)."""
        own = conn.client.pubsub[kind]
        replies = []
        todo = list(own) if names is None else [bytes(n) for n in names]
        for name in todo:
            self._drop(conn, kind, name)
            replies.append(Push([_NAMES[kind][1], name, self.count(conn, kind)]))
        if not todo:
            replies.append(Push([_NAMES[kind][1], None, self.count(conn, kind)]))
        return replies

    def _drop(self, conn: Any, kind: int, name: bytes) -> None:
        client = conn.client
        own = client.pubsub[kind]
        if name in own:
            del own[name]
            client.held_bytes -= held(name)
            client.subscribed = any(client.pubsub)
            table = self.subs[kind]
            members = table.get(name)
            if members is not None:
                members.pop(conn.client.id, None)
                if not members:  # no empty entries left behind: millions of one-off channels cost nothing
                    del table[name]

    def forget(self, conn: Any) -> None:
        """Every subscription of ``conn`` ends, without replies (it closed, or RESET)."""
        for kind in (CHANNEL, PATTERN, SHARD):
            for name in list(conn.client.pubsub[kind]):
                self._drop(conn, kind, name)

    # ---- delivery ----
    def publish(self, channel: bytes, message: bytes, current: Any = None, shard: bool = False) -> int:
        """Deliver ``message`` on ``channel``; returns the receivers counted as Redis does (a connection once per
        subscription that matches). ``current``: the connection running the command, whose messages go after
        the replies it has pending (the others' are queued for the end of the loop's turn)."""
        members = self.subs[SHARD if shard else CHANNEL].get(channel)
        patterns = None if shard else self.subs[PATTERN]
        if not members and not patterns:  # the common case for keyspace events: nobody listens
            return 0
        channel = bytes(channel)
        receivers = 0
        if members:
            frames = _Frames(_NAMES[SHARD if shard else CHANNEL][2], None, channel, message)
            for conn in list(members.values()):
                _send(conn, frames, current)
                receivers += 1
        if patterns:
            for pattern, subscribers in list(patterns.items()):
                if glob_match(pattern, channel):
                    frames = _Frames(b"pmessage", pattern, channel, message)
                    for conn in list(subscribers.values()):
                        _send(conn, frames, current)
                        receivers += 1
        return receivers

    # ---- introspection (PUBSUB, INFO) ----
    def names(self, kind: int, pattern: bytes | None) -> list[bytes]:
        return [n for n in self.subs[kind] if pattern is None or glob_match(pattern, n)]

    def numsub(self, kind: int, names: Iterable[bytes]) -> list[Any]:
        out: list[Any] = []
        for name in names:
            out += [bytes(name), len(self.subs[kind].get(bytes(name), ()))]
        return out

    def sizes(self) -> tuple[int, int, int]:
        """Channels, patterns and shard channels with at least one subscriber."""
        return len(self.subs[CHANNEL]), len(self.subs[PATTERN]), len(self.subs[SHARD])
