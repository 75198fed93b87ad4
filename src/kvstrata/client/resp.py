"""The sans-IO half of the SDK's RESP transport: the receive buffer, reply headers, connection health.

``FastClient`` (blocking, kvstrata.client.fast) and ``AsyncFastClient`` (asyncio, kvstrata.client.afast) are the
same client around two kinds of I/O. Everything that does not wait lives here, once: the reusable receive buffer
and the parsing of lines and buffered bulk values out of it (``RespReader``), what a reply's header line means
(``reply_head``), and whether an idle connection may be used again (``RespReader.broken``). Each client adds
only the waiting: refill the buffer, receive a large value straight into its destination, send. The framing of
commands (``pack``) and the bookkeeping of vectored sends (``send_views``/``advance``) are in kvstrata.client.fast
and shared the same way.
"""

from __future__ import annotations

import os
import select
import socket
import ssl
from typing import Any

# Size of the reusable receive buffer: replies' header lines and small values are parsed out of it; a bulk value
# larger than what is left of it is received into a buffer of its own (or straight into the caller's).
RECV_BUFFER = 256 * 1024

# reply_head's kinds: a complete value, a bulk string of n bytes to read, an array of n replies to read.
VALUE, BULK, ARRAY = 0, 1, 2


# The capability probe of every client of this transport (the SDK's, the SGLang backend's): ``PROBE key`` with a
# key under the client's own prefix (so that an ACL user restricted to it may ask), answered by a kvstrata server
# (nil: no such key) and refused with an error by a server without TAIR.KV.* (Redis, Valkey): that error means
# plain Redis commands (SET PX, MGET).
PROBE = b"TAIR.KV.VERSION"


def probe_says_plain(error: str) -> bool | None:
    """What the probe's error reply (its text, code first) says: True (no TAIR.KV.*: ``-ERR unknown command``),
    False (``-NOPERM``: the server knows the command, its ACL refused it), None (another failure: nothing
    learnt, ask again)."""
    code = error.split(" ", 1)[0]
    return True if code == "ERR" else False if code == "NOPERM" else None


def mget_command(plain: bool) -> bytes:
    """The command that reads several values: TAIR.KV.MGET on kvstrata (at the server's consistency level, under
    its ACL rules for TAIR.KV.*: what every SDK read sends), MGET on a server without TAIR.KV.* (``plain``)."""
    return b"MGET" if plain else b"TAIR.KV.MGET"


class RespError(Exception):
    """An error reply from the server."""


class ValueTooLarge(Exception):
    """A value did not fit the destination buffer given for it."""


def reply_head(line: bytes) -> tuple[int, Any]:
    """What one reply's first line (without its CRLF) says: ``(VALUE, value)`` for a simple string, an integer
    or a nil; ``(BULK, n)`` or ``(ARRAY, n)`` when n bytes or n replies follow. An error reply raises
    ``RespError``."""
    kind, rest = line[:1], line[1:]
    if kind == b"$":
        n = int(rest)
        return (VALUE, None) if n < 0 else (BULK, n)
    if kind == b"+":
        return VALUE, rest
    if kind == b":":
        return VALUE, int(rest)
    if kind == b"-":
        raise error_reply(line)
    if kind == b"*":
        n = int(rest)
        return (VALUE, None) if n < 0 else (ARRAY, n)
    if kind == b"_":
        return VALUE, None
    raise RespError(f"unexpected reply type {line[:20]!r}")


def error_reply(line: bytes) -> RespError:
    """The exception of an error reply's line (``-ERR ...``, without its CRLF)."""
    return RespError(line[1:].decode(errors="replace"))


def error_element(line: bytes) -> RespError | None:
    """An array element that is an error reply, as the exception (returned, not raised: the rest of the array is
    read, so the connection stays in step); None for any other element."""
    return error_reply(line) if line[:1] == b"-" else None


class RespReader:
    """A connection's socket and receive buffer, without I/O: the clients fill ``_room()`` from their socket and
    report it with ``_received``; the ``_buffered_*`` methods take what is complete (None: receive more)."""

    sock: socket.socket

    def _init_buffer(self) -> None:
        self._pid = os.getpid()  # a connection inherited by a forked child is the parent's: never used there
        self._rbuf = bytearray(RECV_BUFFER)
        self._rview = memoryview(self._rbuf)
        self._start = 0
        self._end = 0

    def close(self) -> None:
        self.sock.close()

    def broken(self) -> bool:
        """Whether this connection, idle between commands, must not be used again: the peer closed it (a
        restart, CLIENT KILL, an idle timeout), it has failed, bytes arrived that no command asked for, or this
        process is a fork of the one that connected (the socket is shared with the parent). A pool checks the
        same before handing out a connection; one ``poll``, no wait."""
        if self._start != self._end or os.getpid() != self._pid:
            return True
        try:
            fd = self.sock.fileno()
            if fd < 0:
                return True
            p = select.poll()
            p.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
            if not p.poll(0):
                return False
        except (OSError, ValueError):
            return True
        if isinstance(self.sock, ssl.SSLSocket):
            return self._tls_unsolicited()
        return True

    def _tls_unsolicited(self) -> bool:
        """An idle TLS connection turned readable: TLS's own records (a TLS 1.3 server's session tickets) do
        that without any reply. Read once without waiting: nothing but such records means healthy; a close or
        reply bytes nobody asked for mean broken (the bytes stay buffered, so the connection is not reused)."""
        sock = self.sock
        timeout = sock.gettimeout()
        sock.setblocking(False)
        try:
            k = sock.recv_into(self._room())
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False
        except (OSError, ValueError):
            return True
        finally:
            sock.settimeout(timeout)
        self._end += k
        return True

    def _room(self) -> memoryview:
        """The free tail of the receive buffer, for the next receive (the unread bytes moved to the front when
        the buffer is full up to its end: a header never exceeds the buffer)."""
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._rbuf):
            n = self._end - self._start
            self._rbuf[:n] = self._rbuf[self._start : self._end]
            self._start, self._end = 0, n
        return self._rview[self._end :]

    def _received(self, k: int) -> None:
        """``k`` bytes were received into ``_room()``; 0 means the peer closed the connection."""
        if k == 0:
            raise ConnectionError("server closed the connection")
        self._end += k

    def _buffered_line(self) -> bytes | None:
        """The next line (without CRLF) if it is all in the buffer."""
        i = self._rbuf.find(b"\r\n", self._start, self._end)
        if i < 0:
            return None
        line = bytes(self._rview[self._start : i])
        self._start = i + 2
        return line

    def _buffered_bulk(self, n: int) -> bytes | None:
        """A bulk value of ``n`` bytes and its CRLF, if all in the buffer."""
        if self._end - self._start < n + 2:
            return None
        data = bytes(self._rview[self._start : self._start + n])
        self._start += n + 2
        return data

    def _bulk_fits(self, n: int) -> bool:
        """Whether a bulk value of ``n`` bytes (and its CRLF) can be gathered in what is left of the buffer; if
        not, it is received into a buffer of its own (``_drain_into`` then the socket)."""
        return n + 2 <= len(self._rbuf) - self._start

    def _drain_into(self, into: memoryview, n: int) -> int:
        """Copy up to ``n`` buffered bytes of a value into ``into``; returns how many (the rest comes from the
        socket, straight into ``into``)."""
        have = min(self._end - self._start, n)
        if have:
            into[:have] = self._rview[self._start : self._start + have]
            self._start += have
        return have

    def _buffered_crlf(self) -> bool:
        """Consume the CRLF after a value received straight into its destination, if buffered."""
        if self._end - self._start < 2:
            return False
        self._start += 2
        return True
