"""Pool URLs, parsed as redis-py parses them, plus the cluster forms.

- ``redis://[user[:password]@]host:port[/db]``, ``rediss://`` (TLS; ``?ssl_ca_certs=...&ssl_certfile=...&
  ssl_keyfile=...`` as in redis-py), ``unix:///path.sock[?db=n]``: one server;
- ``valkey://`` and ``valkeys://``: the same as ``redis://`` and ``rediss://``;
- ``redis-cluster://[user[:password]@]host:port[,host:port...]`` (and ``rediss-cluster://``): a Redis/Valkey
  Cluster reached through any of the listed nodes. A cluster has one database, so ``/db`` other than 0 is refused;
- ``redis-sentinel://[user[:password]@]host:port[,host:port...]/service_name[/db]`` (and ``valkey-sentinel://``):
  the current master of a Sentinel-monitored service, found through any of the listed sentinels
  (``pool_sentinel``). The user and password are the data nodes'; the sentinels' own are the query options
  ``sentinel_username`` and ``sentinel_password`` (the redis-py ``Sentinel(sentinel_kwargs=...)`` split).

``PoolUrl.safe`` is the URL with every password (also ``sentinel_password=``) replaced by ``***``: the only form
that logs and INFO show.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from kvstrata.redact import redact_url

_SINGLE = {"redis": "redis", "rediss": "rediss", "valkey": "redis", "valkeys": "rediss", "unix": "unix"}
_CLUSTER = {"redis-cluster": "redis", "rediss-cluster": "rediss", "valkey-cluster": "redis",
            "valkeys-cluster": "rediss"}
_SENTINEL = {"redis-sentinel": "redis", "valkey-sentinel": "redis"}
_SENTINEL_AUTH = ("sentinel_username", "sentinel_password")


@dataclass
class PoolUrl:
    cluster: bool
    nodes: list[tuple[str, int]]
    kwargs: dict[str, Any] = field(default_factory=dict)  # redis-py connection options (auth, db, TLS, path)
    safe: str = ""
    service: str | None = None  # a Sentinel service name: ``nodes`` are then the sentinels
    sentinel_kwargs: dict[str, Any] = field(default_factory=dict)  # the sentinels' own auth

    @property
    def password(self) -> str | None:
        return self.kwargs.get("password")


def parse_pool_url(url: str) -> PoolUrl:
    from redis.connection import parse_url as redis_parse_url

    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    safe = redact_url(url)
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
        auth, nodes = _auth_and_nodes(parts.netloc)
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
    if scheme in _SENTINEL:
        return _sentinel_url(parts, safe)
    raise ValueError(f"pool URL must start with redis://, rediss://, valkey://, unix://, redis-cluster:// or "
                     f"redis-sentinel://, "
                     f"got {safe!r}")


def _auth_and_nodes(netloc: str) -> tuple[str, list[tuple[str, int]]]:
    """The ``user:password`` part (as written) and the ``host:port`` list of a multi-host URL."""
    auth = ""
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
    nodes = []
    for item in netloc.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"pool URL node must be host:port, got {item!r}")
        nodes.append((host.strip("[]"), int(port)))
    return auth, nodes


def _sentinel_url(parts: Any, safe: str) -> PoolUrl:
    from redis.connection import parse_url as redis_parse_url

    auth, nodes = _auth_and_nodes(parts.netloc)
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"a sentinel pool URL ends with /service_name[/db], got {safe!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    sentinel = {k[len("sentinel_"):]: v for k, v in query if k in _SENTINEL_AUTH}
    rest = urlencode([(k, v) for k, v in query if k not in _SENTINEL_AUTH])
    db = path[1] if len(path) == 2 else "0"
    first = f"redis://{auth + '@' if auth else ''}{nodes[0][0]}:{nodes[0][1]}/{db}" + (f"?{rest}" if rest else "")
    try:
        kwargs = redis_parse_url(first)
    except ValueError as exc:
        raise ValueError(f"bad pool URL {safe!r}: {exc}") from None
    kwargs.pop("host", None)
    kwargs.pop("port", None)
    return PoolUrl(False, nodes, kwargs, safe, service=path[0], sentinel_kwargs=sentinel)
