"""KVCacheClient against a real server: lookup/store/retrieve, partial chunks, namespaces, TTL classes,
prefetch, delete/clear, corrupted values, the local tier and the asyncio client."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tests.integration.support import make_kv

from kvstrata.client import AsyncKVCacheClient, KVCacheClient, LocalTier, Namespace

CS = 16


@pytest.fixture(scope="module")
def srv(module_make_server):
    return module_make_server()


@pytest.fixture
def url(srv):
    c = srv.client()
    c.flushall()
    c.close()
    return f"redis://{srv.host}:{srv.port}"


def client(url, model="m", **kw):
    kw.setdefault("chunk_size", CS)
    return KVCacheClient(url, Namespace(model), **kw)


def test_store_lookup_retrieve_round_trip(url):
    c = client(url)
    tokens = list(range(100))  # 6 full chunks + 4 tokens
    kv = make_kv(100)
    assert c.lookup(tokens) == 0
    assert c.retrieve(tokens) == (0, None)
    assert c.store(tokens, kv) == 6
    assert c.lookup(tokens) == 96
    n, out = c.retrieve(tokens)
    assert n == 96 and out.shape == (2, 2, 2, 96, 8)
    assert np.array_equal(out, kv[:, :, :, :96])  # bitwise, raw codec
    # a longer sequence with the same prefix hits the same chunks
    assert c.lookup(tokens + [7] * 50) == 96
    assert c.retrieve(tokens, max_tokens=40)[0] == 32
    c.close()


def test_partial_last_chunk_is_never_stored(url, srv):
    c = client(url)
    assert c.store(list(range(CS - 1)), make_kv(CS - 1)) == 0
    r = srv.client()
    assert r.dbsize() == 0
    assert c.store(list(range(CS + 5)), make_kv(CS + 5)) == 1
    assert r.dbsize() == 1
    assert c.lookup(list(range(CS + 5))) == CS
    r.close()


def test_store_writes_only_missing_chunks(url):
    c = client(url)
    tokens = list(range(64))
    assert c.store(tokens[:32], make_kv(32)) == 2
    assert c.store(tokens, make_kv(64)) == 2
    assert c.stats.skipped_chunks == 2
    # a divergent suffix stores only its own chunks
    assert c.store(tokens[:32] + [999] * 32, make_kv(64)) == 2


def test_lookup_counts_consecutive_hits_only(url):
    c = client(url, batch_size=2)
    tokens = list(range(8 * CS))
    kv = make_kv(8 * CS)
    c.store(tokens, kv)
    c.delete(tokens[: 3 * CS])  # removes chunks 0..2 ...
    c.store(tokens[: 2 * CS], kv)  # ... chunks 0 and 1 come back; chunk 2 stays missing
    assert c.lookup(tokens) == 2 * CS
    n, out = c.retrieve(tokens)
    assert n == 2 * CS and np.array_equal(out, kv[:, :, :, : 2 * CS])


def test_mismatched_namespace_never_hits(url):
    tokens = list(range(64))
    c = client(url)
    c.store(tokens, make_kv(64))
    for ns in (Namespace("other"), Namespace("m", kv_dtype="bfloat16"), Namespace("m", salt="tenant"),
               Namespace("m", tp_rank=1, tp_size=2), Namespace("m", adapter="lora")):
        other = KVCacheClient(url, ns, chunk_size=CS)
        assert other.lookup(tokens) == 0
        assert other.retrieve(tokens) == (0, None)
    # a different chunk size gives different keys too
    assert client(url, chunk_size=32).lookup(tokens) == 0


def test_ttl_classes_and_override(url, srv):
    r = srv.client()
    c = client(url, ttl_classes={"session": 60, "shared": None}, default_ttl_class="session")
    [k0] = c.keys(list(range(CS)))
    c.store(list(range(CS)), make_kv(CS))
    assert 0 < r.pttl(k0) <= 60_000
    toks = [5] * CS
    c.store(toks, make_kv(CS), ttl_class="shared")
    assert r.pttl(c.keys(toks)[0]) == -1
    toks = [6] * CS
    c.store(toks, make_kv(CS), ttl=2.5)
    assert 0 < r.pttl(c.keys(toks)[0]) <= 2500
    toks = [8] * CS
    c.store(toks, make_kv(CS), ttl_class="profile")  # default class table still has profile (1 day)
    assert 3_600_000 < r.pttl(c.keys(toks)[0]) <= 86_400_000
    with pytest.raises(ValueError):
        c.store([9] * CS, make_kv(CS), ttl_class="nope")
    r.close()


def test_delete_and_clear_are_per_namespace(url, srv):
    a, b = client(url, "a"), client(url, "b")
    tokens = list(range(48))
    a.store(tokens, make_kv(48))
    b.store(tokens, make_kv(48))
    assert a.delete(tokens[:CS]) == 1
    assert a.lookup(tokens) == 0 and b.lookup(tokens) == 48
    assert a.clear() == 2
    assert b.lookup(tokens) == 48
    assert srv.client().dbsize() == 3


@pytest.mark.kvstrata_only
def test_prefetch(url):
    c = client(url)
    tokens = list(range(64))
    c.store(tokens, make_kv(64))
    assert isinstance(c.prefetch(tokens), int)
    assert c.prefetch([]) == 0


@pytest.mark.parametrize("codec", ["zstd", "fp8", "fp8+zstd"])
def test_codecs_through_the_server(url, codec):
    c = client(url, compression=codec)
    kv = make_kv(64, layers=4, heads=2, dim=64)
    c.store(list(range(64)), kv)
    n, out = KVCacheClient(url, Namespace("m"), chunk_size=CS).retrieve(list(range(64)))  # any codec decodes
    assert n == 64
    if codec == "zstd":
        assert np.array_equal(out, kv)
    else:
        assert np.abs(out - kv).max() <= np.abs(kv).max() * 2.0 ** -4


def test_environment_chooses_the_codec(url, srv, monkeypatch):
    monkeypatch.setenv("KVSTRATA_COMPRESSION", "zstd")
    c = client(url)
    assert c.compression == "zstd"
    c.store(list(range(CS)), np.zeros((2, 2, 2, CS, 8), np.float32))
    value = srv.client().get(c.keys(list(range(CS)))[0])
    assert value[:4] == b"KVSC" and value[5] & 2  # zstd flag
    assert len(value) < 200


def test_large_values_are_sent_unjoined(url):
    c = KVCacheClient(url, Namespace("big"), chunk_size=256)
    kv = make_kv(1024, layers=30, heads=3, dim=64)  # 11.8 MB per chunk, 47 MB in all
    assert c.store(list(range(1024)), kv) == 4
    assert c.stats.bytes_sent > kv.nbytes
    n, out = c.retrieve(list(range(1024)))
    assert n == 1024 and np.array_equal(out, kv)


def test_corrupted_and_future_values_are_misses(url, srv):
    r = srv.client()
    c = client(url)
    tokens = list(range(3 * CS))
    c.store(tokens, make_kv(3 * CS))
    k1, k2 = c.keys(tokens)[1:]
    value = bytearray(r.get(k1))
    value[-1] ^= 0xFF
    r.set(k1, bytes(value))
    n, _ = c.retrieve(tokens)
    assert n == CS and c.stats.corrupt == 1
    good = bytearray(r.get(k2))
    good[4] = 9  # format version 9
    r.set(k1, bytes(good))
    assert c.retrieve(tokens)[0] == CS
    assert c.stats.refused == 1 and "format version 9" in c.stats.errors[-1]
    r.close()


def test_local_tier_only():
    c = KVCacheClient(None, Namespace("m"), chunk_size=CS, local_tier=LocalTier(1 << 20))
    tokens = list(range(40))
    kv = make_kv(40)
    assert c.store(tokens, kv) == 2
    assert c.lookup(tokens) == 32
    n, out = c.retrieve(tokens)
    assert n == 32 and np.array_equal(out, kv[:, :, :, :32])
    assert c.clear() == 0 and c.lookup(tokens) == 0


def test_local_tier_is_an_lru_within_budget():
    tier = LocalTier(budget=3 * (CS * 2 * 2 * 2 * 8 * 4 + 500))  # value + header + key + overhead: 3 fit
    c = KVCacheClient(None, Namespace("m"), chunk_size=CS, local_tier=tier)
    c.store(list(range(5 * CS)), make_kv(5 * CS))
    assert tier.used <= tier.budget and len(tier) == 3 and tier.evictions == 2
    assert c.lookup(list(range(5 * CS))) == 0  # the oldest chunks (the prefix) went first


def test_local_tier_in_front_of_server(url, srv):
    c = client(url, local_tier=1 << 24)
    tokens = list(range(64))
    kv = make_kv(64)
    c.store(tokens, kv)
    srv.client().flushall()  # only the local copies remain
    n, out = c.retrieve(tokens)
    assert n == 64 and np.array_equal(out, kv) and c.stats.local_hits == 4
    fresh = client(url, local_tier=1 << 24)
    assert fresh.lookup(tokens) == 0


def test_async_client(url):
    async def run():
        async with AsyncKVCacheClient(url, Namespace("async"), chunk_size=CS) as c:
            tokens = list(range(70))
            kv = make_kv(70)
            assert await c.lookup(tokens) == 0
            assert await c.store(tokens, kv) == 4
            assert await c.store(tokens, kv) == 0
            assert await c.lookup(tokens) == 64
            n, out = await c.retrieve(tokens)
            assert n == 64 and np.array_equal(out, kv[:, :, :, :64])
            big = make_kv(256, layers=30, heads=3, dim=64)
            assert await c.store(list(range(1000, 1256)), big) == 16
            n, out = await c.retrieve(list(range(1000, 1256)))
            assert n == 256 and np.array_equal(out, big)
            await c.prefetch(tokens)
            assert await c.delete(tokens[:CS]) == 1
            assert await c.lookup(tokens) == 0
            assert await c.clear() == 19

    asyncio.run(run())


def test_sync_client_reads_what_async_wrote(url):
    async def write():
        async with AsyncKVCacheClient(url, Namespace("x"), chunk_size=CS) as c:
            await c.store(list(range(32)), make_kv(32))

    asyncio.run(write())
    assert KVCacheClient(url, Namespace("x"), chunk_size=CS).lookup(list(range(32))) == 32


def test_reads_into_reusable_buffers(url):
    writer = client(url)
    tokens = list(range(4 * CS))
    kv = make_kv(4 * CS)
    writer.store(tokens, kv)
    reader = client(url)
    n, first = reader.retrieve_chunks(tokens, reuse_buffers=True)  # no size known yet: redis-py reads
    assert n == 4 * CS and reader._size_hint > 0
    n, chunks = reader.retrieve_chunks(tokens, reuse_buffers=True)
    assert n == 4 * CS
    assert np.array_equal(np.concatenate(chunks, axis=3), kv)
    assert getattr(reader._tls, "fast", None) is not None  # the FastClient path was taken
    bufs = reader._tls.bufs
    assert any(np.shares_memory(chunks[0], np.frombuffer(b, np.uint8)) for b in bufs)
    # a value larger than the buffers: read again through redis-py, correct all the same
    big_tokens = [7] * CS
    big = make_kv(CS, layers=8, heads=4, dim=32)
    writer.store(big_tokens, big)
    n, chunks = reader.retrieve_chunks(big_tokens, reuse_buffers=True)
    assert n == CS and np.array_equal(chunks[0], big)
    n, chunks = reader.retrieve_chunks(big_tokens, reuse_buffers=True)  # buffers grew
    assert n == CS and np.array_equal(chunks[0], big)
    reader.close()


def test_reusable_buffers_across_batches(url):
    """Every batch of one call gets its own buffers: a later batch never overwrites an earlier one's chunks."""
    tokens = list(range(7 * CS))
    kv = make_kv(7 * CS)
    client(url).store(tokens, kv)
    reader = client(url, batch_size=2)
    reader.retrieve_chunks(tokens, reuse_buffers=True)  # learns the value size
    for _ in range(2):
        n, chunks = reader.retrieve_chunks(tokens, reuse_buffers=True)
        assert n == 7 * CS and getattr(reader._tls, "fast", None) is not None
        assert np.array_equal(np.concatenate(chunks, axis=3), kv)
    reader.close()


