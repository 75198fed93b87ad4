"""Request parser: hiredis for whole small frames, a Python parser for everything else.

Fast mode feeds each received chunk to ``hiredis.Reader`` while chunks hold only complete multibulk frames (the
common case for small commands). When a chunk ends inside a frame, starts with something other than ``*``
(inline commands), or hiredis rejects it, the parser drops to slow mode: a Python parser that checks every
header before any memory is allocated (Redis's limits and error texts), handles inline commands, and receives
a large bulk value (>= ``large_threshold``) straight into its own buffer. Once slow mode has consumed all it
was given it returns to fast mode.

For ``asyncio.BufferedProtocol``: ``get_buffer()`` returns where the next bytes should land (the large value
itself while one is being received) and ``buffer_updated(n)`` processes them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import hiredis

from kvstrata.errors import ProtocolError
from kvstrata.protocol.alloc import untouched
from kvstrata.protocol.inline import inline_end, split_inline

_STAR = 42
_DOLLAR = 36
_MAX_HEADER = 64 * 1024
_MAX_INLINE = 64 * 1024
_MAX_MULTIBULK = 2**31 - 1
_UNAUTH_MULTIBULK = 10
_UNAUTH_BULK = 16384
_AUTH_COMMANDS = frozenset({b"auth", b"hello"})
_RECV_SIZE = 256 * 1024
# Bytes asked for per read of commands (a large value is received into its own buffer, whatever its size): like
# Redis's 16 KiB reads, this bounds the batch of pipelined commands one client gets run before others are served.
_READ_SIZE = 64 * 1024


class _Shared(threading.local):
    """One receive buffer per thread, shared by every parser of that thread's event loop.

    The event loop calls ``get_buffer()`` and then ``buffer_updated()`` for one connection before it reads for
    another, and ``buffer_updated`` consumes or copies out everything it was given, so the bytes never have to
    outlive the call. An idle connection therefore holds no receive buffer of its own (issue 13: 256 KiB each).
    """

    def __init__(self) -> None:
        self.recv = bytearray(_RECV_SIZE)
        self.view = memoryview(self.recv)
        self.read_view = self.view[:_READ_SIZE]


_SHARED = _Shared()


class LargeArgv(list):  # type: ignore[type-arg]
    """A command with an argument received into a buffer of its own (a bytearray of ``large_threshold`` bytes or
    more) instead of ``bytes``: the connection makes every such argument that is not a value the command stores
    ``bytes`` before it runs (``CommandSpec.own_arguments``), since keys, names and options are hashed and
    compared. Plain commands stay plain lists, so the check costs one class comparison."""


class _Fallback(Exception):
    """hiredis produced something that is not a command; the Python parser takes over."""


_BIG_ARRAY = re.compile(rb"\*[0-9]{6}")
_HDR_MAX = 1 << 16
# Bytes of "$<n>\r\n" (or "*<n>\r\n") for n below _HDR_MAX.
_HDR = [len(b"%d" % i) + 3 for i in range(_HDR_MAX)]
# Bytes of a whole bulk string "$<n>\r\n<n bytes>\r\n", by n.
_FRAME = [h + n + 2 for n, h in enumerate(_HDR)].__getitem__


_LEN = re.compile(rb"(0|-?[1-9][0-9]{0,18})\Z")


def _parse_len(buf: bytearray, start: int, end: int) -> int | None:
    """A length spelled as Redis's string2ll accepts it (no '+', spaces or leading zeros), else None."""
    text = bytes(buf[start:end])
    return int(text) if _LEN.match(text) else None


def _header_end(buf: bytearray, start: int, end: int) -> int:
    """Where a '*<n>' or '$<n>' header ends, found as Redis finds it: strchr(p, '\\r') from the header on, which
    stops at a NUL (then the header is incomplete: -1). Redis then skips the byte after the '\\r' unchecked."""
    cr = buf.find(b"\r", start, end)
    if buf.find(b"\x00", start, end if cr < 0 else cr) >= 0:
        return -1
    return cr


