"""Scatter receive (kvstrata.client.scatter): KV values read off a socket straight into the caller's array.

Against a real server: byte-exact ``retrieve(out=)`` into strided and contiguous destinations, corrupted and
refused values, a connection cut mid-value (through a real TCP proxy) that is recovered, and a server gone
mid-value that raises. Against a scripted peer on a real socket: a reply dribbled out in small TCP segments,
and a peer that closes halfway through a value.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import numpy as np
import pytest
import redis
from tests.integration.support import make_kv

from kvstrata.client import AsyncKVCacheClient, KVCacheClient, Namespace
from kvstrata.client.codec import ChecksumError, encode, read_header
from kvstrata.client.fast import FastClient
from kvstrata.client.scatter import dest_runs, mget_scatter

CS = 64  # tokens per chunk: with 16 head dims of float32 a run is 4 KB, the smallest one received in place


@pytest.fixture(scope="module")
def srv(module_make_server):
    return module_make_server()


@pytest.fixture
def url(srv):
    c = srv.client()
    c.flushall()
    c.close()
    return f"redis://{srv.host}:{srv.port}"


def kv_of(n_tokens: int, seed: int = 0) -> np.ndarray:
    return make_kv(n_tokens, seed=seed, layers=3, heads=2, dim=16)


def client(url: str, layout: str = "LKHTD", **kw: Any) -> KVCacheClient:
    kw.setdefault("chunk_size", CS)
    kw.setdefault("compression", "raw")  # scatter receive is for clients of raw values (whatever the env says)
    return KVCacheClient(url, Namespace("scatter", layout=layout), local_plane=False, **kw)


def placed_count(monkeypatch) -> list[int]:
    """Counts values that ``read_value`` received in place (wraps the real function)."""
    import kvstrata.client.scatter as scatter

    seen = [0]
    real = scatter.read_value

    def counting(fc, n, place):
        result = real(fc, n, place)
        seen[0] += result[2]
        return result

    monkeypatch.setattr(scatter, "read_value", counting)
    return seen


def test_strided_destination_is_filled_in_place_byte_exact(url, monkeypatch):
    seen = placed_count(monkeypatch)
    tokens = list(range(7 * CS))
    kv = kv_of(7 * CS)
    client(url).store(tokens, kv)
    reader = client(url, batch_size=3, prefetch_window=2)  # 7 chunks: windows of 2, 2, 2, 1
    dst = np.full_like(kv, np.nan)
    n, view = reader.retrieve(tokens, out=dst)
    assert n == 7 * CS and view.base is dst
    assert dst.tobytes() == kv.tobytes()  # bitwise
    assert seen[0] == 7  # every chunk went straight into its (strided) slot of dst
    assert reader.stats.hit_chunks == 7 and reader.stats.bytes_received > kv.nbytes
    # a larger out: only the restored part is written
    big = np.full((3, 2, 2, 9 * CS, 16), -7.0, np.float32)
    n, view = reader.retrieve(tokens, out=big)
    assert n == 7 * CS and np.array_equal(view, kv) and (big[:, :, :, 7 * CS:] == -7.0).all()
    reader.close()


def test_retrieve_without_out_receives_into_one_new_array(url, srv, monkeypatch):
    seen = placed_count(monkeypatch)
    tokens = list(range(5 * CS))
    kv = kv_of(5 * CS, seed=9)
    writer = client(url)
    writer.store(tokens, kv)
    reader = client(url)
    n, got = reader.retrieve(tokens)
    assert n == 5 * CS and got.flags.c_contiguous and got.flags.owndata and got.dtype == np.float32
    assert got.tobytes() == kv.tobytes() and seen[0] == 5
    r = srv.client()
    r.delete(writer.keys(tokens)[3])
    n, got = reader.retrieve(tokens)  # a partial hit: the filled part, compacted
    assert n == 3 * CS and got.flags.c_contiguous and got.shape == (3, 2, 2, 3 * CS, 16)
    assert np.array_equal(got, kv[:, :, :, :3 * CS])
    r.close()
    reader.close()
    writer.close()


def test_async_retrieve_into_out_is_received_in_place(url, monkeypatch):
    seen = placed_count(monkeypatch)
    tokens = list(range(4 * CS))
    kv = kv_of(4 * CS, seed=10)
    client(url).store(tokens, kv)

    async def main():
        async with AsyncKVCacheClient(url, Namespace("scatter"), chunk_size=CS, local_plane=False,
                                      compression="raw") as c:
            dst = np.zeros_like(kv)
            n, view = await c.retrieve(tokens, out=dst)
            assert n == 4 * CS and view.base is dst and dst.tobytes() == kv.tobytes()
            n, got = await c.retrieve(tokens)  # without out: the asyncio windows, as before
            assert n == 4 * CS and np.array_equal(got, kv)
            return c.stats.hit_chunks

    assert asyncio.run(main()) == 8  # both reads counted on the asyncio client's stats
    assert seen[0] == 4


def test_contiguous_destination_and_bfloat16_bits(url, monkeypatch):
    """Layout TLKHD: each chunk's slot of ``out`` is one contiguous block (one recv_into per value)."""
    seen = placed_count(monkeypatch)
    tokens = list(range(5 * CS))
    rng = np.random.default_rng(3)
    kv = rng.integers(0, 1 << 16, size=(5 * CS, 3, 2, 2, 16), dtype=np.uint16)
    assert dest_runs(kv[CS:2 * CS]) is not None and len(dest_runs(kv[CS:2 * CS])) == 1
    writer = KVCacheClient(url, Namespace("scatter-bf16", kv_dtype="bfloat16", layout="TLKHD"),
                           chunk_size=CS, local_plane=False, compression="raw")
    writer.store(tokens, kv)
    reader = KVCacheClient(url, Namespace("scatter-bf16", kv_dtype="bfloat16", layout="TLKHD"),
                           chunk_size=CS, local_plane=False, compression="raw")
    dst = np.zeros_like(kv)
    n, view = reader.retrieve(tokens, out=dst)
    assert n == 5 * CS and np.array_equal(dst, kv) and seen[0] == 5
    writer.close()
    reader.close()


