"""The asyncio counterpart of FastClient: the same RESP client (framing, buffer, parsing) around non-blocking I/O.

``AsyncFastClient`` is what ``AsyncKVCacheClient`` stores and reads on. It shares everything but the waiting with
the blocking ``FastClient``: commands are framed by ``fast.pack`` (large values stay the caller's buffers) and
sent with ``sendmsg`` in vectored writes (``fast.send_views``/``fast.advance``); replies are parsed by
``resp.RespReader``/``resp.reply_head``. What differs is only that a receive or a send that would block waits
for the socket on the event loop (``add_reader``/``add_writer``) under the connection's timeout, instead of
blocking the thread. A bulk value too large for the receive buffer is received straight into a buffer of its
own and returned as that ``bytearray`` (no copy into a ``bytes``).

TLS (``ssl_context``: a non-blocking ``SSLSocket``, its handshake and its want-read/want-write answers waited
for the same way; no ``sendmsg`` there, so ``fast.tls_sends``) and a database number (``db``: ``SELECT`` after
AUTH) are spoken as ``FastClient`` speaks them.

``AsyncFastPool`` lends connections to concurrent tasks: at most ``max_connections`` exist at once (lent,
connecting or idle); a task that finds them all lent waits in line for one to come back, up to
``wait_timeout``, then gets ``PoolExhausted``. An idle connection is checked with ``broken()`` before it is lent, as a pool checks,
and one given back unclean (an error or a cancellation between a command and its reply) is closed, never
reused.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kvstrata.client.fast import (
    _IOV_MAX,
    _bytes_view,
    advance,
    pack,
    select_refused,
    send_views,
    tls_sends,
    widen_unix_send_buffer,
)
from kvstrata.client.resp import ARRAY, BULK, RespError, RespReader, error_element, reply_head


class AsyncFastClient(RespReader):
    """One connection; make it with ``await AsyncFastClient.connect(...)``. ``timeout`` bounds each wait for
    the socket (as redis-py's ``socket_timeout``); exceeding it raises ``TimeoutError``."""

    def __init__(self, sock: socket.socket, timeout: float | None) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.timeout = timeout
        self._init_buffer()

    @classmethod
    async def connect(cls, host: str = "127.0.0.1", port: int = 6379, timeout: float | None = 60.0,
                      password: str | None = None, *, unix_path: str | None = None,
                      username: str | None = None, ssl_context: ssl.SSLContext | None = None,
                      db: int = 0) -> AsyncFastClient:
        """TCP to ``host:port`` (each address the name resolves to, in order), or the Unix socket
        ``unix_path``; TLS over TCP with ``ssl_context``; then AUTH when a password is given, and SELECT ``db``
        when not 0. A refused AUTH or SELECT closes the socket and raises ``RespError``."""
        loop = asyncio.get_running_loop()
        if unix_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                async with asyncio.timeout(timeout):
                    await loop.sock_connect(sock, unix_path)
            except BaseException:
                sock.close()
                raise
            widen_unix_send_buffer(sock)
        else:
            sock = await _connect_tcp(loop, host, port, timeout)
            if ssl_context is not None:
                try:
                    sock = ssl_context.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
                except BaseException:
                    sock.close()
                    raise
        conn = cls(sock, timeout)
        try:
            if isinstance(sock, ssl.SSLSocket):
                await conn._handshake()
            if password is not None:
                await conn.call(b"AUTH", *([username] if username else []), password)
            if db:
                try:
                    await conn.call(b"SELECT", db)
                except RespError as exc:
                    raise select_refused(db, exc) from None
        except BaseException:
            conn.close()  # a failed handshake, a refused AUTH or SELECT must not leak the socket
            raise
        return conn

    async def _handshake(self) -> None:
        """The TLS handshake of a non-blocking socket, each want waited for under the timeout."""
        while True:
            try:
                self.sock.do_handshake()  # type: ignore[attr-defined]
                return
            except ssl.SSLWantReadError:
                await self._wait_readable()
            except ssl.SSLWantWriteError:
                await self._wait_writable()

    # ---- waiting for the socket ----
    async def _wait(self, add: Callable[..., Any], remove: Callable[[int], Any]) -> None:
        fd = self.sock.fileno()
        fut = asyncio.get_running_loop().create_future()
        add(fd, _wake, fut)
        try:
            async with asyncio.timeout(self.timeout):
                await fut
        finally:
            remove(fd)

    async def _wait_readable(self) -> None:
        loop = asyncio.get_running_loop()
        await self._wait(loop.add_reader, loop.remove_reader)

    async def _wait_writable(self) -> None:
        loop = asyncio.get_running_loop()
        await self._wait(loop.add_writer, loop.remove_writer)

    async def _recv_into(self, view: memoryview) -> int:
        # A TLS socket reads what its buffer holds first; it says "want read" only when that is empty, so the
        # socket's readiness is then what to wait for.
        while True:
            try:
                return self.sock.recv_into(view)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                await self._wait_readable()
            except ssl.SSLWantWriteError:
                await self._wait_writable()

    # ---- sending ----
    async def send_parts(self, parts: list[Any]) -> int:
        """Send ``parts`` (``pack``'s output) in vectored writes, waiting while the socket's buffer is full;
        returns the bytes sent."""
        views = send_views(parts)
        tls = isinstance(self.sock, ssl.SSLSocket)
        if tls:
            views = tls_sends(views)
        total = 0
        i = 0
        while i < len(views):
            try:
                sent = self.sock.send(views[i]) if tls else self.sock.sendmsg(views[i:i + _IOV_MAX])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                await self._wait_writable()
                continue
            except ssl.SSLWantReadError:
                await self._wait_readable()
                continue
            total += sent
            i = advance(views, i, sent)
        return total

    async def send_many(self, commands: Sequence[Sequence[Any]]) -> int:
        """Send ``commands`` in one write (pipelined); returns the bytes sent."""
        parts: list[Any] = []
        for args in commands:
            pack(args, parts)
        return await self.send_parts(parts)

    # ---- receiving ----
    async def _fill(self) -> None:
        self._received(await self._recv_into(self._room()))

    async def _line(self) -> bytes:
        while True:
            line = self._buffered_line()
            if line is not None:
                return line
            await self._fill()

    async def _bulk(self, n: int) -> bytes | bytearray:
        while (data := self._buffered_bulk(n)) is None:
            if not self._bulk_fits(n):
                # Larger than what is left of the receive buffer: straight into a buffer of its own.
                big = bytearray(n)
                view = _bytes_view(big)
                got = self._drain_into(view, n)
                while got < n:
                    k = await self._recv_into(view[got:])
                    if k == 0:
                        raise ConnectionError("server closed the connection")
                    got += k
                while not self._buffered_crlf():
                    await self._fill()
                return big
            await self._fill()
        return data

    async def read_reply(self) -> Any:
        """One reply (an error reply raises ``RespError``, after it has been read: the connection stays in
        step; an error inside an array is that element, ``error_element``)."""
        return await self._reply(await self._line())

    async def _reply(self, line: bytes) -> Any:
        kind, value = reply_head(line)
        if kind == BULK:
            return await self._bulk(value)
        if kind == ARRAY:
            out = []
            for _ in range(value):
                line = await self._line()
                out.append(error_element(line) or await self._reply(line))
            return out
        return value

    async def call(self, *args: Any) -> Any:
        await self.send_many([args])
        return await self.read_reply()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _connect_tcp(loop: asyncio.AbstractEventLoop, host: str, port: int,
                       timeout: float | None) -> socket.socket:
    error: OSError | None = None
    async with asyncio.timeout(timeout):
        for family, kind, proto, _name, addr in await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, addr)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
    raise error if error is not None else OSError(f"no address for {host!r}")


