"""Pool URLs, parsed as redis-py parses them, plus the cluster forms.

- ``redis://[user[:password]@]host:port[/db]``, ``rediss://`` (TLS; ``?ssl_ca_certs=...&ssl_certfile=...&
  ssl_keyfile=...`` as in redis-py), ``unix:///path.sock[?db=n]``: one server;
- ``valkey://`` and ``valkeys://``: the same as ``redis://`` and ``rediss://``;
- ``redis-cluster://[user[:password]@]host:port[,host:port...]`` (and ``rediss-cluster://``): a Redis/Valkey
  Cluster reached through any of the listed nodes. A cluster has one database, so ``/db`` other than 0 is refused.

``PoolUrl.safe`` is the URL with the password replaced by ``***``: the only form that logs and INFO show.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_SINGLE = {"redis": "redis", "rediss": "rediss", "valkey": "redis", "valkeys": "rediss", "unix": "unix"}
_CLUSTER = {"redis-cluster": "redis", "rediss-cluster": "rediss", "valkey-cluster": "redis",
            "valkeys-cluster": "rediss"}


@dataclass
class PoolUrl:
    cluster: bool
    nodes: list[tuple[str, int]]
    kwargs: dict[str, Any] = field(default_factory=dict)  # redis-py connection options (auth, db, TLS, path)
    safe: str = ""

    @property
    def password(self) -> str | None:
        return self.kwargs.get("password")


def _mask(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def parse_pool_url(url: str) -> PoolUrl:
    from redis.connection import parse_url as redis_parse_url

    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    safe = _mask(url)
    if scheme in _SINGLE:
        target = _SINGLE[scheme]
        rewritten = target + url[len(scheme):]
        try:
            kwargs = redis_parse_url(rewritten)
        except ValueError as exc:
            raise ValueError(f"bad pool URL {safe!r}: {exc}") from None
        if "," in parts.netloc:
            raise ValueError(f"{scheme}:// names one server; use redis-cluster:// for several ({safe!r})")
        if target == "unix":
            return PoolUrl(False, [], kwargs, safe)
        host, port = kwargs.pop("host", None), kwargs.pop("port", None)
        if not host or not port:
            raise ValueError(f"pool URL needs host:port, got {safe!r}")
        return PoolUrl(False, [(host, int(port))], kwargs, safe)
    if scheme in _CLUSTER:
        netloc = parts.netloc
        auth = ""
        if "@" in netloc:
            auth, netloc = netloc.rsplit("@", 1)
        nodes = []
        for item in netloc.split(","):
            host, _, port = item.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"pool URL node must be host:port, got {item!r}")
            nodes.append((host.strip("[]"), int(port)))
        first = f"{_CLUSTER[scheme]}://{auth + '@' if auth else ''}{nodes[0][0]}:{nodes[0][1]}"
        kwargs = redis_parse_url(urlunsplit(urlsplit(first)._replace(path=parts.path, query=parts.query)))
        kwargs.pop("host", None)
        kwargs.pop("port", None)
        if kwargs.pop("db", 0) not in (0, None):
            raise ValueError(f"a cluster has only database 0 ({safe!r})")
        kwargs.pop("connection_class", None)
        if _CLUSTER[scheme] == "rediss":
            kwargs["ssl"] = True
        return PoolUrl(True, nodes, kwargs, safe)
    raise ValueError(f"pool URL must start with redis://, rediss://, valkey://, unix:// or redis-cluster://, "
                     f"got {safe!r}")