class RequestParser:
    def __init__(
        self,
        *,
        max_bulk: Callable[[], int] = lambda: 512 * 1024 * 1024,
        max_query: Callable[[], int] = lambda: 1024 * 1024 * 1024,
        large_threshold: int = 64 * 1024,
        authenticated: Callable[[], bool] = lambda: True,
        allocate: Callable[[int], bytearray] = untouched,
    ) -> None:
        self._max_bulk = max_bulk
        self._max_query = max_query
        # Whether whole frames may go through hiredis: only for authenticated clients (hiredis knows none of the
        # unauthenticated limits) and when no complete frame can exceed proto-max-bulk-len. The owner calls
        # refresh() when either changes; checking per chunk would cost more than the rest of the fast path.
        self.fast_allowed = True
        self._large = large_threshold
        self._authenticated = authenticated
        self._allocate = allocate
        self._reader = hiredis.Reader()
        self._fast = True
        shared = _SHARED
        self._recv = shared.recv
        self._recv_view = shared.view
        self._read_view = shared.read_view
        # slow-mode state
        self._buf = bytearray()
        self._pos = 0
        self._end = -1  # logical end of _buf while it is the receive buffer itself (-1: len(_buf))
        self._args: list[bytes | bytearray] = []
        self._remaining = 0
        self._target: bytearray | None = None
        self._target_view: memoryview | None = None
        self._filled = 0
        self._args_bytes = 0  # bytes of the arguments in _args (the command being received)
        self._need_crlf = False
        self._ready: list[list[bytes | bytearray]] = []
        # An unauthenticated client's AUTH or HELLO was parsed: nothing after it is, until the owner has run it and
        # calls resume(). Redis parses each command after the one before it ran, so a pipelined AUTH lifts the
        # unauthenticated limits for what follows it (Redis's MIGRATE sends AUTH, SELECT and RESTOREs at once).
        self.held = False
        self.refresh()

    def refresh(self) -> None:
        self.fast_allowed = self._authenticated() and self._max_bulk() >= _RECV_SIZE

    # ---- BufferedProtocol side ----
    def get_buffer(self) -> memoryview:
        if self._target_view is not None:
            return self._target_view[self._filled :]
        return self._read_view

    def buffer_updated(self, nbytes: int) -> None:
        if self._target is not None:
            self._filled += nbytes
            if self._filled == len(self._target):
                self._finish_target()
                self._parse_slow()
            return
        if self._fast and self._recv[0] == _STAR:
            self._feed_fast(self._recv, nbytes)
        else:
            self.feed(self._recv_view[:nbytes])

    # ---- plain feeding (tests, data_received) ----
    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._target is not None:
            take = min(len(data), len(self._target) - self._filled)
            self._target[self._filled : self._filled + take] = data[:take]
            self._filled += take
            if self._filled < len(self._target):
                return
            self._finish_target()
            data = data[take:]
            if not data:
                self._parse_slow()
                return
        if self._fast and data[0] == _STAR:
            self._feed_fast(data)
        else:
            self._fast = False
            self._buf += data
            self._parse_slow()

    def _feed_fast(self, data: bytes | bytearray | memoryview, nbytes: int = -1) -> None:
        if data.__class__ is memoryview:
            data = data.tobytes()  # type: ignore[union-attr]
        total = len(data) if nbytes < 0 else nbytes
        # hiredis allocates a list of the announced size up front: never show it a huge array header.
        # The first frame's count must end within 7 bytes (under 100000 arguments); any other '*' in the chunk
        # (a later frame, or a nested array) gets the full search.
        # A big SET's first chunk (its frame cut inside the value) goes to the Python parser before the search
        # for a huge array header, which would scan the value's bytes (a fifth of a 256 KB SET's CPU).
        if (not self.fast_allowed or total > _RECV_SIZE or data.find(b"\r\n", 0, 8) < 0
                or (total >= self._large and self._first_frame_cut_large(data, total))
                or (data.find(b"*", 1, total) >= 0 and _BIG_ARRAY.search(data, 0, total) is not None)):
            self._fallback(data, total)
            return
        reader = self._reader
        ready = self._ready
        before = len(ready)
        reader.feed(data, 0, total)
        pos = 0
        hdr = _HDR
        frame = _FRAME
        try:
            while True:
                cmd = reader.gets()
                if cmd is False:
                    break
                # Only a multibulk of bulk strings is a command: check each element's type byte where it must
                # be on the wire (a RESP3 aggregate or a simple string would otherwise pass as an argument).
                if data[pos] != _STAR:
                    raise _Fallback
                pos += hdr[len(cmd)]
                for arg in cmd:
                    if data[pos] != _DOLLAR:
                        raise _Fallback
                    pos += frame(len(arg))
                if cmd:
                    ready.append(cmd)
            if pos == total:
                return
        except (hiredis.ProtocolError, _Fallback, TypeError, IndexError):
            pass
        # A partial frame, an inline command, a non-bulk element or a hiredis error: nothing from this chunk
        # has run yet, so the Python parser takes the whole chunk again and answers exactly as Redis would.
        del ready[before:]
        self._reader = hiredis.Reader()
        self._fallback(data, total)

    def _first_frame_cut_large(self, data: bytes | bytearray, total: int) -> bool:
        """Whether the chunk's first frame is cut inside a large bulk (a big SET's first chunk): hiredis would
        copy it only for the Python parser to take over; a few header lookups decide it."""
        eol = data.find(b"\r\n", 1, 16)
        if eol < 0:
            return False
        try:
            n = int(data[1:eol])
            pos = eol + 2
            for _ in range(min(n, 8)):
                if pos >= total or data[pos] != _DOLLAR:
                    return False
                eol = data.find(b"\r\n", pos, pos + 24)
                if eol < 0:
                    return False
                length = int(data[pos + 1 : eol])
                pos = eol + 4 + length
                if pos > total:
                    return length >= self._large
        except ValueError:
            return False
        return False

    def _fallback(self, data: bytes | bytearray | memoryview, total: int) -> None:
        self._fast = False
        self._pos = 0
        if data is self._recv:
            # Parse the receive buffer in place (a chunk that starts a large value is mostly that value, which
            # goes straight into its own buffer); whatever is left is copied out before the next read.
            self._buf = self._recv
            self._end = total
            try:
                self._parse_slow()
            finally:
                self._end = -1
                if self._buf is self._recv:
                    self._buf = bytearray(self._recv_view[self._pos : total])
                    self._pos = 0
            return
        with memoryview(data) as view:
            self._buf = bytearray(view[:total])  # one copy (slicing a bytearray would make two)
        self._parse_slow()

    def _finish_target(self) -> None:
        assert self._target is not None
        if self._args.__class__ is not LargeArgv:
            self._args = LargeArgv(self._args)
        self._args.append(self._target)
        self._args_bytes += len(self._target)
        self._remaining -= 1
        self._target = None
        self._target_view = None
        self._filled = 0
        self._need_crlf = True

    def _error(self, text: str) -> ProtocolError:
        self._buf = bytearray()
        self._pos = 0
        return ProtocolError(text)

    def _parse_slow(self) -> None:
        buf = self._buf
        pos = self._pos
        end = len(buf) if self._end < 0 else self._end
        try:
            while not self.held:
                if self._need_crlf:
                    # Like Redis, the two bytes after a bulk string are skipped, not checked.
                    if end - pos < 2:
                        break
                    pos += 2
                    self._need_crlf = False
                    if self._remaining == 0:
                        self._took(self._args)
                        self._args = []
                        self._args_bytes = 0
                        continue
                if self._remaining == 0:
                    if pos >= end:
                        break
                    if buf[pos] != _STAR:
                        eol = inline_end(buf, pos, end)
                        if eol < 0:
                            if end - pos > _MAX_INLINE:
                                raise self._error("too big inline request")
                            break
                        # Like Redis, one '\r' before the '\n' belongs to the line ending.
                        line = bytes(buf[pos : eol - 1 if eol > pos and buf[eol - 1] == 13 else eol])
                        pos = eol + 1
                        args = split_inline(line)
                        if args is None:
                            raise self._error("unbalanced quotes in request")
                        if args:
                            self._took(list(args))
                        continue
                    eol = _header_end(buf, pos, end)
                    if eol < 0:
                        if end - pos > _MAX_HEADER:
                            raise self._error("too big mbulk count string")
                        break
                    if eol + 1 >= end:
                        break  # the byte after '\r' (skipped unchecked, as in Redis) has not arrived
                    count = _parse_len(buf, pos + 1, eol)
                    if count is None or count > _MAX_MULTIBULK:
                        raise self._error("invalid multibulk length")
                    if count > _UNAUTH_MULTIBULK and not self._authenticated():
                        raise self._error("unauthenticated multibulk length")
                    pos = eol + 2
                    if count <= 0:
                        continue
                    self._remaining = count
                    self._args = []
                    self._args_bytes = 0
                while self._remaining:
                    if pos >= end:
                        break
                    # Redis looks for the end of the header before it checks the '$'.
                    eol = _header_end(buf, pos, end)
                    if eol < 0:
                        if end - pos > _MAX_HEADER:
                            raise self._error("too big bulk count string")
                        break
                    if eol + 1 >= end:
                        break  # the byte after '\r' (skipped unchecked, as in Redis) has not arrived
                    if buf[pos] != _DOLLAR:
                        raise self._error(f"expected '$', got '{chr(buf[pos])}'")
                    length = _parse_len(buf, pos + 1, eol)
                    if length is None or length < 0 or length > self._max_bulk():
                        raise self._error("invalid bulk length")
                    if length > _UNAUTH_BULK and not self._authenticated():
                        raise self._error("unauthenticated bulk length")
                    start = eol + 2
                    have = end - start
                    if have >= length + 2:
                        self._args.append(bytes(buf[start : start + length]))
                        self._args_bytes += length
                        pos = start + length + 2
                        self._remaining -= 1
                    elif length >= self._large:
                        # Receive the value straight into its own buffer: copy what came already, then let
                        # get_buffer() hand out the rest of it.
                        target = self._allocate(length)
                        have = min(have, length)
                        with memoryview(buf) as view:
                            target[:have] = view[start : start + have]
                        self._target = target
                        self._target_view = memoryview(target)
                        self._filled = have
                        pos = start + have
                        if have == length:
                            self._finish_target()
                            break
                        self._buf = bytearray()
                        self._pos = 0
                        return
                    else:
                        if end - pos > self._max_query():
                            raise self._error("query buffer limit reached")
                        break
                else:
                    self._took(self._args)
                    self._args = []
                    self._args_bytes = 0
                    continue
                if self._need_crlf:
                    continue
                break
        finally:
            if self._buf is buf:
                self._pos = pos
        # Compact, and go back to hiredis once nothing is pending.
        end = len(self._buf) if self._end < 0 or self._buf is not self._recv else self._end
        if self._pos >= end and self._remaining == 0 and not self._need_crlf:
            self._buf = bytearray()
            self._pos = 0
            self._fast = True
        elif self._pos > 64 * 1024 and self._buf is not self._recv:
            del self._buf[: self._pos]
            self._pos = 0

    def _took(self, cmd: list[bytes | bytearray]) -> None:
        self._ready.append(cmd)
        if cmd and cmd[0].__class__ is bytes and cmd[0].lower() in _AUTH_COMMANDS and not self._authenticated():
            self.held = True

    def resume(self) -> None:
        """Parse what arrived after a held AUTH or HELLO, now that the owner ran it (under the limits it set)."""
        self.held = False
        self._parse_slow()

    def commands(self) -> list[list[bytes | bytearray]]:
        """Take every command parsed so far."""
        ready = self._ready
        if ready:
            self._ready = []
        return ready

    def holds(self, buf: object) -> bool:
        """Whether ``buf`` belongs to a command still being received (or parsed but not yet taken)."""
        if buf is self._target or any(a is buf for a in self._args):
            return True
        return any(a is buf for cmd in self._ready for a in cmd)

    @property
    def pending_bytes(self) -> int:
        return len(self._buf) - self._pos + self._filled

    @property
    def query_bytes(self) -> int:
        """What this client's pending request holds: unparsed bytes, the value being received so far and the
        arguments already parsed (Redis's query buffer plus argv_len_sum, checked against
        client-query-buffer-limit)."""
        return len(self._buf) - self._pos + self._filled + self._args_bytes

    def memory(self) -> tuple[int, int, int]:
        """(qbuf, qbuf-free, argv-mem) as CLIENT LIST shows them: bytes received and not yet parsed (including
        the part of a large value that has arrived), room reserved for the rest of that value (address space
        only: its pages are touched as the bytes arrive), and arguments parsed for commands not yet run."""
        qbuf = len(self._buf) - self._pos + self._filled
        free = len(self._target) - self._filled if self._target is not None else 0
        argv = self._args_bytes + sum(len(a) for cmd in self._ready for a in cmd)
        return qbuf, free, argv

    def partial_value(self) -> bytearray | None:
        """The buffer of a large value still being received, if any."""
        return self._target

    def release(self) -> None:
        """Drop every buffer (the connection is gone): nothing of a half-received request outlives it."""
        self._buf = bytearray()
        self._pos = 0
        self._args = []
        self._args_bytes = 0
        self._target = None
        self._target_view = None
        self._filled = 0
        self._remaining = 0
        self._need_crlf = False
        self._ready = []
        self.held = False
        self._reader = hiredis.Reader()
