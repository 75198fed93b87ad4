"""The pool's health: whether the pool (or one cluster master) is degraded, why, and probing it back.

A connection error or timeout (``CLUSTERDOWN``...) marks the pool *degraded*; in a cluster, a fault against one
master degrades only the keys whose slots it serves (``masters_down``), each with its own exponential backoff.
A command the pool refuses (``-OOM``, a script error) is not a fault: it fails that write only. ``probe``
(run by the server off the loop when ``probe_due``) tries again; when every node answers, the pool is used again.

``PoolHealth`` is a mixin of ``PoolTier`` (pool.py), which owns the state it reads and writes.
"""

from __future__ import annotations

import logging
from typing import Any

from kvstrata.errors import CommandError

log = logging.getLogger("kvstrata.pool")


class PoolUnavailableError(CommandError):
    """The pool could not be asked (degraded, timed out, refused): the command fails instead of guessing."""

    prefix = "TRYAGAIN"



def _is_fault(exc: BaseException) -> bool:
    """Connection-level trouble (degrades the pool), as opposed to a command the pool refused (-OOM...)."""
    import redis

    if isinstance(exc, redis.ResponseError):
        text = str(exc)
        # READONLY: the server is a replica now (a failover demoted the master we were connected to).
        return text.startswith(("CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING", "READONLY"))
    return True


_ERRORS_LOGGED_EVERY = 10.0


class PoolHealth:
    """Degradation of the whole pool or of one master, backoff and probes (state lives on ``PoolTier``)."""

    degraded: str | None
    masters_down: dict[str, list[Any]]
    _closed: bool

    @property
    def active(self) -> bool:
        return self.degraded is None and not self._closed

    def _master(self, key: bytes) -> tuple[str, Any]:
        """The name and redis-py node of the master serving ``key`` ("" and None for a single server)."""
        c = self._client
        if not self.cluster or c is None:
            return "", None
        try:
            node = c.get_node_from_key(self.pool_key(key))
        except Exception:  # no slot map yet (the client is being rebuilt): no master to blame
            return "", None
        return (node.name, node) if node is not None else ("", None)

    def down_reason(self, key: bytes) -> str | None:
        """Why ``key`` cannot use the pool now (the pool or its master is degraded), None when it can."""
        if self._closed:
            return "the pool is closed"
        if self.degraded is not None:
            return self.degraded
        if not self.masters_down:
            return None
        got = self.masters_down.get(self._master(key)[0])
        return f"master {self._master(key)[0]}: {got[0]}" if got is not None else None

    def usable(self, key: bytes) -> bool:
        return self.down_reason(key) is None

    def _master_failed(self, name: str, what: str, exc: BaseException) -> None:
        """A fault against one master: only its slots are degraded, with their own backoff and probe."""
        import redis

        with self._lock:
            self.errors += 1
            if isinstance(exc, redis.TimeoutError | TimeoutError):
                self.timeouts += 1
            got = self.masters_down.get(name)
            first = got is None
            backoff = 100 if first else min(self.backoff_max_ms, got[1] * 2)
            now = self._monotonic()
            self.masters_down[name] = [f"{what}: {type(exc).__name__}: {exc}", backoff, now + backoff / 1000,
                                       now if first else got[3]]
        if first:
            log.warning("pool master %s degraded (%s); its keys are served from local tiers", name,
                        self.masters_down[name][0])

    def _failed(self, what: str, exc: BaseException) -> None:
        """Record an error (any thread): the pool is degraded until a probe succeeds."""
        import redis

        with self._lock:
            self.errors += 1
            if isinstance(exc, redis.TimeoutError | TimeoutError):
                self.timeouts += 1
            first = self.degraded is None
            self.degraded = f"{what}: {type(exc).__name__}: {exc}"
            if first:
                self.degraded_since = self._monotonic()
                self._backoff_ms = 0
            self._backoff_ms = min(self.backoff_max_ms, max(100, self._backoff_ms * 2))
            self.next_probe = self._monotonic() + self._backoff_ms / 1000
            now = self._monotonic()
            noisy = now - self._last_error_log < _ERRORS_LOGGED_EVERY
            if first or not noisy:
                self._last_error_log = now
        if first:
            log.warning("pool %s degraded (%s); serving from local tiers, retrying with backoff", self.url,
                        self.degraded)
        elif not noisy:
            log.warning("pool still degraded: %s (%d errors so far)", self.degraded, self.errors)

    def probe_due(self) -> bool:
        if self.probing:
            return False
        now = self._monotonic()
        if self.degraded is not None:
            return now >= self.next_probe
        return any(now >= m[2] for m in list(self.masters_down.values()))

    def probe(self) -> bool:
        """Try the pool again (worker thread): a fresh client, every node answers PING, the cluster is ok."""
        if self.degraded is None:
            return self._probe_masters()
        self.retries += 1
        self._drop_client()
        try:
            c = self.client()
            if self.cluster:
                from redis.cluster import RedisCluster

                c.ping(target_nodes=RedisCluster.ALL_NODES)
                info = c.cluster_info(target_nodes=RedisCluster.ALL_NODES)
                states = info.values() if isinstance(info, dict) and "cluster_state" not in info else [info]
                if any(isinstance(s, dict) and s.get("cluster_state") != "ok" for s in states):
                    raise ConnectionError("cluster_state is not ok")
            else:
                c.ping()
        except Exception as exc:
            self._failed("probe", exc)
            return False
        with self._lock:
            was = self.degraded
            self.degraded = None
            self._backoff_ms = 0
            self.recoveries += 1
            self.masters_down.clear()
        log.warning("pool %s is back after %.1fs (%s); using it again", self.url,
                    self._monotonic() - self.degraded_since, was)
        return True

    def _probe_masters(self) -> bool:
        """Probe the degraded masters that are due (worker thread): refresh the slot map first (after a failover
        the slots have a new master), then PING each; a master that answers, or no longer serves slots, is back."""
        c = self._client
        if c is None:
            self.masters_down.clear()
            return True
        self.retries += 1
        try:
            c.nodes_manager.initialize()
        except Exception as exc:
            log.warning("pool slot map refresh failed: %s: %s", type(exc).__name__, exc)
        primaries = {n.name: n for n in c.get_primaries()}
        now = self._monotonic()
        back = True
        for name, state in list(self.masters_down.items()):
            if now < state[2]:
                back = False
                continue
            node = primaries.get(name)
            try:
                if node is not None:
                    c.ping(target_nodes=node)
            except Exception as exc:
                self._master_failed(name, "probe", exc)
                back = False
                continue
            with self._lock:
                self.masters_down.pop(name, None)
                self.master_recoveries += 1
            log.warning("pool master %s is back after %.1fs; using it again", name, now - state[3])
        return back
