"""A small HTTP/1.1 server for the observability endpoint, on the kvstrata server's own event loop.

It serves a handful of GET routes (``/metrics``, ``/stats.json``, ``/healthz``, ``/``) to monitoring systems
and browsers, with keep-alive, bounded request heads and idle timeouts. Handlers are plain functions that
return ``(status, headers, body)``; they run on the loop between RESP commands and are built to be cheap.

Authentication: whenever the server has a password (requirepass, or an ACL default user that needs one), every
route but ``/healthz`` needs credentials, also on loopback: ``Authorization: Basic base64(user:password)`` for an
ACL user (an unknown or empty user name means ``default``), or ``Authorization: Bearer <password>`` for the
default user. The user must be allowed to run INFO and to access every key (the pages show server-wide figures
and key prefixes). An endpoint bound to a non-loopback address refuses to start without a password
(``check_bind``).

DNS rebinding: the ``Host`` header must name the endpoint: an IP address, ``localhost`` when it listens on
loopback, this machine's host name, a bound name, or one of ``http-host-names``; anything else gets 421.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import Any

log = logging.getLogger("kvstrata.http")

Response = tuple[int, dict[str, str], bytes]
Route = Callable[[dict[str, str]], Response]

MAX_HEAD = 16 * 1024
IDLE_TIMEOUT = 30.0
REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           405: "Method Not Allowed", 413: "Content Too Large", 421: "Misdirected Request",
           500: "Internal Server Error"}
# Routes anyone may read: a liveness probe says nothing about the data.
OPEN_ROUTES = frozenset({"/healthz"})
Checker = Callable[[str | None, str], bool]


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


def check_bind(bind: str, password: str | bool | None) -> bool:
    """Whether the endpoint listens off loopback; raises when it would be exposed without a password."""
    if not needs_auth(bind):
        return False
    if not password:
        raise ObservabilityConfigError(
            f"the HTTP endpoint would listen on {bind or 'every address'!s} (not loopback) without a password: "
            "set requirepass, bind it to 127.0.0.1 with --http-bind, or disable it with --http-port 0")
    return True


def credentials(header: str | None) -> tuple[str | None, str] | None:
    """``Bearer <password>`` -> (None, password); ``Basic base64(user:password)`` -> (user, password)."""
    if not header:
        return None
    scheme, _, cred = header.strip().partition(" ")
    cred = cred.strip()
    scheme = scheme.lower()
    if scheme == "bearer":
        return None, cred
    if scheme == "basic":
        try:
            decoded = base64.b64decode(cred, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, sep, given = decoded.partition(":")
        return (user, given) if sep else None
    return None


def authorized(header: str | None, password: str | None) -> bool:
    """The header carries ``password`` (as a Bearer token or a basic-auth password), compared in constant time."""
    found = credentials(header)
    if not password or found is None:
        return False
    return hmac.compare_digest(found[1].encode(), password.encode())


def host_names(bound: list[str], extra: str = "") -> set[str]:
    """The names the Host header may use: bound names, localhost on loopback, this host's name, ``extra``."""
    names = {h.lower() for h in bound if not _is_ip(h)}
    if not bound or any(is_loopback(h) or h in ("0.0.0.0", "::", "*") for h in bound):  # loopback included
        names.add("localhost")
    names.add(socket.gethostname().lower())
    names.update(n.lower().rstrip(".") for n in extra.replace(",", " ").split())
    return names


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def host_ok(header: str | None, names: set[str]) -> bool:
    """Whether a Host header names this endpoint. An IP address always does: DNS rebinding needs a name."""
    if header is None:
        return False
    host = header.strip().lower()
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host, _, port = host.partition(":")
        if not port.isdigit():
            return False
    host = host.rstrip(".")
    return bool(host) and (_is_ip(host) or host in names)


def text(status: int, body: str, content_type: str = "text/plain; charset=utf-8") -> Response:
    return status, {"Content-Type": content_type}, body.encode()


class HttpEndpoint:
    """Listens on ``hosts``:``port`` and answers GET/HEAD from ``routes`` (path -> handler)."""

    def __init__(self, routes: dict[str, Route], hosts: list[str], port: int, *,
                 require_auth: bool | Callable[[], bool], check: Checker | None = None,
                 password: Callable[[], str | None] | None = None, names: set[str] | None = None,
                 ssl: Any = None) -> None:
        self.routes = routes
        self.hosts = hosts
        self.port = port
        # A bool, or asked per request (the password can be set or removed at run time).
        self.require_auth = require_auth
        if check is None:  # only requirepass: any user name, the password compared in constant time
            def check(user: str | None, given: str) -> bool:
                pw = password() if password is not None else None
                return bool(pw) and hmac.compare_digest(given.encode(), pw.encode())  # type: ignore[union-attr]
        self.check = check
        self.names = names if names is not None else host_names(hosts)
        self.ssl = ssl
        self.requests = 0
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, host=self.hosts or None, port=self.port, reuse_address=True, limit=MAX_HEAD, ssl=self.ssl)
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
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError):
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
        response = self.respond(method, target, headers, version)
        await self._send(writer, method, *response, keep_alive=keep_alive)
        return keep_alive

    def respond(self, method: str, target: str, headers: dict[str, str], version: str = "HTTP/1.1") -> Response:
        """The response to one request (no I/O): Host, auth, method and route checks, then the route's handler."""
        if not ("host" not in headers and version == "HTTP/1.0") and not host_ok(headers.get("host"), self.names):
            return text(421, "kvstrata: unknown Host (add the name to --http-host-names)\n")
        path = target.split("?", 1)[0].split("#", 1)[0]
        required = self.require_auth() if callable(self.require_auth) else self.require_auth
        if required and path not in OPEN_ROUTES:
            found = credentials(headers.get("authorization"))
            if found is None or not self.check(*found):
                status, hdrs, body = text(401, "kvstrata: this endpoint needs a password: the default user's "
                                               "(requirepass) as a Bearer token, or user:password as basic auth\n")
                hdrs["WWW-Authenticate"] = 'Basic realm="kvstrata", charset="UTF-8"'
                return status, hdrs, body
        if method not in ("GET", "HEAD"):
            status, hdrs, body = text(405, "only GET and HEAD\n")
            hdrs["Allow"] = "GET, HEAD"
            return status, hdrs, body
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
