"""retrieve_chunks with the fetch of window i+1 overlapping the decode of window i, against a real server.

Results (arrays, token counts, stats) must be the same with ``overlap`` on and off for every codec, a prefix that
ends at a missing or corrupt chunk, and reusable receive buffers; and the overlap must really happen. That is
shown without sleeps or timings: a client whose decode step, at the start of window i, waits on an Event set by
the fetch path once window i+1 has been fetched. A sequential client could never set it (the wait would time
out), and the server's ``INFO commandstats``, read from a separate connection inside the hook, confirms that
exactly i+2 MGETs had been executed by then (one fetch in flight, never more). The asyncio client decodes small
raw windows on the event loop, where a hook must not block: there the test checks that window i+1's request had
been sent before window i's decode began.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
from tests.integration.support import make_kv

from kvstrata.client import AsyncKVCacheClient, KVCacheClient, Namespace
from kvstrata.client.codec import encode

CS = 16
N_CHUNKS = 10
WINDOW = 3  # prefetch_window, so the window: 10 chunks are read as 3 + 3 + 3 + 1
WAIT_S = 20.0  # how long a hook waits for a fetch that should already be under way; only reached on failure


@pytest.fixture(scope="module")
def srv(module_make_server):
    return module_make_server()


@pytest.fixture
def url(srv):
    c = srv.client()
    c.flushall()
    c.close()
    return f"redis://{srv.host}:{srv.port}"


def client(url: str, cls: type = KVCacheClient, **kw: Any) -> Any:
    kw.setdefault("chunk_size", CS)
    kw.setdefault("prefetch_window", WINDOW)
    return cls(url, Namespace("overlap"), **kw)


def store(url: str, codec: str = "raw", n_chunks: int = N_CHUNKS, **kv_kw: Any) -> tuple[list[int], np.ndarray]:
    tokens = list(range(n_chunks * CS))
    kv = make_kv(len(tokens), **kv_kw)
    w = client(url, compression=codec)
    assert w.store(tokens, kv) == n_chunks
    w.close()
    return tokens, kv


def as_bytes(chunks: list[np.ndarray]) -> list[tuple[str, tuple[int, ...], bytes]]:
    return [(str(c.dtype), c.shape, c.tobytes()) for c in chunks]


def stats(c: Any) -> dict[str, Any]:
    d = c.stats.as_dict()
    d.pop("errors")
    return d


def mget_calls(r: Any) -> int:
    """MGETs the server has executed (plain MGET is what the reusable-buffer path and plain Redis send)."""
    return sum(v["calls"] for k, v in r.info("commandstats").items() if k.endswith("mget"))


def read_sync(url: str, tokens: list[int], overlap: bool, **kw: Any) -> tuple[int, list, dict]:
    c = client(url, overlap=overlap, **kw)
    n, chunks = c.retrieve_chunks(tokens)
    result = (n, as_bytes(chunks), stats(c))
    c.close()
    return result


def read_async(url: str, tokens: list[int], overlap: bool, **kw: Any) -> tuple[int, list, dict]:
    async def run() -> tuple[int, list, dict]:
        async with client(url, AsyncKVCacheClient, overlap=overlap, **kw) as c:
            n, chunks = await c.retrieve_chunks(tokens)
            return n, as_bytes(chunks), stats(c)

    return asyncio.run(run())


READERS = {"sync": read_sync, "async": read_async}


# ---- same results with overlap on and off -------------------------------------------------------------------


@pytest.mark.parametrize("mode", READERS)
@pytest.mark.parametrize("codec", ["raw", "zstd", "fp8", "fp8+zstd"])
def test_same_chunks_with_and_without_overlap(url, codec, mode):
    tokens, kv = store(url, codec)
    read = READERS[mode]
    off = read(url, tokens, False)
    on = read(url, tokens, True)
    assert on == off
    assert on[0] == len(tokens) and on[2]["bytes_received"] > 0
    if mode == "sync":  # the asyncio client counts bytes only, not hits and misses, in retrieve
        assert on[2]["hit_chunks"] == N_CHUNKS and on[2]["miss_chunks"] == 0
    if codec in ("raw", "zstd"):
        assert np.array_equal(np.concatenate([np.frombuffer(b, dt).reshape(s) for dt, s, b in on[1]], axis=3), kv)


@pytest.mark.parametrize("mode", READERS)
@pytest.mark.parametrize("window", [1, 2, 4, 64])
def test_window_sizes_and_partial_reads(url, mode, window):
    tokens, _ = store(url, "zstd")
    read = READERS[mode]
    for max_tokens in (None, 5 * CS, 5 * CS + 3):
        off = read(url, tokens if max_tokens is None else tokens[:max_tokens], False, prefetch_window=window)
        on = read(url, tokens if max_tokens is None else tokens[:max_tokens], True, prefetch_window=window)
        assert on == off
    # a longer request than what is stored: the prefix ends after the last stored chunk
    on = read(url, tokens + list(range(5000, 5000 + 3 * CS)), True, prefetch_window=window)
    assert on[0] == len(tokens)


@pytest.mark.parametrize("mode", READERS)
def test_prefix_stops_at_a_missing_middle_chunk(url, srv, mode):
    tokens, _ = store(url, "zstd")
    keys = client(url).keys(tokens)
    r = srv.client()
    assert r.delete(keys[4]) == 1  # the middle of the second window (3, 4, 5)
    read = READERS[mode]
    off = read(url, tokens, False)
    on = read(url, tokens, True)
    assert on == off
    assert on[0] == 4 * CS and len(on[1]) == 4
    if mode == "sync":
        assert on[2]["miss_chunks"] == 1 and on[2]["hit_chunks"] == 4
    r.close()


@pytest.mark.parametrize("mode", READERS)
def test_window_fetched_past_a_corrupt_chunk_is_discarded(url, srv, mode):
    """A corrupt chunk is only found by decoding, after the next window was fetched: that window must be
    dropped undecoded (chunk 7, corrupt too, is never looked at) and nothing else may change."""
    tokens, _ = store(url, "raw")
    keys = client(url).keys(tokens)
    r = srv.client()
    for j in (4, 7):
        value = bytearray(r.get(keys[j]))
        value[-1] ^= 0xFF
        r.set(keys[j], bytes(value))
    read = READERS[mode]
    off = read(url, tokens, False)
    on = read(url, tokens, True)
    assert on == off
    assert on[0] == 4 * CS and on[2]["corrupt"] == 1 and on[2]["bytes_received"] == off[2]["bytes_received"]
    r.close()


def test_async_client_is_usable_after_a_discarded_window(url, srv):
    tokens, kv = store(url, "raw")
    keys = client(url).keys(tokens)
    r = srv.client()
    good = r.get(keys[4])
    value = bytearray(good)
    value[-1] ^= 0xFF
    r.set(keys[4], bytes(value))

    async def run() -> None:
        async with client(url, AsyncKVCacheClient, max_connections=2) as c:
            for _ in range(4):  # the dropped window's connection is not left in a bad state for the next call
                assert (await c.retrieve_chunks(tokens))[0] == 4 * CS
            r.set(keys[4], good)
            n, out = await c.retrieve(tokens)
            assert n == len(tokens) and np.array_equal(out, kv)

    asyncio.run(run())
    r.close()


def test_local_tier_and_skip_chunks_unchanged(url):
    tokens, kv = store(url, "raw")
    results = []
    for overlap in (False, True):
        c = client(url, overlap=overlap, local_tier=1 << 24)
        first = c.retrieve_chunks(tokens, skip_chunks=2)
        assert len(c.local) == N_CHUNKS - 2  # filled with what was read
        second = c.retrieve_chunks(tokens)  # the first two from the server, then the local tier
        results.append((first[0], as_bytes(first[1]), second[0], as_bytes(second[1]), stats(c)))
        c.close()
    assert results[0] == results[1]
    assert results[1][0] == len(tokens) and results[1][4]["local_hits"] == 0
    c = client(url, local_tier=1 << 24)
    c.retrieve_chunks(tokens)
    n, chunks = c.retrieve_chunks(tokens)
    assert n == len(tokens) and c.stats.local_hits == N_CHUNKS and as_bytes(chunks) == results[1][3]
    c.close()


# ---- reusable receive buffers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_reuse_buffers_same_chunks_with_and_without_overlap(url, codec):
    tokens, kv = store(url, codec)
    results = []
    for overlap in (False, True):
        c = client(url, overlap=overlap)
        c.retrieve_chunks(tokens, reuse_buffers=True)  # learns the value size: redis-py reads this time
        for _ in range(2):
            n, chunks = c.retrieve_chunks(tokens, reuse_buffers=True)
            assert n == len(tokens) and np.array_equal(np.concatenate(chunks, axis=3), kv)
        results.append(as_bytes(chunks))
        c.close()
    assert results[0] == results[1]


def test_reuse_buffers_overlapped_are_the_callers_buffers(url):
    """With overlap, later windows arrive over the fetch thread's connection, but into the calling thread's
    buffers, each chunk in a buffer of its own: the arrays stay valid until this thread's next call."""
    tokens, kv = store(url, "raw")
    c = client(url)
    c.retrieve_chunks(tokens, reuse_buffers=True)
    n, chunks = c.retrieve_chunks(tokens, reuse_buffers=True)
    assert n == len(tokens)
    assert len(c._fast_clients) == 2  # the caller's (first window) and the fetch thread's (the others)
    bufs = c._tls.bufs
    owners = [next(j for j, b in enumerate(bufs) if np.shares_memory(ch, np.frombuffer(b, np.uint8)))
              for ch in chunks]
    assert owners == list(range(N_CHUNKS))
    # another thread's call uses its own buffers and leaves this thread's arrays alone
    other: list[Any] = []
    t = threading.Thread(target=lambda: other.append(c.retrieve_chunks(tokens[:5 * CS], reuse_buffers=True)))
    t.start()
    t.join()
    assert other[0][0] == 5 * CS
    assert not any(np.shares_memory(a, b) for a in other[0][1] for b in chunks)
    assert np.array_equal(np.concatenate(chunks, axis=3), kv)
    c.close()
    assert c._fast_clients == [] and c._executor is None


