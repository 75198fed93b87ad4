"""The asyncio SDK client on AsyncFastClient (kvstrata.client.afast), against real servers: stores, lookups and
reads make no redis-py connection; error replies and socket failures reach the caller as the redis-py exceptions
the sync client raises for them; a connection cut mid-reply, or left with replies unread, is never reused.

Also the shared sans-IO parts (kvstrata.client.resp) through AsyncFastClient directly: replies of every kind,
large values received into buffers of their own, a command sent in pieces when the socket buffer fills."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from typing import Any

import numpy as np
import pytest
import redis
from tests.conftest import ServerProc
from tests.integration.support import make_kv
from tests.integration.test_scatter import _Proxy

from kvstrata.client import AsyncKVCacheClient, KVCacheClient, Namespace
from kvstrata.client.afast import AsyncFastClient
from kvstrata.client.resp import RECV_BUFFER, RespError

CS = 16
needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")


def _redis_py_connections(c: AsyncKVCacheClient) -> int:
    """Connections redis-py's asyncio pool has made (idle or lent)."""
    return len(c.pool._available_connections) + len(c.pool._in_use_connections)


def _aclient(url: str, ns: str, **kw: Any) -> AsyncKVCacheClient:
    kw.setdefault("chunk_size", CS)
    kw.setdefault("compression", "raw")
    return AsyncKVCacheClient(url, Namespace(ns), local_plane=False, **kw)


def test_async_client_stores_and_reads_without_redis_py(make_server, sockdir) -> None:
    path = os.path.join(sockdir, "kv.sock")
    srv = make_server({"unixsocket": path, "http-port": "0"})
    tokens = list(range(6 * CS))
    small = make_kv(6 * CS)
    big = make_kv(6 * CS, layers=8, heads=8, dim=128)  # 1 MiB chunks: larger than the receive buffer
    assert big.nbytes // 6 > RECV_BUFFER

    async def run(url: str, ns: str, kv: np.ndarray) -> dict[str, Any]:
        async with _aclient(url, ns, batch_size=4) as c:
            assert await c.store(tokens, kv) == 6
            assert await c.store(tokens, kv) == 0  # EXISTS said they are there
            assert await c.lookup(tokens) == 6 * CS
            n, back = await c.retrieve(tokens)
            assert n == 6 * CS and np.array_equal(back, kv)
            n, chunks = await c.retrieve_chunks(tokens[:3 * CS])
            assert n == 3 * CS and np.array_equal(np.concatenate(chunks, axis=3), kv[:, :, :, :3 * CS])
            assert _redis_py_connections(c) == 0  # every command went out on AsyncFastClient
            assert 1 <= c._conns.created <= 2  # reused, not one per command (two while a window overlaps)
            idle = list(c._conns._idle)
            assert idle
        assert c._conns._idle == [] and all(conn.sock.fileno() < 0 for conn in idle)  # aclose closed them
        return {k: v for k, v in c.stats.as_dict().items() if k != "errors"}

    for url in (f"redis://{srv.host}:{srv.port}", f"unix://{path}"):
        for ns, kv in (("small", small), ("big", big)):
            stats = asyncio.run(run(url, ns + url[:4], kv))
            # The sync client, the same calls: the same counters (bytes sent included).
            with KVCacheClient(url, Namespace(ns + url[:4] + "s"), chunk_size=CS, compression="raw",
                               local_plane=False, batch_size=4) as s:
                s.store(tokens, kv)
                s.store(tokens, kv)
                s.lookup(tokens)
                s.retrieve(tokens)
                s.retrieve_chunks(tokens[:3 * CS])
                want = {k: v for k, v in s.stats.as_dict().items() if k != "errors"}
            assert stats == want


@pytest.fixture
def plain_redis(sockdir):
    """A real redis-server with an ACL user limited to ``kvs:*`` keys and one that may not MGET."""
    srv = ServerProc({"maxmemory": "16mb", "maxmemory-policy": "noeviction"}, target="redis").start()
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", "tenant", "on", ">tpw", "+@all", "~kvs:*")
    admin.execute_command("ACL", "SETUSER", "nomget", "on", ">npw", "+@all", "-mget", "~*")
    admin.close()
    yield srv
    srv.stop()


@needs_redis
def test_async_error_replies_are_the_sync_clients(plain_redis) -> None:
    srv = plain_redis
    base = f"redis://{srv.host}:{srv.port}"
    tokens = list(range(4 * CS))
    kv = make_kv(4 * CS, layers=4, heads=4, dim=128)
    other = [b"other:%d" % i for i in range(4)]
    admin = srv.client()

    async def run() -> None:
        async with _aclient(base.replace("//", "//tenant:tpw@"), "acl") as c:
            assert await c.store(tokens, kv) == 4
            assert await c._is_plain()
            assert 0 < admin.pttl(c.keys(tokens)[0]) <= c.ttl_ms()  # SET ... PX on plain Redis
            (conn,) = c._conns._idle
            with pytest.raises(redis.exceptions.NoPermissionError):
                await c.store(tokens, kv, keys=other, skip_existing=False)
            assert admin.exists(*other) == 0
            assert c._conns._idle == [conn]  # every reply was read: the connection was kept
            n, back = await c.retrieve(tokens)
            assert n == 4 * CS and np.array_equal(back, kv)
        async with _aclient(base.replace("//", "//tenant:wrong@"), "acl") as c:
            with pytest.raises(redis.exceptions.AuthenticationError):
                await c.store(tokens, kv)
        async with _aclient(base.replace("//", "//nomget:npw@"), "acl") as c:
            with pytest.raises(redis.exceptions.NoPermissionError):
                await c.retrieve(tokens)
            assert c._conns._idle == []  # a window whose reply raised is not reused
            assert await c.lookup(tokens) == 4 * CS  # a fresh connection
        async with _aclient(base, "oom") as c:
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                for start in range(0, 256 * CS, 4 * CS):  # up to 64 MB: the 16 MB budget runs out on the way
                    await c.store(list(range(start, start + 4 * CS)), kv)
            assert len(c._conns._idle) == 1
            assert _redis_py_connections(c) == 0

    asyncio.run(run())
    # The sync client raises the same classes for the same replies.
    with KVCacheClient(base.replace("//", "//nomget:npw@"), Namespace("acl"), chunk_size=CS,
                       local_plane=False) as s, pytest.raises(redis.exceptions.NoPermissionError):
        s.retrieve_chunks(tokens)
    admin.close()


