"""``endpoint.transport_args``: the SDK's URL (parsed by redis-py, sync or asyncio pool) as the keywords of its own
transport: host/port or Unix path, credentials, database, and a TLS context with redis-py's defaults."""

from __future__ import annotations

import ssl

import pytest
import redis
import redis.asyncio as aredis

from kvstrata.client.endpoint import ssl_context, transport_args


@pytest.mark.parametrize("pools", [redis.ConnectionPool, aredis.ConnectionPool])
def test_urls_become_transport_keywords(pools) -> None:
    a = transport_args(pools.from_url("redis://u:p@10.0.0.1:7000/2", socket_timeout=3.0))
    assert a == {"host": "10.0.0.1", "port": 7000, "unix_path": None, "timeout": 3.0, "password": "p",
                 "username": "u", "db": 2, "ssl_context": None}
    u = transport_args(pools.from_url("unix:///tmp/kv.sock?db=1"))
    assert u["unix_path"] == "/tmp/kv.sock" and u["db"] == 1 and u["ssl_context"] is None
    t = transport_args(pools.from_url("rediss://:pw@127.0.0.1:7001"))
    ctx = t["ssl_context"]
    assert isinstance(ctx, ssl.SSLContext) and t["db"] == 0 and t["password"] == "pw"
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname  # redis-py's defaults


def test_tls_options() -> None:
    ctx = ssl_context({"ssl_cert_reqs": "none"})
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname
    ctx = ssl_context({"ssl_cert_reqs": "optional", "ssl_check_hostname": "false"})
    assert ctx.verify_mode == ssl.CERT_OPTIONAL and not ctx.check_hostname
    with pytest.raises(ValueError, match="ssl_validate_ocsp"):
        ssl_context({"ssl_validate_ocsp": True})  # an option the transport would not apply: refused
    with pytest.raises(ValueError, match="ssl_cert_reqs"):
        ssl_context({"ssl_cert_reqs": "sometimes"})
    with pytest.raises(FileNotFoundError):
        ssl_context({"ssl_ca_certs": "/nonexistent/ca.crt"})
