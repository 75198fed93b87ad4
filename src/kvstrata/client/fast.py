"""A small blocking RESP client for large values: no packing copy on send, replies read into caller buffers.

``FastClient`` is the zero-copy path the SDK builds on (and the client every ``kvstrata bench`` drives every
server with, so the client costs the same against each):

* **Send.** A command is a list of buffers: small arguments are packed into the header bytes, each large value
  (>= ``LARGE``) is passed to ``socket.sendmsg`` as it is (bytes, bytearray, memoryview, a numpy array...), so
  the kernel copies it straight from the caller's memory. Pipelines (``pipeline``, ``mset``, ``set_many``) go
  out in as few ``sendmsg`` calls as the iovec limit allows.
* **Receive.** Replies are parsed from a reusable receive buffer; a bulk value that should land in a caller's
  buffer (``get_into``, ``mget_into``, ``get_many_into``) is received with ``recv_into`` directly into it:
  one kernel copy, no Python bytes object, no page faults when the caller reuses its buffers.
* **Scatter receive.** ``read_array_len``/``read_bulk_len``/``recv_scatter``/``end_bulk`` let a caller read a
  bulk value piece by piece straight into several buffers (a strided tensor's contiguous runs) with
  ``recvmsg_into``, seeing each filled piece while it is still in cache (``kvstrata.client.scatter`` hashes it).

* **TLS and a database number.** ``ssl_context`` wraps the TCP connection in TLS (``rediss://``; an
  ``SSLSocket`` has no ``sendmsg``/``recvmsg_into``, so the large values then go out one ``sendall`` each and
  small parts are joined first, ``tls_sends``); ``db`` sends ``SELECT`` after ``AUTH``, and a server that
  refuses it (kvstrata has database 0 only) fails the connect with a ``RespError`` that says so.

The waiting is all this module adds: the receive buffer, reply parsing and connection health are the sans-IO
``kvstrata.client.resp`` (shared with the asyncio ``kvstrata.client.afast.AsyncFastClient``, which also reuses
``pack`` and the vectored-send bookkeeping here).

Any object with a C-contiguous buffer works as a destination (``bytearray``, ``memoryview``, a numpy array, a
torch CPU tensor through ``tensor.numpy()``). A value longer than its destination raises ``ValueTooLarge``
after the reply has been consumed, so the connection stays usable.
"""

from __future__ import annotations

import mmap
import os
import socket
import ssl
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvstrata.client.resp import (
    ARRAY,
    BULK,
    RECV_BUFFER,
    RespError,
    RespReader,
    ValueTooLarge,
    error_element,
    error_reply,
    reply_head,
)

__all__ = ["LARGE", "FastClient", "RespError", "ValueTooLarge", "nbytes", "pack", "select_refused",
           "sendmsg_all", "tls_sends", "widen_unix_send_buffer"]

LARGE = 16 * 1024
_RECV = RECV_BUFFER
_IOV_MAX = 512
# Bytes one recvmsg_into of a scatter receive asks for: small enough that the pieces it fills are still in the
# CPU cache when the caller hashes them right after (the verify pass then costs no memory traffic), large enough
# that syscalls stay few.
SCATTER_BYTES = 512 * 1024
# A Unix stream socket's sender buffer bounds how much one sendmsg moves before the writer sleeps until the
# server has read it; at the default (~208 KiB) a 15 MB KV chunk costs ~70 wake-ups on each side. 4 MiB (the
# usual net.core.wmem_max; the kernel caps it there) measured +20% on the SDK's Unix store. TCP autotunes.
UNIX_SNDBUF = 4 << 20


def _bytes_view(buf: Any) -> memoryview:
    view = memoryview(buf)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return view


def _arg(a: Any) -> Any:
    if isinstance(a, str):
        return a.encode()
    if isinstance(a, int):
        return b"%d" % a
    return a


def nbytes(p: Any) -> int:
    """Bytes in a buffer (bytes, bytearray or a memoryview of any format)."""
    return p.nbytes if isinstance(p, memoryview) else len(p)


