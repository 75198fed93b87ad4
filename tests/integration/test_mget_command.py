"""The SDK's reads into reusable buffers send the same MGET as its other reads: ``TAIR.KV.MGET`` on kvstrata
(its ``consistency`` level, STRONG by default with a pool, and the ACL rules of that command), plain ``MGET`` on
Redis. Before, ``FastClient.mget_into`` always sent plain MGET: a tenant allowed TAIR.KV.MGET but not MGET had
every such read refused and silently read again through redis-py."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from tests.conftest import ServerProc
from tests.integration.support import make_kv

from kvstrata.client import KVCacheClient, Namespace

CS = 16


def _calls(r, name: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def _read_twice(url: str, **kw) -> KVCacheClient:
    tokens = list(range(8 * CS))
    kv = make_kv(8 * CS)
    c = KVCacheClient(url, Namespace("mget"), chunk_size=CS, local_plane=False, **kw)
    assert c.store(tokens, kv) == 8
    fc = c._tls.fast
    for overlap in (False, True):
        c.overlap = overlap
        n, chunks = c.retrieve_chunks(tokens, reuse_buffers=True)
        assert n == len(tokens) and np.array_equal(np.concatenate(chunks, axis=3), kv)
    assert c._tls.fast is fc  # never dropped for a refused read
    assert c.pool._created_connections == 0  # and never read again through redis-py
    return c


def test_reuse_buffer_reads_send_tair_kv_mget(make_server) -> None:
    srv = make_server()
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", "nomget", "on", ">pw", "+@all", "-mget", "~*")
    c = _read_twice(f"redis://nomget:pw@{srv.host}:{srv.port}", prefetch_window=2)
    c.close()
    assert _calls(admin, "mget") == 0 and _calls(admin, "tair.kv.mget") >= 2
    admin.close()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_reuse_buffer_reads_send_plain_mget_to_redis() -> None:
    srv = ServerProc({}, target="redis").start()
    try:
        c = _read_twice(f"redis://{srv.host}:{srv.port}")
        c.close()
        admin = srv.client()
        assert _calls(admin, "mget") >= 2
        admin.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("path", ["bytes", "reuse_buffers", "scatter", "async"])
def test_a_user_refused_prefetch_still_reads_every_window(make_server, path: str) -> None:
    """A read window's PREFETCH is a hint: a user whose ACL allows reads but not TAIR.KV.PREFETCH reads the whole
    prefix on every read path (before, every read failed with NOPERM), and after the first refusal the client
    stops sending it."""
    srv = make_server()
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", "nopf", "on", ">pw", "+@all", "-tair.kv.prefetch", "~*")
    url = f"redis://nopf:pw@{srv.host}:{srv.port}"
    tokens = list(range(8 * CS))
    kv = make_kv(8 * CS)
    c = KVCacheClient(url, Namespace("hint"), chunk_size=CS, local_plane=False, prefetch_window=2, batch_size=2)
    try:
        assert c.store(tokens, kv) == 8
        for _ in range(2):
            if path == "async":
                import asyncio

                from kvstrata.client import AsyncKVCacheClient

                async def read() -> tuple[int, list[np.ndarray]]:
                    ac = AsyncKVCacheClient(url, Namespace("hint"), chunk_size=CS, prefetch_window=2, batch_size=2)
                    try:
                        first = await ac.retrieve_chunks(tokens)
                        assert ac._prefetch_refused
                        return first
                    finally:
                        await ac.aclose()

                n, chunks = asyncio.run(read())
                got = np.concatenate(chunks, axis=3)
            elif path == "scatter":
                got = np.empty_like(kv)
                n, _ = c.retrieve(tokens, out=got)
            else:
                n, chunks = c.retrieve_chunks(tokens, reuse_buffers=path == "reuse_buffers")
                got = np.concatenate(chunks, axis=3)
            assert n == len(tokens) and np.array_equal(got, kv)
        if path != "async":
            assert c._prefetch_refused
        stats = admin.info("commandstats").get("cmdstat_tair.kv.prefetch", {})
        # Refused once per client that tried (the async client is made twice), never once per window.
        assert int(stats.get("rejected_calls", 0)) == (2 if path == "async" else 1)
    finally:
        c.close()
        admin.close()