def test_reuse_buffers_with_a_missing_chunk(url, srv):
    tokens, kv = store(url, "raw")
    c = client(url)
    c.retrieve_chunks(tokens, reuse_buffers=True)
    r = srv.client()
    r.delete(c.keys(tokens)[7])
    for overlap in (True, False):
        c.overlap = overlap
        n, chunks = c.retrieve_chunks(tokens, reuse_buffers=True)
        assert n == 7 * CS and np.array_equal(np.concatenate(chunks, axis=3), kv[:, :, :, :7 * CS])
    c.close()
    r.close()


def test_overlap_off_starts_no_thread(url):
    tokens, _ = store(url, "raw")
    c = client(url, overlap=False)
    c.retrieve_chunks(tokens)
    assert c._executor is None
    c.overlap = True
    c.retrieve_chunks(tokens)
    assert c._executor is not None
    c.close()
    assert c._executor is None
    assert c.retrieve_chunks(tokens)[0] == len(tokens)  # usable after close: a new executor is started
    c.close()


# ---- the overlap happens --------------------------------------------------------------------------------------


class _Probe:
    """Shared by the spies: which window a key is in, an Event per window set once it has been fetched, and
    what the decode hook saw (nothing before ``setup``)."""

    window_of: dict[bytes, int] = {}

    def setup(self, tokens: list[int], probe: Any) -> None:
        self.probe = probe
        keys = self.keys(tokens)  # type: ignore[attr-defined]
        w = self._window()  # type: ignore[attr-defined]
        self.window_of = {k: j // w for j, k in enumerate(keys)}
        self.n_windows = -(-len(keys) // w)
        self.fetched = [threading.Event() for _ in range(self.n_windows)]
        self.base_mgets = mget_calls(probe)
        self.seen: list[tuple[int, bool, int]] = []  # (window, next one fetched meanwhile, MGETs executed)
        self.log: list[tuple[str, int]] = []

    def on_decode(self, key: bytes) -> None:
        k = self.window_of.get(key)
        if k is None:
            return
        if ("decode", k) in self.log:
            return
        self.log.append(("decode", k))
        if k + 1 < self.n_windows:
            ok = self.fetched[k + 1].wait(WAIT_S)
            self.seen.append((k, ok, mget_calls(self.probe) - self.base_mgets))


class SpyClient(_Probe, KVCacheClient):
    def _fetch_window(self, keys, ahead, plain, bufs, offset):
        values = super()._fetch_window(keys, ahead, plain, bufs, offset)
        if keys[0] in self.window_of:
            self.fetched[self.window_of[keys[0]]].set()
        return values

    def _decode(self, key, value):
        self.on_decode(key)
        return super()._decode(key, value)


class AsyncSpyClient(_Probe, AsyncKVCacheClient):
    async def _send_window(self, keys, ahead, plain):
        sent = await super()._send_window(keys, ahead, plain)
        self.log.append(("sent", self.window_of[keys[0]]))
        return sent

    async def _recv_window(self, conn, n_replies):
        values = await super()._recv_window(conn, n_replies)
        self.fetched[sum(e.is_set() for e in self.fetched)].set()  # replies come back in window order
        return values

    def _decode(self, key, value):
        self.on_decode(key)
        return super()._decode(key, value)


@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_sync_fetches_next_window_while_decoding(url, srv, reuse_buffers):
    tokens, kv = store(url, "zstd")
    probe = srv.client()
    c = client(url, SpyClient)
    if reuse_buffers:
        c.retrieve_chunks(tokens, reuse_buffers=True)  # learn the value size
    c.setup(tokens, probe)
    n, chunks = c.retrieve_chunks(tokens, reuse_buffers=reuse_buffers)
    assert n == len(tokens) and np.array_equal(np.concatenate(chunks, axis=3), kv)
    # While window k decoded, window k+1 had been fetched: k + 2 MGETs done, no more (one fetch in flight).
    assert c.seen == [(k, True, k + 2) for k in range(c.n_windows - 1)]
    c.close()
    probe.close()


def test_async_fetches_next_window_while_decoding_in_a_thread(url, srv):
    """Compressed windows of >= 64 KiB are decoded in a thread: the event loop reads the next window meanwhile."""
    tokens, kv = store(url, "zstd", layers=4, dim=64)  # 64 KiB per chunk, 3 per window
    probe = srv.client()

    async def run() -> AsyncSpyClient:
        async with client(url, AsyncSpyClient) as c:
            c.setup(tokens, probe)
            n, chunks = await c.retrieve_chunks(tokens)
            assert n == len(tokens) and np.array_equal(np.concatenate(chunks, axis=3), kv)
            return c

    c = asyncio.run(run())
    assert c.seen == [(k, True, k + 2) for k in range(c.n_windows - 1)]
    probe.close()


def test_async_sends_next_window_before_decoding_on_the_loop(url, srv):
    """Small raw windows are decoded on the event loop (a thread hop would cost more than the decode); the next
    window's request is on the wire before that decode starts, so the server works on it meanwhile."""
    tokens, kv = store(url, "raw")
    probe = srv.client()

    class NoWait(AsyncSpyClient):
        def on_decode(self, key: bytes) -> None:  # on the loop: must not block, only record the order
            k = self.window_of[key]
            if ("decode", k) not in self.log:
                self.log.append(("decode", k))

    async def run() -> NoWait:
        async with client(url, NoWait) as c:
            c.setup(tokens, probe)
            n, chunks = await c.retrieve_chunks(tokens)
            assert n == len(tokens) and np.array_equal(np.concatenate(chunks, axis=3), kv)
            return c

    c = asyncio.run(run())
    order = c.log
    assert [e for e in order if e[0] == "decode"] == [("decode", k) for k in range(c.n_windows)]
    for k in range(c.n_windows - 1):
        assert order.index(("sent", k + 1)) < order.index(("decode", k))
    probe.close()


def test_async_offload_rule():
    kv = make_kv(CS, layers=4, dim=64)  # 64 KiB
    raw, zstd, fp8 = (encode(kv, codec) for codec in ("raw", "zstd", "fp8"))
    small = encode(make_kv(CS), "zstd")
    off = AsyncKVCacheClient._offload
    assert off([zstd, zstd]) and off([fp8] * 4) and off([raw] * (8 * 1024 * 1024 // len(raw) + 1))
    assert not off([raw, raw]) and not off([fp8]) and not off([small, None])