def pack(args: Sequence[Any], parts: list[Any]) -> int:
    """Append the RESP encoding of one command to ``parts``; returns its size in bytes.

    Small arguments are joined into header bytes; large values are appended as they are (never copied). An
    argument may also be a list of buffers, one value already split (``[header, payload, ...]``).
    """
    head: list[Any] = [b"*%d\r\n" % len(args)]
    total = 0
    for a in args:
        a = _arg(a)
        if isinstance(a, list):
            head.append(b"$%d\r\n" % sum(nbytes(p) for p in a))
            for p in a:
                if nbytes(p) < LARGE:
                    head.append(p)
                else:
                    h = b"".join(head)
                    if h:  # consecutive runs of one value (a strided tensor) need no separator
                        parts.append(h)
                    parts.append(_bytes_view(p))
                    total += len(h) + nbytes(p)
                    head = []
            head.append(b"\r\n")
            continue
        if isinstance(a, (bytes, bytearray)):
            n = len(a)
        else:
            a = _bytes_view(a)
            n = a.nbytes
        if n < LARGE:
            head.append(b"$%d\r\n" % n)
            head.append(a)
            head.append(b"\r\n")
        else:
            head.append(b"$%d\r\n" % n)
            h = b"".join(head)
            parts.append(h)
            parts.append(a)
            total += len(h) + n
            head = [b"\r\n"]
    h = b"".join(head)
    parts.append(h)
    return total + len(h)



def select_refused(db: int, exc: RespError) -> RespError:
    """A refused ``SELECT db`` at connect time, said plainly (kvstrata serves database 0 only)."""
    return RespError(f"ERR the server refused SELECT {db} ({exc}); a kvstrata server has database 0 only: "
                     f"use a URL without /{db}")

def widen_unix_send_buffer(sock: socket.socket) -> None:
    """Raise a Unix socket's send buffer to ``UNIX_SNDBUF`` (best effort; other sockets are left alone)."""
    if sock.family == socket.AF_UNIX:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SNDBUF)
        except OSError:
            pass  # a sandbox refusing it only costs speed


def send_views(parts: list[Any]) -> list[Any]:
    """``parts`` as ``sendmsg`` takes them (bytes, or flat byte views), empty ones left out."""
    return [p if isinstance(p, bytes) else _bytes_view(p) for p in parts if nbytes(p)]


def advance(views: list[Any], i: int, sent: int) -> int:
    """After a ``sendmsg`` of ``views[i:]`` moved ``sent`` bytes: the index of the first view not all sent (a
    partly sent one is cut to its rest in place)."""
    while sent:
        n = len(views[i])
        if sent >= n:
            sent -= n
            i += 1
        else:
            views[i] = memoryview(views[i])[sent:]
            sent = 0
    return i


def tls_sends(views: list[Any]) -> list[Any]:
    """``send_views``' output as a TLS socket sends it (it has no ``sendmsg``): runs of small parts joined into
    one bytes object (one TLS record instead of one per part), each large view kept as it is (sent from the
    caller's memory, encrypted on the way)."""
    out: list[Any] = []
    small: list[Any] = []
    for v in views:
        if len(v) >= LARGE:
            if small:
                out.append(b"".join(small))
                small = []
            out.append(v)
        else:
            small.append(v)
    if small:
        out.append(b"".join(small))
    return out


def sendmsg_all(sock: socket.socket, parts: list[Any]) -> int:
    """Send every buffer in order with vectored writes (``sendmsg``, never joined), continuing after partial
    sends; returns the bytes sent. On a TLS socket: ``tls_sends``' buffers, one ``sendall`` each."""
    views = send_views(parts)
    if isinstance(sock, ssl.SSLSocket):
        for v in tls_sends(views):
            sock.sendall(v)
        return sum(len(v) for v in views)
    total = 0
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i:i + _IOV_MAX])
        total += sent
        i = advance(views, i, sent)
    return total


