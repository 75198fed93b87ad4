"""Restores with the parallel copy (``copy_threads``, kvstrata.client.copypool) against a real server: out of the
arena (sync and async clients; into ``out``, into strided destinations, into new arrays, chunk by chunk) and over
the socket into ``out``: the bytes restored are the bytes stored, for several dtypes and thread counts, and the
copy threads end with the client."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from tests.integration.support import unix_server as _start

from kvstrata.client.keys import Namespace
from kvstrata.client.sdk import AsyncKVCacheClient, KVCacheClient

pytestmark = pytest.mark.kvstrata_only

TOKENS = 768
SHAPE = (4, 2, 4, TOKENS, 64)  # LKHTD


def _kv(dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bfloat16":  # bf16 bits in uint16 storage, as the codec carries them
        return rng.integers(0, 1 << 16, size=SHAPE, dtype=np.uint16)
    return rng.standard_normal(SHAPE).astype(dtype)


def _share_every_copy(c: KVCacheClient) -> None:
    """Make this client's pool share even these small copies (the default waits for 16 MiB)."""
    pool = c._copier()
    pool.min_bytes, pool.min_piece = 0, 4096


def _alive(c: KVCacheClient) -> list[threading.Thread]:
    pool = c._copies
    return [t for t in (pool._helpers if pool is not None else []) if t.is_alive()]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_arena_restores_are_byte_identical_with_any_thread_count(make_server, sockdir, dtype: str) -> None:
    srv, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    ns = Namespace(f"m-{dtype}", kv_dtype=dtype)
    kv = _kv(dtype, seed=len(dtype))
    tokens = list(range(TOKENS))
    want = kv.tobytes()
    results = {}
    for threads in (1, 2, 4):
        with KVCacheClient(f"unix://{path}", ns, copy_threads=threads) as c:
            if threads == 1:
                c.store(tokens, kv)
            _share_every_copy(c)
            dst = np.zeros_like(kv)
            n, view = c.retrieve(tokens, out=dst)
            assert n == TOKENS and view.base is dst and dst.tobytes() == want
            assert c._tls.arena is not None  # read out of the arena, not over the socket
            # strided destinations: room for more tokens; the head-dim axis every other element
            roomy = np.zeros((4, 2, 4, TOKENS + 256, 64), kv.dtype)
            n, view = c.retrieve(tokens, out=roomy)
            assert n == TOKENS and view.tobytes() == want and not roomy[:, :, :, TOKENS:].any()
            wide = np.zeros((4, 2, 4, TOKENS, 128), kv.dtype)
            n, view = c.retrieve(tokens, out=wide[..., ::2])
            assert n == TOKENS and view.tobytes() == want and not wide[..., 1::2].any()
            n, fresh = c.retrieve(tokens)
            assert n == TOKENS and fresh.tobytes() == want
            n, chunks = c.retrieve_chunks(tokens)
            assert n == TOKENS and all(ch.flags.writeable for ch in chunks)  # copies, not arena views
            assert np.concatenate(chunks, axis=3).tobytes() == want
            results[threads] = (dst.tobytes(), fresh.tobytes())
            assert len(_alive(c)) == threads - 1  # the copies were shared
            helpers = _alive(c)
        assert not any(t.is_alive() for t in helpers)  # ended with the client
    assert results[1] == results[2] == results[4]
    assert srv.client().info("memory")["arena_leases"] == 0


def test_socket_restores_into_out_share_each_chunk_copy(make_server, sockdir) -> None:
    """Over the socket, chunks that cannot be received in place (zstd) are decoded and copied into ``out``."""
    _, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    ns = Namespace("m-zstd", kv_dtype="float32")
    kv = _kv("float32", seed=5)
    tokens = list(range(TOKENS))
    with KVCacheClient(f"unix://{path}", ns, local_plane=False, compression="zstd", copy_threads=3) as c:
        c.store(tokens, kv)
        _share_every_copy(c)
        dst = np.zeros((4, 2, 4, TOKENS + 256, 64), np.float32)
        n, view = c.retrieve(tokens, out=dst)
        assert n == TOKENS and view.tobytes() == kv.tobytes() and not dst[:, :, :, TOKENS:].any()
        assert getattr(c._tls, "arena", None) is None and len(_alive(c)) == 2
        helpers = _alive(c)
    assert not any(t.is_alive() for t in helpers)


def test_async_client_restores_with_its_copy_threads(make_server, sockdir) -> None:
    _, path = _start(make_server, sockdir, **{"dram-size": "64mb"})
    ns = Namespace("m-async", kv_dtype="bfloat16")
    kv = _kv("bfloat16", seed=9)
    tokens = list(range(TOKENS))

    async def go() -> tuple[bytes, bytes, int, list[threading.Thread]]:
        c = AsyncKVCacheClient(f"unix://{path}", ns, copy_threads=3)
        try:
            await c.store(tokens, kv)
            assert await c._plane() and c._local is not None and c._local.copy_threads == 3
            _share_every_copy(c._local)
            dst = np.zeros_like(kv)
            n, _ = await c.retrieve(tokens, out=dst)
            n2, fresh = await c.retrieve(tokens)
            assert n == n2 == TOKENS
            return dst.tobytes(), fresh.tobytes(), len(_alive(c._local)), _alive(c._local)
        finally:
            await c.aclose()

    dst, fresh, alive, helpers = asyncio.run(go())
    assert dst == fresh == kv.tobytes() and alive == 2
    assert not any(t.is_alive() for t in helpers)


def test_copy_threads_must_be_a_positive_integer() -> None:
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="copy_threads"):
            KVCacheClient(None, "m", copy_threads=bad)
    assert KVCacheClient(None, "m", copy_threads=2).copy_threads == 2
