"""Wires observability to a running server: snapshots, the per-second sampler and the HTTP endpoint.

``Server`` creates one ``Observability`` (which checks the HTTP configuration before anything listens),
starts it after the RESP listener and closes it on shutdown, all on the same event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from importlib import resources
from typing import Any

from kvstrata.commands.registry import REGISTRY
from kvstrata.observability import snapshot as snapshot_mod
from kvstrata.observability.history import History
from kvstrata.observability.http import HttpEndpoint, Response, bind_hosts, check_bind, host_names, text

log = logging.getLogger("kvstrata.observability")

class Observability:
    def __init__(self, server: Any) -> None:
        self.server = server
        config = server.config
        self.configured_port = int(config.get("http-port"))
        self.bind = str(config.get("http-bind"))
        # Raises ObservabilityConfigError for a non-loopback endpoint without a password.
        self.off_loopback = check_bind(self.bind, not server.acl.open_default()) if self.configured_port else False
        self.history = History(server)
        self.http: HttpEndpoint | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._dashboard: bytes | None = None

    def require_auth(self) -> bool:
        """Off loopback always; on loopback too whenever the server has a password (asked per request)."""
        return self.off_loopback or not self.server.acl.open_default()

    def check(self, username: str | None, password: str) -> bool:
        """HTTP credentials: an ACL user (unknown or empty name: default) allowed INFO on every key."""
        acl = self.server.acl
        if acl.open_default():
            return False  # no password configured (removed at run time): nobody can prove anything
        user = acl.users.get(username) if username else None
        if user is None:
            user = acl.default
        if not user.check_password(password.encode("utf-8", "surrogateescape")):
            return False
        return any(s.allkeys and REGISTRY[b"info"] in s.allowed for s in user.every_selector)

    @property
    def http_port(self) -> int:
        return self.http.port if self.http is not None else 0

    # ---- snapshots ----
    # Every request builds a fresh snapshot: a reader must see what happened before its request (one costs well
    # under a millisecond plus the bounded prefix sample).
    def snapshot(self) -> dict[str, Any]:
        """A snapshot whose commands keep their raw histograms under ``_hist`` (for the Prometheus collector)."""
        return snapshot_mod.build(self.server, history=self.history.as_json(), include_hist=True)

    def snapshot_json(self) -> dict[str, Any]:
        """The snapshot as /stats.json serves it."""
        return snapshot_mod.build(self.server, history=self.history.as_json())

    # ---- routes ----
    def _metrics(self, headers: dict[str, str]) -> Response:
        from kvstrata.observability.prometheus import render

        body, hdrs = render(self.snapshot, headers.get("accept", ""),
                            headers.get("accept-encoding", ""))
        return 200, hdrs, body

    def _stats(self, headers: dict[str, str]) -> Response:
        body = json.dumps(self.snapshot_json(), separators=(",", ":")).encode()
        return 200, {"Content-Type": "application/json"}, body

    def _healthz(self, headers: dict[str, str]) -> Response:
        return text(200, "ok\n")

    def _index(self, headers: dict[str, str]) -> Response:
        if self._dashboard is None:
            self._dashboard = resources.files("kvstrata.observability").joinpath("dashboard.html").read_bytes()
        return 200, {
            "Content-Type": "text/html; charset=utf-8",
            # Everything is inline; the page may only talk back to this endpoint.
            "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                                       "style-src 'unsafe-inline'; connect-src 'self'; img-src data:",
        }, self._dashboard

    def routes(self) -> dict[str, Any]:
        return {"/": self._index, "/index.html": self._index, "/metrics": self._metrics,
                "/stats.json": self._stats, "/healthz": self._healthz}

    # ---- lifecycle ----
    async def start(self) -> None:
        self._sampler = asyncio.ensure_future(self._sample_forever())
        if not self.configured_port:
            return
        config = self.server.config
        hosts = bind_hosts(self.bind)
        endpoint = HttpEndpoint(self.routes(), hosts, self.configured_port, require_auth=self.require_auth,
                                check=self.check, names=host_names(hosts, str(config.get("http-host-names"))),
                                ssl=self.server.tls_context() if config.get("http-tls") else None)
        try:
            await endpoint.start()
        except OSError as exc:
            if "http-port" in getattr(config, "explicit", ()):
                raise OSError(f"HTTP endpoint on {self.bind} port {self.configured_port}: {exc}") from exc
            log.warning("HTTP endpoint not started (%s port %d: %s); set --http-port to another port, or 0",
                        self.bind, self.configured_port, exc.strerror or exc)
            return
        self.http = endpoint
        log.info("HTTP endpoint (/metrics, /stats.json, /healthz, dashboard /) on %s port %d%s", self.bind,
                 endpoint.port, " (password required)" if self.require_auth() else "")

    async def _sample_forever(self) -> None:
        self.history.sample()
        while True:
            await asyncio.sleep(1.0 - (time.monotonic() % 1.0) + 0.001)
            try:
                self.history.sample()
            except Exception:
                log.exception("observability sample failed")

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self.http is not None:
            await self.http.close()
