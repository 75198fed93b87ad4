"""The pool's invalidation subscriber: a thread subscribed to the invalidation channel that hands each
``(key, version, deleted)`` to ``on_invalidate`` on the owner's thread, so this node drops older local copies
(docs/pool.md). It reconnects on its own; invalidations missed meanwhile are counted in ``invalidation_gaps``,
``subscribed`` says whether the pool node has taken the subscription (INFO ``invalidation_subscribed``), and
``subscriptions`` counts the subscriptions taken: each one (the first included: this node was away before it) asks
for a resync of the local copies against the pool (``kvstrata.server.pool_resync``).

``PoolSubscriber`` is a mixin of ``PoolTier`` (pool.py), which owns the state.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable
from typing import Any

from kvstrata.engine.tiers.pool_sentinel import close_pool_client, sentinel_client

log = logging.getLogger("kvstrata.pool")


class PoolSubscriber:
    """The invalidation subscription of a ``PoolTier``."""

    _subscriber: threading.Thread | None
    _stop: threading.Event
    pubsub_channel: bytes
    _received_publish: Callable[[bytes], None]  # PoolPubSub's

    def start_invalidation(self) -> None:
        """Subscribe to the invalidation channel in a thread; messages reach ``on_invalidate`` on the owner's
        thread. While the subscription is down, invalidations are missed (counted in invalidation_gaps)."""
        if self._subscriber is None:
            self._subscriber = threading.Thread(target=self._subscribe_loop, name="kvstrata-pool-inval",
                                                daemon=True)
            self._subscriber.start()

    def _subscribe_loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            conn = None
            try:
                conn = self._subscriber_conn(n)
                ps = conn.pubsub()
                ps.subscribe(self.channel, self.pubsub_channel)  # invalidations; PUBLISH of other nodes
                plen = len(self.prefix)
                while not self._stop.is_set():
                    msg = ps.get_message(timeout=min(0.2, self.timeout_ms / 2000))
                    if msg is None:
                        continue
                    if msg.get("type") == "subscribe" and msg.get("channel") == self.channel:
                        # The pool node took it: invalidations from now on arrive.
                        self.subscribed = True
                        # What was missed before this point is found by a resync (kvstrata.server.pool_resync).
                        self.subscriptions += 1
                        continue
                    if msg.get("type") != "message":
                        continue
                    data = msg["data"]
                    if msg.get("channel") == self.pubsub_channel:
                        self._received_publish(data)
                        continue
                    if len(data) < 9 + plen:
                        continue
                    version = struct.unpack_from(">Q", data)[0]
                    deleted = data[8] == 1
                    key = bytes(data[9 + plen:])
                    self._deliver(lambda key=key, version=version, deleted=deleted:
                                  self._invalidated(key, version, deleted))
            except Exception as exc:
                self.subscribed = False
                if self._stop.is_set():
                    break
                self.invalidation_gaps += 1
                log.warning("pool invalidation subscription lost (%s: %s); reconnecting", type(exc).__name__, exc)
                self._stop.wait(min(1.0, self.backoff_max_ms / 1000))
            finally:
                if conn is not None:
                    close_pool_client(conn)

    def _subscriber_conn(self, n: int) -> Any:
        """The connection for the n-th subscription attempt: the pool's nodes in turn; for a sentinel pool, the
        service's current master (asked again on every attempt, so a failover is followed)."""
        import redis

        if self._url.service is not None:
            return sentinel_client(self._url, self._common())
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # No retries inside redis-py: a lost subscription must reach this loop (gaps counted, subscribed cleared).
        kwargs = {"retry": Retry(NoBackoff(), 0), **{k: v for k, v in self._url.kwargs.items() if k != "db"}}
        if not self.nodes:
            return redis.Redis(socket_timeout=self.timeout_ms / 1000, **kwargs)
        host, port = self.nodes[(n - 1) % len(self.nodes)]
        return redis.Redis(host=host, port=port, socket_timeout=self.timeout_ms / 1000,
                           socket_connect_timeout=self.connect_timeout_ms / 1000, **kwargs)

    def _invalidated(self, key: bytes, version: int, deleted: bool) -> None:
        self.invalidations += 1
        self.on_invalidate(key, version, deleted)