class PoolExhausted(Exception):
    """Every connection an ``AsyncFastPool`` may make is lent, and none came back in time."""


class AsyncFastPool:
    """Connections lent to one task at a time: ``get`` an idle healthy one (or connect a new one), ``put`` it
    back when its replies have all been read (``clean``), else it is closed. At most ``max_connections`` exist at
    once, idle ones included: ``get`` waits for one to be given back (``wait_timeout`` seconds, None: for ever)
    and then raises ``PoolExhausted``."""

    def __init__(self, connect: Callable[[], Awaitable[AsyncFastClient]], max_connections: int,
                 wait_timeout: float | None = None) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self._connect = connect
        self._idle: list[AsyncFastClient] = []
        self.max_connections = max_connections
        self.wait_timeout = wait_timeout
        # One permit per connection that may exist and is not lent: taken by get, given back by put, handed to
        # the waiters in order. Waiters are futures of whichever loop waits (not an asyncio.Semaphore, which
        # binds itself to one loop: a client may serve several asyncio.run calls).
        self._permits = max_connections
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.lent = 0
        self.waiting = 0  # tasks waiting for a connection to come back (diagnostics)
        self.created = 0  # connections made (tests and diagnostics)
        self.closed = False

    async def get(self) -> AsyncFastClient:
        if self._permits > 0 and not self._waiters:
            self._permits -= 1
        else:
            await self._wait_for_permit()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.broken():
                    self.lent += 1
                    return conn
                conn.close()
            conn = await self._connect()
        except BaseException:
            self._release()
            raise
        self.created += 1
        self.lent += 1
        return conn

    def put(self, conn: AsyncFastClient, clean: bool) -> None:
        self.lent -= 1
        if clean and not self.closed:
            self._idle.append(conn)
        else:
            conn.close()
        self._release()

    async def _wait_for_permit(self) -> None:
        """Wait in line for a connection given back, up to ``wait_timeout``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self.waiting += 1
        try:
            async with asyncio.timeout(self.wait_timeout):
                await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self._release()  # handed a permit just as it gave up: the next in line gets it
            elif fut in self._waiters:
                self._waiters.remove(fut)
            if isinstance(exc, TimeoutError):
                raise PoolExhausted(f"all {self.max_connections} connections of the pool are in use; none was "
                                    f"given back within {self.wait_timeout} s (raise max_connections, or run "
                                    "fewer calls at once)") from None
            raise
        finally:
            self.waiting -= 1

    def _release(self) -> None:
        """A permit back: straight to the first live waiter, else to the pool."""
        while self._waiters:
            fut = self._waiters.popleft()
            if fut.done():
                continue
            try:
                fut.set_result(None)
            except RuntimeError:  # its loop has ended (an asyncio.run that is over)
                continue
            return
        self._permits += 1

    def close(self) -> None:
        """Close the idle connections; one still lent is closed when it is given back."""
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
