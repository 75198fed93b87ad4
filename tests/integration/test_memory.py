"""Memory under hostile clients (issue 13): idle connections, declared-but-unsent bulks, a client that never reads.

RSS is read from /proc for the server process (kvstrata or redis-server, whichever is the target: the same
bounds hold for both). Each case checks the bound while the clients are there, that another client is served
within SERVE_DEADLINE meanwhile, and that RSS comes back once they leave.
"""

from __future__ import annotations

import contextlib
import socket

import pytest
from tests.conftest import TARGET
from tests.integration.hostile import MIB, SERVE_DEADLINE, Prober, rss
from tests.integration.polling import wait_for

KIB = 1024
IDLE_CLIENTS = 2000
IDLE_BOUND = 32 * KIB  # per idle connection
DECLARED = 512 * MIB
DECLARED_BOUND = 32 * MIB  # for four connections that declare 512 MiB each and send nothing
# After the clients leave, RSS must come back to within this of where it was (allocator and interpreter caches).
RETURN_SLACK = 24 * MIB


def _settled_rss(pid: int, below: int) -> int:
    """RSS once it is under ``below`` (freeing may finish after the last close)."""
    wait_for(lambda: rss(pid) <= below, timeout=10, what=f"RSS under {below / MIB:.0f} MiB (is {rss(pid) / MIB:.0f})")
    return rss(pid)


@pytest.fixture
def srv(make_server):
    return make_server({"maxclients": 4000})


def _connect_many(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        socks.append(s)
    return socks


def _close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.close()


def test_idle_connections_cost_at_most_32_kib_each(srv):
    pid = srv.proc.pid
    probe = Prober(srv.port)
    probe.ping_seconds()  # warm up the server's first-command paths before the baseline
    before = rss(pid)
    socks = _connect_many(srv.port, IDLE_CLIENTS)
    try:
        # Each connection has been accepted (and its objects created) once the server counts it.
        c = srv.client()
        wait_for(lambda: c.info("clients")["connected_clients"] >= IDLE_CLIENTS + 1, timeout=30,
                 what="all idle clients accepted")
        c.close()
        grown = rss(pid) - before
        assert grown <= IDLE_CLIENTS * IDLE_BOUND, f"{grown / IDLE_CLIENTS / KIB:.1f} KiB per idle connection"
        assert probe.ping_seconds() < SERVE_DEADLINE
    finally:
        _close_all(socks)
    _settled_rss(pid, before + RETURN_SLACK)
    probe.close()


@pytest.fixture(params=["dram", "ssd"])
def any_tiers(request, make_server, tmp_path):
    """The DRAM-only server (values received into the buffer pool) and one with an SSD tier (plain buffers)."""
    if request.param == "ssd":
        if TARGET != "kvstrata":
            pytest.skip("kvstrata's SSD tier")
        return make_server({"maxclients": 4000, "essd-path": str(tmp_path / "ssd")})
    return make_server({"maxclients": 4000})


def test_declared_bulks_are_not_allocated_before_their_bytes_arrive(any_tiers):
    srv = any_tiers
    pid = srv.proc.pid
    probe = Prober(srv.port)
    probe.ping_seconds()
    before = rss(pid)
    header = b"*3\r\n$3\r\nSET\r\n$2\r\nbk\r\n$%d\r\n" % DECLARED
    socks = _connect_many(srv.port, 4)
    try:
        for s in socks:
            s.sendall(header)
        c = srv.client()
        # Every one of them has reached the value: CLIENT LIST shows the room reserved for it.
        wait_for(lambda: _reserved(c) >= 4, timeout=10, what="bulks declared")
        grown = rss(pid) - before
        assert grown <= DECLARED_BOUND, f"RSS grew {grown / MIB:.0f} MiB for values nobody sent"
        assert probe.ping_seconds() < SERVE_DEADLINE
        # Half of one value arrives: memory grows with it (and only with it).
        half = DECLARED // 8
        socks[0].sendall(b"x" * half)
        wait_for(lambda: _qbuf_max(c) >= half, timeout=20, what="part of the value received")
        assert rss(pid) - before <= DECLARED_BOUND + half + 16 * MIB
        c.close()
    finally:
        _close_all(socks)
    _settled_rss(pid, before + RETURN_SLACK)
    assert probe.ping_seconds() < SERVE_DEADLINE
    probe.close()


def _client_lines(c) -> list[str]:
    return c.execute_command("CLIENT", "LIST").decode().splitlines()


def _field(line: str, name: str) -> int:
    return int(line.split(f" {name}=", 1)[1].split(" ", 1)[0])


def _reserved(c) -> int:
    return sum(1 for line in _client_lines(c) if _field(line, "qbuf-free") >= DECLARED - 1)


def _qbuf_max(c) -> int:
    return max(_field(line, "qbuf") for line in _client_lines(c))


def test_a_client_that_pipelines_and_never_reads(srv):
    """A million PINGs sent without reading one reply: the server stops reading from it instead of buffering
    without bound, keeps serving others, and gives the memory back when it goes."""
    pid = srv.proc.pid
    probe = Prober(srv.port)
    probe.ping_seconds()
    before = rss(pid)
    flood = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    flood.setblocking(False)
    data = b"*1\r\n$4\r\nPING\r\n" * 1_000_000
    view = memoryview(data)
    off = 0
    stalled = 0
    slowest = 0.0
    try:
        while off < len(data) and stalled < 50:
            try:
                off += flood.send(view[off:])
                stalled = 0
            except BlockingIOError:
                stalled += 1  # the server stopped reading (or the kernel buffers are full)
                slowest = max(slowest, probe.ping_seconds())
        slowest = max(slowest, probe.ping_seconds())
        grown = rss(pid) - before
        # Replies waiting for this client are bounded by the transport's high-water mark (64 MiB at most).
        assert grown <= 96 * MIB, f"RSS grew {grown / MIB:.0f} MiB"
        assert slowest < SERVE_DEADLINE
    finally:
        flood.close()
    _settled_rss(pid, before + RETURN_SLACK)
    assert probe.ping_seconds() < SERVE_DEADLINE
    probe.close()


def test_query_buffer_limit_closes_the_client(make_server):
    """client-query-buffer-limit (Redis's minimum, 1mb): a request that outgrows it closes the connection
    without a reply, as in Redis; the server counts it."""
    srv = make_server({"client-query-buffer-limit": "1mb"})
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4000000\r\n")
    got = b""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        for _ in range(40):
            s.sendall(b"y" * 65536)
    with contextlib.suppress(ConnectionResetError):
        while True:
            data = s.recv(65536)
            if not data:
                break
            got += data
    s.close()
    assert got == b""
    c = srv.client()
    assert c.ping()
    stats = c.info("stats")
    if "client_query_buffer_limit_disconnections" in stats:  # Redis 7.0 does not count them yet
        assert stats["client_query_buffer_limit_disconnections"] == 1
