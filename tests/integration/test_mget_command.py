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
