"""The SDK's small commands (the TAIR.KV.VERSION probe, EXISTS of lookups and skip_existing, TAIR.KV.PREFETCH,
DEL, the SCAN of clear) on the SDK's own transport, sync (FastClient) and asyncio (AsyncFastClient): the same
answers from both, no redis-py connection made, error replies as redis-py's exceptions, and a database-number
URL served on the same transport (SELECT at connect)."""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

import pytest
import redis
from tests.conftest import ServerProc
from tests.integration.support import make_kv

from kvstrata.client import AsyncKVCacheClient, KVCacheClient, Namespace

CS = 16
needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")


def _sync_ops(url: str, ns: str, **kw: Any) -> tuple[list[Any], int]:
    """Store, lookups, prefetch, delete and clear with the sync client: their answers, and the connections
    redis-py made."""
    tokens = list(range(6 * CS))
    kv = make_kv(6 * CS)
    with KVCacheClient(url, Namespace(ns), chunk_size=CS, local_plane=False, batch_size=4, **kw) as c:
        got = [c.store(tokens, kv), c.store(tokens, kv), c.lookup(tokens), c.prefetch(tokens),
               c.prefetch([]), c.delete(tokens[:2 * CS]), c.lookup(tokens), c.store(tokens, kv),
               c.clear(), c.lookup(tokens), c.clear(), c.delete(tokens)]
        return got, c.pool._created_connections


async def _async_ops(url: str, ns: str, **kw: Any) -> tuple[list[Any], int]:
    tokens = list(range(6 * CS))
    kv = make_kv(6 * CS)
    async with AsyncKVCacheClient(url, Namespace(ns), chunk_size=CS, local_plane=False, batch_size=4,
                                  **kw) as c:
        got = [await c.store(tokens, kv), await c.store(tokens, kv), await c.lookup(tokens),
               await c.prefetch(tokens), await c.prefetch([]), await c.delete(tokens[:2 * CS]),
               await c.lookup(tokens), await c.store(tokens, kv), await c.clear(), await c.lookup(tokens),
               await c.clear(), await c.delete(tokens)]
        return got, len(c.pool._available_connections) + len(c.pool._in_use_connections)


def test_small_commands_on_the_sdk_transport(make_server) -> None:
    srv = make_server()
    url = f"redis://{srv.host}:{srv.port}"
    admin = srv.client()
    for i in range(2500):  # other namespaces' keys: clear must page through them (SCAN COUNT 1000) and keep them
        admin.set(b"kvs:other:%d" % i, b"x")
    sync_got, sync_redis_py = _sync_ops(url, "small-s")
    async_got, async_redis_py = asyncio.run(_async_ops(url, "small-a"))
    assert sync_got[:3] == [6, 0, 6 * CS] and sync_got[5:] == [2, 0, 2, 6, 0, 0, 0]
    assert isinstance(sync_got[3], int) and sync_got[4] == 0
    assert async_got == sync_got
    assert sync_redis_py == 0 and async_redis_py == 0  # nothing went through redis-py
    assert admin.dbsize() == 2500
    admin.close()


@needs_redis
def test_small_commands_on_plain_redis_errors_and_database_number() -> None:
    srv = ServerProc({"databases": "4"}, target="redis").start()
    try:
        admin = srv.client()
        admin.execute_command("ACL", "SETUSER", "noscan", "on", ">pw", "+@all", "-scan", "~*")
        base = f"redis://{srv.host}:{srv.port}"
        sync_got, n = _sync_ops(base, "plain-s")
        assert n == 0 and sync_got[:3] == [6, 0, 6 * CS] and sync_got[3:5] == [0, 0]  # no PREFETCH on Redis
        assert asyncio.run(_async_ops(base, "plain-a")) == (sync_got, 0)
        # A database number: the same transport selects it, with the same answers.
        db_got, n = _sync_ops(base + "/2", "db-s")
        assert db_got == sync_got and n == 0
        assert asyncio.run(_async_ops(base + "/2", "db-a")) == (sync_got, 0)
        assert admin.dbsize() == 0 and srv.client(db=2).dbsize() == 0  # each clear() emptied its namespace
        # An error reply: the redis-py exception, from both clients.
        noscan = base.replace("//", "//noscan:pw@")
        with KVCacheClient(noscan, Namespace("n"), chunk_size=CS) as c:
            assert c.store(list(range(CS)), make_kv(CS)) == 1
            with pytest.raises(redis.exceptions.NoPermissionError):
                c.clear()
            assert c.lookup(list(range(CS))) == CS  # the connection stays in step

        async def run() -> None:
            async with AsyncKVCacheClient(noscan, Namespace("n"), chunk_size=CS) as c:
                with pytest.raises(redis.exceptions.NoPermissionError):
                    await c.clear()
                assert await c.lookup(list(range(CS))) == CS

        asyncio.run(run())
        admin.close()
    finally:
        srv.stop()
