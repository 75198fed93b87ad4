"""Large values through a Connection with a fake transport: pooled receive, streamed replies, backpressure,
reply leases and the output-buffer limit, without sockets or sleeps."""

from __future__ import annotations

import os
from typing import Any

import pytest

from kvstrata.config import build_config
from kvstrata.server.app import Server
from kvstrata.server.connection import Connection

MB = 1024 * 1024


class FakeTransport:
    """Buffers what is written (holding a memoryview export of each part, as uvloop does) until drained."""

    def __init__(self, high: int = 8 * MB) -> None:
        self.protocol: Connection | None = None
        self.high = high
        self.low = high // 4
        self.pending: list[memoryview] = []
        self.size = 0
        self.sent = bytearray()
        self.paused = False
        self.reading = True
        self.aborted = False
        self.closed = False
        self.max_size = 0

    def get_extra_info(self, key: str) -> Any:
        return ("127.0.0.1", 1) if key in ("peername", "sockname") else None

    def set_write_buffer_limits(self, high: int) -> None:
        self.high = min(self.high, high)
        self.low = self.high // 4

    def write(self, data: Any) -> None:
        self.writelines([data])

    def writelines(self, parts: list[Any]) -> None:
        assert not self.closed
        for p in parts:
            v = memoryview(p).cast("B")
            self.pending.append(v)
            self.size += v.nbytes
        self.max_size = max(self.max_size, self.size)
        if self.size > self.high and not self.paused:
            self.paused = True
            assert self.protocol is not None
            self.protocol.pause_writing()

    def drain(self, nbytes: int | None = None) -> None:
        left = self.size if nbytes is None else nbytes
        while self.pending and left > 0:
            v = self.pending[0]
            k = min(left, v.nbytes)
            self.sent += v[:k]
            left -= k
            self.size -= k
            if k == v.nbytes:
                self.pending.pop(0).release()
            else:
                self.pending[0] = v[k:]
                v.release()
        if self.paused and self.size <= self.low:
            self.paused = False
            assert self.protocol is not None
            self.protocol.resume_writing()

    def get_write_buffer_size(self) -> int:
        return self.size

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True
        for v in self.pending:
            v.release()
        self.pending = []
        assert self.protocol is not None
        self.protocol.connection_lost(None)


def _conn(config: dict[str, Any] | None = None, high: int = 8 * MB) -> tuple[Server, Connection, FakeTransport]:
    srv = Server(build_config(dict(config or {}), {}))
    conn = Connection(srv)
    t = FakeTransport(high)
    t.protocol = conn
    conn.connection_made(t)
    return srv, conn, t


def _feed(conn: Connection, data: bytes, chunk: int = 1 << 30) -> None:
    view = memoryview(data)
    while view:
        buf = conn.get_buffer(-1)
        k = min(len(buf), len(view), chunk)
        buf[:k] = view[:k]
        conn.buffer_updated(k)
        view = view[k:]


