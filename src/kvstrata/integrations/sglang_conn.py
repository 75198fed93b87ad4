"""The SGLang HiCache backend's connection: RESP over one socket, values straight into host-pool memory.

``RespConnection`` is ``kvstrata.client.fast.FastClient`` (the transport the SDK reads with) plus the backend's
conventions: error replies come back as ``KvstrataError`` instances from ``read_reply`` and ``pipeline`` (raised
by ``call``), and a value is received straight into the host-pool segments that hold its page
(``read_bulk_into``). ``parse_url`` turns the backend's ``url`` into connection keywords.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import ssl
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from kvstrata.client.fast import FastClient, RespError, pack, sendmsg_all

logger = logging.getLogger("kvstrata.integrations.sglang")


class KvstrataError(RespError):
    """An error reply from the server (``-ERR ...``, ``-OOM ...``)."""


def _view(address: int, length: int) -> memoryview:
    """A writable memoryview of ``length`` bytes at ``address`` (host memory owned by a live tensor)."""
    return memoryview((ctypes.c_char * length).from_address(address)).cast("B")


class RespConnection(FastClient):
    """The backend's connection: ``kvstrata.client.fast.FastClient`` (the transport the SDK reads with too), plus
    the backend's conventions: error replies returned as ``KvstrataError`` instances by ``read_reply`` and
    ``pipeline`` (raised by ``call``), values received straight into host-pool segments (``read_bulk_into``)."""

    def __init__(self, host: str, port: int, *, username: str | None = None, password: str | None = None,
                 db: int = 0, timeout: float | None = 30.0, connect_timeout: float = 5.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(host, port, timeout=timeout, connect_timeout=connect_timeout, password=password,
                         username=username, db=db, ssl_context=ssl_context)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __del__(self) -> None:  # a finished thread's connection: close its socket quietly
        sock = getattr(self, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    # -- sending ----------------------------------------------------------------------------------------------
    @staticmethod
    def encode(args: Sequence[bytes | str | int]) -> bytes:
        parts: list[Any] = []
        pack(args, parts)
        return b"".join(bytes(p) if isinstance(p, memoryview) else p for p in parts)

    def sendv(self, parts: list[bytes | memoryview]) -> None:
        """Send every byte of ``parts`` with vectored writes (``sendmsg``): large values are never joined."""
        sendmsg_all(self.sock, parts)

    # -- receiving --------------------------------------------------------------------------------------------
    def read_reply(self, into: Any = None) -> Any:
        """The next reply; an error reply is returned as a ``KvstrataError`` instance (not raised)."""
        try:
            return super().read_reply(into)
        except KvstrataError as exc:
            return exc
        except RespError as exc:
            if str(exc).startswith("unexpected reply type"):
                raise ConnectionError(f"unexpected reply from kvstrata: {exc}") from None
            return KvstrataError(str(exc))

    def read_bulk_into(self, segments: list[tuple[int, int]], expected: int) -> bool:
        """Read one bulk reply straight into ``segments``. False (and nothing kept) for nil, an error reply or a
        value whose length is not ``expected``."""
        try:
            n = self.read_bulk_len()
        except RespError as exc:
            if str(exc).startswith("expected a bulk string"):
                raise ConnectionError(f"expected a bulk reply from kvstrata: {exc}") from None
            logger.warning("kvstrata: %s", exc)
            return False
        if n is None:
            return False
        if n != expected:
            self.skip(n)
            self.end_bulk()
            logger.warning("kvstrata: stored object has %d bytes, the host pool page needs %d: treated as a miss",
                           n, expected)
            return False
        self.recv_scatter([_view(address, length) for address, length in segments])
        self.end_bulk()
        return True

    # -- commands ---------------------------------------------------------------------------------------------
    def call(self, *args: bytes | str | int) -> Any:
        self.sendv([self.encode(args)])
        reply = self.read_reply()
        if isinstance(reply, KvstrataError):
            raise reply
        return reply

    def pipeline(self, commands: Iterable[Sequence[bytes | str | int]]) -> list[Any]:  # type: ignore[override]
        """Send every command, then read every reply (error replies come back as ``KvstrataError``)."""
        encoded = [self.encode(c) for c in commands]
        if not encoded:
            return []
        self.sendv([b"".join(encoded)])
        return [self.read_reply() for _ in encoded]


def parse_url(url: str) -> dict[str, Any]:
    """``redis://[user:password@]host:port[/db]`` (also ``kvstrata://``, ``tcp://``; ``rediss://`` for TLS, with
    redis-py's ``?ssl_ca_certs=...&ssl_certfile=...&ssl_keyfile=...`` options, as the SDK reads them) ->
    connection keywords."""
    parsed = urlparse(url if "://" in url else f"redis://{url}")
    if parsed.scheme not in ("redis", "rediss", "kvstrata", "tcp"):
        raise ValueError(f"unsupported URL scheme {parsed.scheme!r} (use redis://host:port)")
    db = 0
    if parsed.path and parsed.path.strip("/"):
        db = int(parsed.path.strip("/"))
    out = {
        "host": parsed.hostname or "127.0.0.1",
        "port": parsed.port or 6379,
        "username": unquote(parsed.username) if parsed.username else None,
        "password": unquote(parsed.password) if parsed.password is not None else None,
        "db": db,
    }
    if parsed.scheme == "rediss":
        from kvstrata.client.endpoint import ssl_context

        options = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        out["ssl_context"] = ssl_context(options)
    return out


