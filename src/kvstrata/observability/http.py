"""A small HTTP/1.1 server for the observability endpoint, on the kvstrata server's own event loop.

It serves a handful of GET routes (``/metrics``, ``/stats.json``, ``/healthz``, ``/``) to monitoring systems
and browsers, with keep-alive, bounded request heads and idle timeouts. Handlers are plain functions that
return ``(status, headers, body)``; they run on the loop between RESP commands and are built to be cheap.

Authentication: when the endpoint listens on any address that is not loopback, every request must carry the
server's ``requirepass``, as ``Authorization: Bearer <password>`` or as the password of HTTP basic auth (any
user name). Without a password configured, a non-loopback endpoint refuses to start (``check_bind``) and,
should the password be removed at run time, answers 401 to everything.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import logging
from collections.abc import Callable

log = logging.getLogger("kvstrata.http")

Response = tuple[int, dict[str, str], bytes]
Route = Callable[[dict[str, str]], Response]

MAX_HEAD = 16 * 1024
IDLE_TIMEOUT = 30.0
REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           405: "Method Not Allowed", 413: "Content Too Large", 500: "Internal Server Error"}


class ObservabilityConfigError(ValueError):
    """The HTTP endpoint's configuration is unsafe or invalid (raised before anything listens)."""


def bind_hosts(bind: str) -> list[str]:
    """``"127.0.0.1 [::1]"`` -> ``["127.0.0.1", "::1"]`` (spaces or commas; brackets around IPv6 dropped)."""
    return [h.strip("[]") for h in str(bind).replace(",", " ").split() if h.strip("[]")]


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; False for wildcards, other addresses and other names."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def needs_auth(bind: str) -> bool:
    hosts = bind_hosts(bind)
    return not hosts or not all(is_loopback(h) for h in hosts)


def check_bind(bind: str, password: str | None) -> bool:
    """Whether the endpoint must check passwords; raises when it would be exposed without one."""
    if not needs_auth(bind):
        return False
    if not password:
        raise ObservabilityConfigError(
            f"the HTTP endpoint would listen on {bind or 'every address'!s} (not loopback) without a password: "
            "set requirepass, bind it to 127.0.0.1 with --http-bind, or disable it with --http-port 0")
    return True


def authorized(header: str | None, password: str | None) -> bool:
    """``Authorization: Bearer <password>`` or ``Basic base64(user:password)``, compared in constant time."""
    if not password or not header:
        return False
    scheme, _, cred = header.strip().partition(" ")
    cred = cred.strip()
    scheme = scheme.lower()
    if scheme == "bearer":
        given = cred
    elif scheme == "basic":
        try:
            decoded = base64.b64decode(cred, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        _, sep, given = decoded.partition(":")
        if not sep:
            return False
    else:
        return False
    return hmac.compare_digest(given.encode(), password.encode())


def text(status: int, body: str, content_type: str = "text/plain; charset=utf-8") -> Response:
    return status, {"Content-Type": content_type}, body.encode()


class HttpEndpoint:
    """Listens on ``hosts``:``port`` and answers GET/HEAD from ``routes`` (path -> handler)."""

    def __init__(self, routes: dict[str, Route], hosts: list[str], port: int, *, require_auth: bool,
                 password: Callable[[], str | None]) -> None:
        self.routes = routes
        self.hosts = hosts
        self.port = port
        self.require_auth = require_auth
        self.password = password
        self.requests = 0
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, host=self.hosts or None, port=self.port, reuse_address=True, limit=MAX_HEAD)
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._conns):
            writer.close()
        self._conns.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT)
                except asyncio.LimitOverrunError:
                    await self._send(writer, "GET", *text(413, "request head too large\n"), keep_alive=False)
                    break
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    break
                keep_alive = await self._handle(head, reader, writer)
                if not keep_alive:
                    break
        except Exception:  # a broken client must never hurt the server
            log.debug("HTTP connection failed", exc_info=True)
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _handle(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._send(writer, "GET", *text(400, "bad request\n"), keep_alive=False)
            return False
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if version != "HTTP/1.1":
            keep_alive = headers.get("connection", "").lower() == "keep-alive"
        else:
            keep_alive = headers.get("connection", "").lower() != "close"
        length = headers.get("content-length", "0")
        if not length.isdigit() or int(length) > MAX_HEAD or "transfer-encoding" in headers:
            await self._send(writer, method, *text(400, "request bodies are not accepted\n"), keep_alive=False)
            return False
        if int(length):
            await reader.readexactly(int(length))
        self.requests += 1
        response = self.respond(method, target, headers)
        await self._send(writer, method, *response, keep_alive=keep_alive)
        return keep_alive

    def respond(self, method: str, target: str, headers: dict[str, str]) -> Response:
        """The response to one request (no I/O): auth, method and route checks, then the route's handler."""
        if self.require_auth and not authorized(headers.get("authorization"), self.password()):
            status, hdrs, body = text(401, "kvstrata: this endpoint needs the server password (requirepass) as a "
                                           "Bearer token or as the basic-auth password\n")
            hdrs["WWW-Authenticate"] = 'Basic realm="kvstrata", charset="UTF-8"'
            return status, hdrs, body
        if method not in ("GET", "HEAD"):
            status, hdrs, body = text(405, "only GET and HEAD\n")
            hdrs["Allow"] = "GET, HEAD"
            return status, hdrs, body
        path = target.split("?", 1)[0].split("#", 1)[0]
        route = self.routes.get(path)
        if route is None:
            return text(404, f"not found: {path}\nroutes: {', '.join(sorted(self.routes))}\n")
        try:
            return route(headers)
        except Exception:
            log.exception("HTTP handler for %s failed", path)
            return text(500, "internal error\n")

    async def _send(self, writer: asyncio.StreamWriter, method: str, status: int, headers: dict[str, str],
                    body: bytes, *, keep_alive: bool) -> None:
        out = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}",
               f"Content-Length: {len(body)}",
               f"Connection: {'keep-alive' if keep_alive else 'close'}"]
        headers.setdefault("Cache-Control", "no-store")
        headers.setdefault("X-Content-Type-Options", "nosniff")
        out += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
        if method != "HEAD":
            writer.write(body)
        await writer.drain()
