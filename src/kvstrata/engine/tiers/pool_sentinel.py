"""Sentinel pools (``redis-sentinel://``): the pool is the current master of a Sentinel-monitored service.

The client is redis-py's ``Sentinel(...).master_for(service)``: each new connection asks the sentinels for the
master's address, and a connection to a master that has become a replica fails (``READONLY`` is turned into a
connection error by redis-py), so the pool's ordinary single-server health applies: a fault degrades the pool,
and the probe builds a fresh client, whose first connection finds the master the sentinels promoted.
``check_sentinels`` is the startup check's sentinel part: a clear message when no sentinel answers or when none
knows the service.
"""

from __future__ import annotations

from typing import Any

from kvstrata.engine.tiers.pool_url import PoolUrl


def _sentinel_kwargs(url: PoolUrl, common: dict[str, Any]) -> dict[str, Any]:
    # The sentinels get the timeouts (and no retries) but not the data nodes' auth or db: theirs is separate.
    keep = {k: v for k, v in common.items() if k.startswith("socket_") or k == "retry"}
    return {**keep, **url.sentinel_kwargs}


def sentinel_client(url: PoolUrl, common: dict[str, Any]) -> Any:
    """A redis-py client of the service's current master (``common``: the connection options with the URL's)."""
    from redis.sentinel import Sentinel

    sentinel = Sentinel(url.nodes, sentinel_kwargs=_sentinel_kwargs(url, common), **common)
    return sentinel.master_for(url.service, **common)


def close_pool_client(client: Any) -> None:
    """Close a pool client or connection without raising (it may be broken), and the sentinel connections behind
    a ``sentinel_client`` (the master's are closed by ``close``)."""
    try:
        client.close()
    except Exception:  # closing a broken client must not raise
        pass
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for s in getattr(manager, "sentinels", ()):
        try:
            s.close()
        except Exception:  # closing a broken connection must not raise
            pass


def check_sentinels(url: PoolUrl, common: dict[str, Any]) -> None:
    """At startup: at least one sentinel answers and one knows the service. Raises ValueError saying which."""
    import redis

    kwargs = _sentinel_kwargs(url, common)
    failures: list[str] = []
    answered = refused = 0
    for host, port in url.nodes:
        conn = redis.Redis(host=host, port=port, **kwargs)
        try:
            conn.sentinel_master(url.service)
            return
        except redis.AuthenticationError as exc:
            answered += 1
            refused += 1
            failures.append(f"{host}:{port}: authentication failed ({exc})")
        except redis.ResponseError as exc:
            answered += 1
            failures.append(f"{host}:{port}: {exc}")
        except Exception as exc:
            failures.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
        finally:
            conn.close()
    if not answered:
        raise ValueError(f"pool {url.safe}: no sentinel answers ({'; '.join(failures)})")
    if refused == answered:
        raise ValueError(f"pool {url.safe}: sentinel authentication failed (sentinel_password; "
                         f"{'; '.join(failures)})")
    raise ValueError(f"pool {url.safe}: no sentinel knows the service {url.service!r} ({'; '.join(failures)})")