class FastClient(RespReader):
    # A value too large for the receive buffer is received into a bytearray of its own: returned as it is when
    # True (the SDK's connections: one copy fewer, as AsyncFastClient does), else copied into bytes.
    keep_bytearrays = False

    def __init__(self, host: str = "127.0.0.1", port: int = 6379, timeout: float | None = 60.0,
                 password: str | None = None, *, unix_path: str | None = None,
                 username: str | None = None, connect_timeout: float | None = None,
                 ssl_context: ssl.SSLContext | None = None, db: int = 0) -> None:
        """TCP to ``host:port``, or the Unix socket ``unix_path`` when given. ``timeout`` bounds each socket
        operation; ``connect_timeout`` (default: ``timeout``) the TCP connect and TLS handshake.
        ``ssl_context``: TLS over the TCP connection (``host`` is the name checked against the certificate
        when the context checks host names). ``db``: ``SELECT`` it after AUTH."""
        self.host, self.port = host, port
        if unix_path is not None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            try:
                self.sock.connect(unix_path)
            except OSError:
                self.sock.close()
                raise
            widen_unix_send_buffer(self.sock)
        else:
            sock = socket.create_connection(
                (host, port), timeout=timeout if connect_timeout is None else connect_timeout)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if ssl_context is not None:
                    sock = ssl_context.wrap_socket(sock, server_hostname=host)  # handshake under connect_timeout
            except BaseException:
                sock.close()
                raise
            self.sock = sock
            self.sock.settimeout(timeout)
        self._init_buffer()
        try:
            if password is not None:
                self.call(b"AUTH", *([username] if username else []), password)
            if db:
                try:
                    self.call(b"SELECT", db)
                except RespError as exc:
                    raise select_refused(db, exc) from None
        except BaseException:
            self.sock.close()  # a refused AUTH or SELECT must not leak the socket
            raise

    def __enter__(self) -> FastClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- a descriptor passed with the reply (TAIR.KV.ARENA, TAIR.KV.STAGE) ----
    def map_passed_fd(self, command: bytes, prot: int, unavailable: type[Exception],
                      what: str) -> tuple[Any, int]:
        """Send ``command`` on this Unix-socket connection and map the descriptor its reply passes (SCM_RIGHTS)
        with ``prot``: (mmap, size). An error reply, or a reply without a descriptor, raises ``unavailable``."""
        self.send(command)
        data, fds, _flags, _addr = socket.recv_fds(self.sock, 4096, 4)
        if not data:
            raise ConnectionError("server closed the connection")
        try:
            self._rbuf[:len(data)] = data
            self._start, self._end = 0, len(data)
            try:
                size = int(self.read_reply())
            except RespError as exc:
                raise unavailable(str(exc)) from None
            if not fds:
                raise unavailable(f"the server sent no {what} descriptor")
            return mmap.mmap(fds[0], size, mmap.MAP_SHARED, prot), size
        finally:
            for fd in fds:
                os.close(fd)

    # ---- sending ----
    def send(self, *args: Any) -> None:
        parts: list[Any] = []
        pack(args, parts)
        sendmsg_all(self.sock, parts)

    def send_many(self, commands: Iterable[Sequence[Any]]) -> int:
        parts: list[Any] = []
        count = 0
        for args in commands:
            pack(args, parts)
            count += 1
        sendmsg_all(self.sock, parts)
        return count

    # ---- receiving (the buffer's bookkeeping is RespReader's, shared with the asyncio client) ----
    def _fill(self) -> None:
        self._received(self.sock.recv_into(self._room()))

    def _line(self) -> bytes:
        while True:
            line = self._buffered_line()
            if line is not None:
                return line
            self._fill()

    def _bulk(self, n: int, into: memoryview | None) -> Any:
        """A bulk value of n bytes (then CRLF): as bytes (see ``keep_bytearrays``), or into ``into`` (returns n)."""
        if into is None or n > into.nbytes:
            while (data := self._buffered_bulk(n)) is None:
                if not self._bulk_fits(n):
                    # Larger than what is left of the receive buffer: receive into a buffer of its own.
                    big = bytearray(n)
                    self._recv_exact(_bytes_view(big), n)
                    data = big if self.keep_bytearrays else bytes(big)
                    break
                self._fill()
            if into is not None:
                raise ValueTooLarge(f"value of {n} bytes does not fit a buffer of {into.nbytes}")
            return data
        self._recv_exact(into, n)
        return n

    def _recv_exact(self, into: memoryview, n: int) -> None:
        got = self._drain_into(into, n)
        recv_into = self.sock.recv_into
        while got < n:
            k = recv_into(into[got:n])
            if k == 0:
                raise ConnectionError("server closed the connection")
            got += k
        while not self._buffered_crlf():
            self._fill()

    # ---- piecewise reading (scatter receive) ----
    def read_array_len(self) -> int | None:
        """The length of an array reply (None for a nil array); an error reply raises ``RespError``."""
        line = self._line()
        if line[:1] == b"*":
            n = int(line[1:])
            return None if n < 0 else n
        if line[:1] == b"-":
            raise error_reply(line)
        raise RespError(f"expected an array, got {line[:20]!r}")

    def read_bulk_len(self) -> int | None:
        """The length of the next bulk string (None for nil); its bytes are then read with ``recv_scatter``
        (exactly that many, in total) and ``end_bulk``. An error reply raises ``RespError``."""
        line = self._line()
        if line[:1] == b"$":
            n = int(line[1:])
            return None if n < 0 else n
        if line[:1] == b"_":
            return None
        if line[:1] == b"-":
            raise error_reply(line)
        raise RespError(f"expected a bulk string, got {line[:20]!r}")

    def recv_scatter(self, views: Sequence[memoryview], on_data: Callable[[memoryview], Any] | None = None,
                     group: int = SCATTER_BYTES) -> int:
        """Fill ``views`` (writable 1-D byte views) in order with the next bytes of the reply: what the receive
        buffer holds already is copied, the rest lands there straight from the socket (``recvmsg_into``, up to
        ``group`` bytes a call). ``on_data`` sees each filled piece as soon as it is filled. Returns the bytes
        read. A connection closed before the last byte raises ``ConnectionError`` (the views are then only
        partly filled: the caller must not use them)."""
        total = sum(v.nbytes for v in views)
        got = 0
        i = off = 0
        while i < len(views) and self._start < self._end:
            v = views[i]
            take = min(v.nbytes - off, self._end - self._start)
            v[off:off + take] = self._rview[self._start:self._start + take]
            self._start += take
            if on_data is not None and take:
                on_data(v[off:off + take])
            got += take
            off += take
            if off == v.nbytes:
                i, off = i + 1, 0
        sock = self.sock
        # A TLS socket has no recvmsg_into: one view per receive.
        one = isinstance(sock, ssl.SSLSocket)
        while i < len(views):
            first = views[i][off:] if off else views[i]
            bufs = [first]
            size = first.nbytes
            j = i + 1
            while not one and j < len(views) and size < group and len(bufs) < _IOV_MAX:
                bufs.append(views[j])
                size += views[j].nbytes
                j += 1
            k = sock.recv_into(first) if len(bufs) == 1 else sock.recvmsg_into(bufs)[0]
            if k == 0:
                raise ConnectionError(f"server closed the connection after {got} of {total} bytes of a value")
            got += k
            for b in bufs:
                take = min(b.nbytes, k)
                if on_data is not None and take:
                    on_data(b[:take] if take < b.nbytes else b)
                k -= take
                if take == b.nbytes:
                    i, off = i + 1, 0
                else:
                    off += take
                if not k:
                    break
        return got

    def skip(self, n: int) -> None:
        """Read and drop the next ``n`` bytes of the reply (a value nobody wants any more)."""
        scratch = memoryview(bytearray(min(n, _RECV) or 1))
        while n:
            take = min(n, scratch.nbytes)
            self.recv_scatter([scratch[:take]])
            n -= take

    def end_bulk(self) -> None:
        """Consume the CRLF that ends a bulk string read piecewise."""
        while self._end - self._start < 2:
            self._fill()
        if self._rbuf[self._start:self._start + 2] != b"\r\n":
            raise RespError("bulk string not followed by CRLF (protocol out of step)")
        self._start += 2

    def read_reply(self, into: Any = None) -> Any:
        """One reply; a bulk value goes into ``into`` when given (returns its length). An error reply raises
        ``RespError``; an error inside an array is that element (``error_element``)."""
        return self._reply(self._line(), into)

    def _reply(self, line: bytes, into: Any = None) -> Any:
        kind, value = reply_head(line)
        if kind == BULK:
            return self._bulk(value, None if into is None else _bytes_view(into))
        if kind == ARRAY:
            out = []
            for _ in range(value):
                line = self._line()
                out.append(error_element(line) or self._reply(line))
            return out
        return value

    def _array_into(self, bufs: Sequence[Any]) -> list[int | None]:
        line = self._line()
        if line[:1] == b"-":
            raise error_reply(line)
        if line[:1] != b"*":
            raise RespError(f"expected an array, got {line[:20]!r}")
        n = int(line[1:])
        out: list[int | None] = []
        error: Exception | None = None
        for i in range(n):
            try:
                out.append(self.read_reply(into=bufs[i] if i < len(bufs) else None))
            except ValueTooLarge as exc:
                error = exc
                out.append(None)
        if error is not None:
            raise error
        return out

    # ---- commands ----
    def call(self, *args: Any) -> Any:
        self.send(*args)
        return self.read_reply()

    def pipeline(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Send every command, then read every reply (errors are returned as RespError instances)."""
        self.send_many(commands)
        out: list[Any] = []
        for _ in commands:
            try:
                out.append(self.read_reply())
            except RespError as exc:
                out.append(exc)
        return out

    def set(self, key: Any, value: Any) -> Any:
        return self.call(b"SET", key, value)

    def get(self, key: Any) -> bytes | None:
        return self.call(b"GET", key)  # type: ignore[no-any-return]

    def read_before(self, on_error: Callable[[RespError], None] | None = None) -> None:
        """Read and drop the reply of a command sent ahead of another in one write; an error reply raises, or
        goes to ``on_error`` (the connection stays in step: an error reply is read whole)."""
        try:
            self.read_reply()
        except RespError as exc:
            if on_error is None:
                raise
            on_error(exc)

    def get_into(self, key: Any, buf: Any) -> int | None:
        """GET into ``buf``; returns the value's length, or None when the key is missing."""
        self.send(b"GET", key)
        return self.read_reply(into=buf)  # type: ignore[no-any-return]

    def mget_into(self, keys: Sequence[Any], bufs: Sequence[Any], before: Sequence[Any] | None = None,
                  command: bytes = b"MGET",
                  on_before_error: Callable[[RespError], None] | None = None) -> list[int | None]:
        """One MGET whose values land in ``bufs`` (one per key); lengths, None for missing keys. ``before``: a
        command sent in the same write ahead of it (its reply is read and dropped; an error reply raises, or
        goes to ``on_before_error`` and the MGET is read all the same). ``command``: ``b"TAIR.KV.MGET"`` on
        kvstrata, as the SDK reads (its consistency level and ACL rules, not plain MGET's); the default speaks
        to any Redis."""
        if before:
            self.send_many((before, (command, *keys)))
            self.read_before(on_before_error)
        else:
            self.send(command, *keys)
        return self._array_into(bufs)

    def get_many_into(self, keys: Sequence[Any], bufs: Sequence[Any]) -> list[int | None]:
        """Pipelined GETs, each value into its buffer."""
        self.send_many([(b"GET", k) for k in keys])
        return [self.read_reply(into=b) for b in bufs[: len(keys)]]

    def mset(self, items: Iterable[tuple[Any, Any]] | dict[Any, Any]) -> Any:
        """One MSET; values are sent from the caller's memory."""
        pairs = items.items() if isinstance(items, dict) else items
        args: list[Any] = [b"MSET"]
        for k, v in pairs:
            args += (k, v)
        return self.call(*args)

    def set_many(self, items: Iterable[tuple[Any, Any]] | dict[Any, Any]) -> list[Any]:
        """Pipelined SETs."""
        pairs = items.items() if isinstance(items, dict) else items
        return self.pipeline([(b"SET", k, v) for k, v in pairs])
