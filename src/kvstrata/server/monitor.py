"""MONITOR: the commands the server runs, one line each to every client in monitor mode, in Redis's format.

A line is ``+<unix time, microseconds> [0 <client address>] "arg" "arg" ...``, each argument quoted as Redis's
``sdscatrepr`` does (``\\n``, ``\\"``, ``\\xff`` ...). As in Redis: commands flagged ``admin`` are not shown (CONFIG,
CLIENT LIST, ACL SETUSER, MONITOR ...), nor commands refused before they ran (unknown, arity, NOAUTH, ACL, OOM);
AUTH's arguments and HELLO's credentials show as ``"(redacted)"``; the commands of a transaction show when EXEC
runs them, followed by EXEC. A monitor may not run commands that touch keys ("Replica can't interact with the
keyspace"), and RESET ends monitor mode.

Unlike Redis, an argument longer than ``LONG_ARG`` shows its first ``SHOWN`` bytes and its length
(``"abc..."...(1048576 bytes)``): a KV chunk is megabytes, which quoted would be up to four times as many bytes of
text per monitor per write. A monitor that does not read its lines is closed at ``client-output-buffer-limit``,
as any client whose replies pile up.
"""

from __future__ import annotations

import time
from typing import Any

LONG_ARG = 1024
SHOWN = 64
REDACTED = b'"(redacted)"'


def shown(spec: Any) -> bool:
    """Whether monitors see a command that ran: as Redis, not those flagged admin."""
    return "admin" not in spec.flags


def _escape(byte: int) -> bytes:
    special = {ord("\\"): b"\\\\", ord('"'): b'\\"', ord("\n"): b"\\n", ord("\r"): b"\\r", ord("\t"): b"\\t",
               7: b"\\a", 8: b"\\b"}
    if byte in special:
        return special[byte]
    return bytes([byte]) if 0x20 <= byte <= 0x7E else b"\\x%02x" % byte


# Every byte's quoted form, as sdscatrepr writes it (isprint in the C locale: 0x20..0x7e).
_QUOTED = [_escape(b) for b in range(256)]
_PLAIN = frozenset(b for b in range(0x20, 0x7F) if b not in (ord("\\"), ord('"')))


def quote(arg: Any) -> bytes:
    """One argument as Redis quotes it (bytes, bytearray or memoryview), cut at LONG_ARG (see the module)."""
    n = len(arg)
    data = bytes(arg[:SHOWN]) if n > LONG_ARG else bytes(arg)
    body = data if _PLAIN.issuperset(data) else b"".join([_QUOTED[b] for b in data])
    if n > LONG_ARG:
        return b'"%s"...(%d bytes)' % (body, n)
    return b'"%s"' % body


def _redacted(args: list[Any]) -> list[bytes]:
    """AUTH's arguments, and HELLO's after its AUTH token, as ``(redacted)``; the rest quoted."""
    name = bytes(args[0]).lower()
    if name == b"auth":
        return [quote(args[0])] + [REDACTED] * (len(args) - 1)
    if name == b"hello":
        out = [quote(a) for a in args]
        for i in range(2, len(args)):
            if bytes(args[i]).lower() == b"auth":
                for j in range(i + 1, min(i + 3, len(args))):
                    out[j] = REDACTED
        return out
    return [quote(a) for a in args]


def line(addr: str, args: list[Any]) -> bytes:
    now = time.time()
    head = b"+%d.%06d [0 %s] " % (int(now), int((now % 1) * 1_000_000), addr.encode(errors="replace"))
    return head + b" ".join(_redacted(args)) + b"\r\n"


class Monitors:
    """The connections in monitor mode (by client id) and the feed of commands to them."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.conns: dict[int, Any] = {}

    def __bool__(self) -> bool:
        return bool(self.conns)

    def add(self, conn: Any) -> None:
        self.conns[conn.client.id] = conn

    def discard(self, client_id: int) -> None:
        self.conns.pop(client_id, None)

    def line_for(self, client: Any, args: list[Any]) -> bytes:
        """``client``'s command as a monitor line (a Unix-socket client shows as ``unix:<path>``, as in Redis)."""
        return line(f"unix:{self.config.get('unixsocket')}" if client.unix else client.addr, args)

    def feed(self, client: Any, args: list[Any], current: Any = None, skip: Any = None) -> None:
        """Send the line of ``client``'s command ``args`` to every monitor but ``skip``; ``current``: the connection
        running it (EXEC's), whose own line goes after the replies it has pending (the others' are written now)."""
        data = self.line_for(client, args)
        for conn in list(self.conns.values()):
            if conn is not skip:
                conn.deliver(data, current)