def _cmd(*args: bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%b\r\n" % (len(a), a))
    return b"".join(out)


def _where(pool: Any, value: Any) -> int:
    """Which memory holds a received value: its arena slot's offset, or the pool buffer itself."""
    slot = getattr(pool, "slot", None)
    return slot(value).off if slot is not None else id(value)


# The shared-memory arena (the default) and the heap buffer pool (arena no) give the same guarantees.
both = pytest.mark.parametrize("arena", ["yes", "no"])


@both
def test_large_set_is_received_into_a_pool_buffer_and_reused_after_overwrite(arena: str) -> None:
    srv, conn, t = _conn({"arena": arena})
    pool = srv.bufpool  # type: ignore[attr-defined]
    v1 = os.urandom(MB)
    _feed(conn, _cmd(b"SET", b"k", v1), chunk=100_000)
    stored = srv.store.get(b"k").value  # type: ignore[union-attr]
    assert stored == v1 and pool.leases(stored) == 1  # the entry's lease; the parser gave its own back
    where = _where(pool, stored)
    t.drain()
    v2 = os.urandom(MB)
    _feed(conn, _cmd(b"SET", b"k", v2), chunk=100_000)  # the old buffer is in limbo while this one arrives
    _feed(conn, _cmd(b"SET", b"k", v1), chunk=100_000)
    now = srv.store.get(b"k").value  # type: ignore[union-attr]
    assert _where(pool, now) == where
    assert now == v1


@both
def test_mget_of_many_large_values_streams_with_backpressure(arena: str) -> None:
    srv, conn, t = _conn({"arena": arena}, high=8 * MB)
    values = [os.urandom(4 * MB + i) for i in range(12)]
    for i, v in enumerate(values):
        _feed(conn, _cmd(b"SET", b"k%d" % i, v), chunk=256 * 1024)
    t.drain()
    t.sent.clear()
    _feed(conn, _cmd(b"MGET", *[b"k%d" % i for i in range(12)], b"missing"))
    # Only about one batch went to the transport; the rest waits, and reading is paused meanwhile.
    assert t.size < 8 * MB + 17 * MB
    assert not t.reading
    assert conn._stream is not None
    # GET behind the stream keeps its place.
    while t.size:
        t.drain(3 * MB)
    assert t.reading
    expect = b"*13\r\n" + b"".join(b"$%d\r\n%b\r\n" % (len(v), v) for v in values) + b"$-1\r\n"
    assert bytes(t.sent) == expect
    assert t.max_size < 8 * MB + 17 * MB
    # Every reply lease is given back once the transport is empty (checked on resume_writing, before the
    # next large reply, or when the pool runs short).
    pool = srv.bufpool
    pool.settle()  # type: ignore[attr-defined]
    assert all(pool.leases(srv.store.get(b"k%d" % i).value) == 1 for i in range(12))  # type: ignore[union-attr]


def test_tair_kv_mget_streams_too() -> None:
    srv, conn, t = _conn(high=4 * MB)
    values = [os.urandom(2 * MB) for _ in range(6)]
    for i, v in enumerate(values):
        _feed(conn, _cmd(b"TAIR.KV.SETEX", b"k%d" % i, b"0", v), chunk=256 * 1024)
    t.drain()
    t.sent.clear()
    _feed(conn, _cmd(b"TAIR.KV.MGET", *[b"k%d" % i for i in range(6)]))
    assert not t.reading
    while t.size:
        t.drain(MB)
    assert bytes(t.sent) == b"*6\r\n" + b"".join(b"$%d\r\n%b\r\n" % (len(v), v) for v in values)


@both
def test_overwritten_value_in_flight_is_not_reused_until_written(arena: str) -> None:
    srv, conn, t = _conn({"arena": arena}, high=64 * MB)
    pool = srv.bufpool  # type: ignore[attr-defined]
    v1 = os.urandom(MB)
    _feed(conn, _cmd(b"SET", b"k", v1), chunk=100_000)
    t.drain()
    old = srv.store.get(b"k").value  # type: ignore[union-attr]
    where = _where(pool, old)
    _feed(conn, _cmd(b"GET", b"k"))  # reply in flight (not drained)
    assert pool.leases(old) == 2
    other = conn.server.clients  # a second client overwrites the key meanwhile
    assert other
    srv2conn = Connection(srv)
    t2 = FakeTransport()
    t2.protocol = srv2conn
    srv2conn.connection_made(t2)
    _feed(srv2conn, _cmd(b"SET", b"k", b"x" * 10))
    assert pool.leases(old) == 1  # only the reply's lease
    v2 = os.urandom(MB)
    _feed(srv2conn, _cmd(b"SET", b"k2", v2), chunk=100_000)
    assert _where(pool, srv.store.get(b"k2").value) != where  # type: ignore[union-attr]
    t.drain()
    assert bytes(t.sent).endswith(b"$%d\r\n%b\r\n" % (MB, v1))
    # Written: before allocating, the pool asks connections holding reply leases to give back what the
    # transport has written, so the buffer comes back for the next value.
    assert pool.leases(old) == 1
    _feed(srv2conn, _cmd(b"SET", b"k3", v2), chunk=100_000)
    k3 = srv.store.get(b"k3").value  # type: ignore[union-attr]
    assert _where(pool, k3) == where
    assert k3 == v2


@both
def test_getset_returns_the_old_large_value_intact(arena: str) -> None:
    srv, conn, t = _conn({"arena": arena})
    v1, v2, v3 = os.urandom(MB), os.urandom(MB), os.urandom(MB)
    _feed(conn, _cmd(b"SET", b"k", v1), chunk=100_000)
    t.drain()
    t.sent.clear()
    # GETSET's old value leaves the store, the next SET arrives before the reply is written.
    _feed(conn, _cmd(b"GETSET", b"k", v2) + _cmd(b"SET", b"j", v3), chunk=100_000)
    t.drain()
    assert bytes(t.sent) == b"$%d\r\n%b\r\n+OK\r\n" % (MB, v1)


def test_client_over_output_limit_is_closed() -> None:
    srv, conn, t = _conn({"client-output-buffer-limit": 10 * MB}, high=64 * MB)
    v = os.urandom(MB)
    _feed(conn, _cmd(b"SET", b"k", v), chunk=100_000)
    t.drain()
    _feed(conn, b"".join(_cmd(b"GET", b"k") for _ in range(20)))
    assert t.aborted
    assert srv.stats.output_limit_closed == 1
    assert conn.client.id not in srv.clients
