"""Reaching the pool: the redis-py client (created lazily, off the loop), the startup check, and one pipeline per
healthy master (``_run``), so that a hung or failed master costs only its own keys.

``PoolClient`` is a mixin of ``PoolTier`` (pool.py), which owns the state; health bookkeeping (``_failed``,
``_master_failed``, ``masters_down``) is ``pool_health``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kvstrata.engine.tiers.pool_health import PoolUnavailableError, _is_fault
from kvstrata.engine.tiers.pool_sentinel import check_sentinels, close_pool_client, sentinel_client

log = logging.getLogger("kvstrata.pool")


class _Targeted:
    """A pipeline whose every command names its master. Without ``target_nodes`` redis-py's cluster pipeline asks
    its default node for the keys of an EVAL (COMMAND GETKEYS): a hung default node would hang every master's
    writes."""

    def __init__(self, pipe: Any, node: Any) -> None:
        self.pipe = pipe
        self.kw = {"target_nodes": node} if node is not None else {}

    def execute_command(self, *args: Any) -> Any:
        return self.pipe.execute_command(*args, **self.kw)

    def get(self, name: bytes) -> Any:
        return self.execute_command("GET", name)

    def getrange(self, name: bytes, start: int, end: int) -> Any:
        return self.execute_command("GETRANGE", name, start, end)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        return self.pipe.execute(raise_on_error=raise_on_error)



class PoolClient:
    """The redis-py client and per-master pipelines of a ``PoolTier``."""

    _client: Any
    cluster: bool
    masters_down: dict[str, list[Any]]
    degraded: str | None
    prefix: bytes

    # ---- the redis-py client (created lazily, off the loop) ----
    def _common(self) -> dict[str, Any]:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        return {
            "socket_timeout": self.timeout_ms / 1000,
            "socket_connect_timeout": self.connect_timeout_ms / 1000,
            "retry": Retry(NoBackoff(), 0),
            **self._url.kwargs,
        }

    def _connect(self) -> Any:
        common = self._common()
        if self.cluster:
            from redis.cluster import ClusterNode, RedisCluster

            # No retries (``retry`` above): a hung master costs at most one pool-timeout per request.
            return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in self.nodes],
                                require_full_coverage=False, **common)
        import redis

        if self._url.service is not None:
            return sentinel_client(self._url, common)
        if self.nodes:
            host, port = self.nodes[0]
            return redis.Redis(host=host, port=port, **common)
        return redis.Redis(**common)  # unix socket: the path is in the URL's options

    def client(self) -> Any:
        c = self._client
        if c is None:
            with self._lock:
                c = self._client
                if c is None:
                    c = self._client = self._connect()
        return c

    def _drop_client(self) -> None:
        with self._lock:
            c, self._client = self._client, None
        if c is not None:
            close_pool_client(c)

    def pool_key(self, key: bytes) -> bytes:
        return self.prefix + key

    def check_connect(self) -> None:
        """At startup (off the loop): every node answers (for redis-sentinel://, a sentinel knows the service and
        its master answers), the endpoint is what the URL says (a cluster for redis-cluster://, a single server
        otherwise), and the pool's memory policy is read (a warning when it
        is ``noeviction`` or maxmemory is unset). Raises ValueError with a clear message."""
        import redis

        try:
            if self._url.service is not None:
                check_sentinels(self._url, self._common())
            c = self.client()
            if self.cluster:
                from redis.cluster import RedisCluster

                c.ping(target_nodes=RedisCluster.ALL_NODES)
                nodes = c.get_primaries()
                configs = [c.config_get("maxmemory*", target_nodes=n) for n in nodes]
            else:
                c.ping()
                if int(c.info("cluster").get("cluster_enabled", 0)):
                    raise ValueError(f"pool {self.url} is a Redis Cluster node: use redis-cluster://")
                configs = [c.config_get("maxmemory*")]
        except ValueError:
            raise
        except redis.AuthenticationError as exc:
            raise ValueError(f"pool {self.url}: authentication failed ({exc})") from None
        except redis.ResponseError as exc:
            if "cluster" in str(exc).lower() or "unknown command" in str(exc).lower():
                raise ValueError(f"pool {self.url}: not a Redis Cluster ({exc}); use redis:// for one server") \
                    from None
            if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
                raise ValueError(f"pool {self.url}: authentication failed ({exc})") from None
            configs = []  # CONFIG renamed or forbidden: the policy stays unknown
        except Exception as exc:
            self._drop_client()
            raise ValueError(f"pool {self.url} unreachable: {type(exc).__name__}: {exc}") from None
        policies = {str(cfg.get("maxmemory-policy", "")) for cfg in configs}
        unset = any(str(cfg.get("maxmemory", "0")) == "0" for cfg in configs)
        self.maxmemory_policy = ",".join(sorted(policies))
        if configs and (unset or "noeviction" in policies):
            log.warning("pool %s: maxmemory %s, maxmemory-policy %s; the pool can fill up (writes are then "
                        "refused with -OOM): set maxmemory and an allkeys-* policy", self.url,
                        "unset" if unset else "set", self.maxmemory_policy)

    def _grouped(self, keys: list[bytes]) -> tuple[dict[str, tuple[Any, list[int]]], list[int]]:
        """Indexes of ``keys`` per healthy master (with its redis-py node), and those whose master is degraded."""
        groups: dict[str, tuple[Any, list[int]]] = {}
        skipped: list[int] = []
        for i, key in enumerate(keys):
            name, node = self._master(key) if self.cluster else ("", None)
            if name and name in self.masters_down:
                skipped.append(i)
            else:
                groups.setdefault(name, (node, []))[1].append(i)
        return groups, skipped

    def _fault(self, name: str, what: str, exc: BaseException) -> None:
        # Any fault of one master's pipeline (connection, timeout, CLUSTERDOWN, MOVED after a failover) is that
        # master's: its probe refreshes the slot map, so keys whose slots moved find their new master.
        if name:
            self._master_failed(name, what, exc)
        else:
            self._failed(what, exc)

    def _run(self, keys: list[bytes], what: str, add: Callable[[Any, int], None],
             per_key: int = 1) -> tuple[list[Any], list[int]]:
        """One pipeline per healthy master over ``keys`` (``add(pipe, i)`` queues key i's ``per_key`` commands).
        Returns the results (a tuple of ``per_key`` replies each when more than one; an exception for each key
        whose master is degraded or failed now) and the failed indexes; a fault of one master degrades that master
        only (the whole pool for one server or a cluster-wide fault)."""
        c = self.client()
        groups, skipped = self._grouped(keys)
        out: list[Any] = [None] * len(keys)
        failed = list(skipped)
        for i in skipped:
            out[i] = PoolUnavailableError(f"pool master degraded ({self.down_reason(keys[i])})")
        for name, (node, idx) in groups.items():
            try:
                pipe = _Targeted(c.pipeline(transaction=False), node)
                for i in idx:
                    add(pipe, i)
                res = pipe.execute(raise_on_error=False)
                fault = next((r for r in res if isinstance(r, BaseException) and _is_fault(r)), None)
                if fault is not None:
                    raise fault
            except Exception as exc:
                self._fault(name, what, exc)
                if self.degraded is not None:
                    raise
                for i in idx:
                    out[i] = exc
                failed.extend(idx)
                continue
            if per_key > 1:
                res = [tuple(res[j:j + per_key]) for j in range(0, len(res), per_key)]
            for i, r in zip(idx, res, strict=True):
                out[i] = r
        return out, failed
