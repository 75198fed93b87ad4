"""Pub/Sub across the nodes that share a pool: a PUBLISH on one node reaches the subscribers of every node, as
Redis Cluster forwards PUBLISH over its bus.

The publishing node delivers to its own subscribers at once (PUBLISH counts those, as a Redis Cluster node does),
then hands the message to a forwarder thread, which PUBLISHes it on the pool's Pub/Sub channel
``__kvstrata_pubsub__:<prefix>`` (a Redis Cluster broadcasts it to every master); each node's pool subscriber
thread (pool_subscriber) receives it there and delivers it to its own subscribers on the event loop. A message
is ``origin (8 random bytes of the sending node) | channel length (4, big-endian) | channel | message``: parsed,
never executed; a node skips its own. One forwarder and one subscription keep a node's messages in their order.

Like Redis Cluster: shard channels (SPUBLISH) and keyspace notifications stay on their node; a message is lost
while the pool cannot be reached (counted in INFO ``pool`` ``pubsub_dropped``), and the forwarder's queue is
bounded (``FORWARD_MAX_BYTES``), so a pool slower than the publishers drops messages rather than memory.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from kvstrata.engine.tiers.pool_sentinel import close_pool_client

log = logging.getLogger("kvstrata.pool")

FORWARD_MAX_BYTES = 64 * 1024 * 1024
_BATCH = 256


class PoolPubSub:
    """The Pub/Sub forwarding of a ``PoolTier`` (which owns ``_stop``, ``_deliver`` and the connection helpers)."""

    _stop: threading.Event
    _deliver: Callable[[Callable[[], None]], None]
    backoff_max_ms: int
    _subscriber_conn: Callable[[int], Any]  # PoolSubscriber's

    def _init_pubsub(self, prefix: bytes, forwarding: bool) -> None:
        self.pubsub_channel = b"__kvstrata_pubsub__:" + prefix
        self.origin = os.urandom(8)
        self.forwarding = forwarding  # pool-pubsub (CONFIG SET changes it: Server.apply_config)
        # Set by the server: deliver a message another node published to this node's subscribers (on the loop).
        self.on_publish: Callable[[bytes, bytes], None] = lambda channel, message: None
        self._outbox: deque[bytes] = deque()
        self._outbox_bytes = 0
        self._outbox_ready = threading.Condition()
        self._forwarder: threading.Thread | None = None
        self.pubsub_forwarded = 0
        self.pubsub_received = 0
        self.pubsub_dropped = 0

    # ---- sending (PUBLISH on this node) ----
    def forward(self, channel: bytes, message: bytes) -> None:
        """Queue a message this node's PUBLISH delivered locally, for the other nodes (never blocks)."""
        frame = b"%b%b%b%b" % (self.origin, struct.pack(">I", len(channel)), channel, message)
        with self._outbox_ready:
            if self._outbox_bytes + len(frame) > FORWARD_MAX_BYTES:
                self.pubsub_dropped += 1
                return
            self._outbox.append(frame)
            self._outbox_bytes += len(frame)
            self._outbox_ready.notify()
        if self._forwarder is None:
            self._forwarder = threading.Thread(target=self._forward_loop, name="kvstrata-pool-pubsub", daemon=True)
            self._forwarder.start()

    def _take(self) -> list[bytes]:
        with self._outbox_ready:
            while not self._outbox and not self._stop.is_set():
                self._outbox_ready.wait(0.2)
            batch = [self._outbox.popleft() for _ in range(min(_BATCH, len(self._outbox)))]
            self._outbox_bytes -= sum(len(f) for f in batch)
        return batch

    def _forward_loop(self) -> None:
        conn = None
        attempt = 0
        while not self._stop.is_set():
            batch = self._take()
            if not batch:
                continue
            try:
                if conn is None:
                    attempt += 1
                    conn = self._subscriber_conn(attempt)  # one node: a Redis Cluster broadcasts PUBLISH
                pipe = conn.pipeline(transaction=False)
                for frame in batch:
                    pipe.publish(self.pubsub_channel, frame)
                pipe.execute()
                self.pubsub_forwarded += len(batch)
            except Exception as exc:
                self.pubsub_dropped += len(batch)
                log.warning("pool Pub/Sub forwarding failed (%s: %s); %d message(s) dropped", type(exc).__name__,
                            exc, len(batch))
                if conn is not None:
                    close_pool_client(conn)
                    conn = None
                self._stop.wait(min(1.0, self.backoff_max_ms / 1000))
        if conn is not None:
            close_pool_client(conn)

    def _stop_forwarder(self) -> None:
        with self._outbox_ready:
            self._outbox_ready.notify_all()

    # ---- receiving (the pool subscriber thread) ----
    def _received_publish(self, data: bytes) -> None:
        if len(data) < 12 or data[:8] == self.origin:
            return
        n = struct.unpack_from(">I", data, 8)[0]
        if 12 + n > len(data):
            return  # not one of ours: ignored, as any malformed message on the channel
        channel, message = bytes(data[12:12 + n]), bytes(data[12 + n:])
        self.pubsub_received += 1
        self._deliver(lambda: self.on_publish(channel, message))