def test_compressed_values_fall_back_to_decode_and_copy(url, monkeypatch):
    """Values written compressed by another client: received whole, decoded and copied into ``out``."""
    seen = placed_count(monkeypatch)
    tokens = list(range(3 * CS))
    kv = kv_of(3 * CS, seed=4)
    client(url, compression="zstd").store(tokens, kv)
    reader = client(url)
    dst = np.zeros_like(kv)
    n, _ = reader.retrieve(tokens, out=dst)
    assert n == 3 * CS and np.array_equal(dst, kv) and seen[0] == 0
    reader.close()
    zreader = client(url, compression="zstd")  # a client that writes zstd reads through the overlapped windows
    assert not zreader._scatter_reads()
    n, got = zreader.retrieve(tokens)
    assert n == 3 * CS and np.array_equal(got, kv)
    zreader.close()


def test_corrupted_value_ends_the_prefix_and_the_connection_stays_in_step(url, srv):
    r = srv.client()
    tokens = list(range(6 * CS))
    kv = kv_of(6 * CS, seed=1)
    writer = client(url)
    writer.store(tokens, kv)
    keys = writer.keys(tokens)
    value = bytearray(r.get(keys[2]))
    value[len(value) // 2] ^= 0x01  # one payload bit
    r.set(keys[2], bytes(value))
    reader = client(url, prefetch_window=4)
    dst = np.zeros_like(kv)
    n, view = reader.retrieve(tokens, out=dst)
    assert n == 2 * CS and np.array_equal(view, kv[:, :, :, :2 * CS])
    assert reader.stats.corrupt == 1 and "checksum" in reader.stats.errors[-1]
    fc = reader._tls.fast
    assert fc is not None and fc.call("PING") == b"PONG"  # the rest of that reply was read and dropped
    # the same connection serves the next restore, and a future format version is refused, not decoded
    r.set(keys[2], writer.redis.get(keys[1]).replace(b"KVSC\x01", b"KVSC\x09", 1))
    n, _ = reader.retrieve(tokens, out=dst)
    assert n == 2 * CS and reader.stats.refused == 1 and "format version 9" in reader.stats.errors[-1]
    assert reader._tls.fast is fc
    reader.close()
    writer.close()
    r.close()


def test_checksum_error_from_mget_scatter_after_the_whole_reply(url, srv):
    r = srv.client()
    kv = kv_of(CS, seed=2)
    value = bytearray(encode(kv, layout="LKHTD"))
    value[-3] ^= 0x80
    r.set(b"bad", bytes(value))
    r.set(b"good", encode(kv, layout="LKHTD"))
    fc = FastClient(srv.host, srv.port)
    dst = np.zeros_like(kv)
    with pytest.raises(ChecksumError):
        mget_scatter(fc, [b"bad", b"good"], lambda hdr: dst, command=b"MGET")
    assert fc.call("PING") == b"PONG"
    fc.close()
    r.close()


class _Proxy:
    """A TCP proxy to the server that, once armed, cuts the first connection that asks for an MGET after
    ``cut_after`` bytes of its reply (``then_refuse``: and then stops listening, as a server that went away)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.cut_after: int | None = None
        self.then_refuse = False
        self.cuts = 0
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            with self.lock:
                self.socks += [c, s]
            state = {"mget": False}
            threading.Thread(target=self._up, args=(c, s, state), daemon=True).start()
            threading.Thread(target=self._down, args=(s, c, state), daemon=True).start()

    def _up(self, src: socket.socket, dst: socket.socket, state: dict[str, bool]) -> None:
        try:
            while data := src.recv(65536):
                if b"MGET" in data:
                    state["mget"] = True
                dst.sendall(data)
        except OSError:
            pass
        self._shut(src, dst)

    def _down(self, src: socket.socket, dst: socket.socket, state: dict[str, bool]) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                limit = self.cut_after
                if state["mget"] and limit is not None:
                    if sent + len(data) >= limit:
                        dst.sendall(data[:limit - sent])
                        with self.lock:
                            self.cut_after = None
                            self.cuts += 1
                            if self.then_refuse:
                                self._stop_listening()
                        break
                    sent += len(data)
                dst.sendall(data)
        except OSError:
            pass
        self._shut(src, dst)

    @staticmethod
    def _shut(a: socket.socket, b: socket.socket) -> None:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _stop_listening(self) -> None:
        try:
            self.lsock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (a close alone would not, on Linux)
        except OSError:
            pass
        self.lsock.close()

    def close(self) -> None:
        self._stop_listening()
        with self.lock:
            for s in self.socks:
                s.close()


def test_connection_cut_mid_value_is_read_again_byte_exact(url, srv):
    tokens = list(range(6 * CS))
    kv = kv_of(6 * CS, seed=5)
    client(url).store(tokens, kv)
    proxy = _Proxy(srv.host, srv.port)
    try:
        reader = client(f"redis://127.0.0.1:{proxy.port}", prefetch_window=2)
        dst = np.zeros_like(kv)
        reader.retrieve(tokens, out=dst)  # connections up, sizes learnt
        chunk_bytes = kv.nbytes // 6
        proxy.cut_after = 3 * chunk_bytes + chunk_bytes // 2  # in the middle of a value of the second window
        dst[...] = 0
        n, view = reader.retrieve(tokens, out=dst)
        assert proxy.cuts == 1
        assert n == 6 * CS and dst.tobytes() == kv.tobytes()
        reader.close()
    finally:
        proxy.close()


def test_server_gone_mid_value_raises_instead_of_returning_a_partial_restore(url, srv):
    tokens = list(range(4 * CS))
    kv = kv_of(4 * CS, seed=6)
    client(url).store(tokens, kv)
    proxy = _Proxy(srv.host, srv.port)
    try:
        reader = client(f"redis://127.0.0.1:{proxy.port}", prefetch_window=4)
        reader.retrieve(tokens, out=np.zeros_like(kv))
        reader.pool.disconnect()  # redis-py must reconnect for the retry: to a proxy no longer listening
        proxy.then_refuse = True
        proxy.cut_after = kv.nbytes // 8  # inside the first value
        with pytest.raises((redis.ConnectionError, OSError)):
            reader.retrieve(tokens, out=np.zeros_like(kv))
        assert proxy.cuts == 1 and reader.stats.hit_chunks == 4  # only the first restore's hits
        reader.close()
    finally:
        proxy.close()


class _Scripted:
    """A peer on a real TCP socket that answers the first request with ``script``, written in ``pieces``
    (small sends with TCP_NODELAY: many segments), then closes unless ``keep_open``."""

    def __init__(self, script: bytes, pieces: list[int], keep_open: bool = True) -> None:
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.script, self.pieces, self.keep_open = script, pieces, keep_open
        self.conn: socket.socket | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.lsock.accept()
        self.conn = conn
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.recv(65536)
        pos = 0
        for size in self.pieces:
            conn.sendall(self.script[pos:pos + size])
            pos += size
        conn.sendall(self.script[pos:])
        if not self.keep_open:
            conn.close()

    def close(self) -> None:
        self.thread.join(timeout=30)
        if self.conn is not None:
            self.conn.close()
        self.lsock.close()


def _bulk(b: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(b), b)


def test_reply_in_many_small_segments_lands_byte_exact():
    big = kv_of(4 * CS, seed=7)
    values = [encode(big[:, :, :, i * CS:(i + 1) * CS], layout="LKHTD") for i in range(4)]
    script = b"*4\r\n" + b"".join(_bulk(v) for v in values) + b"+PONG\r\n"
    rng = np.random.default_rng(0)
    pieces = [int(x) for x in rng.integers(1, 3000, size=400)]  # the first 600 KB in segments of < 3 KB
    peer = _Scripted(script, pieces)
    fc = FastClient("127.0.0.1", peer.port)
    dst = np.zeros_like(big)
    pos = [0]

    def place(hdr):
        return dst[:, :, :, pos[0]:pos[0] + hdr.shape[3]]

    def on_value(i, hdr, arr, placed, nbytes):
        assert placed and arr.base is dst
        pos[0] += hdr.shape[3]
        return True

    assert mget_scatter(fc, [b"k0", b"k1", b"k2", b"k3"], place, command=b"MGET", on_value=on_value) == 4
    assert dst.tobytes() == big.tobytes()
    assert fc.read_reply() == b"PONG"  # the CRLF after each value was consumed, nothing more
    fc.close()
    peer.close()


def test_peer_closing_mid_value_raises_a_clear_error():
    kv = kv_of(CS, seed=8)
    value = encode(kv, layout="LKHTD")
    half = b"*1\r\n" + b"$%d\r\n" % len(value) + value[: len(value) // 2]
    peer = _Scripted(half, [], keep_open=False)
    fc = FastClient("127.0.0.1", peer.port)
    dst = np.zeros_like(kv)
    accepted: list[int] = []
    with pytest.raises(ConnectionError, match=r"closed the connection after \d+ of \d+ bytes"):
        mget_scatter(fc, [b"k"], lambda hdr: dst, command=b"MGET",
                     on_value=lambda *a: accepted.append(a[0]) or True)
    assert accepted == []  # the half-filled slot was never reported as a value
    assert read_header(value).payload_len == kv.nbytes
    fc.close()
    peer.close()
