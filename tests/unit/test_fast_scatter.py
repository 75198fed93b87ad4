"""FastClient's piecewise reading (read_bulk_len / recv_scatter / end_bulk / skip) on a real socket pair: any
split of a value into destination buffers, any split of the stream into writes, bytes already buffered."""

from __future__ import annotations

import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstrata.client.fast import FastClient, RespError


def _client_on(sock: socket.socket) -> FastClient:
    fc = FastClient.__new__(FastClient)  # the transport over an existing socket (no connect, no AUTH)
    fc.sock = sock
    fc.host, fc.port = "socketpair", 0
    fc._rbuf = bytearray(256 * 1024)
    fc._rview = memoryview(fc._rbuf)
    fc._start = fc._end = 0
    return fc


def _feed(sock: socket.socket, data: bytes, pieces: list[int]) -> threading.Thread:
    def run() -> None:
        pos = 0
        for size in pieces:
            if pos >= len(data):
                break
            sock.sendall(data[pos:pos + size])
            pos += size
        sock.sendall(data[pos:])

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


@settings(max_examples=60, deadline=None)
@given(payload_len=st.integers(1, 300_000), cuts=st.lists(st.integers(0, 300_000), max_size=12),
       pieces=st.lists(st.integers(1, 70_000), max_size=20), group=st.sampled_from([1, 4096, 65536, 512 * 1024]))
def test_recv_scatter_fills_any_split_in_order(payload_len, cuts, pieces, group):
    payload = bytes((i * 7 + 3) & 0xFF for i in range(payload_len))
    bounds = sorted({0, payload_len, *(c % (payload_len + 1) for c in cuts)})
    bufs = [bytearray(b - a) for a, b in zip(bounds, bounds[1:], strict=False)]
    views = [memoryview(b) for b in bufs]
    a, b = socket.socketpair()
    try:
        stream = b"$%d\r\n" % payload_len + payload + b"\r\n+NEXT\r\n"
        th = _feed(a, stream, pieces)
        fc = _client_on(b)
        assert fc.read_bulk_len() == payload_len
        seen = bytearray()
        assert fc.recv_scatter(views, seen.extend, group=group) == payload_len
        fc.end_bulk()
        assert b"".join(bufs) == payload and bytes(seen) == payload  # on_data saw every byte once, in order
        assert fc.read_reply() == b"NEXT"
        th.join(timeout=10)
    finally:
        a.close()
        b.close()


def test_skip_nil_error_and_a_missing_crlf():
    a, b = socket.socketpair()
    try:
        a.sendall(b"*3\r\n$5\r\nhello\r\n$-1\r\n-ERR nope\r\n$2\r\nab!!")
        fc = _client_on(b)
        assert fc.read_array_len() == 3
        n = fc.read_bulk_len()
        fc.skip(n)
        fc.end_bulk()
        assert fc.read_bulk_len() is None
        with pytest.raises(RespError, match="nope"):
            fc.read_bulk_len()
        assert fc.read_bulk_len() == 2
        fc.recv_scatter([memoryview(bytearray(2))])
        with pytest.raises(RespError, match="CRLF"):
            fc.end_bulk()
    finally:
        a.close()
        b.close()


def test_peer_closing_mid_value_says_how_far_it_got():
    a, b = socket.socketpair()
    try:
        a.sendall(b"$100\r\n" + b"x" * 40)
        a.close()
        fc = _client_on(b)
        assert fc.read_bulk_len() == 100
        with pytest.raises(ConnectionError, match="after 40 of 100 bytes"):
            fc.recv_scatter([memoryview(bytearray(60)), memoryview(bytearray(40))])
    finally:
        b.close()
