"""Helpers for the hostile-input tests: send raw bytes, see what comes back, check the server still serves.

``exchange`` sends bytes (optionally one small piece at a time) and collects everything until the server closes
the connection or stays quiet; ``serve_time`` measures how long another client waits for PING meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import time
from dataclasses import dataclass

HOST = "127.0.0.1"
# Another client must get PING answered within this while hostile input is being handled. Redis's figure (and
# the issue's) is 100 ms; the tests allow more because they share two CPU cores with other work.
SERVE_DEADLINE = 1.0


MIB = 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss(pid: int) -> int:
    """Resident memory of a process (bytes), from /proc."""
    with open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


@dataclass
class Outcome:
    reply: bytes
    closed: bool

    def __str__(self) -> str:
        return f"{self.reply[:300]!r}{' <closed>' if self.closed else ''}"


def exchange(port: int, data: bytes, *, piece: int = 0, quiet: float = 0.25, limit: float = 5.0) -> Outcome:
    """Send ``data`` (``piece`` bytes per send when > 0), then read until close or ``quiet`` seconds of silence."""
    with socket.create_connection((HOST, port), timeout=limit) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        closed = False
        try:
            if piece > 0:
                for i in range(0, len(data), piece):
                    s.sendall(data[i : i + piece])
            else:
                s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        out = bytearray()
        deadline = time.monotonic() + limit
        while not closed and time.monotonic() < deadline:
            s.settimeout(quiet)
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                closed = True
                break
            out += chunk
        return Outcome(bytes(out), closed)


class Prober:
    """A connection kept open to time PING while something else happens on the server."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def ping_seconds(self) -> float:
        t0 = time.monotonic()
        self.sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        got = b""
        while not got.endswith(b"\r\n"):
            chunk = self.sock.recv(64)
            assert chunk, "the server closed the probe connection"
            got += chunk
        assert got == b"+PONG\r\n", got
        return time.monotonic() - t0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def exchange_many(port: int, inputs: list[bytes], *, quiet: float = 0.3, limit: float = 10.0) -> list[Outcome]:
    """``exchange`` for many inputs at once, one connection each: replies are collected until every connection
    has closed or none has sent anything for ``quiet`` seconds."""
    socks = []
    for _ in inputs:
        s = socket.create_connection((HOST, port), timeout=limit)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(s)
    outcomes = [Outcome(b"", False) for _ in inputs]
    with selectors.DefaultSelector() as sel:
        for i, (s, data) in enumerate(zip(socks, inputs, strict=True)):
            try:
                s.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                outcomes[i].closed = True
                s.close()
                continue
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, i)
        deadline = time.monotonic() + limit
        while sel.get_map() and time.monotonic() < deadline:
            events = sel.select(quiet)
            if not events:
                break
            for key, _ in events:
                i = key.data
                try:
                    chunk = key.fileobj.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    outcomes[i].reply += chunk
                else:
                    outcomes[i].closed = True
                    sel.unregister(key.fileobj)
    for s in socks:
        with contextlib.suppress(OSError):
            s.close()
    return outcomes