def test_retrieve_into_out_across_windows_and_a_miss(url):
    """retrieve(out=) copies each chunk into ``out`` as it is decoded (window by window, with the next window
    fetched meanwhile): the filled part is a view of ``out``, and a missing chunk ends it there."""
    tokens = list(range(7 * CS))
    kv = make_kv(7 * CS)
    writer = client(url)
    writer.store(tokens, kv)
    for overlap in (True, False):
        reader = client(url, batch_size=2, local_plane=False, overlap=overlap)
        reader.retrieve_chunks(tokens, reuse_buffers=True)  # learns the value size: the FastClient path next
        dst = np.full_like(kv, -1.0)
        n, view = reader.retrieve(tokens, out=dst)
        assert n == 7 * CS and view.base is dst and np.array_equal(dst, kv)
        reader.close()
    assert writer.redis.delete(writer.keys(tokens)[4]) == 1  # chunk 4 gone: the prefix ends before it
    reader = client(url, batch_size=2, local_plane=False)
    dst = np.full_like(kv, -1.0)
    n, view = reader.retrieve(tokens, out=dst)
    assert n == 4 * CS and view.shape[3] == 4 * CS and np.array_equal(view, kv[:, :, :, :4 * CS])
    assert (dst[:, :, :, 5 * CS:] == -1.0).all()  # nothing past the miss was written
    reader.close()
    writer.close()
