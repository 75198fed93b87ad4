"""The SDK as an ACL tenant: KVCacheClient / AsyncKVCacheClient with ``username=`` (and in the URL) reach their
own namespace's chunk keys (also through the FastClient read path) and nothing of another tenant's."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import redis
from tests.integration.support import make_kv

from kvstrata.client import AsyncKVCacheClient, KVCacheClient, Namespace
from kvstrata.client.fast import FastClient, RespError

pytestmark = pytest.mark.kvstrata_only
CS = 16
NS_A, NS_B = Namespace("tenant-a-model"), Namespace("tenant-b-model")


@pytest.fixture(scope="module")
def srv(module_make_server):
    srv = module_make_server({"requirepass": "admin"})
    r = srv.client(password="admin")
    for name, ns in (("tenantA", NS_A), ("tenantB", NS_B)):
        r.execute_command("ACL", "SETUSER", name, "on", f">{name}-pw", f"~{ns.prefix.decode()}*", "+@all",
                          "-@admin", "-@dangerous")
    r.close()
    return srv


def test_sdk_tenant_reaches_only_its_namespace(srv):
    url = f"redis://{srv.host}:{srv.port}"
    tokens = list(range(4 * CS))
    kv = make_kv(len(tokens), seed=1, dim=2048)  # large chunks: values come back through the FastClient
    a = KVCacheClient(url, NS_A, chunk_size=CS, username="tenantA", password="tenantA-pw")
    try:
        a.store(tokens, kv)
    finally:
        a.close()
    a2 = KVCacheClient(url, NS_A, chunk_size=CS, username="tenantA", password="tenantA-pw")
    try:
        n, back = a2.retrieve(tokens)
        assert n == len(tokens) and np.array_equal(back, kv)
        # The SDK's FastClient (large reads into reusable buffers) authenticates as the same user.
        assert a2._fast().call(b"ACL", b"WHOAMI") == b"tenantA"
    finally:
        a2.close()
    with FastClient(srv.host, srv.port, username="tenantA", password="tenantA-pw") as fc:
        assert fc.call(b"EXISTS", NS_A.prefix + b"x") == 0
        with pytest.raises(RespError, match="NOPERM"):
            fc.call(b"GET", NS_B.prefix + b"x")
    with pytest.raises(RespError, match="WRONGPASS"):
        FastClient(srv.host, srv.port, username="tenantA", password="wrong")
    # The same tenant pointed at another tenant's namespace is refused, whatever the client does.
    wrong = KVCacheClient(f"redis://tenantA:tenantA-pw@{srv.host}:{srv.port}", NS_B, chunk_size=CS)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            wrong.store(tokens, kv)
        with pytest.raises(redis.exceptions.NoPermissionError):
            wrong.lookup(tokens)
    finally:
        wrong.close()
    b = KVCacheClient(url, NS_B, chunk_size=CS, username="tenantB", password="tenantB-pw")
    try:
        assert b.lookup(tokens) == 0
    finally:
        b.close()
    admin = srv.client(password="admin")
    try:
        keys = admin.keys("*")
        assert keys and all(k.startswith(NS_A.prefix) for k in keys)
    finally:
        admin.close()


def test_async_sdk_with_username(srv):
    async def run() -> int:
        c = AsyncKVCacheClient(f"redis://{srv.host}:{srv.port}", NS_B, chunk_size=CS, username="tenantB",
                               password="tenantB-pw")
        try:
            tokens = list(range(2 * CS))
            await c.store(tokens, make_kv(len(tokens), seed=2))
            return await c.lookup(tokens)
        finally:
            await c.aclose()

    assert asyncio.run(run()) == 2 * CS