def test_async_connection_cut_mid_reply_is_connection_error_and_dropped(make_server) -> None:
    srv = make_server()
    tokens = list(range(4 * CS))
    kv = make_kv(4 * CS, layers=4, heads=4, dim=128)  # 64 KiB chunks
    proxy = _Proxy(srv.host, srv.port)

    async def run() -> None:
        async with _aclient(f"redis://127.0.0.1:{proxy.port}", "cut", prefetch_window=0) as c:
            assert await c.store(tokens, kv) == 4
            proxy.cut_after = kv.nbytes // 8 + 1000  # inside the second value of the first window
            with pytest.raises(redis.exceptions.ConnectionError):
                await c.retrieve(tokens)
            assert proxy.cuts == 1
            assert c._conns._idle == []  # the cut connection was closed, not kept
            n, back = await c.retrieve(tokens)  # a new connection, through the proxy again
            assert n == 4 * CS and np.array_equal(back, kv)

    try:
        asyncio.run(run())
    finally:
        proxy.close()


def test_async_stopped_server_times_out_and_gone_server_is_connection_error(make_server) -> None:
    srv = make_server()
    tokens = list(range(2 * CS))
    kv = make_kv(2 * CS)

    async def run() -> None:
        async with _aclient(f"redis://{srv.host}:{srv.port}", "gone", socket_timeout=1.0) as c:
            assert await c.store(tokens, kv) == 2
            srv.proc.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(redis.exceptions.TimeoutError):
                    await c.store(tokens, kv, skip_existing=False)
            finally:
                srv.proc.send_signal(signal.SIGCONT)
            assert c._conns._idle == []  # timed out mid-reply: out of step, closed
            assert await c.store(tokens, kv, skip_existing=False) == 2
            srv.stop()
            with pytest.raises(redis.exceptions.ConnectionError):
                await c.store(tokens, kv, skip_existing=False)

    asyncio.run(run())


def test_async_fast_client_replies_and_large_sends(make_server) -> None:
    """AsyncFastClient on its own: each reply kind, a value larger than the receive buffer both ways (sent in
    pieces as the socket's buffer fills, received into a buffer of its own), pipelines in one write."""
    srv = make_server()

    async def run() -> None:
        c = await AsyncFastClient.connect(srv.host, srv.port, timeout=10.0)
        try:
            assert await c.call("PING") == b"PONG"
            big = os.urandom(3 * RECV_BUFFER + 17)
            assert await c.call("SET", "k", memoryview(big)) == b"OK"
            assert await c.call("GET", "k") == big
            assert await c.call("GET", "missing") is None
            assert await c.call("EXISTS", "k", "missing") == 1
            with pytest.raises(RespError, match="unknown command"):
                await c.call("NO.SUCH.COMMAND")
            await c.send_many([("SET", "a", "1"), ("MGET", "a", "missing", "k"), ("DEL", "a")])
            assert await c.read_reply() == b"OK"
            assert await c.read_reply() == [b"1", None, big]
            assert await c.read_reply() == 1
            assert not c.broken()
        finally:
            c.close()

    asyncio.run(run())


def test_an_error_inside_an_array_is_its_element_and_the_connection_stays_in_step(plain_redis) -> None:
    """A real Redis answers EXEC with an array whose second element is an error reply: both of the SDK's
    transports return it as a RespError element, read the whole array, and the next reply is the next command's
    (raising at the element, as before, left the rest of the array on the socket)."""
    from kvstrata.client.fast import FastClient

    srv = plain_redis
    script = [(b"MULTI",), (b"SET", b"ctr", b"x"), (b"INCR", b"ctr"), (b"SET", b"after", b"1"), (b"EXEC",)]

    def check(replies: list[Any], ping: Any) -> None:
        exec_reply = replies[-1]
        assert exec_reply[0] == b"OK" and exec_reply[2] == b"OK"
        assert isinstance(exec_reply[1], RespError) and "not an integer" in str(exec_reply[1])
        assert ping == b"PONG"

    c = FastClient(srv.host, srv.port, timeout=10.0)
    try:
        check(c.pipeline(script), c.call(b"PING"))
    finally:
        c.close()

    async def run() -> None:
        a = await AsyncFastClient.connect(srv.host, srv.port, timeout=10.0)
        try:
            await a.send_many(script)
            replies = [await a.read_reply() for _ in script]
            check(replies, await a.call(b"PING"))
        finally:
            a.close()

    asyncio.run(run())
