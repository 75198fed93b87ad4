"""A minimal blocking RESP client for benchmarks: large values go out as separate buffers (no packing copy)
and come back into a caller's buffer (``get_into``), so the client costs the same against every server."""

from __future__ import annotations

import socket
from typing import Any


class RespError(Exception):
    pass


class RawClient:
    def __init__(self, host: str, port: int, timeout: float = 60.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- sending ----
    @staticmethod
    def _parts(args: tuple[Any, ...]) -> list[Any]:
        parts: list[Any] = [b"*%d\r\n" % len(args)]
        for a in args:
            if isinstance(a, str):
                a = a.encode()
            elif isinstance(a, int):
                a = str(a).encode()
            n = len(a) if not isinstance(a, memoryview) else a.nbytes
            if n < 16384:
                parts.append(b"$%d\r\n%b\r\n" % (n, a))
            else:
                parts += [b"$%d\r\n" % n, a, b"\r\n"]
        return parts

    def send(self, *args: Any) -> None:
        parts = self._parts(args)
        total = sum(len(p) if not isinstance(p, memoryview) else p.nbytes for p in parts)
        sent = self.sock.sendmsg(parts)
        while sent < total:
            # sendmsg may stop early on large buffers: continue from where it stopped.
            views: list[Any] = []
            skip = sent
            for p in parts:
                n = len(p) if not isinstance(p, memoryview) else p.nbytes
                if skip >= n:
                    skip -= n
                    continue
                views.append(memoryview(p)[skip:])
                skip = 0
            parts = views
            total -= sent
            sent = self.sock.sendmsg(parts)

    # ---- receiving ----
    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self._buf += chunk

    def _line(self) -> bytes:
        while True:
            i = self._buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[: i + 2]
                return line
            self._fill()

    def _exact(self, n: int, into: memoryview | None = None) -> Any:
        """n bytes (plus the trailing CRLF), into ``into`` when given."""
        if into is None:
            while len(self._buf) < n + 2:
                self._fill()
            data = bytes(self._buf[:n])
            del self._buf[: n + 2]
            return data
        have = min(len(self._buf), n)
        into[:have] = self._buf[:have]
        del self._buf[:have]
        got = have
        while got < n:
            k = self.sock.recv_into(into[got:n])
            if k == 0:
                raise ConnectionError("server closed the connection")
            got += k
        while len(self._buf) < 2:
            self._fill()
        del self._buf[:2]
        return n

    def read_reply(self, into: memoryview | None = None) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n, into)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read_reply() for _ in range(n)]
        if kind == b"_":
            return None
        raise RespError(f"unexpected reply type {line[:20]!r}")

    def call(self, *args: Any) -> Any:
        self.send(*args)
        return self.read_reply()

    def get_into(self, key: Any, buf: memoryview) -> int | None:
        """GET into ``buf``; returns the value's length, or None when the key is missing."""
        self.send(b"GET", key)
        return self.read_reply(into=buf)

    def mget_into(self, keys: list[Any], bufs: list[memoryview]) -> list[int | None]:
        self.send(b"MGET", *keys)
        line = self._line()
        if not line.startswith(b"*"):
            raise RespError(line.decode(errors="replace"))
        return [self.read_reply(into=b) for b in bufs[: int(line[1:])]]
