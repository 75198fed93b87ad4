"""tcp-keepalive as Redis 7.0: a client's TCP connection gets the kernel's keepalive timer at the configured
idle time (read from the kernel's own table, /proc/net/tcp, on the server's side of the connection), CONFIG SET
applies to new connections, 0 turns it off. Also tcp-backlog's configuration. Run against both targets."""

from __future__ import annotations

import os

import pytest
import redis

from integration.polling import wait_for

TICKS = os.sysconf("SC_CLK_TCK")


def _server_side_timer(server_port: int, client_port: int) -> tuple[int, float] | None:
    """(timer kind, seconds until it fires) of the server's socket of one connection (1: retransmit,
    2: keepalive, 0: none), from /proc/net/tcp; None while the kernel does not list it."""
    with open("/proc/net/tcp") as fh:
        next(fh)
        for line in fh:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
                kind, when = fields[5].split(":")
                return int(kind, 16), int(when, 16) / TICKS
    return None


def _timer_of_a_new_connection(server) -> tuple[int, float]:
    conn = server.raw()
    try:
        assert conn.cmd("PING") == "PONG"
        client_port = conn.sock.getsockname()[1]
        return wait_for(lambda: _server_side_timer(server.port, client_port), what="the connection in /proc")
    finally:
        conn.close()


def test_keepalive_timer_follows_tcp_keepalive(server, r):
    assert r.config_get("tcp-keepalive") == {"tcp-keepalive": "300"}  # Redis's default
    try:
        kind, seconds = _timer_of_a_new_connection(server)
        assert kind == 2 and 250 < seconds <= 300
        assert r.config_set("tcp-keepalive", 7)
        kind, seconds = _timer_of_a_new_connection(server)
        assert kind == 2 and 0 < seconds <= 7
        assert r.config_set("tcp-keepalive", 0)
        kind, _ = _timer_of_a_new_connection(server)
        assert kind == 0
    finally:
        r.config_set("tcp-keepalive", 300)


def test_tcp_keepalive_and_backlog_bounds(r):
    with pytest.raises(redis.ResponseError, match="argument must be between 0 and 2147483647 inclusive"):
        r.config_set("tcp-keepalive", -1)
    assert r.config_get("tcp-backlog") == {"tcp-backlog": "511"}
    with pytest.raises(redis.ResponseError, match="can't set immutable config"):
        r.config_set("tcp-backlog", 100)
