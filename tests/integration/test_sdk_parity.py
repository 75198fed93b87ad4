"""What the asyncio client gained to match the sync one, against a real server: ``reserve`` (in place through a
local server's staging segment, ordinary arrays over TCP; ``await slots.done(i)``; an exception stores nothing),
``retrieve_chunks(skip_chunks=, keys=)``, ``verify_local``/``lease_ms``, ``url=None`` (local tier only), and a
reservation block keeping its staging connection to itself while other stores run.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tests.integration.support import make_kv
from tests.integration.support import memory_info as _info
from tests.integration.support import unix_server as _start

from kvstrata.client import AsyncKVCacheClient, KVCacheClient, LocalTier, Namespace

pytestmark = pytest.mark.kvstrata_only

CS = 16
SHAPE = (2, 2, 2, CS, 8)  # one chunk of make_kv's layout


def _fill(slots, kv: np.ndarray) -> None:
    for i, slot in enumerate(slots):
        np.copyto(slot, kv[:, :, :, i * CS:(i + 1) * CS])  # a strided source


def test_async_reserve_through_the_staging_segment_and_over_tcp(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    tokens = list(range(4 * CS))
    kv = make_kv(4 * CS, seed=3)

    async def run(url: str, ns: str, **kw) -> tuple[list[bytes], list[bytes | None]]:
        async with AsyncKVCacheClient(url, Namespace(ns, kv_dtype="float32"), chunk_size=CS, **kw) as c:
            async with c.reserve(tokens, SHAPE) as slots:
                assert len(slots) == 4
                _fill(slots, kv)
                await slots.done(1)  # committed at once, in a worker thread
            n, got = await c.retrieve(tokens)
            assert n == 4 * CS and np.array_equal(got, kv)
            keys = c.keys(tokens)
            return keys, [tcp.get(k) for k in keys]

    staged_keys, staged = asyncio.run(run(f"unix://{path}", "res-staged"))
    info = _info(tcp)
    assert info["stage_commits"] == 4 and info["stage_reservations"] == 0  # through the segment, all committed
    _, over_tcp = asyncio.run(run(f"redis://{srv.host}:{srv.port}", "res-tcp", local_plane=False))
    assert _info(tcp)["stage_commits"] == 4  # ordinary arrays, stored over the socket
    # Byte for byte what the sync client's store writes for the same tensor.
    with KVCacheClient(f"redis://{srv.host}:{srv.port}", Namespace("res-sync", kv_dtype="float32"),
                       chunk_size=CS, local_plane=False) as s:
        assert s.store(tokens, kv) == 4
        expect = [tcp.get(k) for k in s.keys(tokens)]
    assert staged == expect and over_tcp == expect
    assert all(tcp.exists(k) for k in staged_keys)
    tcp.close()


def test_async_reserve_stores_nothing_when_the_block_raises(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    tokens = list(range(3 * CS))
    kv = make_kv(3 * CS, seed=4)

    async def run(url: str, ns: str, kept: int, **kw) -> list[bytes]:
        async with AsyncKVCacheClient(url, Namespace(ns, kv_dtype="float32"), chunk_size=CS, **kw) as c:
            with pytest.raises(RuntimeError, match="engine failed"):
                async with c.reserve(tokens, SHAPE) as slots:
                    _fill(slots, kv)
                    await slots.done(0)
                    raise RuntimeError("engine failed")
            assert await c.lookup(tokens) == kept
            return c.keys(tokens)

    # Staged: the slot marked done was committed at once, the rest given back.
    keys = asyncio.run(run(f"unix://{path}", "raise-staged", CS))
    assert tcp.exists(keys[0]) and not tcp.exists(keys[1]) and not tcp.exists(keys[2])
    info = _info(tcp)
    assert info["stage_reservations"] == 0 and info["stage_reserved_bytes"] == 0  # the room was given back
    # Ordinary arrays (no staging over TCP): `done` commits nothing early, so nothing is stored (as the sync
    # client's reserve).
    keys = asyncio.run(run(f"redis://{srv.host}:{srv.port}", "raise-tcp", 0, local_plane=False))
    assert not any(tcp.exists(k) for k in keys)
    tcp.close()


def test_a_reservation_keeps_its_staging_connection_while_other_stores_run(make_server, sockdir) -> None:
    """COMMITs sent by ``done`` have their replies read when the block ends: a store in between (the same
    thread here; for the asyncio client, any call landing in the worker thread that reserved) must not use
    that connection and read them as its own."""
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    tokens = list(range(2 * CS))
    other = list(range(1000, 1000 + 2 * CS))
    kv, kv2 = make_kv(2 * CS, seed=5), make_kv(2 * CS, seed=6)
    with KVCacheClient(f"unix://{path}", Namespace("hold", kv_dtype="float32"), chunk_size=CS) as c:
        with c.reserve(tokens, SHAPE) as slots:
            _fill(slots, kv)
            slots.done(0)
            assert c.store(other, kv2) == 2  # staged through another segment of its own
        assert c.retrieve(tokens)[0] == 2 * CS and np.array_equal(c.retrieve(tokens)[1], kv)
        assert np.array_equal(c.retrieve(other)[1], kv2)
        assert c.store(list(range(5000, 5000 + CS)), make_kv(CS)) == 1  # one staging connection left in use
    info = _info(tcp)
    assert info["stage_commits"] == 5 and info["stage_checksum_failures"] == 0
    tcp.close()


def test_async_retrieve_chunks_skip_chunks_and_keys_as_the_sync_client(make_server) -> None:
    srv = make_server()
    url = f"redis://{srv.host}:{srv.port}"
    tokens = list(range(5 * CS))
    kv = make_kv(5 * CS, seed=7)
    with KVCacheClient(url, Namespace("skip"), chunk_size=CS, local_plane=False) as s:
        assert s.store(tokens, kv) == 5
        keys = s.keys(tokens[:4 * CS])
        sync = [s.retrieve_chunks(tokens, skip_chunks=2), s.retrieve_chunks([], keys=keys, skip_chunks=1)]
        sync_stats = s.stats.as_dict()

    async def run() -> tuple[list, dict]:
        async with AsyncKVCacheClient(url, Namespace("skip"), chunk_size=CS, local_plane=False) as c:
            got = [await c.retrieve_chunks(tokens, skip_chunks=2),
                   await c.retrieve_chunks([], keys=keys, skip_chunks=1)]
            return got, c.stats.as_dict()

    aio, aio_stats = asyncio.run(run())
    for (n_s, ch_s), (n_a, ch_a) in zip(sync, aio, strict=True):
        assert n_s == n_a and len(ch_s) == len(ch_a)
        assert all(np.array_equal(x, y) for x, y in zip(ch_s, ch_a, strict=True))
    assert sync[0][0] == 5 * CS and len(sync[0][1]) == 3  # the skipped chunks counted, not read
    assert sync[1][0] == 4 * CS and len(sync[1][1]) == 3
    assert aio_stats["hit_chunks"] == 9 and aio_stats["bytes_received"] == sync_stats["bytes_received"]


def test_async_client_without_a_server_uses_the_local_tier_as_the_sync_one() -> None:
    tokens = list(range(3 * CS))
    kv = make_kv(3 * CS, seed=8)

    def sync_ops() -> list:
        c = KVCacheClient(None, Namespace("local", kv_dtype="float32"), chunk_size=CS,
                          local_tier=LocalTier(1 << 24))
        n, got = c.retrieve(tokens)
        out = [c.store(tokens, kv), c.store(tokens, kv), c.lookup(tokens), c.prefetch(tokens),
               c.retrieve(tokens)[0], c.delete(tokens[:CS]), c.lookup(tokens), c.clear(), c.lookup(tokens), n]
        c.close()
        return out

    async def async_ops() -> list:
        async with AsyncKVCacheClient(None, Namespace("local", kv_dtype="float32"), chunk_size=CS,
                                      local_tier=LocalTier(1 << 24)) as c:
            n, got = await c.retrieve(tokens)
            out = [await c.store(tokens, kv), await c.store(tokens, kv), await c.lookup(tokens),
                   await c.prefetch(tokens)]
            n2, back = await c.retrieve(tokens)
            assert np.array_equal(back, kv)
            buf = np.zeros_like(kv)
            n3, into = await c.retrieve(tokens, out=buf)  # the local tier through the worker-thread reader
            assert n3 == 3 * CS and np.array_equal(buf, kv)
            async with c.reserve(tokens, SHAPE, start=CS) as slots:  # ordinary arrays, kept in the local tier
                assert len(slots) == 2
                _fill(slots, kv[:, :, :, CS:])
            out += [n2, await c.delete(tokens[:CS]), await c.lookup(tokens), await c.clear(),
                    await c.lookup(tokens), n]
            return out

    expect = sync_ops()
    assert expect == [3, 0, 3 * CS, 0, 3 * CS, 0, 0, 0, 0, 0]
    assert asyncio.run(async_ops()) == expect


def test_async_client_passes_verify_local_and_lease_ms_to_its_arena_reader(make_server, sockdir) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tokens = list(range(2 * CS))
    kv = make_kv(2 * CS, seed=9)

    async def run() -> None:
        async with AsyncKVCacheClient(f"unix://{path}", Namespace("verify"), chunk_size=CS, verify_local=True,
                                      lease_ms=1234) as c:
            assert await c.store(tokens, kv) == 2
            n, got = await c.retrieve(tokens)
            assert n == 2 * CS and np.array_equal(got, kv)
            assert c._local is not None and c._local.verify_local is True and c._local.lease_ms == 1234

    asyncio.run(run())


def test_a_tenant_restricted_to_its_namespace_uses_tair_kv_commands(make_server) -> None:
    """The capability probe asks on a key of the client's own namespace: a tenant whose ACL covers only that
    namespace is recognised as talking to kvstrata (it was sent down the plain-Redis path, SET PX and MGET, by a
    -NOPERM on the old fixed probe key), sync and asyncio alike."""
    srv = make_server({"requirepass": "admin"})
    admin = srv.client(password="admin")
    ns = Namespace("tenant-probe")
    admin.execute_command("ACL", "SETUSER", "t", "on", ">tpw", f"~{ns.prefix.decode()}*", "+@all", "-@admin",
                          "-@dangerous")
    url = f"redis://t:tpw@{srv.host}:{srv.port}"
    tokens = list(range(2 * CS))
    kv = make_kv(2 * CS, seed=10)
    with KVCacheClient(url, ns, chunk_size=CS, local_plane=False) as c:
        assert c.store(tokens, kv) == 2 and np.array_equal(c.retrieve_chunks(tokens)[1][1], kv[:, :, :, CS:])
        assert c._is_plain() is False

    async def run() -> None:
        async with AsyncKVCacheClient(url, ns, chunk_size=CS, local_plane=False) as c:
            assert await c.store(tokens, kv, skip_existing=False) == 2
            n, got = await c.retrieve(tokens)
            assert n == 2 * CS and np.array_equal(got, kv)
            assert await c._is_plain() is False

    asyncio.run(run())
    stats = admin.info("commandstats")
    calls = {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
             for name in ("tair.kv.setex", "tair.kv.mget", "set", "mget")}
    assert calls["tair.kv.setex"] == 4 and calls["tair.kv.mget"] >= 2 and calls["set"] == 0 and calls["mget"] == 0
    admin.close()


def test_tail_chunks_store_and_read_alike_in_both_clients_and_on_every_path(make_server, sockdir) -> None:
    """``store(tail=True)`` writes the tokens after the last full chunk as a tail chunk; ``longest_tail`` finds the
    longest stored one of a longer sequence; reading it after the full chunks gives back exactly its tokens' KV.
    The same through a local server's staging segment and arena, over TCP, without a server, and async."""
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    tcp = srv.client()
    n = 3 * CS + 5
    tokens = list(range(1000, 1000 + n))
    kv = make_kv(n, seed=5)
    later = tokens + [7, 8, 9]  # the sequence went on: the stored tail is its first 5 tokens after 3 chunks

    def check_sync(c: KVCacheClient) -> list[bytes | None]:
        assert c.store(tokens, kv, tail=True) == 4
        assert c.store(tokens, kv, tail=True) == 0  # all present, the tail too
        assert c.longest_tail(tokens) == (5, c.tail_keys(tokens)[4])
        r, key = c.longest_tail(later)
        assert r == 5 and key == c.tail_keys(later)[4]
        assert c.longest_tail(later[:-4]) == (0, None)  # 4 tokens after the chunks: shorter than what is stored
        assert c.longest_tail(tokens[:3 * CS]) == (0, None)  # nothing after the last full chunk
        much_later = later + list(range(40))  # two more full chunks after the stored tail's boundary
        assert c.lookup_tail(much_later) == (3 * CS + 5, key)  # the full chunks, then the tail at their end
        assert c.lookup_tail(tokens[:2 * CS + 3]) == (2 * CS, None)  # no tail there
        got, chunks = c.retrieve_chunks(later, keys=[*c.keys(later), key])
        assert got == 4 * CS and chunks[3].shape[3] == 5  # the tail holds its 5 tokens
        assert np.array_equal(np.concatenate(chunks, axis=3), kv)
        assert c.lookup(later) == 3 * CS  # lookups and plain retrieves stay on full chunks
        return [tcp.get(k) for k in [*c.keys(tokens), key]] if c.redis is not None else []

    with KVCacheClient(f"unix://{path}", Namespace("tail-unix", kv_dtype="float32"), chunk_size=CS) as c:
        via_segment = check_sync(c)
        assert c._tls.arena is not None  # read out of the arena
    assert _info(tcp)["stage_commits"] == 4  # the tail went through the staging segment as the chunks did
    with KVCacheClient(f"redis://{srv.host}:{srv.port}", Namespace("tail-tcp", kv_dtype="float32"),
                       chunk_size=CS, local_plane=False) as c:
        over_tcp = check_sync(c)
    assert via_segment == over_tcp and None not in over_tcp
    with KVCacheClient(None, Namespace("tail-local", kv_dtype="float32"), chunk_size=CS,
                       local_tier=LocalTier(1 << 24)) as c:
        check_sync(c)

    async def check_async(url: str | None, ns: str, **kw) -> None:
        async with AsyncKVCacheClient(url, Namespace(ns, kv_dtype="float32"), chunk_size=CS, **kw) as c:
            assert await c.store(tokens, kv, tail=True) == 4
            r, key = await c.longest_tail(later)
            assert r == 5 and key == c.tail_keys(later)[4]
            assert await c.longest_tail(later[:-4]) == (0, None)
            assert await c.lookup_tail(later + list(range(40))) == (3 * CS + 5, key)
            got, chunks = await c.retrieve_chunks(later, keys=[*c.keys(later), key])
            assert got == 4 * CS and np.array_equal(np.concatenate(chunks, axis=3), kv)

    asyncio.run(check_async(f"redis://{srv.host}:{srv.port}", "tail-async", local_plane=False))
    asyncio.run(check_async(f"unix://{path}", "tail-async-unix"))
    asyncio.run(check_async(None, "tail-async-local", local_tier=LocalTier(1 << 24)))
    with KVCacheClient(f"redis://{srv.host}:{srv.port}", Namespace("tail-async", kv_dtype="float32"),
                       chunk_size=CS, local_plane=False) as s:
        # Byte for byte what the sync client wrote (a value does not carry its namespace).
        assert [tcp.get(k) for k in [*s.keys(tokens), s.tail_keys(tokens)[4]]] == over_tcp
    tcp.close()
