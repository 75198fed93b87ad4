"""The SDK's own transport (FastClient, AsyncFastClient) over TLS (``rediss://``, a kvstrata TLS port with
client certificates), with a database number in the URL (``SELECT``: served by Redis, refused by kvstrata with a
clear error), and the asyncio pool's bound on open connections. Nothing goes through redis-py's connections."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from urllib.parse import quote

import numpy as np
import pytest
import redis
from tests.conftest import ServerProc
from tests.integration.polling import wait_for
from tests.integration.support import make_kv
from tests.integration.test_tls import _cert, _write

from kvstrata.client import AsyncKVCacheClient, KVCacheClient, Namespace
from kvstrata.client.afast import AsyncFastClient, AsyncFastPool, PoolExhausted
from kvstrata.client.fast import FastClient, RespError

CS = 16
BIG = 512 * 1024  # values larger than the 256 KiB receive buffer: received into buffers of their own
needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    d = tmp_path_factory.mktemp("sdkpki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    _write(d / "ca", _cert("sdk test CA", ca_key, "sdk test CA", ca_key, ca=True), ca_key)
    for name, usage in (("server", ExtendedKeyUsageOID.SERVER_AUTH), ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        _write(d / name, _cert(name, ca_key, "sdk test CA", key, usage=usage), key)
    return d


def _tls_url(srv, certs, *, client_cert: bool = True, ca: bool = True) -> str:
    q = []
    if ca:
        q.append(f"ssl_ca_certs={quote(str(certs / 'ca.crt'))}")
    if client_cert:
        q += [f"ssl_certfile={quote(str(certs / 'client.crt'))}", f"ssl_keyfile={quote(str(certs / 'client.key'))}"]
    return f"rediss://:pw@127.0.0.1:{srv.config['tls-port']}/?" + "&".join(q)


def _kv(n_tokens: int, seed: int) -> np.ndarray:
    return make_kv(n_tokens, seed=seed, layers=8, heads=4, dim=128)  # 512 KiB per 16-token chunk in fp32


def _sync_round(url: str, ns: str) -> tuple[list, list[bytes], KVCacheClient]:
    tokens = list(range(4 * CS))
    kv = _kv(4 * CS, 1)
    c = KVCacheClient(url, Namespace(ns), chunk_size=CS, batch_size=2, prefetch_window=2)
    got: list = [c.store(tokens, kv), c.store(tokens, kv), c.lookup(tokens)]
    n, back = c.retrieve(tokens)  # scatter receive
    got.append(n)
    assert np.array_equal(back, kv)
    buf = np.zeros_like(kv)
    assert c.retrieve(tokens, out=buf)[0] == 4 * CS and np.array_equal(buf, kv)
    for reuse in (False, True):
        n, chunks = c.retrieve_chunks(tokens, reuse_buffers=reuse)
        assert n == 4 * CS and np.array_equal(np.concatenate(chunks, axis=3), kv)
    got += [c.delete(tokens[:CS]), c.lookup(tokens), c.clear(), c.lookup(tokens)]
    return got, c.keys(tokens), c


async def _async_round(url: str, ns: str, **kw) -> tuple[list, list[AsyncFastClient], int]:
    tokens = list(range(4 * CS))
    kv = _kv(4 * CS, 1)
    async with AsyncKVCacheClient(url, Namespace(ns), chunk_size=CS, batch_size=2, prefetch_window=2,
                                  **kw) as c:
        got: list = [await c.store(tokens, kv), await c.store(tokens, kv), await c.lookup(tokens)]
        n, back = await c.retrieve(tokens)
        got.append(n)
        assert np.array_equal(back, kv)
        got += [await c.delete(tokens[:CS]), await c.lookup(tokens), await c.clear(), await c.lookup(tokens)]
        conns = list(c._conns._idle)
        redis_py = len(c.pool._available_connections) + len(c.pool._in_use_connections)
        return got, conns, redis_py


EXPECT = [4, 0, 4 * CS, 4 * CS, 1, 0, 3, 0]


def test_sdk_over_tls_with_client_certificates(make_server, certs) -> None:
    srv = make_server({"tls-port": str(_free()), "tls-cert-file": certs / "server.crt",
                       "tls-key-file": certs / "server.key", "tls-ca-cert-file": certs / "ca.crt",
                       "requirepass": "pw"})
    url = _tls_url(srv, certs)
    got, keys, c = _sync_round(url, "tls-s")
    try:
        assert got == EXPECT
        assert isinstance(c._tls.fast.sock, ssl.SSLSocket)  # the SDK's own connection, encrypted
        assert c.pool._created_connections == 0  # nothing through redis-py
        assert c._arena() is None  # a TLS URL never maps the arena, even on this host
    finally:
        c.close()
    got, conns, redis_py = asyncio.run(_async_round(url, "tls-a"))
    assert got == EXPECT and redis_py == 0
    assert conns and all(isinstance(conn.sock, ssl.SSLSocket) for conn in conns)
    # Without a client certificate (the server requires one), or without the CA: a clear connection error.
    for bad in (_tls_url(srv, certs, client_cert=False), _tls_url(srv, certs, ca=False)):
        with KVCacheClient(bad, Namespace("tls-bad"), chunk_size=CS, socket_timeout=5) as b:
            with pytest.raises(redis.ConnectionError):
                b.lookup(list(range(CS)))

        async def bad_async(bad: str = bad) -> None:
            async with AsyncKVCacheClient(bad, Namespace("tls-bad"), chunk_size=CS, socket_timeout=5) as b:
                with pytest.raises(redis.ConnectionError):
                    await b.lookup(list(range(CS)))

        asyncio.run(bad_async())
    assert srv.alive()
    # A TLS connection left idle (the server's TLS 1.3 session tickets arrive unasked) is still reused.
    fc = FastClient("127.0.0.1", srv.config["tls-port"], password="pw", ssl_context=_ctx(certs))
    try:
        assert fc.call(b"PING") in ("PONG", b"PONG")
        wait_for(lambda: not fc.broken(), timeout=5, what="an idle TLS connection to read healthy")
        assert fc.call(b"ECHO", b"x" * BIG) == b"x" * BIG
    finally:
        fc.close()


def _ctx(certs) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    ctx.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
    return ctx


def _free() -> int:
    from kvstrata.bench.procs import free_port

    return free_port()


def test_a_database_number_kvstrata_refuses_clearly(make_server) -> None:
    srv = make_server()
    url = f"redis://{srv.host}:{srv.port}/3"
    with KVCacheClient(url, Namespace("db"), chunk_size=CS) as c:
        with pytest.raises(redis.ResponseError, match="SELECT 3.*database 0 only"):
            c.store(list(range(CS)), make_kv(CS))
    assert srv.client().dbsize() == 0

    async def run() -> None:
        async with AsyncKVCacheClient(url, Namespace("db"), chunk_size=CS) as c:
            with pytest.raises(redis.ResponseError, match="SELECT 3.*database 0 only"):
                await c.lookup(list(range(CS)))

    asyncio.run(run())
    with pytest.raises(RespError, match="SELECT 3"):
        FastClient(srv.host, srv.port, db=3)
    got, _, c = _sync_round(f"redis://{srv.host}:{srv.port}/0", "db0")  # database 0 is fine
    c.close()
    assert got == EXPECT


@needs_redis
def test_a_database_number_on_redis_selects_it() -> None:
    srv = ServerProc({"databases": "4"}, target="redis").start()
    try:
        url = f"redis://{srv.host}:{srv.port}/3"
        got, keys, c = _sync_round(url, "db3-s")
        try:
            assert got == [4, 0, 4 * CS, 4 * CS, 1, 0, 3, 0]
            assert c.pool._created_connections == 0
            assert c.store(list(range(CS)), make_kv(CS)) == 1
        finally:
            c.close()
        assert srv.client(db=3).dbsize() == 1 and srv.client().dbsize() == 0  # in database 3, not 0
        got, _, redis_py = asyncio.run(_async_round(url, "db3-a"))
        assert got == EXPECT and redis_py == 0
        assert srv.client(db=3).dbsize() == 1 and srv.client().dbsize() == 0
    finally:
        srv.stop()


def test_async_pool_bounds_every_connection_not_only_the_idle(make_server) -> None:
    srv = make_server()
    url = f"redis://{srv.host}:{srv.port}"
    tokens = list(range(8 * CS))
    kv = make_kv(8 * CS, seed=2)

    async def run() -> None:
        async with AsyncKVCacheClient(url, Namespace("bound"), chunk_size=CS, max_connections=2,
                                      socket_timeout=5, prefetch_window=1) as c:
            assert await c.store(tokens, kv) == 8
            # Twelve calls at once share two connections: they wait their turn instead of opening more.
            results = await asyncio.gather(*[c.retrieve(tokens) for _ in range(6)],
                                           *[c.lookup(tokens) for _ in range(6)])
            assert all(n == 8 * CS and np.array_equal(a, kv) for n, a in results[:6])
            assert results[6:] == [8 * CS] * 6
            assert c._conns.created <= 2 and c._conns.lent == 0

    asyncio.run(run())


def test_async_pool_waits_for_a_connection_then_says_it_is_exhausted(make_server) -> None:
    srv = make_server()

    async def run() -> None:
        made = []

        async def connect() -> AsyncFastClient:
            conn = await AsyncFastClient.connect(srv.host, srv.port, timeout=5)
            made.append(conn)
            return conn

        pool = AsyncFastPool(connect, 1, wait_timeout=0.2)
        held = await pool.get()
        with pytest.raises(PoolExhausted, match="all 1 connections of the pool are in use"):
            await pool.get()
        assert pool.lent == 1 and len(made) == 1
        # A waiter gets the connection given back, not a new one.
        pool.wait_timeout = 10
        waiter = asyncio.ensure_future(pool.get())
        deadline = asyncio.get_running_loop().time() + 5
        while pool.waiting == 0 and asyncio.get_running_loop().time() < deadline:  # a condition, with a deadline
            await asyncio.sleep(0.01)
        assert not waiter.done()
        pool.put(held, True)
        got = await asyncio.wait_for(waiter, 5)
        assert got is held and len(made) == 1
        assert await got.call(b"PING") in ("PONG", b"PONG")
        # A connection given back unclean is closed, and its room goes to a new one.
        pool.put(got, False)
        fresh = await pool.get()
        assert fresh is not held and len(made) == 2 and held.sock.fileno() < 0
        pool.put(fresh, True)
        pool.close()
        assert fresh.sock.fileno() < 0

    asyncio.run(run())

    async def client_side() -> None:
        async with AsyncKVCacheClient(f"redis://{srv.host}:{srv.port}", Namespace("x"), chunk_size=CS,
                                      max_connections=1, socket_timeout=1.0) as c:
            assert await c.lookup(list(range(CS))) == 0
            held = await c._conns.get()
            with pytest.raises(redis.ConnectionError, match="connections of the pool are in use"):
                await c.lookup(list(range(CS)))
            c._conns.put(held, True)
            assert await c.lookup(list(range(CS))) == 0  # served again once it is back

    asyncio.run(client_side())


def test_async_pool_serves_several_event_loops_and_skips_cancelled_waiters(make_server) -> None:
    srv = make_server()
    c = AsyncKVCacheClient(f"redis://{srv.host}:{srv.port}", Namespace("loops"), chunk_size=CS, max_connections=1,
                           socket_timeout=5)

    async def burst() -> None:
        assert await asyncio.gather(*[c.lookup(list(range(CS))) for _ in range(4)]) == [0] * 4

    asyncio.run(burst())
    asyncio.run(burst())  # waiting again, in another event loop: the same pool

    async def cancelled() -> None:
        pool = c._conns
        held = await pool.get()
        first, second = asyncio.ensure_future(pool.get()), asyncio.ensure_future(pool.get())
        deadline = asyncio.get_running_loop().time() + 5
        while pool.waiting < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        pool.put(held, True)
        got = await asyncio.wait_for(second, 5)  # the cancelled waiter's turn went to the next
        assert got is held
        pool.put(got, True)
        assert pool.lent == 0 and pool.waiting == 0 and pool.created == 1

    asyncio.run(cancelled())
    asyncio.run(c.aclose())
