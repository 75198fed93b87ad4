"""The SDK's store path on FastClient (no redis-py internals) against real servers, and the sync and asyncio
clients' shared store planning (``store(keys=)``, skip_existing, start, counters).

Plain Redis runs as a real ``redis-server``: the SDK then writes SET PX; its error replies (OOM, NOPERM) reach
the caller as the redis-py exceptions they always were; a connection the server closed while idle is replaced;
a stopped or vanished server raises redis-py's TimeoutError / ConnectionError."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal

import numpy as np
import pytest
import redis
from tests.conftest import ServerProc
from tests.integration.polling import wait_for
from tests.integration.support import make_kv

from kvstrata.client import AsyncKVCacheClient, KVCacheClient, Namespace

CS = 16
needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")


@pytest.fixture
def plain_redis(sockdir):
    """A real redis-server on TCP and a Unix socket, with an ACL user limited to ``kvs:*`` keys."""
    path = os.path.join(sockdir, "redis.sock")
    srv = ServerProc({"unixsocket": path, "databases": "4"}, target="redis").start()
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", "tenant", "on", ">tpw", "+@all", "~kvs:*")
    admin.close()
    yield srv, path
    srv.stop()


def _round_trip(c: KVCacheClient, tokens: list[int], kv: np.ndarray) -> None:
    assert c.store(tokens, kv) == len(tokens) // CS
    assert c._tls.fast is not None  # the values went out on this thread's FastClient
    n, back = c.retrieve(tokens)
    assert n == len(tokens) and np.array_equal(back, kv)


@needs_redis
def test_plain_redis_over_tcp_unix_and_acl_user(plain_redis) -> None:
    srv, path = plain_redis
    tokens = list(range(4 * CS))
    kv = make_kv(4 * CS, layers=4, heads=4, dim=128)  # 64 KB chunks: sent unjoined
    admin = srv.client()
    for url, ns in ((f"redis://{srv.host}:{srv.port}", "tcp"), (f"unix://{path}", "unix"),
                    (f"redis://tenant:tpw@{srv.host}:{srv.port}", "acl")):
        with KVCacheClient(url, Namespace(ns), chunk_size=CS, compression="raw") as c:
            _round_trip(c, tokens, kv)
            assert c._is_plain()
            key = c.keys(tokens)[0]
            assert 0 < admin.pttl(key) <= c.ttl_ms() and admin.type(key) == b"string"  # SET ... PX
            assert c.stats.stored_chunks == 4 and c.stats.bytes_sent > kv.nbytes
            assert c.store(tokens, kv) == 0 and c.stats.skipped_chunks == 4
    # The ACL user outside its key pattern: the write is refused as redis-py refuses it.
    with KVCacheClient(f"redis://tenant:tpw@{srv.host}:{srv.port}", Namespace("acl"), chunk_size=CS) as c:
        with pytest.raises(redis.exceptions.NoPermissionError):
            c.store(tokens, kv, keys=[b"other:%d" % i for i in range(4)], skip_existing=False)
        assert admin.exists(b"other:0") == 0
        assert c.store(tokens, kv, skip_existing=False) == 4  # the same connection, still in step
    with KVCacheClient(f"redis://tenant:wrong@{srv.host}:{srv.port}", Namespace("acl"), chunk_size=CS) as c:
        with pytest.raises(redis.exceptions.AuthenticationError):
            c.store(tokens, kv, skip_existing=False)
    admin.close()


@needs_redis
def test_database_number_is_selected_on_the_sdk_transport(plain_redis) -> None:
    srv, _ = plain_redis
    tokens = list(range(2 * CS))
    kv = make_kv(2 * CS)
    with KVCacheClient(f"redis://{srv.host}:{srv.port}/2", Namespace("db"), chunk_size=CS) as c:
        assert c.store(tokens, kv) == 2
        assert c._fast().call(b"CLIENT", b"INFO").split(b" db=")[1].startswith(b"2 ")  # FastClient SELECTed 2
        assert c.pool._created_connections == 0  # nothing through redis-py
        db2, db0 = srv.client(db=2), srv.client()
        assert all(db2.exists(k) for k in c.keys(tokens)) and not any(db0.exists(k) for k in c.keys(tokens))
        n, back = c.retrieve(tokens)
        assert n == 2 * CS and np.array_equal(back, kv)
        db2.close()
        db0.close()


@needs_redis
def test_out_of_memory_is_redis_py_error_and_connection_stays_usable() -> None:
    srv = ServerProc({"maxmemory": "8mb", "maxmemory-policy": "noeviction"}, target="redis").start()
    try:
        big = make_kv(8 * CS, layers=8, heads=8, dim=128)  # 8 chunks of 256 KB = 2 MB of values
        with KVCacheClient(f"redis://{srv.host}:{srv.port}", Namespace("oom"), chunk_size=CS) as c:
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                for start in range(0, 8 * CS * 16, 8 * CS):  # up to 32 MB: the budget runs out on the way
                    c.store(list(range(start, start + 8 * CS)), big)
            fc = c._tls.fast
            srv.client().flushall()
            assert c.store(list(range(2 * CS)), big[:, :, :, :2 * CS], skip_existing=False) == 2
            assert c._tls.fast is fc  # every reply was read: the connection was kept
    finally:
        srv.stop()


def test_connection_closed_while_idle_is_replaced(make_server) -> None:
    srv = make_server()
    tokens = list(range(2 * CS))
    kv = make_kv(2 * CS)
    with KVCacheClient(f"redis://{srv.host}:{srv.port}", Namespace("idle"), chunk_size=CS) as c:
        assert c.store(tokens, kv) == 2
        fc = c._tls.fast
        cid = fc.call(b"CLIENT", b"ID")
        admin = srv.client()
        assert admin.execute_command("CLIENT", "KILL", "ID", cid) == 1
        wait_for(fc.broken, what="the killed connection seen as closed")
        assert c.store(tokens, kv, skip_existing=False) == 2
        assert c._tls.fast is not fc and c._tls.fast.call(b"CLIENT", b"ID") != cid
        admin.close()


def test_stopped_server_times_out_and_gone_server_is_connection_error(make_server) -> None:
    srv = make_server()
    tokens = list(range(2 * CS))
    kv = make_kv(2 * CS)
    c = KVCacheClient(f"redis://{srv.host}:{srv.port}", Namespace("gone"), chunk_size=CS, socket_timeout=2.0)
    try:
        assert c.store(tokens, kv) == 2
        srv.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(redis.exceptions.TimeoutError):
                c.store(tokens, kv, skip_existing=False)
        finally:
            srv.proc.send_signal(signal.SIGCONT)
        assert c._tls.fast is None  # a connection that timed out mid-reply is out of step: dropped
        assert c.store(tokens, kv, skip_existing=False) == 2
        srv.stop()
        with pytest.raises(redis.exceptions.ConnectionError):
            c.store(tokens, kv, skip_existing=False)
    finally:
        c.close()


def _stored(srv: ServerProc, keys: list[bytes]) -> list[bool]:
    r = srv.client()
    try:
        return [bool(r.exists(k)) for k in keys]
    finally:
        r.close()


def test_async_store_plans_like_the_sync_one(make_server) -> None:
    """Same calls, same answers, same counters: keys=, start, skip_existing, partial last chunk."""
    srv = make_server()
    url = f"redis://{srv.host}:{srv.port}"
    tokens = list(range(5 * CS + 3))
    kv = make_kv(5 * CS + 3)

    def calls(ns: str) -> tuple[list[bytes], list[tuple[str, dict]]]:
        keys = KVCacheClient(None, Namespace(ns), chunk_size=CS, shard_key="user-9").keys(tokens)
        return keys, [("first two", {"start": 3 * CS}), ("keys", {"keys": keys, "start": 2 * CS}),
                      ("again", {"keys": keys}), ("forced", {"keys": keys, "skip_existing": False}),
                      ("past the end", {"start": 9 * CS})]

    def run_sync() -> tuple[list[int], dict]:
        keys, seq = calls("s")
        with KVCacheClient(url, Namespace("s"), chunk_size=CS, batch_size=2) as c:
            got = [c.store(tokens, kv, **kw) for _, kw in seq]
            assert _stored(srv, keys) == [True] * 5
            return got, {k: v for k, v in c.stats.as_dict().items() if k in ("stored_chunks", "skipped_chunks")}

    async def run_async() -> tuple[list[int], dict]:
        keys, seq = calls("a")
        async with AsyncKVCacheClient(url, Namespace("a"), chunk_size=CS, batch_size=2) as c:
            got = [await c.store(tokens, kv, **kw) for _, kw in seq]
            assert _stored(srv, keys) == [True] * 5
            n, back = await c.retrieve(tokens)
            assert n == 0  # stored under keys= (another shard key): the namespace's own keys are not there
            return got, {k: v for k, v in c.stats.as_dict().items() if k in ("stored_chunks", "skipped_chunks")}

    sync_got, sync_stats = run_sync()
    async_got, async_stats = asyncio.run(run_async())
    assert sync_got == [2, 3, 2, 5, 0]
    assert async_got == sync_got and async_stats == sync_stats == {"stored_chunks": 12, "skipped_chunks": 3}


def test_async_store_keys_through_a_local_server(make_server, sockdir) -> None:
    """With a local server the async store runs the sync one in a thread: keys= reaches it."""
    path = os.path.join(sockdir, "kv.sock")
    srv = make_server({"unixsocket": path, "http-port": "0"})
    tokens = list(range(3 * CS))
    kv = make_kv(3 * CS)
    keys = [b"kvs:custom:%d" % i for i in range(3)]

    async def run() -> int:
        async with AsyncKVCacheClient(f"unix://{path}", Namespace("u"), chunk_size=CS) as c:
            assert await c._plane()
            n = await c.store(tokens, kv, keys=keys)
            assert await c.store(tokens, kv, keys=keys) == 0
            return n

    assert asyncio.run(run()) == 3
    assert _stored(srv, keys) == [True] * 3


def test_forked_child_stores_on_its_own_connection(make_server) -> None:
    """A child forked after the parent stored never writes on the parent's inherited socket."""
    srv = make_server()
    kv = make_kv(2 * CS)
    with KVCacheClient(f"redis://{srv.host}:{srv.port}", Namespace("fork"), chunk_size=CS) as c:
        assert c.store(list(range(2 * CS)), kv) == 2
        parent_fc = c._tls.fast
        pid = os.fork()
        if pid == 0:  # the child: store, report through the exit status only
            ok = False
            try:
                ok = c.store(list(range(100, 100 + 2 * CS)), kv) == 2 and c._tls.fast is not parent_fc
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert c.store(list(range(200, 200 + 2 * CS)), kv) == 2 and c._tls.fast is parent_fc
        assert c.lookup(list(range(100, 100 + 2 * CS))) == 2 * CS
